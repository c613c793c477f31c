"""Does padding change a model file's outputs? Run eval examples one at a time at their own length and
again right-padded to the contract's longest length, and compare.

A float file should not care (masked positions get zero attention). Dynamic-INT8 ONNX does: its
activation ranges are taken over the whole tensor, padded positions included, so the quantization
step, and sometimes the label, changes with the padding. The bundle records which a file is.
"""

from __future__ import annotations

import numpy as np

from .backends import logits

EXAMPLES = 64  # enough to see a difference: any quantization change moves every logit a little
TOLERANCE = 1e-5  # |padded − unpadded| allowed, relative to the largest |logit| (float rounding)


def check(model, arrays: dict, length: int, examples: int = EXAMPLES) -> dict:
    """{padding_invariant, max_abs_diff, label_flips, examples, padded_to, how} for `model` (a loaded
    backend) on the first `examples` rows of right-padded `arrays` (with `lengths`)."""
    n = min(examples, len(arrays["lengths"]))
    own = {k: np.asarray(v[:n]) for k, v in arrays.items() if k != "labels"}
    t = own["input_ids"].shape[1]
    padded = {k: np.pad(v, ((0, 0), (0, max(0, length - t)))) if v.ndim == 2 else v for k, v in own.items()}
    padded["lengths"] = np.full(n, length, dtype=np.int32)  # each row then runs at `length`
    a = logits(model, own, batch_size=1)  # batch 1: each row at its own length, no batch padding
    b = logits(model, padded, batch_size=1)
    if a.ndim == 3:  # token-level outputs: compare the real tokens only
        real = own["attention_mask"].astype(bool)
        a, b = a[real], b[:, :t][real]
    diff = float(np.abs(a - b).max())
    return {"padding_invariant": diff <= TOLERANCE * max(1.0, float(np.abs(a).max())), "max_abs_diff": diff,
            "label_flips": int((a.argmax(-1) != b.argmax(-1)).sum()) if a.shape[-1] > 1 else 0, "examples": n,
            "padded_to": length, "how": "batch 1, each example at its own length vs right-padded to padded_to"}
