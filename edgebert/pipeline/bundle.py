"""The app bundle: the one folder an app developer takes, with what it needs to run and check the model.

    write_bundle("out/sst2", models={"model.onnx": onnx_path, "model.tflite": tflite_path},
                 tokenizer_dir=checkpoint, labels=["negative", "positive"], eval_arrays=dev,
                 manifest={"task": "sst2", "quantization": {...}, "stages": [...]})

The folder is filled beside the target and renamed into place, so a crash, a full disk or a bad input
never leaves a half bundle. Every file but manifest.json is a pure function of the inputs (no
timestamps, fixed zip dates), so a resumed compile hashes equal to an uninterrupted one;
manifest.json lists each file's sha256 and bytes, and `verify_bundle` checks them. golden.json holds
what each model file answered on a few eval examples in its own runtime, so that a device can check
the file still does (`python -m device_tests verify`).
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import numpy as np

from edgebert.config import repeated
from edgebert.device_tests import HarnessError, verify
from edgebert.device_tests.evalset import INPUTS, TASK, task_of
from edgebert.device_tests.files import atomic_dir, sha256
from edgebert.device_tests.verify import GOLDEN
from edgebert.device_tests.versions import versions
from edgebert.errors import EdgebertError, on_disk_full
from edgebert.export import formats, load_arrays

from .resources import check_disk
from edgebert.export.mediapipe import CLASSIFIER, EMBEDDER

FORMAT_VERSION = 1
MANIFEST, LABELS, EVAL, REPORT = "manifest.json", "labels.txt", "eval.npz", "report.html"
MEDIAPIPE = (CLASSIFIER, EMBEDDER)  # MediaPipe's TextClassifier and TextEmbedder files, cut from model.tflite
HF_CONFIG = "config.json"  # the model's Hugging Face config: Optimum and transformers.pipeline load the bundle
# Keys write_bundle computes; a caller's manifest may carry anything else (task, quantization, stages...).
COMPUTED = ("format", "format_version", "labels", "inputs", "eval", "mediapipe", "text_model", "golden", "hf", "pareto",
            "files", "versions", "created")
VERSIONED = ("edgebert", "torch", "transformers", "tokenizers", "numpy", "onnx", "onnxruntime", "onnxscript",
             "onnxruntime-extensions", "ai-edge-litert", "litert-torch", "ai-edge-quantizer", "mediapipe", "jinja2",
             "matplotlib")
STAGE_KEYS = ("name", "params", "bytes", "flops", "metrics", "wall_s")
POINT_KEYS = ("stage", "format", "latency_ms", "metric", "bytes")
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def write_bundle(out: str | Path, *, models: dict[str, str | Path], tokenizer_dir: str | Path, labels: list[str],
                 eval_arrays: dict[str, np.ndarray] | str | Path, manifest: dict,
                 report_points: list[dict] | None = None, max_length: int | None = None,
                 mediapipe: bool | None = None, source_model: str | Path | None = None,
                 force: bool = False, scratch: str | Path | None = None) -> Path:
    """Write the bundle folder `out` atomically; refuse an existing `out` unless `force`.

    models: {bundle file name: source}, names ending .onnx/.tflite. max_length: the input contract's
    limit (default: the longest TFLite signature, else the tokenizer's positions). mediapipe: also
    write classifier.tflite (a text classifier) or embedder.tflite (a sentence embedder): model.tflite's
    longest signature + MediaPipe metadata — None = when the model, task and tokenizer allow it (else
    the manifest's `mediapipe.skipped` says why not), True = required, False = never.
    report_points: Pareto-chart points {stage, format, latency_ms, metric (in points), bytes[, metric_name]}.
    source_model: the PyTorch checkpoint the files were exported from; its Hugging Face config.json goes
    into the bundle, so Optimum's ORTModel and transformers' pipeline run model.onnx (the manifest's `hf`
    says why not when transformers cannot express the model's shape). scratch: where the half-written
    folder lives until it is renamed into place (default: beside `out`; a compile's OUT/work)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise EdgebertError(f"{out} is a file, not a bundle folder: pick another --out")
    if out.exists() and not force:
        raise EdgebertError(f"{out} already exists: pass force=True (--force) to replace the bundle, "
                            "or pick another folder")
    sources = _check_models(models)
    labels = _check_labels(labels)
    arrays = load_arrays(eval_arrays, what="eval set")
    extra = _check_manifest(manifest)
    points = _check_points(report_points or [])
    tokenizer_dir = Path(tokenizer_dir)
    if mediapipe and "model.tflite" not in sources:
        raise EdgebertError("mediapipe=True needs a models entry 'model.tflite' to derive the MediaPipe file from")
    need = (sum(p.stat().st_size for p in sources.values()) + sum(a.nbytes for a in arrays.values())
            + (sources["model.tflite"].stat().st_size if "model.tflite" in sources and mediapipe is not False else 0)
            + sum(p.stat().st_size for p in tokenizer_dir.glob("*") if p.is_file()))  # + classifier.tflite
    check_disk(out.parent, need, f"bundle {out}", "free disk space or write it elsewhere")
    full = f"no space left writing bundle {out}: free disk space or write it elsewhere (nothing was left behind)"
    try:  # an old bundle is swapped out only once the new one is whole
        with on_disk_full(full, out.parent), atomic_dir(out, replace=True, scratch=scratch) as tmp:
            _fill(tmp, sources, tokenizer_dir, labels, arrays, extra, points, max_length, mediapipe, source_model)
    except OSError as e:
        raise EdgebertError(f"cannot write bundle {out}: {e.strerror or e} ({e.filename or out}); check the folder "
                            "and permissions") from None
    return out


def _fill(tmp: Path, sources: dict[str, Path], tokenizer_dir: Path, labels: list[str], arrays: dict, extra: dict,
          points: list[dict], max_length: int | None, mediapipe: bool | None, source_model) -> None:
    from edgebert.device_tests import padding
    from edgebert.tokenizer import describe, load_tokenizer, save

    from .report import render

    for name, src in sources.items():
        shutil.copyfile(src, tmp / name)
    tokenizer = load_tokenizer(tokenizer_dir)
    if labels:
        (tmp / LABELS).write_text("".join(f"{label}\n" for label in labels), encoding="utf-8")
    files = {name: _model_io(tmp / name) for name in sources}
    fixed = [f for f in files.values() if "lengths" in f]  # formats with one signature per length (TFLite)
    longest = max((max(f["lengths"]) for f in fixed), default=None)
    max_length = max_length or longest or _positions(tokenizer, tokenizer_dir)
    if longest is not None and max_length > longest:
        raise EdgebertError(f"max_length {max_length} exceeds the longest TFLite signature seq_{longest}: "
                            "export that length or lower max_length")
    if int(arrays["lengths"].max()) > max_length:
        raise EdgebertError(f"eval set has examples of {int(arrays['lengths'].max())} tokens, over max_length "
                            f"{max_length}: tokenize it with max_length={max_length}")
    written = {p.name for p in save(tokenizer, tmp, max_length=max_length)}
    clash = sorted(written & (set(sources) | {MANIFEST, LABELS, EVAL, REPORT, GOLDEN, *MEDIAPIPE, HF_CONFIG}))
    if clash:
        raise EdgebertError(f"tokenizer file names {clash} clash with bundle files: rename the models")
    for name in sources:  # which files give the same outputs however far an input is padded
        files[name].update(padding.check(formats.of_file(tmp / name).open(tmp / name), arrays, max_length))
    columns = _eval_columns(arrays)
    _write_npz(tmp / EVAL, columns)
    record = {"format": "edgebert-bundle", "format_version": FORMAT_VERSION, **extra, "labels": labels,
              "inputs": {"names": sorted({n for f in files.values() for n in _input_names(f)}, key=_input_order),
                         "padding": "right-pad to the chosen length: input_ids with tokenizer.pad_id, "
                                    "attention_mask and token_type_ids with 0",
                         "max_length": max_length, "tokenizer": describe(tokenizer, max_length),
                         "tokenizer_files": sorted(written), "files": files},
              "eval": {"file": EVAL, "examples": len(arrays["lengths"]), "length": int(arrays["input_ids"].shape[1]),
                       "columns": list(columns)}}
    record["text_model"] = _text_model(files, extra.get("task"))
    if mediapipe is not False:
        record["mediapipe"] = _mediapipe(tmp, labels, extra.get("task"), required=bool(mediapipe))
        if "file" in record["mediapipe"]:
            files[record["mediapipe"]["file"]] = _model_io(tmp / record["mediapipe"]["file"])
    record["golden"] = _golden(tmp, list(files), columns)
    if source_model is not None:
        record["hf"] = _hf_config(tmp, source_model)
    record["pareto"] = points
    record["versions"] = versions(*VERSIONED)  # before the report, which shows them
    (tmp / REPORT).write_text(render(record, points), encoding="utf-8")
    record["files"] = {p.name: {"sha256": sha256(p), "bytes": p.stat().st_size} for p in sorted(tmp.iterdir())}
    record["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    (tmp / MANIFEST).write_text(json.dumps(record, indent=2, default=_plain) + "\n", encoding="utf-8")
    _permissions(tmp)


def _mediapipe(tmp: Path, labels: list[str], task, required: bool) -> dict:
    """The MediaPipe file (export.mediapipe.for_bundle) for the manifest's task; when not required, a
    refusal becomes the reason."""
    from edgebert.export.mediapipe import for_bundle

    kind = task.get("kind") if isinstance(task, dict) else None
    return for_bundle(tmp, labels=labels, kind=kind, required=required)


def _text_model(files: dict[str, dict], task) -> dict:
    """The raw-text model (a file built from another format's file and the tokenizer: strings in, answers out), or why
    the bundle has none: the task's kind is one it cannot serve, or the recipe did not ask for it."""
    found = {name: io for name, io in files.items() if formats.of_path(name).source is not None}
    if found:
        name, io = next(iter(found.items()))
        return {"file": name, "wraps": formats.get(formats.of_path(name).source).name, "inputs": list(io["inputs"]),
                "outputs": list(io["outputs"]), "needs": io["custom_ops"]["package"]}
    kind = task.get("kind") if isinstance(task, dict) else None
    derived = [f for f in formats.all_formats() if f.source is not None]
    reasons = [f.skips[kind] for f in derived if kind in f.skips]
    asked = "; ".join(f"list \"{f.name}\" in [export] formats (pip install 'edgebert[{f.extra}]')" for f in derived)
    return {"skipped": reasons[0] if reasons else f"not asked for: {asked}"}


def _golden(tmp: Path, names: list[str], columns: dict) -> dict:
    """Write golden.json (device_tests.verify.golden: each model file's outputs on a few eval examples, in the
    runtime its format runs in, and its tolerance) and return its manifest record, the outputs left out."""
    models = {name: partial(formats.of_file(tmp / name).open, tmp / name) for name in names}
    try:
        golden = verify.golden(models, columns, task_of(columns))
    except HarnessError as e:
        raise EdgebertError(str(e)) from None
    (tmp / GOLDEN).write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")
    return {"file": GOLDEN, "examples": [e["row"] for e in golden["examples"]],
            "lengths": [e["length"] for e in golden["examples"]], "tolerance": golden["tolerance"],
            "files": {name: {k: v for k, v in entry.items() if k != "outputs"}
                      for name, entry in golden["files"].items()}}


def _hf_config(tmp: Path, source_model: str | Path) -> dict:
    """Write config.json (the model's Hugging Face config); a shape transformers cannot say becomes the reason."""
    from edgebert.checkpoint import hf_config_of, load

    try:
        config = hf_config_of(load(source_model))
    except EdgebertError as e:
        return {"skipped": str(e)}
    (tmp / HF_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return {"config": HF_CONFIG, "model_type": config["model_type"], "architectures": config["architectures"]}


def read_bundle(path: str | Path, *, verify: bool = True) -> dict:
    """The bundle's manifest, after checking every listed file's bytes and sha256 (unless verify=False)."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise EdgebertError(f"{path} has no {MANIFEST}: pass a bundle folder written by edgebert")
    try:
        record = json.loads(manifest_path.read_text(encoding="utf-8"))
        entries = {name: (int(e["bytes"]), str(e["sha256"])) for name, e in record["files"].items()}
        version = int(record.get("format_version", 0))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise EdgebertError(f"{manifest_path} is not a bundle manifest ({type(e).__name__}: {e}): "
                            "write the bundle again") from None
    if version > FORMAT_VERSION:
        raise EdgebertError(f"{path} is bundle format {version}; this edgebert reads up to {FORMAT_VERSION}: "
                            "upgrade edgebert")
    if verify:
        for name, (size, digest) in entries.items():
            _check_file(path, name, size, digest)
    return record


def verify_bundle(path: str | Path) -> dict:
    """Check every file against the manifest; raise naming the first that is missing, resized or changed."""
    return read_bundle(path, verify=True)


def _check_file(folder: Path, name: str, size: int, digest: str) -> None:
    file = folder / name
    if Path(name).name != name or not file.is_file():
        raise EdgebertError(f"bundle {folder} lacks {name}, which its manifest lists: copy the whole bundle again")
    if file.stat().st_size != size:
        raise EdgebertError(f"{file} is {file.stat().st_size} bytes, the manifest says {size}: the copy is "
                            "truncated or the file was changed; copy the bundle again")
    if sha256(file) != digest:
        raise EdgebertError(f"{file} sha256 differs from the manifest ({digest[:12]}…): the file was changed "
                            "after export; copy the bundle again")


# Input checks: all before anything is written.


def _check_models(models: dict) -> dict[str, Path]:
    if not isinstance(models, dict) or not models:
        raise EdgebertError("models must be a non-empty dict {bundle file name: path}, e.g. {'model.tflite': path}")
    sources = {}
    reserved = (MANIFEST, LABELS, EVAL, REPORT, GOLDEN, *MEDIAPIPE)
    suffixes = tuple(f.suffix for f in formats.all_formats())
    for name, src in models.items():
        if not isinstance(name, str) or Path(name).name != name or not name.endswith(suffixes) or name in reserved:
            raise EdgebertError(f"model name {name!r}: use a plain file name ending {' or '.join(suffixes)}, "
                                f"other than {', '.join(reserved)}")
        if not Path(src).is_file():
            raise EdgebertError(f"model file {src} (for {name}) does not exist: export it first")
        sources[name] = Path(src)
    return sources


def _check_labels(labels) -> list[str]:
    if not isinstance(labels, (list, tuple)) or not all(isinstance(x, str) and x.strip() and "\n" not in x
                                                        for x in labels):
        raise EdgebertError(f"labels must be a list of non-empty one-line strings in logit order, got {labels!r}")
    if repeated(labels) is not None:
        raise EdgebertError(f"labels {list(labels)} name {repeated(labels)!r} twice: give each class its own")
    return list(labels)


def _check_manifest(manifest) -> dict:
    if not isinstance(manifest, dict):
        raise EdgebertError(f"manifest must be a dict (task, quantization, stages...), got {type(manifest).__name__}")
    taken = [k for k in manifest if k in COMPUTED]
    if taken:
        raise EdgebertError(f"manifest keys {taken} are computed by write_bundle: drop them")
    extra = dict(manifest)
    if "stages" in extra:
        extra["stages"] = [_stage(s, i) for i, s in enumerate(extra["stages"] or [])]
    try:
        json.dumps(extra, default=_plain)
    except (TypeError, ValueError) as e:
        raise EdgebertError(f"manifest is not JSON-serializable ({e}): pass plain dicts, lists, numbers and "
                            "strings") from None
    return extra


def _stage(stage, i: int) -> dict:
    """A per-stage record with every field present: {name, params, bytes, flops, metrics, wall_s}."""
    if not isinstance(stage, dict) or not isinstance(stage.get("name"), str) or not stage["name"]:
        raise EdgebertError(f"stage {i} must be a dict with a name ({', '.join(STAGE_KEYS)}), got {stage!r}")
    for key in ("params", "metrics"):
        if stage.get(key) is not None and not isinstance(stage[key], dict):
            raise EdgebertError(f"stage {stage['name']!r} {key} must be a dict, got {type(stage[key]).__name__}")
    for key in ("bytes", "flops", "wall_s"):
        if stage.get(key) is not None and not isinstance(stage[key], (int, float, np.number)):
            raise EdgebertError(f"stage {stage['name']!r} {key} must be a number, got {stage[key]!r}")
    return {**{k: stage.get(k) for k in STAGE_KEYS}, **stage,
            "params": stage.get("params") or {}, "metrics": stage.get("metrics") or {}}


def _check_points(points) -> list[dict]:
    checked = []
    for i, p in enumerate(points):
        bad = not isinstance(p, dict) or any(k not in p for k in POINT_KEYS)
        if not bad:
            bad = not all(isinstance(p[k], (int, float, np.number)) for k in ("latency_ms", "metric", "bytes")) \
                or p["latency_ms"] <= 0 or p["bytes"] <= 0
        if bad:
            raise EdgebertError(f"report point {i} {p!r}: give {{{', '.join(POINT_KEYS)}}} "
                                "with latency_ms > 0 and bytes > 0")
        checked.append({"stage": str(p["stage"]), "format": str(p["format"]), "latency_ms": float(p["latency_ms"]),
                        "metric": float(p["metric"]), "bytes": int(p["bytes"]),
                        "metric_name": str(p.get("metric_name", "accuracy"))})
    return checked


# The input contract, read from the files themselves by their format.


def _model_io(path: Path) -> dict:
    return formats.of_file(path).io(path)


def _input_names(io: dict) -> list[str]:
    """Token-id input names of one file: of its graph, or of each of its signatures (a raw-text model's are strings)."""
    graphs = io["signatures"].values() if "signatures" in io else [io]
    return [n for g in graphs for n in g["inputs"] if n in INPUTS]


def _input_order(name: str) -> tuple:
    known = ("input_ids", "attention_mask", "token_type_ids")
    return (known.index(name) if name in known else len(known), name)


def _positions(tokenizer, folder: Path) -> int:
    from edgebert.tokenizer import max_positions

    limit = max_positions(tokenizer)
    if limit is None:
        raise EdgebertError(f"neither the models nor the tokenizer in {folder} give a maximum length: pass max_length")
    return limit


# Files.


def _write_npz(path: Path, columns: dict[str, np.ndarray]) -> None:
    """An .npz with fixed zip dates, so the same arrays give the same bytes (np.savez stamps the time)."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, array in columns.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w") as f:
                np.lib.format.write_array(f, np.ascontiguousarray(array), allow_pickle=False)


def _eval_columns(arrays: dict) -> dict[str, np.ndarray]:
    """The columns and dtypes the device harness reads (int labels int64, regression scores float32),
    and the `task` entry that tells it how to score them."""
    columns = {k: arrays[k].astype(np.int32) for k in ("input_ids", "attention_mask", "token_type_ids", "lengths")}
    if "labels" in arrays:
        labels = arrays["labels"]
        columns["labels"] = labels.astype(np.float32 if labels.dtype.kind == "f" else np.int64)
    if TASK in arrays:
        columns[TASK] = np.asarray(arrays[TASK]).astype(str)
    return columns


def _permissions(folder: Path) -> None:
    """Ordinary permissions (temporary files and folders are created owner-only)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for p in folder.iterdir():
        os.chmod(p, 0o666 & ~umask)


def _plain(value):
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")
