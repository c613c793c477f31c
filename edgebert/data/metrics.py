"""A task's metrics: the task decides which of the shared metrics (device_tests.metrics) apply."""

from __future__ import annotations

from ..device_tests.metrics import task_metrics
from .tasks import Task, get_task


def compute_metrics(task: str | Task, predictions, labels) -> dict[str, float]:
    """All metrics of a task kind: predicted class ids / scores / [N, T] tag ids vs labels."""
    task = get_task(task)
    return task_metrics(task.kind, predictions, labels, task.labels)
