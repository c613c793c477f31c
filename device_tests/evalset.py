"""The pre-tokenized eval set (eval.npz, written by the exporter) and the task metric on it."""

from __future__ import annotations

import numpy as np

from . import HarnessError, metrics

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class EvalSet:
    """Right-padded int arrays [N, T], true `lengths` [N] and optional `labels` [N]."""

    def __init__(self, path: str):
        try:
            data = dict(np.load(path, allow_pickle=False))
        except (OSError, ValueError) as e:
            raise HarnessError(f"cannot read eval set {path} ({e}): pass the eval.npz the exporter wrote") from None
        missing = [k for k in ("input_ids", "attention_mask", "lengths") if k not in data]
        if missing:
            raise HarnessError(f"eval set {path} lacks {', '.join(missing)}: re-export it (needs input_ids, "
                               "attention_mask, token_type_ids, lengths, labels)")
        ids = data["input_ids"]
        if ids.ndim != 2 or ids.shape[0] == 0:
            raise HarnessError(f"eval set {path}: input_ids has shape {ids.shape}, expected non-empty [N, T]")
        self.arrays = {k: data[k] for k in INPUTS if k in data}
        for k, a in self.arrays.items():
            if a.shape != ids.shape or a.dtype.kind not in "iu":
                raise HarnessError(f"eval set {path}: {k} is {a.dtype}{list(a.shape)}, expected an int "
                                   f"array shaped like input_ids {list(ids.shape)}")
        self.lengths = data["lengths"].astype(np.int64)
        if self.lengths.shape != (len(ids),) or self.lengths.min() < 1 or self.lengths.max() > ids.shape[1]:
            raise HarnessError(f"eval set {path}: lengths must be [N] with 1 <= length <= {ids.shape[1]}")
        self.labels = data.get("labels")
        if self.labels is not None and self.labels.shape != (len(ids),):
            raise HarnessError(f"eval set {path}: labels has shape {self.labels.shape}, expected [{len(ids)}]")
        self.n = len(ids)

    @property
    def task(self) -> str | None:
        if self.labels is None:
            return None
        return "regression" if self.labels.dtype.kind == "f" else "classification"

    def batch(self, rows: list[int], length: int) -> dict[str, np.ndarray]:
        """Rows `rows` cut or zero-padded (pad id 0, mask 0) to `length` tokens."""
        out = {}
        for k, a in self.arrays.items():
            b = a[rows, :length]
            if b.shape[1] < length:
                b = np.pad(b, ((0, 0), (0, length - b.shape[1])))
            out[k] = b
        return out


def metric(logits: np.ndarray, labels: np.ndarray) -> tuple[dict, list]:
    """The task metric and per-example predictions (argmax, or the score for regression)."""
    if labels.dtype.kind == "f":
        if logits.shape[1] != 1:
            raise HarnessError(f"regression labels but the model gives {logits.shape[1]} outputs per example")
        scores = logits[:, 0].astype(np.float64)
        return ({"pearson": metrics.pearson(scores, labels), "spearman": metrics.spearman(scores, labels)},
                [float(s) for s in logits[:, 0]])
    if logits.shape[1] < 2:
        raise HarnessError("classification labels but the model gives 1 output per example: "
                           "pass the matching eval set")
    predictions = logits.argmax(axis=1)
    return {"accuracy": metrics.accuracy(predictions, labels)}, predictions.tolist()
