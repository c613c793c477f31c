"""The promise, judged by the compiler: every bundle file within the recipe's `max_drop` points of its
teacher on the task's own metric, and at least SMALLER times smaller than the teacher's FP32 weights.

A student that misses is still written (the best the recipe found), and the compile says so in one line before
it finishes; the manifest's `promise` and the report carry the numbers, so a user never reads "within budget"
where it is not.
"""

from __future__ import annotations

import json

from edgebert.device_tests.files import write_json
from edgebert.device_tests.metrics import points

from .context import Context, State, StageRecord, log, start_model, start_weights, task_model
from .report import promise_lines
from .stages import STAGES

SMALLER = 10.0  # the promise's size ratio, teacher FP32 bytes over the file's


def teacher_metric(ctx: Context, stages: list[StageRecord], start_key: str) -> float:
    """The metric (points) a drop is counted from: the fine-tuned model's, else the start model's, on the eval
    split (the start model's evaluated once and cached beside the stages)."""
    metric = ctx.task.metric
    if stages and STAGES.get(stages[0].name).fine_tunes:
        return points(stages[0].metrics[metric])
    cache = ctx.out / "search" / f"teacher-{start_key}.json"
    if cache.is_file():
        return json.loads(cache.read_text())["metric"]
    from ..passes import evaluate

    value = points(evaluate(task_model(start_model(ctx.recipe), ctx.task), ctx.data.eval)[metric])
    write_json(cache, {"metric": value})
    return value


def _teacher_bytes(ctx: Context, stages: list[StageRecord]) -> int | None:
    """The teacher's FP32 bytes: the fine-tuned model's, else the start model's weight files (None: none found)."""
    if stages and STAGES.get(stages[0].name).fine_tunes:
        return stages[0].bytes
    return sum(w.stat().st_size for w in start_weights(ctx.recipe)[1]) or None


def promise(ctx: Context, stages: list[StageRecord], state: State, start_key: str) -> dict | None:
    """Each verified file's metric, drop and size ratio against the teacher, and whether all keep the promise;
    None when no file was scored on the eval split (nothing to judge)."""
    scored = {name: v["verify"] for name, v in state.verification.items()
              if (v.get("verify") or {}).get("value") is not None}
    if not scored:
        return None
    teacher, big, max_drop = teacher_metric(ctx, stages, start_key), _teacher_bytes(ctx, stages), ctx.recipe.max_drop
    files = {}
    for name, check in scored.items():
        size = state.files[name].stat().st_size
        files[name] = {"metric": round(points(check["value"]), 4), "drop": round(teacher - points(check["value"]), 4),
                       "bytes": size, "smaller": round(big / size, 2) if big else None}
    record = {"metric": ctx.task.metric, "teacher": round(teacher, 4), "teacher_bytes": big, "max_drop": max_drop,
              "smaller_target": SMALLER, "files": files,
              "within": all(f["drop"] <= max_drop for f in files.values()),
              "small": all(f["smaller"] is not None and f["smaller"] >= SMALLER for f in files.values())}
    for line in promise_lines(record, missed_only=True):
        log(line)
    return record
