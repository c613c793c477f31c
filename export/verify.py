"""Check an exported file against PyTorch on the eval split, in the file's own runtime.

Every export and quantization ends here: the numbers land in `<file>.verify.json` (and the
manifest), and a configured `Budget` turns a regression into an error instead of a shipped model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgebert.errors import EdgebertError

from ._files import sidecar, write_json
from .runtime import logits as runtime_logits


@dataclass(frozen=True, kw_only=True)
class Budget:
    """How far an exported or quantized model may drift from its reference; None = unchecked.

    `max_metric_drop` is in points (accuracy 90.1 → 89.2 is a 0.9-point drop)."""

    max_abs_diff: float | None = None
    max_metric_drop: float | None = None
    min_agreement: float | None = None

    def violations(self, result: dict) -> list[str]:
        found = []
        if self.max_abs_diff is not None and result["max_abs_diff"] > self.max_abs_diff:
            found.append(f"max |logit diff| {result['max_abs_diff']:.3g} > {self.max_abs_diff:.3g}")
        if self.max_metric_drop is not None and result.get("metric_drop") is not None \
                and result["metric_drop"] > self.max_metric_drop:
            found.append(f"{result['metric']} drop {result['metric_drop']:.2f} points > {self.max_metric_drop}")
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
    """The task metric in points: accuracy (token accuracy for token tasks), Pearson×100 for regression."""
    labels = arrays.get("labels")
    if labels is None:
        return None
    if logits.shape[-1] == 1:
        return "pearson", float(np.corrcoef(logits.reshape(-1), labels.astype(np.float64))[0, 1] * 100)
    pred = logits.argmax(-1)
    keep = _valid(arrays, logits) & (labels != -100)
    return "accuracy", float((pred[keep] == labels[keep]).mean() * 100)


def compare(arrays: dict, got: np.ndarray, ref: np.ndarray) -> dict:
    """max |diff|, argmax agreement and metric of `got` against the reference logits."""
    keep = _valid(arrays, ref)
    diff = float(np.abs(got - ref)[keep].max())
    agreement = float((got.argmax(-1) == ref.argmax(-1))[keep].mean()) if ref.shape[-1] > 1 else None
    if agreement is None:  # regression: agreement is meaningless, report the correlation instead
        agreement = float(np.corrcoef(got[keep].reshape(-1), ref[keep].reshape(-1))[0, 1])
    result = {"examples": int(len(ref)), "max_abs_diff": diff, "agreement": agreement}
    m_got, m_ref = metric(arrays, got), metric(arrays, ref)
    if m_got is not None:
        result.update(metric=m_got[0], value=m_got[1], reference_value=m_ref[1], metric_drop=m_ref[1] - m_got[1])
    return result


def verify(path: str | Path, arrays: dict, reference: np.ndarray, *, budget: Budget | None = None,
           write: bool = True, threads: int = 1, against: str = "pytorch") -> dict:
    """Run `path` on `arrays`, compare with `reference` logits, write `<path>.verify.json`, enforce `budget`.

    On a budget violation the file stays (it is a valid model) but the error names what failed."""
    got = runtime_logits(path, arrays, threads=threads)
    if got.shape != reference.shape:
        raise EdgebertError(f"{Path(path).name} returns logits {got.shape}, PyTorch {reference.shape}: "
                            "the export lost or reshaped an output")
    result = {"file": Path(path).name, "bytes": Path(path).stat().st_size, "reference": against,
              **compare(arrays, got, reference)}
    if budget is not None:
        result["budget"] = asdict(budget)
    if write:
        write_json(sidecar(path, "verify"), result)
    broken = budget.violations(result) if budget else []
    if broken:
        raise EdgebertError(f"{Path(path).name} exceeds its budget: {'; '.join(broken)}")
    return result
