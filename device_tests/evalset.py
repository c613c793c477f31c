"""The pre-tokenized eval set (eval.npz, written by the exporter) and the task metric on it."""

from __future__ import annotations

import json

import numpy as np

from . import HarnessError, metrics

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
TASK = "task"  # the entry naming the task: one JSON string in a [1] array, so cutting rows ([:n]) keeps it
TASK_KEYS = ("name", "kind", "metric", "labels")


def task_entry(name: str, kind: str, metric: str, labels) -> np.ndarray:
    """The eval set's `task` entry: what the harness needs to score it (kind, metric, label names)."""
    return np.array([json.dumps({"name": name, "kind": kind, "metric": metric, "labels": list(labels)})])


def pick_rows(arrays: dict, rows) -> dict:
    """The eval set's examples at `rows` (an index array), the task entry kept whole."""
    return {k: v if k == TASK else v[rows] for k, v in arrays.items()}


def task_of(arrays: dict, where: str = "the eval set") -> dict | None:
    """{name, kind, metric, labels} from the `task` entry; without one, read off the labels (float:
    regression by Spearman, else classification by accuracy); None without labels either."""
    if TASK in arrays:
        try:
            task = json.loads(str(np.asarray(arrays[TASK]).reshape(-1)[0]))
            if not isinstance(task, dict) or any(k not in task for k in TASK_KEYS):
                raise ValueError(f"needs {', '.join(TASK_KEYS)}")
        except (ValueError, IndexError) as e:
            raise HarnessError(f"{where}: its task entry is unreadable ({e}): re-export the eval set") from None
        return task
    labels = arrays.get("labels")
    if labels is None:
        return None
    if labels.ndim != 1:
        raise HarnessError(f"{where}: labels of shape {list(labels.shape)} but no task entry naming the tags: "
                           "re-export the eval set (edgebert writes one)")
    if labels.dtype.kind == "f":
        return {"name": None, "kind": "regression", "metric": "spearman", "labels": []}
    return {"name": None, "kind": "classification", "metric": "accuracy", "labels": []}


class EvalSet:
    """Right-padded int arrays [N, T], true `lengths` [N], optional `labels` ([N], or [N, T] tag ids for
    token tasks) and the `task` entry that says how to score them."""

    def __init__(self, path: str):
        try:
            data = dict(np.load(path, allow_pickle=False))
        except OSError as e:
            raise HarnessError(f"cannot read eval set {path} ({e}): pass the eval.npz the exporter wrote") from None
        except ValueError:  # numpy's own advice (allow_pickle) would run code from an untrusted file
            raise HarnessError(f"eval set {path} is not an .npz file of arrays: pass the eval.npz the exporter "
                               "wrote") from None
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
        if ids.min() < 0:
            raise HarnessError(f"eval set {path}: input_ids holds negative id {ids.min()}; token ids start at 0: "
                               "re-export the eval set")
        mask = self.arrays.get("attention_mask")
        empty = np.flatnonzero(~mask.any(axis=1)) if mask is not None else []
        if len(empty):
            raise HarnessError(f"eval set {path}: attention_mask row {empty[0]} is all zeros, so the model would "
                               "answer from no token: re-export the eval set (every row needs its real tokens)")
        self.lengths = data["lengths"].astype(np.int64)
        if self.lengths.shape != (len(ids),) or self.lengths.min() < 1 or self.lengths.max() > ids.shape[1]:
            raise HarnessError(f"eval set {path}: lengths must be [N] with 1 <= length <= {ids.shape[1]}")
        self.labels = data.get("labels")
        self.task = task_of(data, f"eval set {path}")
        if self.labels is not None:
            shape = ids.shape if self.task["kind"] == "token-classification" else (len(ids),)
            if self.labels.shape != shape:
                raise HarnessError(f"eval set {path}: labels has shape {self.labels.shape}, expected {list(shape)} "
                                   f"for a {self.task['kind']} task")
        self.n, self.path = len(ids), path

    def check_vocabulary(self, vocab_size: int, source: str) -> None:
        """Refuse ids the model cannot embed: a runtime would crash on them or read another row."""
        ids = self.arrays["input_ids"]
        if ids.max() >= vocab_size:
            row = int(np.argwhere(ids >= vocab_size)[0][0])
            raise HarnessError(f"eval set {self.path}: example {row} holds id {ids[row].max()}, outside the "
                               f"vocabulary of {vocab_size} tokens ({source}): re-export the eval set with "
                               "the bundle's tokenizer")

    def batch(self, rows: list[int], length: int) -> dict[str, np.ndarray]:
        """Rows `rows` cut or zero-padded (pad id 0, mask 0) to `length` tokens."""
        out = {}
        for k, a in self.arrays.items():
            b = a[rows, :length]
            if b.shape[1] < length:
                b = np.pad(b, ((0, 0), (0, length - b.shape[1])))
            out[k] = b
        return out


def metric(outputs: np.ndarray, labels: np.ndarray, task: dict | None = None) -> tuple[dict, list]:
    """The task's metrics (metrics.task_metrics) and per-example predictions: the class, the score
    (regression), the tag ids of the labeled first pieces (token tasks) or the pair's cosine (embedding).
    `task` is the eval set's (`task_of`); without it, what the labels say."""
    task = task or task_of({"labels": labels})
    kind, names = task["kind"], task["labels"]
    if kind == "embedding":
        if outputs.ndim != 2 or len(outputs) % 2:
            raise HarnessError(f"an embedding eval set pairs rows 2i and 2i+1, but the model gives outputs "
                               f"{list(outputs.shape)}: pass the eval set written with this model")
        return metrics.task_metrics(kind, outputs, labels), metrics.cosine_pairs(outputs).tolist()
    if kind == "regression":
        if outputs.shape[1] != 1:
            raise HarnessError(f"regression labels but the model gives {outputs.shape[1]} outputs per example")
        scores = outputs[:, 0].astype(np.float64)
        return metrics.task_metrics(kind, scores, labels), [float(s) for s in outputs[:, 0]]
    token = kind == "token-classification"
    if token != (outputs.ndim == 3):
        raise HarnessError(f"a {kind} eval set but the model gives {'per-token' if outputs.ndim == 3 else 'per-example'}"
                           " outputs: pass the eval set written with this model")
    classes = outputs.shape[-1]
    if classes < 2:
        raise HarnessError("classification labels but the model gives 1 output per example: "
                           "pass the matching eval set")
    if names and len(names) != classes:
        raise HarnessError(f"the eval set names {len(names)} labels but the model has {classes} outputs: "
                           "pass the eval set written with this model")
    scored = labels[labels != metrics.IGNORE] if token else labels
    if scored.size and (scored.min() < 0 or scored.max() >= classes):
        raise HarnessError(f"eval set labels run {scored.min()}..{scored.max()} but the model has {classes} "
                           f"classes (0..{classes - 1}): pass the eval set written with this model")
    if token and not names:
        raise HarnessError("token labels but the eval set names no tags: re-export the eval set")
    predictions = outputs.argmax(axis=-1)
    scores = metrics.task_metrics(kind, predictions, labels, names)
    if token:
        return scores, [p[g != metrics.IGNORE].tolist() for p, g in zip(predictions, labels)]
    return scores, predictions.tolist()
