"""`edgebert compile`: run a recipe's stages in order and write the app bundle.

Each stage's output lands in `OUT/stages/NN-name-KEY/`, where KEY hashes everything the stage
depends on (the previous stage's key, its options, the data, the start model). A stage folder is
renamed into place only when complete, so a killed run resumes at the stage it was in (the passes
also resume mid-stage from `OUT/work/`), and a re-run of an unchanged recipe does no work.
"""

from __future__ import annotations

import errno
import hashlib
import json
import random
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from edgebert.device_tests.files import sha256

from . import checkpoint, data, tokenizer as tokenization
from .errors import EdgebertError
from .model import HeadConfig, TaskModel, with_head
from .recipe import Recipe

MODEL_STAGES = ("finetune", "distill", "prune", "share")


@dataclass
class Context:
    """What the stages read: the recipe, the tokenized data, and where to work."""

    recipe: Recipe
    out: Path
    tokenizer_dir: Path
    tokenizer: object
    train: data.EncodedDataset
    eval: data.EncodedDataset
    eval_arrays: dict
    calibration: dict


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _log(message: str) -> None:
    print(f"edgebert: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Inputs


def start_model(recipe: Recipe) -> Path:
    """The checkpoint folder the recipe starts from: its teacher, else its model."""
    source = recipe.teacher or recipe.model
    if source == "minilm":
        return checkpoint.default_checkpoint()
    path = Path(source)
    if not (path / "config.json").is_file():
        what = "teacher" if recipe.teacher else "model"
        raise EdgebertError(f"{what} {source} is not a checkpoint folder (no config.json): pass a folder that "
                            "transformers or edgebert saved, or model = \"minilm\"")
    return path


def _head_for(task: data.Task) -> HeadConfig:
    if task.kind == "token-classification":
        return HeadConfig(kind="token-classification", num_labels=len(task.labels), labels=list(task.labels),
                          pooler=None)
    if task.kind == "regression":
        return HeadConfig(num_labels=1, labels=["score"])
    return HeadConfig(num_labels=len(task.labels), labels=list(task.labels))


def _task_model(path: Path, task: data.Task) -> TaskModel:
    """The start checkpoint as a model for `task`: its own head if it fits, else a fresh one."""
    model = checkpoint.load(path)
    head = _head_for(task)
    if isinstance(model, TaskModel) and model.head.kind == head.kind and model.head.num_labels == head.num_labels:
        return model
    return with_head(model, head)


def _limited(split: data.Split, limit: int, seed: int) -> data.Split:
    """The first `limit` examples after a seeded shuffle (the whole split when limit is 0)."""
    if not limit or limit >= len(split):
        return split
    order = list(range(len(split)))
    random.Random(seed).shuffle(order)
    return replace(split, examples=[split.examples[i] for i in sorted(order[:limit])])


def _context(recipe: Recipe, out: Path, data_dir: str | None) -> Context:
    task = data.get_task(recipe.task)
    tokenizer_dir = start_model(recipe)
    tok = tokenization.load_tokenizer(tokenizer_dir)
    tokenization.check_max_length(tok, recipe.max_length)
    train_split = _limited(data.load_task(task, "train", data_dir=data_dir), recipe.train_limit, recipe.seed)
    eval_split = _limited(data.load_task(task, task.eval_split, data_dir=data_dir), recipe.eval_limit, recipe.seed)
    calibration_split = _limited(train_split, recipe.stage("quantize").calibration_size, recipe.seed + 1)
    return Context(
        recipe=recipe, out=out, tokenizer_dir=tokenizer_dir, tokenizer=tok,
        train=data.EncodedDataset(train_split, tok, recipe.max_length),
        eval=data.EncodedDataset(eval_split, tok, recipe.max_length),
        eval_arrays=data.pretokenize_eval(eval_split, tok, recipe.max_length),
        calibration=data.pretokenize_eval(calibration_split, tok, recipe.max_length),
    )


def _data_fingerprint(ctx: Context) -> str:
    arrays = (ctx.eval_arrays, ctx.calibration)
    h = hashlib.sha256()
    for ids in ctx.train.input_ids:
        h.update(np.asarray(ids, dtype=np.int32).tobytes())
    for a in arrays:
        for name in sorted(a):
            h.update(a[name].tobytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Stages: each reads the previous state and writes its outputs into `dest`.


@dataclass
class State:
    """Where the run stands between stages."""

    model: Path  # the current PyTorch checkpoint
    files: dict[str, Path]  # exported model files so far ("model.onnx", "model.tflite")
    verification: dict[str, dict]


def _torch_stage(name: str, ctx: Context, state: State, dest: Path, work: Path) -> dict:
    from . import passes

    options = ctx.recipe.stage(name)
    model = _task_model(state.model, data.get_task(ctx.recipe.task))
    torch.manual_seed(ctx.recipe.seed)
    if name == "finetune":
        model, record = passes.finetune(model, ctx.train, ctx.eval, config=options.options, work_dir=work)
    elif name == "distill":
        student = passes.init_student(model, num_layers=options.layers)
        model, record = passes.distill(student, model, ctx.train, ctx.eval, config=options.options,
                                       tokenizer=ctx.tokenizer, work_dir=work)
    elif name == "prune":
        model, record = passes.prune(model, ctx.train, ctx.eval, config=options.options, work_dir=work)
    else:
        model, record = passes.share(model, ctx.train, ctx.eval, config=options.options, work_dir=work)
    checkpoint.save(model, dest / "model", tokenizer_from=ctx.tokenizer_dir)
    return record.to_dict()


def _int8_config(fmt: str, method: str, ctx: Context):
    """The quantize package's config for a recipe's `quantize.onnx` / `quantize.tflite` method."""
    from edgebert.export import Budget
    from edgebert.quantize import QAT, DynamicInt8, MixedPrecision, StaticInt8

    q = ctx.recipe.stage("quantize")
    methods = {
        "dynamic": lambda: DynamicInt8(target=q.target),
        "static": lambda: StaticInt8(target=q.target, method=q.calibration_method),
        "mixed": lambda: MixedPrecision(budget=Budget(max_metric_drop=q.accuracy_budget), target=q.target,
                                        method=q.calibration_method),
        "qat": lambda: QAT(target=q.target, seq_lens=tuple(ctx.recipe.stage("export").seq_lens)),
    }
    if fmt == "tflite":
        methods["full"] = methods["static"]
    return methods[method]()


def _write_model(stage: str, fmt: str, model, ctx: Context, target: Path, work: Path):
    """One model file, verified against PyTorch on the eval split; None if this stage leaves `fmt` alone."""
    from edgebert.export import Budget, OnnxExport, TFLiteExport, export
    from edgebert.quantize import quantize

    q = ctx.recipe.stage("quantize")
    method = q.onnx if fmt == "onnx" else q.tflite
    int8_budget, float_budget = Budget(max_metric_drop=q.accuracy_budget), Budget(max_abs_diff=1e-3)
    evals = {"eval_data": ctx.eval_arrays}
    if stage == "quantize" and method == "none":
        return None
    if fmt == "onnx":
        if stage == "export":
            return export(model, OnnxExport(), out=target, budget=float_budget, **evals)
        return quantize(model, _int8_config(fmt, method, ctx), out=target, calibration=ctx.calibration,
                        budget=int8_budget, **evals)
    seq_lens = tuple(ctx.recipe.stage("export").seq_lens)
    if stage == "export" or method == "fp16":
        fp16 = stage == "quantize"
        return export(model, TFLiteExport(seq_lens=seq_lens, precision="fp16" if fp16 else "fp32"), out=target,
                      budget=int8_budget if fp16 else float_budget, **evals)
    config = _int8_config(fmt, method, ctx)
    if method == "qat":
        return quantize(model, config, out=target, calibration=ctx.calibration, budget=int8_budget, **evals)
    work.mkdir(parents=True, exist_ok=True)
    float_file = export(model, TFLiteExport(seq_lens=seq_lens), out=work / "float.tflite", budget=float_budget,
                        **evals).path
    return quantize(float_file, config, out=target, calibration=ctx.calibration, budget=int8_budget, **evals)


def _export_stage(name: str, ctx: Context, state: State, dest: Path, work: Path) -> dict:
    """quantize: the INT8 files; export: the float files for formats quantize did not write."""
    model = checkpoint.load(state.model)
    record = {"files": {}}
    for fmt in ctx.recipe.stage("export").formats:
        if fmt not in ("onnx", "tflite"):
            raise EdgebertError(f"export.formats: unknown format {fmt!r}; use onnx and/or tflite")
        target = dest / f"model.{fmt}"
        if name == "export" and target.name in state.files:
            shutil.copy2(state.files[target.name], target)
            record["files"][target.name] = state.verification[target.name]
            continue
        result = _write_model(name, fmt, model, ctx, target, work)
        if result is not None:
            record["files"][target.name] = {"meta": result.meta, "verify": result.verify}
    return record


RUNNERS = {"finetune": _torch_stage, "distill": _torch_stage, "prune": _torch_stage, "share": _torch_stage,
           "quantize": _export_stage, "export": _export_stage}


@contextmanager
def _staging(dest: Path):
    """A temporary sibling of `dest`, renamed into place only if the block finishes."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        yield tmp
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---------------------------------------------------------------------------------------------
# The verb


def _prepare_out(out: Path, *, resume: bool, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise EdgebertError(f"output {out} is a file: pass a folder for --out")
    if out.exists() and any(out.iterdir()):
        if force:
            shutil.rmtree(out)
        elif not resume:
            raise EdgebertError(f"output folder {out} exists: pass --resume to continue it or --force to start over")
    out.mkdir(parents=True, exist_ok=True)


def compile(recipe: Recipe, out: str | Path, *, data_dir: str | None = None, resume: bool = False,
            force: bool = False, bench: bool | None = None) -> Path:
    """Run `recipe` into `out` and return the bundle folder (`out/bundle`)."""
    out = Path(out).resolve()
    ctx = _context(recipe, out, data_dir)  # bad data fails here, before anything is written
    _prepare_out(out, resume=resume, force=force)
    start = start_model(recipe)
    weights = sorted(start.glob("*.safetensors"))
    key = _key("start", {k: v for k, v in asdict(recipe).items() if k not in ("stages", "options")},
               sha256(str(weights[0])) if weights else str(start), _data_fingerprint(ctx))
    state = State(model=start, files={}, verification={})
    stages = []
    for i, name in enumerate(recipe.stages, 1):
        if name == "finetune" and recipe.teacher:
            _log("finetune: skipped, the recipe starts from a fine-tuned teacher")
            continue
        key = _key(key, name, asdict(recipe.stage(name)))
        dest = out / "stages" / f"{i:02d}-{name}-{key}"
        if (dest / "record.json").is_file():
            _log(f"{name}: done already ({dest.name})")
        else:
            _log(f"{name}: running")
            t0 = time.time()
            try:
                with _staging(dest) as tmp:
                    record = RUNNERS[name](name, ctx, state, tmp, out / "work" / dest.name)
                    record = {"name": name, "wall_s": round(time.time() - t0, 1), **record}
                    (tmp / "record.json").write_text(json.dumps(record, indent=1, default=str))
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                raise EdgebertError(f"disk full while writing stage {name} under {out}: free space, then "
                                    "re-run with --resume") from None
        record = json.loads((dest / "record.json").read_text())
        if (dest / "model").is_dir():
            state.model = dest / "model"
        for name in record.get("files", {}):
            state.files[name] = dest / name
            state.verification[name] = record["files"][name]
        stages.append(record)
    if not state.files:
        raise EdgebertError("stages: the recipe exports nothing; add \"export\" to stages")
    return build_bundle(ctx, state, stages, out / "bundle",
                        bench=recipe.stage("export").bench if bench is None else bench)


# ---------------------------------------------------------------------------------------------
# The bundle: model files + tokenizer + labels + eval set + manifest + report


def _points(fraction) -> float | None:
    """A metric in points (accuracy 0.9014 → 90.14): passes and the harness report fractions, the
    report's chart and the verification records use points."""
    return None if fraction is None else float(fraction) * 100


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


def _bench_files(ctx: Context, state: State) -> dict[str, dict]:
    """The harness, locally, on each model file: latency p50 and on-device accuracy."""
    from .bench import bench

    eval_file = ctx.out / "work" / "eval.npz"
    eval_file.parent.mkdir(parents=True, exist_ok=True)
    np.savez(eval_file, **ctx.eval_arrays)
    results = {}
    for name, path in sorted(state.files.items()):
        run = bench(path, inputs=eval_file, target="local", threads=1, warmup=5, runs=50, log=_log)["runs"][0]
        results[name] = {"latency_ms": run["latency_ms"], "accuracy": run.get("accuracy"),
                         "peak_rss_mb": run["peak_rss_mb"], "load_ms": run["load_ms"]}
    return results


def build_bundle(ctx: Context, state: State, stages: list[dict], dest: Path, *, bench: bool) -> Path:
    from edgebert.export.bundle import write_bundle

    task = data.get_task(ctx.recipe.task)
    manifest_stages, points = [], []
    for record in stages:
        if "params" not in record:  # an export stage: its files are described under "verification"
            continue
        metric = record["metrics"].get(task.metric)
        manifest_stages.append({"name": record["name"], "params": {"total": record["params"]},
                                "bytes": record["bytes"], "flops": record["flops_128"],
                                "metrics": record["metrics"], "wall_s": record["wall_s"]})
        if bench and metric is not None:
            model_dir = next(ctx.out.glob(f"stages/*-{record['name']}-*/model"))
            points.append({"stage": record["name"], "format": "pytorch", "metric": _points(metric),
                           "latency_ms": _torch_latency(model_dir, ctx.eval_arrays), "bytes": record["bytes"],
                           "metric_name": task.metric})
    measured = _bench_files(ctx, state) if bench else {}
    for name, m in measured.items():
        if m["accuracy"] is not None:
            points.append({"stage": "bundle", "format": name, "metric": _points(m["accuracy"]),
                           "latency_ms": m["latency_ms"]["p50"], "bytes": state.files[name].stat().st_size,
                           "metric_name": "accuracy"})
    q = ctx.recipe.stage("quantize")
    manifest = {
        "task": {"name": task.name, "kind": task.kind, "metric": task.metric},
        "recipe": {"stages": ctx.recipe.stages, "model": ctx.recipe.model, "teacher": ctx.recipe.teacher,
                   "max_length": ctx.recipe.max_length},
        "quantization": asdict(q) if "quantize" in ctx.recipe.stages else None,
        "stages": manifest_stages,
        "verification": state.verification,
        "bench_local": measured,
    }
    labels = list(task.labels) if task.kind != "regression" else []
    bundle = write_bundle(dest, models=state.files, tokenizer_dir=ctx.tokenizer_dir, labels=labels,
                          eval_arrays=ctx.eval_arrays, manifest=manifest, report_points=points,
                          max_length=ctx.recipe.max_length, force=True)
    _log(f"bundle written to {bundle}")
    return bundle


def summary(bundle: Path) -> str:
    """The one screen printed at the end of a compile."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    metric = manifest["task"]["metric"]
    lines = [f"{'stage':<10} {'params':>12} {'MB':>8} {'GFLOPs@128':>11} {metric:>10} {'wall s':>8}"]
    for s in manifest["stages"]:
        value = s["metrics"].get(metric)
        lines.append(f"{s['name']:<10} {s['params']['total']:>12,} {s['bytes'] / 1e6:>8.1f} {s['flops'] / 1e9:>11.2f} "
                     f"{'-' if value is None else f'{_points(value):.2f}':>10} {s['wall_s']:>8.0f}")
    lines.append("")
    lines.append(f"{'file':<20} {'MB':>8} {'max|diff|':>10} {'agree':>7} {'metric':>8} {'p50 ms':>8}")
    for name, v in manifest["verification"].items():
        check = v["verify"] or {}
        bench = manifest["bench_local"].get(name, {})
        p50 = bench.get("latency_ms", {}).get("p50")
        lines.append(f"{name:<20} {manifest['files'][name]['bytes'] / 1e6:>8.1f} {check.get('max_abs_diff', 0):>10.2g} "
                     f"{check.get('agreement', 0):>7.3f} {check.get('value', 0):>8.2f} "
                     f"{'-' if p50 is None else f'{p50:.2f}':>8}")
    lines.append(f"\nbundle: {bundle} (report.html, manifest.json)")
    return "\n".join(lines)
