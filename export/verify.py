"""Check a model file against a reference (PyTorch, or the float file) in the file's own runtime.

Every export and quantization ends here: the numbers land in `<file>.verify.json` (and the
manifest), and a configured `Budget` turns a regression into an error instead of a shipped model.
The metric is the task's (the eval set's `task` entry: accuracy, F1, Pearson, entity F1, cosine
Spearman), as fractions, scored by `edgebert.device_tests.evalset.metric`, the code the device
harness runs; points appear only in messages.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgebert.device_tests import HarnessError, metrics
from edgebert.device_tests.evalset import metric as task_metric
from edgebert.device_tests.evalset import task_of
from edgebert.device_tests.files import sidecar, write_json
from edgebert.errors import EdgebertError

from . import formats


@dataclass(frozen=True, kw_only=True)
class Budget:
    """How far an exported or quantized model may drift from its reference; None = unchecked.

    `max_metric_drop` is a fraction like the metric (accuracy 0.901 → 0.892 is a 0.009 drop, 0.9 points)."""

    max_abs_diff: float | None = None
    max_metric_drop: float | None = None
    min_agreement: float | None = None

    def violations(self, result: dict) -> list[str]:
        found = []
        if self.max_abs_diff is not None and result["max_abs_diff"] > self.max_abs_diff:
            found.append(f"max |logit diff| {result['max_abs_diff']:.3g} > {self.max_abs_diff:.3g}")
        if self.max_metric_drop is not None and result.get("metric_drop") is not None \
                and result["metric_drop"] > self.max_metric_drop:
            found.append(f"{result['metric']} drop {result['metric_drop'] * 100:.2f} points > "
                         f"{self.max_metric_drop * 100:g}")
        if self.min_agreement is not None and result["agreement"] < self.min_agreement:
            found.append(f"argmax agreement {result['agreement']:.4f} < {self.min_agreement}")
        return found


def _valid(arrays: dict, logits: np.ndarray) -> np.ndarray:
    """Mask of the positions that count: every example, or the real tokens for token-level outputs."""
    if logits.ndim == 3:
        t = logits.shape[1]
        return np.arange(t)[None, :] < arrays["lengths"][:, None]
    return np.ones(len(logits), dtype=bool)


def _task(arrays: dict) -> dict | None:
    try:
        return task_of(arrays)
    except HarnessError as e:
        raise EdgebertError(str(e)) from None


def metric(arrays: dict, logits: np.ndarray) -> tuple[str, dict] | None:
    """(the task's primary metric name, every metric of the task) on `logits`; None without labels."""
    task = _task(arrays)
    if task is None or "labels" not in arrays:
        return None
    try:
        return task["metric"], task_metric(logits, arrays["labels"], task)[0]
    except HarnessError as e:
        raise EdgebertError(str(e)) from None


def compare(arrays: dict, got: np.ndarray, ref: np.ndarray) -> dict:
    """max |diff|, agreement and the task metric of `got` against the reference outputs.

    Agreement: argmax agreement (classes, tags), Pearson of the scores (regression), mean cosine of
    the vectors (embeddings)."""
    keep = _valid(arrays, ref)
    diff = float(np.abs(got - ref)[keep].max())
    task = _task(arrays)
    if task is not None and task["kind"] == "embedding":  # rows interleaved got_i, ref_i: cosine of each pair
        agreement = float(np.mean(metrics.cosine_pairs(np.stack([got, ref], 1).reshape(-1, got.shape[-1]))))
    elif ref.shape[-1] > 1:
        agreement = metrics.accuracy(got.argmax(-1)[keep], ref.argmax(-1)[keep])
    else:
        agreement = metrics.pearson(got[keep].reshape(-1), ref[keep].reshape(-1))
    result = {"examples": int(len(ref)), "max_abs_diff": diff, "agreement": agreement}
    m_got, m_ref = metric(arrays, got), metric(arrays, ref)
    if m_got is not None:
        name = m_got[0]
        value, reference = m_got[1].get(name), m_ref[1].get(name)
        result.update(metric=name, value=value, reference_value=reference,
                      metric_drop=None if value is None else reference - value, metrics=m_got[1])
    return result


def check(path: Path, arrays: dict, reference: np.ndarray, *, budget: Budget | None = None,
          against: str = "pytorch") -> dict:
    """Run `path` on `arrays`, compare with `reference` logits, write `<path>.verify.json`, enforce `budget`.

    On a budget violation the file stays (it is a valid model) but the error names what failed."""
    # Batch 1, each example at its own length, as the device harness scores it: a dynamic-INT8 ONNX file
    # quantizes activations with one scale per tensor, so an example's outputs depend on its batch-mates.
    got = formats.of_file(path).run(path, arrays, batch_size=1)
    if got.shape != reference.shape:
        raise EdgebertError(f"{Path(path).name} returns logits {got.shape}, PyTorch {reference.shape}: "
                            "the export lost or reshaped an output")
    result = {"file": Path(path).name, "bytes": Path(path).stat().st_size, "reference": against,
              **compare(arrays, got, reference)}
    if budget is not None:
        result["budget"] = asdict(budget)
    write_json(sidecar(path, "verify"), result)
    broken = budget.violations(result) if budget else []
    if broken:
        raise EdgebertError(f"{Path(path).name} exceeds its budget: {'; '.join(broken)}")
    return result
