"""`edgebert compile --budget "drop<=1.0,size<=9MB,p50<=1.5ms"`: search a grid of students, keep the best inside.

A candidate is the recipe with other options on the grid's axes (`[search]`: prune fractions of heads,
FFN neurons and hidden width; the vocab stage's min_count; the quantize stage's embedding precision),
so each runs through compile's own stage loop: the stages before the
first changed one are shared, the rest hash to their own folders, and a re-run finds them all done.
Each candidate's model files are measured through the harness `edgebert bench` runs, on `--target`
(latency is never estimated), and the figures are cached beside the stages (OUT/search/), so a
re-run with another budget trains and measures nothing.

A candidate's figures are its worst file's (the bundle ships them all): the largest size, the
slowest p50 and the largest drop. Drop is in points against the model the compression starts from:
the finetune stage's metric, else the start model's (the teacher's), both on the eval split.
"""

from __future__ import annotations

import itertools
import json
import re
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from edgebert.config import Config, repeated
from edgebert.device_tests.files import write_json
from edgebert.device_tests.metrics import points

from ..errors import EdgebertError
from .context import Context, eval_file, log
from .promise import teacher_metric
from .report import optimal
from .stages import STAGES, bundle_stage

PICKS = ("size", "p50")


def axes() -> dict[str, tuple[str, str]]:
    """The grid's axes, [search] field -> (stage, option), as the stages' entries declare them (`searched`). A
    new searchable option is its field in SearchConfig and its line in the stage's entry."""
    return {axis: (stage.name, option) for stage in STAGES.values() for axis, option in stage.searched.items()}


@dataclass(frozen=True, kw_only=True)
class SearchConfig(Config):
    """The grid `--budget` searches (every combination is one candidate) and how each is timed."""

    heads: list[float] = field(default_factory=lambda: [0.25, 0.5])  # prune.heads fractions
    ffn: list[float] = field(default_factory=lambda: [0.5, 0.75])  # prune.ffn fractions
    width: list[float] = field(default_factory=lambda: [0.0, 0.25])  # prune.width fractions
    min_count: list[int] | None = None  # vocab.min_count values (None: the recipe's own, not searched)
    embeddings: list[str] | None = None  # quantize.embeddings precisions, e.g. ["int8", "int4"] (None: not searched)
    warmup: int = 5  # untimed runs per file before the timed ones
    runs: int = 50  # timed runs per file (batch 1, 1 thread)

    def __post_init__(self):
        for name in axes():
            values = getattr(self, name)
            if values is None:
                continue
            if not values:
                raise EdgebertError(f"search.{name}: an empty list leaves no candidate; give at least one value")
            if repeated(values) is not None:
                raise EdgebertError(f"search.{name}: {repeated(values)!r} is listed twice in {values}; list each once")


# ---------------------------------------------------------------------------------------------
# The budget


@dataclass(frozen=True)
class Bound:
    name: str  # drop | size | p50 | p90
    limit: float  # points, bytes or ms
    text: str  # as the user wrote it, for messages


UNITS = {"drop": {"": 1.0, "points": 1.0, "pt": 1.0},
         "size": {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30},
         "p50": {"us": 1e-3, "ms": 1.0, "s": 1e3}}
UNITS["p90"] = UNITS["p50"]
HOW = {"drop": "points of the task metric, e.g. drop<=1.0", "size": "a size with its unit, e.g. size<=9MB",
       "p50": "a latency with its unit, e.g. p50<=1.5ms", "p90": "a latency with its unit, e.g. p90<=3ms"}


def parse_budget(text: str) -> list[Bound]:
    """`drop<=1.0,size<=9MB,p50<=1.5ms` as bounds; a mistake is one line naming the part and the fix."""
    bounds = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_]+)\s*(<=|>=|<|>|==|=)\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)", part)
        if not m:
            raise EdgebertError(f"--budget: cannot read {part!r}; write NAME<=VALUE, e.g. "
                                "\"drop<=1.0,size<=9MB,p50<=1.5ms\"")
        name, op, value, unit = m.groups()
        if name not in UNITS:
            raise EdgebertError(f"--budget: unknown constraint {name!r} in {part!r}; use {', '.join(UNITS)}")
        if op != "<=":
            raise EdgebertError(f"--budget: {part!r} uses {op!r}; every constraint is an upper bound: {name}<=VALUE")
        if unit not in UNITS[name]:
            if name == "drop":
                raise EdgebertError(f"--budget: {part!r}: drop is in points of the task metric; write drop<={value}")
            raise EdgebertError(f"--budget: {part!r} needs {HOW[name]} (units: {', '.join(UNITS[name])})")
        if any(b.name == name for b in bounds):
            raise EdgebertError(f"--budget: {name} is bounded twice; keep one {name}<=VALUE")
        bounds.append(Bound(name, float(value) * UNITS[name][unit], part))
    if not bounds:
        raise EdgebertError("--budget: no constraint given; write e.g. \"drop<=1.0,size<=9MB,p50<=1.5ms\"")
    return bounds


def _show(name: str, value: float) -> str:
    if name == "size":
        return f"{value / 1e6:.3g} MB"
    return f"{value:.2f} points" if name == "drop" else f"{value:.3g} ms"


def missed(row: dict, bounds: list[Bound]) -> list[str]:
    """The constraints `row` misses, as `p50 1.9 ms > 1.5 ms`."""
    return [f"{b.name} {_show(b.name, row[b.name])} > {_show(b.name, b.limit)}" for b in bounds if row[b.name] > b.limit]


def _excess(row: dict, bounds: list[Bound]) -> float:
    """How far outside the budget: the summed relative overshoot (drop relative to at least 1 point)."""
    return sum(max(row[b.name] - b.limit, 0) / (max(b.limit, 1.0) if b.name == "drop" else max(b.limit, 1e-9))
               for b in bounds)


# ---------------------------------------------------------------------------------------------
# The candidates


def _searched(recipe) -> list[str]:
    """The [search] axes the recipe's stages take: one its stages lack is skipped at its default, else refused."""
    grid, defaults, known = recipe.search, SearchConfig(), axes()
    found = []
    for name, (stage, _) in known.items():
        value = getattr(grid, name)
        if value is None:
            continue
        if stage in recipe.stages:
            found.append(name)
        elif value != getattr(defaults, name):
            raise EdgebertError(f"search.{name}: searches the {stage} stage, which the recipe does not run; add "
                                f"\"{stage}\" to stages or drop search.{name}")
    if not found:
        stages = list(dict.fromkeys(stage for stage, _ in known.values()))
        raise EdgebertError(f"--budget: nothing to search; the [search] grid varies the {', '.join(stages[:-1])} and "
                            f"{stages[-1]} stages: add \"{stages[0]}\" to the recipe's stages")
    return found


def candidates(recipe) -> list[tuple[str, dict, object]]:
    """(label, choice, recipe) for every point of the recipe's grid."""
    if not any(STAGES.get(name).writes_files for name in recipe.stages):
        raise EdgebertError(f"--budget measures the model files: add \"{bundle_stage().name}\" to the recipe's stages")
    searched, known = _searched(recipe), axes()
    found = []
    for values in itertools.product(*(getattr(recipe.search, name) for name in searched)):
        choice = dict(zip(searched, values))
        options = dict(recipe.options)
        by_stage: dict[str, dict] = {}
        for name, value in choice.items():
            stage, option = known[name]
            by_stage.setdefault(stage, {})[option] = value
        for stage, changes in by_stage.items():
            try:
                options[stage] = options[stage].replace(**changes)
            except EdgebertError as e:
                raise EdgebertError(f"search: {e} (the [{stage}] table conflicts with the grid)") from None
        label = " ".join(f"{stage} " + " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                                  for k, v in changes.items())
                         for stage, changes in by_stage.items())
        found.append((label, choice, replace(recipe, options=options)))
    return found


def _measure(ctx: Context, state, key: str, target: str, fresh: bool) -> dict:
    """Size, latency on `target` and metric (points) of each of the candidate's files, cached by its key."""
    from ..bench import bench

    grid = ctx.recipe.search
    slug = re.sub(r"[^A-Za-z0-9.-]+", "_", target)
    cache = ctx.out / "search" / f"{key}-{slug}-{grid.warmup}x{grid.runs}.json"
    if cache.is_file() and not fresh:
        return json.loads(cache.read_text())
    inputs = eval_file(ctx)
    files = {}
    for name, path in sorted(state.files.items()):
        run = bench(path, inputs=inputs, target=target, threads=1, warmup=grid.warmup, runs=grid.runs,
                    log=log)["runs"][0]
        files[name] = {"bytes": path.stat().st_size, "p50_ms": run["latency_ms"]["p50"],
                       "p90_ms": run["latency_ms"]["p90"], "metric": points(run[ctx.task.metric])}
    write_json(cache, files)
    return files


def check_floor(ctx: Context, budget: list[Bound], target: str) -> None:
    """Refuse a latency bound no student can meet, before any work: an empty ONNX model (the task's inputs and
    output shape, one op between them) timed on `target` through the same harness; no candidate is faster."""
    bounds = [b for b in budget if b.name in ("p50", "p90")]
    if not bounds or ctx.task.kind == "embedding":  # an embedder's eval set scores pairs of pooled vectors
        return
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from ..bench import bench

    width = max(len(ctx.task.labels), 1)
    shape = ["batch", "sequence", width] if ctx.task.kind == "token-classification" else ["batch", width]
    names = ["input_ids", "attention_mask", "token_type_ids"]
    first = [helper.make_node("Slice", ["input_ids", "zero", "width", "one"], ["first"]),  # batch x width ids
             helper.make_node("Cast", ["first"], ["logits"], to=TensorProto.FLOAT)]
    if ctx.task.kind == "token-classification":
        first = [helper.make_node("Unsqueeze", ["input_ids", "two"], ["ids3"]),
                 helper.make_node("Expand", ["ids3", "wide"], ["many"]),
                 helper.make_node("Cast", ["many"], ["logits"], to=TensorProto.FLOAT)]
    consts = [helper.make_tensor(n, TensorProto.INT64, [len(v)], v)
              for n, v in (("zero", [0]), ("width", [width]), ("one", [1]), ("two", [2]), ("wide", [1, 1, width]))]
    graph = helper.make_graph(first, "floor", [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
                                               for n in names],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, shape)], initializer=consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with tempfile.TemporaryDirectory(prefix="edgebert-floor-") as tmp:
        path, inputs = Path(tmp) / "model.onnx", Path(tmp) / "eval.npz"
        onnx.save(model, path)
        np.savez(inputs, **ctx.eval_arrays)
        grid = ctx.recipe.search
        run = bench(path, inputs=inputs, target=target, threads=1, warmup=grid.warmup, runs=grid.runs,
                    log=lambda _: None)["runs"][0]
    for b in bounds:
        floor = run["latency_ms"][b.name]
        if b.limit < floor:
            raise EdgebertError(f"--budget {b.text}: an empty model's call already takes {_show(b.name, floor)} "
                                f"{b.name} on {target}, so no student can meet it; raise the bound")


def search(ctx: Context, budget: list[Bound], run_stages, *, start_key: str, target: str = "local",
           pick: str = "size", fresh: bool = False):
    """Run and measure every candidate (`run_stages(ctx)` -> (state, stages, key) is compile's loop),
    then return (ctx, state, stages, key, record) of the smallest (`pick="size"`) or fastest
    (`"p50"`) inside `budget`; none inside raises, naming the closest and what it misses."""
    if pick not in PICKS:
        raise EdgebertError(f"--pick: unknown {pick!r}; use {' or '.join(PICKS)}")
    runs, rows = [], []
    for label, choice, recipe in candidates(ctx.recipe):
        log(f"search: candidate {label}")
        cctx = replace(ctx, recipe=recipe)
        state, stages, key = run_stages(cctx)
        files = _measure(cctx, state, key, target, fresh)
        reference = teacher_metric(ctx, stages, start_key)  # the original ctx: a vocab stage re-encodes cctx
        row = {"candidate": label, "choice": choice, "files": files,
               "size": max(f["bytes"] for f in files.values()), "p50": max(f["p50_ms"] for f in files.values()),
               "p90": max(f["p90_ms"] for f in files.values()),
               "drop": round(max(reference - f["metric"] for f in files.values()), 4), "reference": reference}
        row["missed"] = missed(row, budget)
        log(f"search: {label}: {_show('size', row['size'])}, p50 {_show('p50', row['p50'])}, drop "
            f"{_show('drop', row['drop'])}" + (f" — misses {', '.join(row['missed'])}" if row["missed"] else " — fits"))
        runs.append((cctx, state, stages, key))
        rows.append(row)
    front = optimal([{"metric": -r["drop"], "latency_ms": r["p50"], "bytes": r["size"]} for r in rows])
    for row, ok in zip(rows, front):
        row["pareto"] = ok
    inside = [i for i, r in enumerate(rows) if not r["missed"]]
    if not inside:
        r = rows[min(range(len(rows)), key=lambda i: _excess(rows[i], budget))]
        raise EdgebertError(f"no candidate meets the budget: closest is {r['candidate']} ({_show('size', r['size'])}, "
                            f"p50 {_show('p50', r['p50'])}, drop {_show('drop', r['drop'])}) — {', '.join(r['missed'])}")
    order = ("size", "p50") if pick == "size" else ("p50", "size")
    best = min(inside, key=lambda i: tuple(rows[i][k] for k in order))
    for i, row in enumerate(rows):
        row["chosen"] = i == best
    log(f"search: picked {rows[best]['candidate']} (the {'smallest' if pick == 'size' else 'fastest'} of "
        f"{len(inside)} inside the budget)")
    record = {"budget": ",".join(b.text for b in budget), "target": target, "pick": pick,
              "metric": ctx.task.metric, "candidates": rows}
    return (*runs[best], record)


def search_lines(record: dict) -> list[str]:
    """The search's candidates for the compile summary: figures, what each misses, the Pareto set, the pick."""
    rows = record["candidates"]
    width = max(len(r["candidate"]) for r in rows)
    lines = [f"budget {record['budget']} on {record['target']} (pick {record['pick']}; drop in {record['metric']} "
             f"points from {rows[0]['reference']:.2f}):",
             f"{'candidate':<{width}} {'MB':>8} {'p50 ms':>8} {'drop':>6}  pareto  budget"]
    for r in rows:
        lines.append(f"{r['candidate']:<{width}} {r['size'] / 1e6:>8.3f} {r['p50']:>8.3f} {r['drop']:>6.2f}  "
                     f"{'yes' if r['pareto'] else '':<6}  {'misses ' + ', '.join(r['missed']) if r['missed'] else 'fits'}"
                     + ("  <- picked" if r["chosen"] else ""))
    return lines
