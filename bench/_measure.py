"""bench/compare.py's runs: the machine, the eval sets, the models (built in children, cached), and
every accuracy, GEMM, timing and profile run, each in a process of its own."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _figures import CONDITIONS, DISTS, PAD, _f, _load_entry, summarize
from _timing import model2vec_bytes, timed_rows

from edgebert.device_tests import runtimes
from edgebert.device_tests.evalset import pick_rows
from edgebert.device_tests.files import sha256, write_bytes
from edgebert.device_tests.versions import versions
from edgebert.export.onnx import trims_padding

ROOT = Path(__file__).resolve().parents[1]
FULL = {"repeats": 3, "runs": 100, "warmup": 10, "timing_rows": 50, "eval_rows": 0, "gemm_seconds": 1.0,
        "gemm_repeats": 2, "profile_runs": 100, "retry_noisy": 2}
QUICK = {"repeats": 1, "runs": 20, "warmup": 3, "timing_rows": 20, "eval_rows": 200, "gemm_seconds": 0.5,
         "gemm_repeats": 1, "profile_runs": 20, "retry_noisy": 0}
GEMM_SHAPES = ("1024x1024x1024", f"{PAD}x384x1536", "32x384x1536")
PTE = "student-executorch-int8"  # the ExecuTorch row's id, and the folder its .pte is built into under --work


def log(message: str) -> None:
    """A progress line, named by the bench script that runs (compare, promise)."""
    print(f"{Path(sys.argv[0]).stem}: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The machine


def machine() -> dict:
    from edgebert.device_tests.device import describe

    info = describe()
    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags.update(line.split(":", 1)[1].split())
    except OSError:
        pass
    simd = sorted(f for f in flags if f.startswith(("avx", "sse", "fma", "f16c", "amx")) or "vnni" in f)
    info["simd_flags"] = simd
    info["vnni"] = any("vnni" in f for f in flags)
    info["load_average"] = list(os.getloadavg())
    info["hostname_hash"] = hashlib.sha256(platform.node().encode()).hexdigest()[:8]
    return info


def machine_line() -> str:
    """This machine in one line: CPU model, cores and the ISA features that decide its speed and training precision."""
    m = machine()
    return f"{m['cpu_model']}, {m['cores']} cores, {', '.join(m['isa_features'])}"


def optimum_config(mach: dict) -> str:
    """The AutoQuantizationConfig an Optimum user picks for this CPU (`machine()`)."""
    return "avx512_vnni" if mach["vnni"] else "avx2"


class OtherLoad:
    """CPU time other processes used since the last call, in cores (0 = the machine was ours).

    The load average cannot tell: it counts this run's own children. This is the machine's busy
    time (/proc/stat) minus this process's and its finished children's CPU time."""

    def __init__(self):
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.last = self._snapshot()

    def _snapshot(self):
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:9]]
            busy = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / self.hz  # user nice system irq softirq steal
        except (OSError, ValueError, IndexError):
            busy = None
        t = os.times()
        return time.monotonic(), busy, t.user + t.system + t.children_user + t.children_system

    def cores(self) -> float | None:
        now = self._snapshot()
        (w0, b0, o0), (w1, b1, o1) = self.last, now
        self.last = now
        if b0 is None or b1 is None or w1 - w0 <= 0:
            return None
        return max(0.0, ((b1 - b0) - (o1 - o0)) / (w1 - w0))


def wait_quiet(minutes: float, window: float = 30.0, limit: float = 0.25) -> None:
    """Wait (up to `minutes`) until other processes use under `limit` cores over a `window`-second span."""
    other, deadline = OtherLoad(), time.time() + minutes * 60
    while True:
        time.sleep(window)
        cores = other.cores()
        if cores is not None and cores < limit:
            log(f"machine quiet (others use {cores:.2f} cores)")
            return
        if time.time() > deadline:
            log(f"still busy after {minutes:g} min (others use {_f(cores)} cores): running anyway; figures will say so")
            return
        log(f"waiting for a quiet machine: others use {_f(cores)} cores")


# ---------------------------------------------------------------------------------------------
# Children: every build and every timing runs in a process of its own


class ChildFailed(RuntimeError):
    pass


def child(argv: list[str], log_file: Path, timeout: float, env: dict | None = None) -> None:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "w") as f:
        try:
            proc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, cwd=ROOT, check=False,
                                  env={**os.environ, **(env or {})})
        except subprocess.TimeoutExpired:
            raise ChildFailed(f"timed out after {timeout:.0f} s (log: {log_file})") from None
    if proc.returncode != 0:
        lines = [ln for ln in log_file.read_text(errors="replace").splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if "error" in ln.lower()), lines[-1] if lines else "")
        raise ChildFailed(f"exit {proc.returncode}: {last.strip()[:300]} (log: {log_file})")


def cached_build(name: str, argv: list[str], key: dict, work: Path, timeout: float = 1800) -> dict:
    """Run a bench/_build.py child into work/name unless a complete build with the same key is there."""
    out = work / name
    stamp = json.dumps(key, sort_keys=True)
    if (out / "info.json").is_file() and (out / "key.json").is_file() and (out / "key.json").read_text() == stamp:
        log(f"{name}: cached ({out})")
        return json.loads((out / "info.json").read_text())
    log(f"{name}: building (minutes)")
    child([sys.executable, str(ROOT / "bench" / "_build.py"), *argv, "--out", str(out)], work / "logs" / f"build-{name}.log",
          timeout)
    write_bytes(out / "key.json", stamp.encode())
    return json.loads((out / "info.json").read_text())


# ---------------------------------------------------------------------------------------------
# The eval sets


def eval_sets(folders: dict[str, Path], data_dir: str | None, work: Path, rows: int, seed: int = 0) -> dict:
    """SST-2 dev, tokenized at PAD by each folder's tokenizer ({"teacher": ..., "student": the bundle, ...}; one file
    for the folders whose tokenizers agree), with each sentence's text for the models that tokenize it themselves.
    rows > 0 keeps a seeded random subset (--quick)."""
    from edgebert.data import load_task, pretokenize_eval
    from edgebert.tokenizer import load_tokenizer

    dev = load_task("sst2", "dev", data_dir=data_dir)
    out = {}
    arrays_by_who = {}
    for who, folder in folders.items():
        tok = load_tokenizer(folder)
        # A bundle's tokenizer says its recipe's max_length (64 by default); padding to PAD is this bench's
        # condition, which the ONNX file's 512 positions and the seq_PAD TFLite file built here both take.
        tok.model_max_length = max(tok.model_max_length, PAD)
        arrays = {**pretokenize_eval(dev, tok, PAD), "text": np.array([e.text for e in dev.examples])}
        if rows and rows < len(arrays["lengths"]):
            keep = np.sort(np.random.default_rng(seed).choice(len(arrays["lengths"]), rows, replace=False))
            arrays = pick_rows(arrays, keep)
        twin = next((w for w, a in arrays_by_who.items() if all(np.array_equal(a[k], arrays[k]) for k in a)), None)
        arrays_by_who[who] = arrays
        if twin:
            out[who] = out[twin]
            continue
        path = work / f"sst2_dev_{who}_t{PAD}.npz"  # never "eval.npz": the harness checks that name against a manifest
        np.savez(path, **arrays)
        out[who] = {"path": path, "lengths": arrays["lengths"].astype(int), "n": len(arrays["lengths"]),
                    "labels": arrays["labels"]}
    return out


def timing_subset(source: Path, rows: int, seed: int, dest: Path) -> Path:
    with np.load(source) as f:
        arrays = {k: f[k] for k in f.files}
    n = len(arrays["lengths"])
    keep = np.random.default_rng(1000 + seed).choice(n, min(rows, n), replace=False)
    np.savez(dest, **pick_rows(arrays, keep))
    return dest


# ---------------------------------------------------------------------------------------------
# The student's checkpoint (for FLOPs, and for a seq_128 TFLite the bundle lacks)


def student_checkpoint(bundle: Path, manifest: dict, explicit: str | None) -> tuple[Path | None, str]:
    """The last model stage's checkpoint of the compile that wrote `bundle`, as its manifest names it
    (OUT/stages/NN-name-KEY/model): stages of one shape, from recipes that differ elsewhere, sit side by side."""
    if explicit:
        return Path(explicit), "given with --student-checkpoint"
    stages = [s for s in manifest.get("stages", []) if "params" in s]
    if not stages:
        return None, "the manifest lists no model stages"
    last = stages[-1]
    if "checkpoint" not in last:
        return None, f"the manifest names no checkpoint for its {last['name']} stage: compile the bundle again"
    folder = bundle.parent / last["checkpoint"]
    if not (folder / "config.json").is_file():
        return None, f"no {last['name']} checkpoint at {folder}, where the manifest puts it"
    return folder, f"{last['checkpoint']} (the manifest's {last['name']} stage)"


def tflite_int8_options(manifest: dict) -> dict:
    """The DynamicInt8Config options the compile used for the bundle's model.tflite."""
    config = manifest.get("verification", {}).get("model.tflite", {}).get("meta", {}).get("config", {})
    return {k: config[k] for k in ("per_channel", "target", "int8_embeddings", "int4_embeddings")
            if config.get(k) is not None}


# ---------------------------------------------------------------------------------------------
# Models


def _flops(count, config, t) -> int:
    return count(config, int(t), 2)


def _student(ckpt: Path) -> tuple[object, str]:
    """The student checkpoint's EncoderConfig, and where its parameters are, in words."""
    import edgebert
    from edgebert.stats import params

    student = edgebert.load(ckpt)
    c = student.config
    split = params(student)
    return c, (f"{split['total']:,} parameters: embeddings {split['embeddings']:,} "
               f"({split['embeddings'] / split['total']:.0%}; the word table alone {c.vocab_size:,} × {c.embedding_dim} = {c.vocab_size * c.embedding_dim:,}), "
               f"encoder {split['encoder']:,}, heads {split['heads']:,}; layers {c.num_layers}, heads per layer "
               f"{[c.heads(i) for i in range(c.num_layers)]}, FFN {[c.ffn(i) for i in range(c.num_layers)]}")


def _shorter(longest: int | None) -> str | None:
    """Why no file of the student takes PAD tokens, when its position table stops before (the vocab stage keeps
    the rows the bundle's max_length reads); None when one can."""
    if longest is None or longest >= PAD:
        return None
    return (f"n/a: the student reads at most {longest} tokens (the bundle's max_length; its position table stops "
            f"there), so no file of it takes {PAD}")


def _student_tflite_pad(manifest: dict, tfl_sigs: list[int], ckpt: Path | None, why: str, work: Path,
                        longest: int | None = None) -> tuple[dict | None, str]:
    """The student's TFLite file for padded-PAD inputs: (what was built here, or None; how it was chosen).
    The bundle's own when it has a seq_PAD signature, else one exported here from the student checkpoint."""
    if tfl_sigs and max(tfl_sigs) >= PAD:
        return None, f"the bundle's model.tflite has seq_{max(tfl_sigs)}"
    stops = f"the bundle's model.tflite stops at seq_{max(tfl_sigs) if tfl_sigs else '?'}"
    if short := _shorter(longest):
        return None, short
    if not ckpt:
        return None, f"n/a: {stops} and {why}, so no seq_{PAD} file could be exported"
    options = tflite_int8_options(manifest)
    built = cached_build(
        f"student-tflite-{PAD}",
        ["tflite", "--model", str(ckpt), "--seq-lens", str(PAD), "--int8", json.dumps(options)],
        {"model": sha256(str(ckpt / "model.safetensors")), "seq": [PAD], "int8": options, "v": versions(*DISTS)}, work)
    return built, (f"{stops}: padded-{PAD} figures use a seq_{PAD} file exported here from the student checkpoint "
                   f"through the same path (litert-torch FP32, then DynamicInt8Config {options})")


def _student_pte(bundle: Path, manifest: dict, ckpt: Path | None, why: str, work: Path,
                 longest: int | None = None) -> tuple[Path | None, str, dict | None]:
    """The student's INT8 .pte, one file for real and padded lengths alike (it takes dynamic shapes): (the file,
    or None; where it came from, or why there is none; what was built here, or None). The bundle's model.pte
    when it takes PAD tokens, else one exported here from the student checkpoint; never an exception, so a
    machine without executorch still gets every other row."""
    if not runtimes.get("executorch").installed():
        return None, "n/a: executorch is not installed (pip install 'edgebert[executorch]')", None
    own = bundle / "model.pte"
    takes = manifest.get("inputs", {}).get("files", {}).get("model.pte", {}).get("max_length") or 0
    if own.is_file() and takes >= PAD:
        return own, "the bundle's file as is", None
    has = f"the bundle's model.pte takes {takes} tokens" if own.is_file() else "the bundle has no model.pte"
    if not ckpt:
        return None, f"n/a: {has} and {why}, so none could be exported", None
    length = min(PAD, longest or PAD)
    try:
        built = cached_build(PTE, ["pte", "--model", str(ckpt), "--int8", "--max-length", str(length)],
                             {"model": sha256(str(ckpt / "model.safetensors")), "max_length": length,
                              "v": versions(*DISTS)}, work)
    except ChildFailed as e:
        return None, f"n/a: {has}, and exporting one from the student checkpoint failed: {e}", None
    return work / PTE / built["files"]["int8"], (
        f"{has}: export.export(ExecuTorchExportConfig(precision='int8', max_length={length})) of the student "
        "checkpoint, lowered to XNNPACK (its PT2E quantizer: int8 weights per channel, int8 activations per call; "
        f"word tables float); the runtime plans memory for the longest input, so the file stops at {length}"), built


def _describe_files(m: dict) -> None:
    """Set the model's file and size (None when it has none: m["na"] says why), and its padded file's when that
    is another."""
    first = m["run"]["real"]
    if first is None:
        m["file"], m["bytes"] = None, None
        return
    if first["kind"] == "harness":
        m["file"], m["bytes"] = str(first["path"]), first["path"].stat().st_size
    elif first["kind"] == "torch":
        weights = sorted(Path(first["path"]).glob("*.safetensors"))
        m["file"], m["bytes"] = str(weights[0]), sum(w.stat().st_size for w in weights)
    else:
        m["file"], m["bytes"] = str(first["path"]), model2vec_bytes(first["path"])
    pad = m["run"].get(f"pad{PAD}")
    if pad and pad["kind"] == "harness" and pad["path"] != first["path"]:
        m["file_pad"], m["bytes_pad"] = str(pad["path"]), pad["path"].stat().st_size


def _harness(path, backend) -> dict:
    """How to run a model file: in the device_tests harness, with this backend."""
    return {"kind": "harness", "path": Path(path), "backend": backend}


def _teacher_models(teacher: Path, config, qname: str, optimum: dict, work: Path) -> list[dict]:
    """The teacher's rows: PyTorch eager (1), Optimum's two INT8 ONNX files (2), litert-torch TFLite (3)."""
    odir = work / "optimum"
    tdir = work / "teacher-tflite"
    return [
        {"id": "pytorch-fp32", "group": "1", "label": "teacher · PyTorch FP32 eager (transformers)", "int8": False,
         "eval": "teacher", "config": config,
         "how": "AutoModelForSequenceClassification.from_pretrained(teacher), torch.inference_mode(), "
                "torch.set_num_threads(N)",
         "run": {c: {"kind": "torch", "path": teacher} for c in CONDITIONS}},
        {"id": "optimum-o2-int8", "group": "2", "label": "teacher · Optimum ONNX O2 + dynamic INT8", "int8": True,
         "eval": "teacher", "config": config,
         "how": f"ORTModelForSequenceClassification.from_pretrained(export=True) → ORTOptimizer O2 → ORTQuantizer "
                f"AutoQuantizationConfig.{qname}(is_static=False) (per_channel={optimum['quantization']['per_channel']})",
         "run": {c: _harness(odir / optimum["files"]["o2-int8"], "onnxruntime") for c in CONDITIONS}},
        {"id": "optimum-int8", "group": "2", "label": "teacher · Optimum ONNX + dynamic INT8 (no offline O2)",
         "int8": True, "eval": "teacher", "config": config,
         "how": f"the same export and ORTQuantizer {qname} config on the unoptimized export (ORT fuses at load)",
         "run": {c: _harness(odir / optimum["files"]["int8"], "onnxruntime") for c in CONDITIONS}},
        {"id": "tflite-fp32", "group": "3", "label": "teacher · litert-torch TFLite FP32", "int8": False,
         "eval": "teacher", "config": config,
         "how": f"export.export(TFLiteExportConfig(seq_lens=(16, 32, 64, {PAD}))), one multi-signature file",
         "run": {c: _harness(tdir / "fp32.tflite", "litert") for c in CONDITIONS}},
        {"id": "tflite-int8", "group": "3", "label": "teacher · litert-torch TFLite dynamic-range INT8", "int8": True,
         "eval": "teacher", "config": config,
         "how": "quantize.quantize(fp32.tflite, DynamicInt8Config()) — ai-edge-quantizer dynamic_wi8_afp32",
         "run": {c: _harness(tdir / "int8.tflite", "litert") for c in CONDITIONS}},
    ]


def _model2vec(teacher: Path, teacher_weights: str, data: str | None, work: Path) -> tuple[dict, dict | None]:
    """model2vec's row, distilled from the same teacher and trained on SST-2 train (bench/_build.py model2vec) and
    run on each sentence's text, and what was built (None if nothing); n/a, never an exception, where model2vec is
    not installed or its build fails."""
    from edgebert.data import data_root, get_task

    row = {"id": "model2vec", "group": "5", "int8": False, "eval": "teacher", "config": None,
           "label": "model2vec · distill(teacher) + StaticModelForClassification (int8 vectors)",
           "how": "model2vec.distill.distill(teacher) (PCA to 256 dimensions, SIF weights), "
                  "StaticModelForClassification.from_static_model(...).fit(SST-2 train) with its defaults, "
                  "to_pipeline() with the vectors quantized to int8 (quantize_model), save_pretrained; timed on "
                  "each sentence's text, its tokenizer inside the timed call (the other rows are timed from token "
                  "ids); size: the folder save_pretrained writes, its tokenizer.json included",
           "run": {c: None for c in CONDITIONS},
           "na": {f"pad{PAD}": "n/a: it averages its tokens' vectors, so nothing is padded"}}
    if importlib.util.find_spec("model2vec") is None:
        row["na"]["real"] = "n/a: model2vec is not installed (pip install 'edgebert[bench]')"
        return row, None
    train = data_root(data) / get_task("sst2").files["train"]
    try:
        built = cached_build("model2vec", ["model2vec", "--teacher", str(teacher), *(["--data", data] if data else [])],
                             {"teacher": teacher_weights, "train": sha256(str(train)),
                              "v": versions("model2vec", "torch", "transformers", "tokenizers")}, work)
    except ChildFailed as e:
        row["na"]["real"] = f"n/a: building it failed: {e}"
        return row, None
    row["run"]["real"] = {"kind": "model2vec", "path": work / "model2vec" / built["files"]["model"]}
    return row, built


def _static_models(static: Path) -> list[dict]:
    """The static bundle's rows, its files run as the student's are; its model.tflite padded only where it has a
    seq_PAD signature (there is no checkpoint to export one from here)."""
    manifest = json.loads((static / "manifest.json").read_text())
    sigs = manifest.get("inputs", {}).get("files", {}).get("model.tflite", {}).get("lengths") or []
    tfl = _harness(static / "model.tflite", "litert")
    pad_na = {} if sigs and max(sigs) >= PAD else {
        f"pad{PAD}": f"n/a: the static bundle's model.tflite stops at seq_{max(sigs) if sigs else '?'}"}
    return [
        {"id": "static-onnx-int8", "group": "4", "label": "edgebert static student · bundle model.onnx (INT8)",
         "int8": True, "eval": "static", "config": None, "how": "the static bundle's file as is",
         "run": {c: _harness(static / "model.onnx", "onnxruntime") for c in CONDITIONS}},
        {"id": "static-tflite-int8", "group": "4", "label": "edgebert static student · bundle model.tflite (INT8)",
         "int8": True, "eval": "static", "config": None, "how": "the static bundle's file as is",
         "run": {c: None if c in pad_na else tfl for c in CONDITIONS}, "na": pad_na},
    ]


def model_table(args, manifest: dict, work: Path, mach: dict) -> tuple[list[dict], dict]:
    """Build what is missing and describe each model: how it is run for each input shape."""
    import edgebert
    from edgebert.stats import flops

    teacher = Path(args.teacher)
    bundle = Path(args.bundle)
    teacher_weights = sha256(str(next(iter(sorted(teacher.glob("*.safetensors"))))))
    teacher_config = edgebert.load(teacher).config
    notes = {}

    qname = optimum_config(mach)
    optimum = cached_build("optimum", ["optimum", "--teacher", str(teacher), "--config", qname],
                           {"teacher": teacher_weights, "config": qname, "v": versions(*DISTS)}, work)
    teacher_tfl = cached_build("teacher-tflite", ["tflite", "--model", str(teacher), "--seq-lens", f"16,32,64,{PAD}"],
                               {"model": teacher_weights, "seq": [16, 32, 64, PAD], "v": versions(*DISTS)}, work)
    ckpt, why = student_checkpoint(bundle, manifest, args.student_checkpoint)
    notes["student_checkpoint"] = why
    student_config = None
    if ckpt:
        student_config, notes["student_params"] = _student(ckpt)
    tfl_sigs = manifest.get("inputs", {}).get("files", {}).get("model.tflite", {}).get("lengths") or []
    longest = student_config.max_length if student_config is not None else None
    student_tfl, notes["student_tflite_pad"] = _student_tflite_pad(manifest, tfl_sigs, ckpt, why, work, longest)
    pte, pte_how, student_pte = _student_pte(bundle, manifest, ckpt, why, work, longest)
    short = _shorter(longest)
    pte_na = {c: pte_how for c in CONDITIONS} if not pte else {f"pad{PAD}": short} if short else {}

    trims = trims_padding(bundle / "model.onnx")
    real_tfl = _harness(bundle / "model.tflite", "litert")
    pad_tfl = _harness(work / f"student-tflite-{PAD}" / "int8.tflite", "litert") if student_tfl else None
    if tfl_sigs and max(tfl_sigs) >= PAD:
        pad_tfl = real_tfl
    models = _teacher_models(teacher, teacher_config, qname, optimum, work) + [
        {"id": "student-onnx-int8", "group": "4", "label": "edgebert student · bundle model.onnx (INT8)", "int8": True,
         "eval": "student", "config": student_config, "trims": trims,
         "how": "the bundle's file as is" + ("; it drops the columns that are padding in every row before its "
                                             "encoder (OnnxExportConfig.trim_padding), so padded it computes at "
                                             "the real length" if trims else ""),
         "run": {c: _harness(bundle / "model.onnx", "onnxruntime") for c in CONDITIONS}},
        {"id": "student-tflite-int8", "group": "4", "label": "edgebert student · bundle model.tflite (INT8)",
         "int8": True, "eval": "student", "config": student_config,
         "how": "the bundle's file as is" + ("" if pad_tfl is real_tfl else f"; padded {PAD}: " + notes["student_tflite_pad"]),
         "run": {"real": real_tfl, f"pad{PAD}": pad_tfl},
         "na": {f"pad{PAD}": notes["student_tflite_pad"]} if pad_tfl is None else {}},
        {"id": PTE, "group": "4", "label": "edgebert student · ExecuTorch .pte (INT8, XNNPACK)", "int8": True,
         "eval": "student", "config": student_config, "how": pte_how,
         "run": {c: _harness(pte, "executorch") if pte and c not in pte_na else None for c in CONDITIONS},
         "na": pte_na},
    ]
    if args.static_bundle:
        models += _static_models(Path(args.static_bundle))
    m2v, notes["model2vec_build"] = _model2vec(teacher, teacher_weights, args.data, work)
    models.append(m2v)
    for m in models:
        _describe_files(m)
        m["flops"] = functools.partial(_flops, flops, m["config"]) if m["config"] is not None else None
    notes["optimum"] = optimum
    notes["teacher_tflite"] = teacher_tfl
    notes["student_tflite_pad_build"] = student_tfl
    notes["student_pte_build"] = student_pte
    return models, notes


# ---------------------------------------------------------------------------------------------
# One measurement


def measure(model: dict, cond: str, inputs: Path, threads: int, warmup: int, runs: int, out: Path,
            env: dict) -> dict:
    spec = model["run"][cond]
    pad = ["--pad-to", str(PAD)] if cond != "real" else []
    if spec["kind"] != "harness":  # a folder bench/_timing.py loads as its users do
        argv = [sys.executable, str(ROOT / "bench" / "_timing.py"), spec["kind"], "--model", str(spec["path"])]
    else:
        argv = [sys.executable, "-m", "device_tests", "run", "--model", str(spec["path"]), "--backend", spec["backend"]]
        if spec["backend"] == "litert" and cond == "real":
            argv.append("--truncate")  # the harness says so in warnings if any sentence was cut
    argv += ["--inputs", str(inputs), "--threads", str(threads), "--warmup", str(warmup), "--runs", str(runs),
             *pad, "--json", str(out)]
    child(argv, out.with_suffix(".log"), timeout=1200, env=env)
    return json.loads(out.read_text())


def useful_flops(model: dict, cond: str, lengths: np.ndarray, warmup: int, runs: int) -> float | None:
    """Mean FLOPs per sequence over the rows the run timed, at the true length (padded: at 128, unless the
    file trims the padding first)."""
    if model["flops"] is None:
        return None
    if cond != "real" and not model.get("trims"):
        return float(model["flops"](PAD))
    return float(np.mean([model["flops"](lengths[r]) for r in timed_rows(len(lengths), warmup, runs)]))


# ---------------------------------------------------------------------------------------------
# The run


def disagreements(models: list[dict], accuracy: dict) -> list[dict]:
    """The student's seq_PAD TFLite file, built here from the checkpoint the manifest names, holds the
    weights of the bundle's model.tflite, and padding never changes that file's outputs (every op is row-wise
    or masked: the two agree bit for bit), so both get the same sentences wrong. When they do not, the
    bundle's files were built from other weights than that checkpoint, and its padded line measures
    another model than its real-length line."""
    out = []
    for m in models:
        runs, scored = m["run"], accuracy.get(m["id"], {})
        real, pad = runs.get("real"), runs.get(f"pad{PAD}")
        if not (real and pad and m["eval"] == "student" and real["path"] != pad["path"]
                and "real" in scored and f"pad{PAD}" in scored):
            continue
        differ = set(scored["real"]["wrong"]) ^ set(scored[f"pad{PAD}"]["wrong"])
        if differ:
            out.append({"what": f"accuracy {m['id']} pad{PAD}",
                        "error": f"{pad['path'].name} (built here from the student checkpoint) and {real['path']} "
                                 f"disagree on {len(differ)} of {scored['real']['n']} dev sentences, so they do not "
                                 f"hold the same weights: the bundle is older than its checkpoint; compile it again"})
    return out


def _settings(args) -> dict:
    """QUICK or FULL, with the figures the command line sets."""
    settings = dict(QUICK if args.quick else FULL)
    for k in settings:
        if getattr(args, k, None) is not None:
            settings[k] = getattr(args, k)
    return settings


def _accuracy(models: list[dict], sets: dict, work: Path, env: dict, failures: list) -> dict:
    """Once per model and input shape, the whole dev set, 1 thread: {model id: {condition: scores}}."""
    accuracy = {m["id"]: {} for m in models}
    for m in models:
        for cond in CONDITIONS:
            if m["run"].get(cond) is None:
                continue
            log(f"accuracy: {m['id']} {cond}")
            out = work / "results" / f"acc-{m['id']}-{cond}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            try:
                r = measure(m, cond, sets[m["eval"]]["path"], 1, 0, 1, out, env)
                wrong = np.flatnonzero(np.asarray(r["predictions"]) != sets[m["eval"]]["labels"])
                accuracy[m["id"]][cond] = {"accuracy": r.get("accuracy"), "n": r["n_examples"],
                                           "wrong": wrong.tolist(), "warnings": r.get("warnings", []),
                                           "signatures_used": r.get("signatures_used")}
            except ChildFailed as e:
                failures.append({"what": f"accuracy {m['id']} {cond}", "error": str(e)})
                log(f"FAILED accuracy {m['id']} {cond}: {e}")
    return accuracy


def _gemm(threads: list[int], settings: dict, other: OtherLoad, work: Path, env: dict,
          failures: list) -> tuple[list[dict], list[dict]]:
    """The GEMM limit: each shape and op in its own process, rotating; (results, load per repeat)."""
    jobs = [(op, w, shape) for shape in GEMM_SHAPES for op, w in (("matmulinteger", "s8"), ("matmulinteger", "u8"),
                                                                  ("matmul", "f32"))]
    raw, loads = [], []
    rep, extra = 0, 0
    while rep < settings["gemm_repeats"] + extra:
        other.cores()
        for t in threads:
            for op, w, shape in jobs[rep % len(jobs):] + jobs[:rep % len(jobs)]:
                out = work / "results" / f"gemm-{op}-{w}-{shape}-t{t}-r{rep}.json"
                argv = [sys.executable, str(ROOT / "bench" / "_timing.py"), "gemm", "--op", op, "--shape", shape,
                        "--threads", str(t), "--seconds", str(settings["gemm_seconds"]), "--json", str(out)]
                if op == "matmulinteger":
                    argv += ["--weight", w]
                try:
                    child(argv, out.with_suffix(".log"), timeout=300, env=env)
                    raw.append({**json.loads(out.read_text()), "repeat": rep})
                except ChildFailed as e:
                    failures.append({"what": f"gemm {op} {w} {shape} t{t}", "error": str(e)})
        loads.append(_load_entry(rep, other.cores()))
        if loads[-1]["noisy"] and extra < settings["retry_noisy"]:
            extra += 1
            log(f"gemm repeat {rep + 1} was noisy (others used {loads[-1]['other_cores']:.2f} cores): one more")
        rep += 1
    log("gemm done")
    return raw, loads


def _timings(models: list[dict], sets: dict, threads: list[int], settings: dict, other: OtherLoad, work: Path,
             env: dict, failures: list) -> tuple[dict, list[dict]]:
    """For each repeat, every model once per (threads, shape), in rotating order; (latencies, load per repeat)."""
    raw = {f"t{t}": {c: {m["id"]: [] for m in models} for c in CONDITIONS} for t in threads}
    loads = []
    rep, extra = 0, 0
    while rep < settings["repeats"] + extra:
        other.cores()
        subsets = {who: timing_subset(sets[who]["path"], settings["timing_rows"], rep,
                                      work / f"timing_{who}_r{rep}.npz") for who in sets}
        sub_lengths = {who: np.load(p)["lengths"].astype(int) for who, p in subsets.items()}
        order = models[rep % len(models):] + models[:rep % len(models)]
        load_before = list(os.getloadavg())
        for t in threads:
            for cond in CONDITIONS:
                for m in order:
                    if m["run"].get(cond) is None:
                        continue
                    log(f"repeat {rep + 1}/{settings['repeats'] + extra}: {m['id']} t{t} {cond}")
                    out = work / "results" / f"time-{m['id']}-t{t}-{cond}-r{rep}.json"
                    try:
                        r = measure(m, cond, subsets[m["eval"]], t, settings["warmup"], settings["runs"], out, env)
                    except ChildFailed as e:
                        failures.append({"what": f"time {m['id']} t{t} {cond} r{rep}", "error": str(e)})
                        log(f"FAILED {m['id']} t{t} {cond}: {e}")
                        continue
                    lat = r["latency_ms"]
                    raw[f"t{t}"][cond][m["id"]].append({
                        "repeat": rep, "p50": lat["p50"], "p90": lat["p90"], "mean": lat["mean"],
                        "peak_rss_mb": r["peak_rss_mb"],
                        "flops": useful_flops(m, cond, sub_lengths[m["eval"]], settings["warmup"], settings["runs"]),
                        "warnings": r.get("warnings", [])})
        loads.append({**_load_entry(rep, other.cores()), "load_average": load_before})
        log(f"repeat {rep + 1}: other processes used {_f(loads[-1]['other_cores'])} cores on average")
        if loads[-1]["noisy"] and extra < settings["retry_noisy"]:
            extra += 1
            log(f"repeat {rep + 1} was noisy: one more repeat")
        rep += 1
    return raw, loads


def _profiles(models: list[dict], sets: dict, settings: dict, threads: list[int], work: Path, env: dict,
              failures: list) -> tuple[dict, dict]:
    """Op-level profiles of the INT8 ONNX models at 1 thread, {model id: {condition: profile}}, and of the
    student at each thread count above 1, {"t2": {condition: profile}}: what a second thread splits, and what not."""
    profiles, student = {}, {}
    runs = [(mid, 1) for mid in ("student-onnx-int8", "optimum-o2-int8", "optimum-int8")]
    runs += [("student-onnx-int8", t) for t in threads if t > 1]
    for mid, t in runs:
        m = next(x for x in models if x["id"] == mid)
        for cond in CONDITIONS:
            out = work / "results" / f"profile-{mid}-{cond}-t{t}.json"
            argv = [sys.executable, str(ROOT / "bench" / "_timing.py"), "profile", "--model", str(m["run"][cond]["path"]),
                    "--inputs", str(sets[m["eval"]]["path"]), "--threads", str(t), "--runs", str(settings["profile_runs"]),
                    "--json", str(out)] + (["--pad-to", str(PAD)] if cond != "real" else [])
            try:
                child(argv, out.with_suffix(".log"), timeout=600, env=env)
                (profiles.setdefault(mid, {}) if t == 1 else student.setdefault(f"t{t}", {}))[cond] = \
                    json.loads(out.read_text())
            except ChildFailed as e:
                failures.append({"what": f"profile {mid} {cond} {t} thread(s)", "error": str(e)})
    return profiles, student


def run(args) -> dict:
    settings = _settings(args)
    threads = [int(t) for t in args.threads.split(",")]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = {"OMP_WAIT_POLICY": "PASSIVE"} if args.omp_passive else {}
    if args.wait_quiet:
        wait_quiet(args.wait_quiet)
    t_start = time.time()
    mach = machine()
    if mach["load_average"][0] > 1.5:
        log(f"WARNING: load average {mach['load_average'][0]:.2f} > 1.5: other work is running; timings will be noisy")
    bundle = Path(args.bundle)
    if not (bundle / "manifest.json").is_file():
        raise SystemExit(f"compare: no bundle at {bundle} (no manifest.json): run `edgebert compile "
                         f"edgebert/recipes/sst2-minilm-long.toml --teacher {args.teacher} --out {bundle.parent}` "
                         "or pass --bundle")
    manifest = json.loads((bundle / "manifest.json").read_text())

    log("eval sets")
    folders = {"teacher": Path(args.teacher), "student": bundle}
    if args.static_bundle:
        folders["static"] = Path(args.static_bundle)
    sets = eval_sets(folders, args.data, work, settings["eval_rows"])
    log("models")
    models, notes = model_table(args, manifest, work, mach)
    failures = []
    accuracy = _accuracy(models, sets, work, env, failures)
    failures += disagreements(models, accuracy)
    other = OtherLoad()
    gemm_raw, gemm_load = _gemm(threads, settings, other, work, env, failures)
    raw, loads = _timings(models, sets, threads, settings, other, work, env, failures)
    profiles, student_profiles = _profiles(models, sets, settings, threads, work, env, failures)
    result = summarize(args, settings, threads, mach, models, notes, sets, accuracy, raw, gemm_raw, profiles,
                       manifest, failures, loads, env, gemm_load, student_profiles)
    result["wall_s"] = round(time.time() - t_start, 1)
    return result
