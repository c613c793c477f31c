"""`edgebert compile`: run a recipe's stages in order and write the app bundle.

Each stage's output lands in `OUT/stages/NN-name-KEY/`, where KEY hashes everything the stage
depends on (the previous stage's key and the stage's cache key from the registry: its options,
and for the first also the data and the start model). A stage folder is renamed into place only
when complete, so a killed run resumes at the stage it was in (the passes also resume mid-stage
from `OUT/work/`), and a re-run of an unchanged recipe does no work.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import warnings
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock, Timeout

from edgebert.device_tests.files import sha256
from edgebert.device_tests.metrics import points

from .. import checkpoint
from ..errors import EdgebertError, on_disk_full
from ..progress import clock
from ..passes.train import Accelerator, fingerprint
from .estimate import estimate
from .context import Context, StageRecord, State, context, data_fingerprint, eval_file, log, retokenize, start_weights
from .promise import promise
from .recipe import Recipe
from .report import BASELINE_MARGIN, near_baseline, promise_lines
from .resources import check_disk
from .search import check_floor, search, search_lines
from .stages import STAGES, bundle_stage

# bench/compare.py's results, in the repository this edgebert runs from (not the current directory)
COMPARE = Path(__file__).resolve().parents[2] / "bench" / "results" / "compare.json"
THREADS = (1, 2)  # the local bench times each file at each count this machine has
# Each count is timed this many times, in turns (1, 2, 2, 1, 1, 2), and the thread count recommended from each
# count's median: one pass each, 1 then 2, recommended 2 threads where bench/compare.py measured 2 a quarter slower
# (ff69d2e). The file's figures are its median turn at the first count: the very first turn was the slowest
# (0.775 ms against 0.647 and 0.671 in 0d6a4cf's run)
ROUNDS = 3


def _key(*parts) -> str:
    """A stage folder's key: the 12-character fingerprint of what the stage's output is a function of."""
    return fingerprint(*parts, length=12)


LOCK = "work/compile.lock"  # held by the one run writing in OUT; the OS frees it when that run dies


@contextmanager
def _claimed(out: Path, *, resume: bool, force: bool, need: int = 0):
    """`out` ready to write and held by this run alone while the block runs. A second run into it is refused
    at once (a killed run's lock goes with its process), and what a killed run left half-written beside its
    atomic renames (`.*.tmp`, `.*.old`) is removed before anything reads the folder."""
    lock = _claim(out, resume=resume, force=force, need=need)
    try:
        yield
    finally:
        lock.release()


def _claim(out: Path, *, resume: bool, force: bool, need: int) -> FileLock:
    if out.exists() and not out.is_dir():
        raise EdgebertError(f"output {out} is a file: pass a folder for --out")
    if not (resume or force) and out.is_dir() and _everything_but(out, out / LOCK):
        raise EdgebertError(f"output folder {out} exists: pass --resume to continue it or --force to start over")
    new, lock = not out.exists(), FileLock(out / LOCK, timeout=0)
    try:
        (out / LOCK).parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except Timeout:
        raise EdgebertError(f"output folder {out} is in use by another compile: wait for it to finish, or pass "
                            "another --out") from None
    except OSError as e:
        raise _unwritable(out, e) from None
    try:
        check_disk(out, need, "the compile", "free space or pass another --out")
        for path in _everything_but(out, out / LOCK) if force else _half_written(out):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        with tempfile.TemporaryFile(dir=out):
            pass
    except (EdgebertError, OSError) as e:
        lock.release()
        if new:  # a refused run leaves no folder behind
            shutil.rmtree(out, ignore_errors=True)
        raise _unwritable(out, e) if isinstance(e, OSError) else e from None
    return lock


def _absolute(out: str | Path) -> Path:
    """The output folder, absolute; a symlink loop is one line (pathlib raises RuntimeError, or OSError)."""
    try:
        return Path(out).resolve()
    except (RuntimeError, OSError) as e:
        raise EdgebertError(f"cannot use the output folder {out} ({e}): pass another --out") from None


def _unwritable(out: Path, error: OSError) -> EdgebertError:
    return EdgebertError(f"cannot write the output folder {out} ({error.strerror}): pass a writable --out")


def _everything_but(out: Path, keep: Path) -> list[Path]:
    """What is in `out` beside the lock (`keep`): what --force deletes, and what makes `out` not new."""
    inside = [p for p in keep.parent.iterdir() if p != keep] if keep.parent.is_dir() else []
    return [p for p in out.iterdir() if p != keep.parent] + inside


def _half_written(out: Path) -> list[Path]:
    """What atomic writes (device_tests.files) leave when their process is killed before the rename."""
    return sorted((p for pattern in (".*.tmp", ".*.old") for p in out.rglob(pattern)), reverse=True)


def compile(recipe: Recipe, out: str | Path, *, data_dir: str | None = None, resume: bool = False,
            force: bool = False, bench: bool | None = None, rebench: bool = False, on_out=None,
            budget: list | None = None, target: str = "local", pick: str = "size") -> Path:
    """Run `recipe` into `out` and return the bundle folder (`out/bundle`).

    A resumed run whose stages and bundle are all current changes nothing (not even timings);
    `rebench` rebuilds the bundle with fresh ones. `on_out(out)` is called once the output folder
    is ready (the CLI starts its log there). With a `budget` (search.parse_budget's bounds) the bundle
    is the `pick` of the [search] grid's candidates inside it, measured on `target` (pipeline.search)."""
    out = _absolute(out)
    if rebench and bench is False:
        raise EdgebertError("--rebench asks for fresh timings and --no-bench for none: pass one of them")
    if force and resume:
        raise EdgebertError("--force deletes the output folder and --resume continues it: pass one of them")
    if not any(STAGES.get(name).writes_files for name in recipe.stages):
        raise EdgebertError(f"stages: the recipe exports nothing; add \"{bundle_stage().name}\" to stages")
    ranks = Accelerator.process()  # under torchrun: every rank trains, rank 0 alone writes
    if budget is not None and ranks.world > 1:
        raise EdgebertError("--budget measures each candidate's latency in one process: run it without torchrun")
    ctx = context(recipe, out, data_dir)  # bad data or recipe fails here, before anything is written
    if budget is not None:
        check_floor(ctx, budget, target)  # a latency no student can reach, too
    start, weights = start_weights(recipe)
    need = 4 * sum(f.stat().st_size for f in weights)  # stage models, ONNX, TFLite, bundle
    with ExitStack() as held:
        def prepare():
            held.enter_context(_claimed(out, resume=resume, force=force, need=need))
            if on_out:
                on_out(out)

        ranks.first(prepare)
        return _compile(ctx, start, _start_key(ctx, start, weights), bench=bench, rebench=rebench, budget=budget,
                        target=target, pick=pick)


def _compile(ctx: Context, start: Path, key: str, *, bench: bool | None, rebench: bool, budget: list | None,
             target: str, pick: str) -> Path:
    """The stages and the bundle, into a claimed output folder."""
    recipe, out, ranks = ctx.recipe, ctx.out, Accelerator.process()
    found, start_key, start_ctx = None, key, ctx  # start_ctx: the eval split as the start model reads it
    if budget is None:
        ctx = replace(ctx)  # a vocab stage re-encodes the context its stages run in, not start_ctx
        state, stages, key = _run_stages(ctx, start, key)
    else:
        ctx, state, stages, key, found = search(ctx, budget, lambda c, first=key: _run_stages(c, start, first),
                                                start_key=key, target=target, pick=pick, fresh=rebench)
    bench = True if rebench else recipe.stage(bundle_stage().name).bench if bench is None else bench
    records = [r.to_dict() for r in stages]
    promised = ranks.first(lambda: promise(start_ctx, stages, state, start_key))  # said before the bundle is written
    build = _key(key, bench, records, state.verification, found, promised)  # what the bundle is a function of
    if not rebench and ranks.first(lambda: _current(out / "bundle", build)):
        log("bundle: up to date, nothing to do (--rebench for fresh timings)")
        return out / "bundle"
    return ranks.first(lambda: build_bundle(ctx, state, stages, out / "bundle", bench=bench, build=build,
                                            searched=found, promised=promised))


def _start_key(ctx: Context, start: Path, weights: list[Path]) -> str:
    """What every stage's cache key chains from: the recipe's top-level fields (but max_drop, which judges the
    result and trains nothing, and sized_for, which acts through the step counts it sets), the start weights, the
    data."""
    top = {k: v for k, v in asdict(ctx.recipe).items()
           if k not in ("stages", "options", "search", "max_drop", "sized_for")}
    return _key("start", top, sha256(str(weights[0])) if weights else str(start), data_fingerprint(ctx))


def run_stages(recipe: Recipe, out: str | Path, *, data_dir: str | None = None) -> list[StageRecord]:
    """The records of `recipe`'s stages, run into `out` (or found there) as a compile of it runs them, without
    a bundle: a recipe that stops before export, to compare stage options (bench/recovery.py). Stages a
    compile into the same `out` has run already are reused."""
    out = _absolute(out)
    ctx = context(recipe, out, data_dir)
    start, weights = start_weights(recipe)
    with ExitStack() as held:
        Accelerator.process().first(lambda: held.enter_context(_claimed(out, resume=True, force=False)))
        return _run_stages(ctx, start, _start_key(ctx, start, weights))[1]


def _tries(recipe: Recipe, name: str) -> list[Recipe]:
    """The recipe once per try of stage `name` (its entry's `tries`: the options of each, seeds seed, seed + 1,
    ...), each a stage of its own, cached under its own key; else the recipe alone."""
    tries = STAGES.get(name).tries
    each = tries(recipe.stage(name)) if tries else []
    if len(each) < 2:
        return [recipe]
    return [replace(recipe, options={**recipe.options, name: options}) for options in each]


def best_try(records: list[StageRecord], metric: str) -> int:
    """The try whose result is best on the validation split (the first of equals): never dev, which is reported
    (the recipe refuses tries without a validation split)."""
    scores = [r.details["validation"][metric] for r in records]
    return scores.index(max(scores))


def _run_stages(ctx: Context, start: Path, key: str) -> tuple[State, list[StageRecord], str]:
    """Each stage of `ctx.recipe` in order from `start` (chained from the start `key`), from its cache
    folder when done already: the final state, the stage records and the last stage's key. A record with a
    new tokenizer re-encodes `ctx` in place with it (context.retokenize); a stage with `tries` runs once
    per try and the rest chain from the try kept."""
    recipe, out = ctx.recipe, ctx.out
    # Every stage's key now, before hours of training: a code-keyed stage's holds the code's hash, and an
    # edit made meanwhile must not key the files this process's older code writes later.
    tries = {name: _tries(recipe, name) for name in recipe.stages}
    stage_keys = {name: [STAGES.get(name).cache_key(r) for r in tries[name]] for name in recipe.stages}
    state = State(model=start, files={}, verification={})
    stages, ranks = [], Accelerator.process()
    for i, name in enumerate(recipe.stages, 1):
        stage = STAGES.get(name)
        if stage.fine_tunes and recipe.teacher:
            log(f"{name}: skipped, the recipe starts from a fine-tuned teacher")
            continue
        if stage.sets_teacher:
            state.teacher = state.model
        keys = [_key(key, name, k) for k in stage_keys[name]]
        dests = [out / "stages" / f"{i:02d}-{name}-{k}" for k in keys]
        done = ranks.first(lambda: [(d / "record.json").is_file() for d in dests])  # found from an earlier call
        if state.estimate is None and not all(done):
            state.estimate = _estimate(ctx, state, recipe.stages[i - 1:], ranks)
        options = [r.stage(name) for r in tries[name]]
        n = len(options)
        records = [_stage(ctx, state, name, o, dest, f" (try {t + 1} of {n}, seed {o.seed})" if n > 1 else "")
                   for t, (o, dest) in enumerate(zip(options, dests))]
        state.took[name] = round(sum(r.took_s for r in records), 1)
        state.resumed_s = round(state.resumed_s + sum(r.took_s for r, d in zip(records, done) if d), 1)
        kept = best_try(records, ctx.task.metric) if n > 1 else 0
        record, dest, key = records[kept], dests[kept], keys[kept]
        if n > 1:
            metric = ctx.task.metric
            record = replace(record, tries=[{"seed": o.seed, "folder": r.folder, "metrics": r.metrics,
                                             "validation": r.details["validation"][metric], "kept": t == kept}
                                            for t, (o, r) in enumerate(zip(options, records))])
            log(f"{name}: kept try {kept + 1} (seed {options[kept].seed}), the best on validation {metric} ("
                + ", ".join(f"{points(t['validation']):.2f}" for t in record.tries) + ")")
        if stage.makes_model:
            state.model = dest / "model"
        if record.new_tokenizer:  # the rest of the run reads the new tokenizer's ids
            retokenize(ctx, state.model)
        for file, verification in record.files.items():
            state.files[file] = dest / file
            state.verification[file] = verification
        stages.append(record)
    return state, stages, key


def _estimate(ctx: Context, state: State, stages: list[str], ranks: Accelerator) -> dict:
    """The time `stages` will take here, said before the first of them trains (every rank times its share)."""
    found = estimate(ctx, state.model, state.teacher, stages)
    if ranks.main:
        log(found.line())
    return {"stages": found.stages, "warmup_s": found.warmup_s, "total_s": round(found.total_s, 1),
            "on": found.on}


def _stage(ctx: Context, state: State, name: str, options, dest: Path, label: str) -> StageRecord:
    """Stage `name`'s record, from `dest` when it is done already, else from running it into `dest`.

    Under torchrun a stage that trains runs on every rank (DistributedDataParallel) and one that does not runs
    on rank 0 alone; either way rank 0 alone writes `dest`, and the others read it once it is in place, so
    every rank starts the next stage from the same model."""
    ranks = Accelerator.process()
    if ranks.first(lambda: (dest / "record.json").is_file()):  # rank 0's answer: it may write dest any moment
        log(f"{name}{label}: done already ({dest.name})")
    else:
        log(f"{name}{label}: running")
        stage = STAGES.get(name)
        if stage.trains is not None and stage.trains(options) is not None:
            _run_stage(ctx, state, name, options, dest, ranks)
            ranks.barrier()  # until rank 0's copy is in place
        else:
            ranks.first(lambda: _run_stage(ctx, state, name, options, dest, ranks))
    return replace(StageRecord.from_dict(json.loads((dest / "record.json").read_text())), folder=dest.name)


def _run_stage(ctx: Context, state: State, name: str, options, dest: Path, ranks: Accelerator) -> None:
    t0 = time.time()
    with on_disk_full(f"disk full while writing stage {name} under {ctx.out}: free space, then re-run with "
                      "--resume", ctx.out), ranks.output(dest, scratch=ctx.out / "work") as tmp:
        record = STAGES.get(name).run(ctx, state, options, tmp, ctx.out / "work" / dest.name)
        took = round(time.time() - t0, 1)
        record = replace(record, wall_s=record.wall_s or took, took_s=took)  # a pass may time its training itself
        (tmp / "record.json").write_text(json.dumps(record.to_dict(), indent=1, default=str))
    _warn_near_baseline(record, ctx.sources.get("majority_baseline"))  # once: the summary marks it after


def _warn_near_baseline(record: StageRecord, baseline: dict | None) -> None:
    accuracy = record.metrics.get("accuracy")
    if near_baseline(accuracy, baseline):
        warnings.warn(f"{record.name}: accuracy {points(accuracy):.2f} does not beat the majority-class baseline "
                      f"{points(baseline['accuracy']):.2f} (always {baseline['label']!r}) by "
                      f"{BASELINE_MARGIN * 100:.0f} points, so the model learned little: check the labels, train "
                      "longer (train.steps) or give it more data", stacklevel=2)


def _current(bundle: Path, build: str) -> bool:
    """Whether `bundle` is whole (every file matches its manifest) and was built from `build`."""
    from .bundle import read_bundle

    try:
        return bundle.is_dir() and read_bundle(bundle).get("build") == build
    except EdgebertError:
        return False


# ---------------------------------------------------------------------------------------------
# The bundle: model files + tokenizer + labels + eval set + manifest + report


def _torch_latency(model_dir: Path, arrays: dict, runs: int = 30) -> float:
    """p50 ms of the PyTorch model at batch 1 over real eval lengths (1 thread, in process)."""
    model = checkpoint.load(model_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    times = []
    try:
        with torch.inference_mode():
            for i in range(runs + 3):
                n = int(arrays["lengths"][i % len(arrays["lengths"])])
                feed = [torch.from_numpy(arrays[k][i % len(arrays["lengths"]), None, :n].astype(np.int64))
                        for k in ("input_ids", "attention_mask", "token_type_ids")]
                t0 = time.perf_counter()
                model(*feed)
                if i >= 3:
                    times.append((time.perf_counter() - t0) * 1000)
    finally:
        torch.set_num_threads(threads)
    return float(np.median(times))


def _bench_files(ctx: Context, state: State, labels: list[str]) -> dict[str, dict]:
    """The harness, locally, on each model file: latency (each run), load time, peak RSS, on-device
    metric and error breakdown; for an ONNX file also ORT's op-level profile (a separate, untimed pass)."""
    from edgebert.device_tests.evalset import EvalSet
    from edgebert.device_tests.metrics import NAMES
    from edgebert.device_tests.profile import profile_onnx

    from ..bench import bench, recommended_threads
    from .report import error_breakdown

    inputs = eval_file(ctx)
    results = {}
    for name, path in sorted(state.files.items()):
        def timed(threads: int) -> dict:
            return bench(path, inputs=inputs, target="local", threads=threads, warmup=5, runs=50, log=log)["runs"][0]

        first = timed(THREADS[0])
        # the counts the harness could use (its device section says), the order reversed each round
        counts = [n for n in THREADS if n <= first["device"]["cores_usable"]]
        turns = {n: [] for n in counts}
        turns[THREADS[0]].append(first)
        for n in [n for r in range(ROUNDS) for n in (counts if r % 2 == 0 else counts[::-1])][1:]:
            turns[n].append(timed(n))
        rounds = {n: [t["latency_ms"]["p50"] for t in ts] for n, ts in turns.items()}
        p50 = {n: float(np.median(ms)) for n, ms in rounds.items()}
        run = sorted(turns[THREADS[0]], key=lambda t: t["latency_ms"]["p50"])[len(turns[THREADS[0]]) // 2]
        results[name] = {"latency_ms": run["latency_ms"], "latency_runs_ms": run["latency_runs_ms"],
                         "p50_ms_rounds": {str(n): ms for n, ms in rounds.items()},
                         "p50_ms_by_threads": {str(n): ms for n, ms in p50.items()},
                         "recommended_threads": recommended_threads(p50),
                         "metric": run.get("metric"), "metrics": {k: run[k] for k in NAMES if k in run},
                         "peak_rss_mb": run["peak_rss_mb"], "load_ms": run["load_ms"],
                         "first_inference_ms": run["first_inference_ms"], "threads": run["settings"]["threads"],
                         "device": run["device"], "runtime": run["runtime"],
                         "errors": error_breakdown(run.get("predictions"), ctx.eval_arrays.get("labels"), labels)}
        if path.suffix == ".onnx":
            data_set = EvalSet(str(inputs))
            results[name]["profile"] = profile_onnx(str(path), data_set, list(range(min(20, data_set.n))),
                                                    threads=1, warmup=3)
    return results


def _baselines(out: Path, dest: Path) -> dict | None:
    """bench/compare.py's teacher and Optimum figures, when a results file (OUT/compare.json, else the
    repository's bench/results/compare.json) measured this bundle; the report shows them, and never needs them."""
    from .report import baselines

    for path in (out / "compare.json", COMPARE):
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        bundle = (found.get("inputs") or {}).get("bundle") if isinstance(found, dict) else None
        if bundle and Path(bundle).resolve() == dest.resolve():
            return baselines(found)
    return None


def build_bundle(ctx: Context, state: State, stages: list[StageRecord], dest: Path, *, bench: bool,
                 build: str | None = None, searched: dict | None = None, promised: dict | None = None) -> Path:
    from .bundle import write_bundle

    task = ctx.task
    manifest_stages, chart = [], []
    made_by = {}  # file -> the stage that wrote it first (a later one may copy it)
    for record in stages:
        for name in record.files:
            made_by.setdefault(name, record.name)
        if record.params is None:  # it made no model: its files are described under "verification"
            continue
        metric = record.metrics.get(task.metric)
        model_dir = f"stages/{record.folder}/model"  # this run's, under the compile's --out (a search makes several)
        manifest_stages.append({"name": record.name, "params": {"total": record.params},
                                "bytes": record.bytes, "flops": record.flops_128,
                                "metrics": record.metrics, "wall_s": record.wall_s, "checkpoint": model_dir,
                                **({"steps": record.steps} if record.steps else {}),  # scaled to the data: sized_for
                                **({"validation": chosen} if (chosen := record.details.get("validation")) else {}),
                                **({"tries": record.tries} if record.tries is not None else {})})
        if bench and metric is not None:
            chart.append({"stage": record.name, "format": "pytorch", "metric": points(metric),
                           "latency_ms": _torch_latency(ctx.out / model_dir, ctx.eval_arrays), "bytes": record.bytes,
                           "metric_name": task.metric})
    labels = list(task.labels) if task.kind != "regression" else []
    measured = _bench_files(ctx, state, labels) if bench else {}
    for name, m in measured.items():
        if m["metrics"].get(task.metric) is not None:
            chart.append({"stage": "bundle", "format": name, "metric": points(m["metrics"][task.metric]),
                           "latency_ms": m["latency_ms"]["p50"], "bytes": state.files[name].stat().st_size,
                           "metric_name": task.metric})
    recipe = ctx.recipe
    manifest = {
        "task": {"name": task.name, "kind": task.kind, "metric": task.metric},
        "data": ctx.sources,
        "recipe": {"stages": recipe.stages, "model": recipe.model, "teacher": recipe.teacher,
                   "max_length": recipe.max_length},
        **{s.manifest: asdict(recipe.stage(s.name)) if s.name in recipe.stages else None  # "quantization"
           for s in STAGES.values() if s.manifest},
        "stages": manifest_stages,
        "verification": {name: {"stage": made_by[name], **v} for name, v in state.verification.items()},
        "bench_local": measured,
        "build": build,
        "baselines": _baselines(ctx.out, dest),
        "search": searched,  # compile --budget's candidates (pipeline.search), else None
        "promise": promised,  # each file against the teacher: within max_drop, and how much smaller (pipeline.promise)
        # the estimate said before the first stage this call ran trained; the time this call took; the time each
        # stage took when it ran, teacher labels and all, and of that what stages an earlier call ran (--resume) took
        "time": {"estimate": state.estimate, "took_s": round(time.time() - ctx.started, 1), "stages": state.took,
                 "resumed_s": state.resumed_s},
    }
    bundle = write_bundle(dest, models=state.files, tokenizer_dir=ctx.tokenizer_dir, labels=labels,
                          eval_arrays=ctx.eval_arrays, manifest=manifest, report_points=chart,
                          max_length=ctx.recipe.max_length, source_model=state.model, force=True,
                          scratch=ctx.out / "work")
    log(f"bundle written to {bundle}")
    return bundle


def summary_data(bundle: Path) -> dict:
    """The end-of-compile summary as plain data (`compile --json` prints it); metrics in points."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    metric = manifest["task"]["metric"]
    stages = [{"stage": s["name"], "params": s["params"]["total"], "bytes": s["bytes"], "flops_128": s["flops"],
               metric: points(s["metrics"].get(metric)), "wall_s": s["wall_s"],
               **({"tries": [{"seed": t["seed"], "validation": points(t["validation"]),
                              metric: points(t["metrics"].get(metric)), "kept": t["kept"]}
                             for t in s["tries"]]} if "tries" in s else {})} for s in manifest["stages"]]
    files = []
    for name, v in manifest["verification"].items():
        check = v["verify"] or {}
        files.append({"file": name, "bytes": manifest["files"][name]["bytes"],
                      "max_abs_diff": check.get("max_abs_diff"), "agreement": check.get("agreement"),
                      metric: points(check.get("value")),
                      "p50_ms": manifest["bench_local"].get(name, {}).get("latency_ms", {}).get("p50")})
    data = manifest.get("data") or {}
    baseline = data.get("majority_baseline")
    for s, m in zip(stages, manifest["stages"]):
        s["near_baseline"] = near_baseline(m["metrics"].get("accuracy"), baseline)
    return {"bundle": str(bundle), "metric": metric, "stages": stages, "files": files,
            "majority_baseline": {**baseline, "accuracy": points(baseline["accuracy"])} if baseline else None,
            "unk_rate": data.get("unk_rate"), "validation": data.get("validation"), "search": manifest.get("search"),
            "time": manifest.get("time"), "promise": manifest.get("promise")}


def summary(bundle: Path) -> str:
    """The one screen printed at the end of a compile."""
    data = summary_data(bundle)
    metric = data["metric"]

    def num(value, spec):
        return "-" if value is None else format(value, spec)

    lines = [f"{'stage':<10} {'params':>12} {'MB':>8} {'GFLOPs@128':>11} {metric:>10} {'wall s':>8}"]
    for s in data["stages"]:
        lines.append(f"{s['stage']:<10} {s['params']:>12,} {s['bytes'] / 1e6:>8.1f} {s['flops_128'] / 1e9:>11.2f} "
                     f"{num(s[metric], '.2f'):>10} {s['wall_s']:>8.0f}"
                     + (f"  <- not {BASELINE_MARGIN * 100:.0f} points above the majority-class baseline"
                        if s["near_baseline"] else ""))
    if data["majority_baseline"]:
        b = data["majority_baseline"]
        lines.append(f"majority-class baseline: accuracy {b['accuracy']:.2f} (always {b['label']!r})")
    for s in data["stages"]:
        if "tries" in s:
            lines.append(f"{s['stage']}: {len(s['tries'])} tries, the one best on validation kept: " + "; ".join(
                f"seed {t['seed']} validation {t['validation']:.2f}, {metric} {num(t[metric], '.2f')}"
                + (" (kept)" if t["kept"] else "") for t in s["tries"]))
    if data["validation"]:
        lines.append(f"checkpoints chosen on {data['validation']['rows']:,} training examples held out (validation); "
                     f"{metric} above is the eval split's")
    if data["time"] and data["time"]["estimate"]:
        said, took = data["time"]["estimate"]["total_s"], data["time"]["took_s"]
        lines.append(f"time: {clock(took)}, estimated {clock(said)} before the first stage trained "
                     f"({100 * (said - took) / took:+.0f}%)")
    if data["unk_rate"]:
        lines.append("[UNK] tokens: " + ", ".join(f"{v:.1%} of {k}" for k, v in data["unk_rate"].items()))
    lines.append("")
    lines.append(f"{'file':<20} {'MB':>8} {'max|diff|':>10} {'agree':>7} {'metric':>8} {'p50 ms':>8}")
    for f in data["files"]:
        lines.append(f"{f['file']:<20} {f['bytes'] / 1e6:>8.1f} {num(f['max_abs_diff'], '.2g'):>10} "
                     f"{num(f['agreement'], '.3f'):>7} {num(f[metric], '.2f'):>8} {num(f['p50_ms'], '.2f'):>8}")
    if data["promise"]:
        lines.extend(promise_lines(data["promise"]))
    if data["search"]:
        lines.extend(["", *search_lines(data["search"])])
    lines.append(f"\nbundle: {bundle} (report.html, manifest.json)")
    return "\n".join(lines)
