"""A task's metrics: the task decides which of the shared metrics (device_tests.metrics) apply."""

from __future__ import annotations

import numpy as np

from ..device_tests.metrics import accuracy, entity_f1, f1, pearson, spearman
from .tasks import IGNORE, Task, get_task


def compute_metrics(task: str | Task, predictions, labels) -> dict[str, float]:
    """All metrics of a task kind: predicted class ids / scores / [N, T] tag ids vs labels."""
    task = get_task(task)
    if task.kind == "regression":
        return {"pearson": pearson(predictions, labels), "spearman": spearman(predictions, labels)}
    if task.kind == "token-classification":
        true, guess = [], []
        for predicted, gold in zip(np.asarray(predictions), np.asarray(labels), strict=True):
            keep = gold != IGNORE
            true.append([task.labels[t] for t in gold[keep]])
            guess.append([task.labels[t] for t in predicted[keep]])
        return entity_f1(true, guess)
    metrics = {"accuracy": accuracy(predictions, labels)}
    if len(task.labels) == 2:
        metrics["f1"] = f1(predictions, labels)
    return metrics
