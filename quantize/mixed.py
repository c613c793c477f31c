"""Automatic mixed precision: find which op kinds must stay in float for a budget to hold.

Each group (an op kind, or the linear layers of one encoder layer) is quantized alone to measure
its sensitivity on (the first `search_samples` of) the eval split; then the shortest prefix of
the most-sensitive-first order that, moved back to float (linear layers: to dynamic INT8), meets
the budget on the whole eval split is found by bisection: a few full evaluations, not one per group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from edgebert.errors import EdgebertError
from edgebert.export import Budget, compare


def _cost(result: dict) -> tuple[float, float]:
    drop = result.get("metric_drop")
    return (drop if drop is not None else 0.0) + (1 - result["agreement"]), result["max_abs_diff"]


IN_FLOAT = "in float and linear layers dynamic INT8"  # where the float search keeps a group


def search(groups: list[str], build: Callable[[set[str], Path], None], run: Callable[[Path, dict], np.ndarray],
           arrays: dict, reference: np.ndarray, budget: Budget, work: Path, suffix: str,
           search_samples: int = 256, kept_as: str = IN_FLOAT) -> dict:
    """`build(float_groups, path)` writes a candidate with `float_groups` kept in the higher precision (`kept_as`
    says which), `run(path, arrays)` returns its logits.

    Returns {"float": [...], "sensitivity": {...}, "result": {...}, "path": Path}; raises when even
    the most float candidate misses the budget."""
    trial = iter(range(10_000))
    few = {k: v[:search_samples] for k, v in arrays.items()}

    def evaluate(float_groups: set[str], data: dict, ref: np.ndarray) -> tuple[Path, dict]:
        path = work / f"trial{next(trial)}{suffix}"
        build(float_groups, path)
        return path, compare(data, run(path, data), ref)

    path, result = evaluate(set(), arrays, reference)
    if not budget.violations(result):
        return {"float": [], "sensitivity": {}, "result": result, "path": path}
    path, result = evaluate(set(groups), arrays, reference)
    if budget.violations(result):
        raise EdgebertError(f"quantization budget cannot be met ({'; '.join(budget.violations(result))} with "
                            f"every op kind {kept_as}): loosen the budget or use QAT")
    best = (len(groups), path, result)
    sensitivity = {g: _cost(evaluate(set(groups) - {g}, few, reference[:search_samples])[1]) for g in groups}
    order = sorted(groups, key=lambda g: sensitivity[g], reverse=True)
    lo, hi = 0, len(order)  # prefix lo fails (lo=0 evaluated above), prefix hi passes
    while hi - lo > 1:
        mid = (lo + hi) // 2
        path, result = evaluate(set(order[:mid]), arrays, reference)
        if budget.violations(result):
            lo = mid
        else:
            hi, best = mid, (mid, path, result)
    n, path, result = best
    return {"float": order[:n], "sensitivity": {g: round(s[0], 5) for g, s in sensitivity.items()},
            "order": order, "result": result, "path": path}
