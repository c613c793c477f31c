"""Check a model file against a reference (PyTorch, or the float file) in the file's own runtime.

Every export and quantization ends here: the numbers land in `<file>.verify.json` (and the
manifest), and a configured `Budget` turns a regression into an error instead of a shipped model.
Metrics are fractions (accuracy 0.9014), computed by `edgebert.device_tests.metrics`, the copy
the device harness uses; points appear only in messages.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgebert.device_tests import metrics
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


def metric(arrays: dict, logits: np.ndarray) -> tuple[str, float] | None:
    """The task metric as a fraction: accuracy (token accuracy for token tasks), Pearson for regression."""
    labels = arrays.get("labels")
    if labels is None:
        return None
    if logits.shape[-1] == 1:
        return "pearson", metrics.pearson(logits.reshape(-1), labels)
    keep = _valid(arrays, logits) & (labels != -100)
    return "accuracy", metrics.accuracy(logits.argmax(-1)[keep], labels[keep])


def compare(arrays: dict, got: np.ndarray, ref: np.ndarray) -> dict:
    """max |diff|, argmax agreement and metric of `got` against the reference logits."""
    keep = _valid(arrays, ref)
    diff = float(np.abs(got - ref)[keep].max())
    if ref.shape[-1] > 1:
        agreement = metrics.accuracy(got.argmax(-1)[keep], ref.argmax(-1)[keep])
    else:  # regression: agreement is meaningless, report the correlation instead
        agreement = metrics.pearson(got[keep].reshape(-1), ref[keep].reshape(-1))
    result = {"examples": int(len(ref)), "max_abs_diff": diff, "agreement": agreement}
    m_got, m_ref = metric(arrays, got), metric(arrays, ref)
    if m_got is not None:
        result.update(metric=m_got[0], value=m_got[1], reference_value=m_ref[1], metric_drop=m_ref[1] - m_got[1])
    return result


def check(path: Path, arrays: dict, reference: np.ndarray, *, budget: Budget | None = None,
          against: str = "pytorch") -> dict:
    """Run `path` on `arrays`, compare with `reference` logits, write `<path>.verify.json`, enforce `budget`.

    On a budget violation the file stays (it is a valid model) but the error names what failed."""
    got = formats.of_file(path).run(path, arrays)
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
