"""Does padding, or the batch, change a model file's outputs? Run eval examples one at a time at their own
length, again right-padded to the contract's longest length, and again in batches, and compare.

A float file should not care (masked positions get zero attention), nor should static scales. A plain
dynamic-INT8 ONNX file does: its activation ranges are taken over the whole tensor, padded positions and the
other rows of the batch included, so the quantization step, and sometimes the label, changes with them
(edgebert's own runs each row alone: `quantize.onnx_ptq.by_row`). The bundle records which a file is.
"""

from __future__ import annotations

import numpy as np

from .backends import logits

EXAMPLES = 64  # enough to see a difference: any quantization change moves every logit a little
BATCH = 8  # rows of different lengths, each batch cut to its longest
TOLERANCE = 1e-5  # |padded − unpadded| allowed, relative to the largest |logit| (float rounding)


def check(model, arrays: dict, length: int, examples: int = EXAMPLES) -> dict:
    """{padding_invariant, max_abs_diff, label_flips, batch_invariant, batch_max_abs_diff, batch_label_flips,
    examples, padded_to, batch, how} for `model` (a loaded backend) on the first `examples` rows of
    right-padded `arrays` (with `lengths`)."""
    n = min(examples, len(arrays["lengths"]))
    own = {k: np.asarray(v[:n]) for k, v in arrays.items() if k != "labels"}
    t = own["input_ids"].shape[1]
    padded = {k: np.pad(v, ((0, 0), (0, max(0, length - t)))) if v.ndim == 2 else v for k, v in own.items()}
    padded["lengths"] = np.full(n, length, dtype=np.int32)  # each row then runs at `length`
    alone = logits(model, own, batch_size=1)  # batch 1: each row at its own length, no batch padding
    real = own["attention_mask"].astype(bool)
    scale = max(1.0, float(np.abs(alone).max()))

    def against_alone(other: np.ndarray) -> tuple[bool, float, int]:
        a, b = (alone[real], other[:, :t][real]) if alone.ndim == 3 else (alone, other)  # tokens: the real ones
        diff = float(np.abs(a - b).max())
        return diff <= TOLERANCE * scale, diff, int((a.argmax(-1) != b.argmax(-1)).sum()) if a.shape[-1] > 1 else 0

    padding, batch = against_alone(logits(model, padded, batch_size=1)), against_alone(logits(model, own, BATCH))
    return {"padding_invariant": padding[0], "max_abs_diff": padding[1], "label_flips": padding[2],
            "batch_invariant": batch[0], "batch_max_abs_diff": batch[1], "batch_label_flips": batch[2],
            "examples": n, "padded_to": length, "batch": model.batch_size or BATCH,
            "how": "each example alone at its own length vs right-padded to padded_to (batch 1), and vs in batches "
                   "of `batch` rows, each batch cut to its longest row"}
