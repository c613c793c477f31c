"""Every figure side by side, from one run on this machine: the SST-2 teacher as users run it today
(PyTorch FP32 eager; Hugging Face Optimum ONNX + O2 + dynamic INT8; litert-torch TFLite FP32 and
dynamic-range INT8) against edgebert's compiled student (the bundle's ONNX INT8 and TFLite INT8),
and this CPU's own INT8/FP32 GEMM limit.

    python bench/compare.py [--teacher DIR] [--bundle DIR] [--data DIR] [--quick]
    python bench/compare.py --render          # BENCHMARKS.md again from bench/results/compare.json

--quick (1 repeat, 20 runs, 200 dev sentences) writes runs/compare/quick/{compare.json,BENCHMARKS.md}
unless --results/--markdown say otherwise, so a smoke run never replaces the reference figures.

Every model is timed in its own process (`python -m device_tests run` for ONNX/TFLite files,
bench/_timing.py for PyTorch): for each repeat, every model runs once, in an order that rotates
from repeat to repeat, so drift hits all of them; figures are medians over repeats, and each ratio
is taken pair by pair within a repeat before its median. Accuracy is scored once per model and
input shape over the whole SST-2 dev set (872), at 1 thread. Built files are cached under --work.
Results: bench/results/compare.json, and BENCHMARKS.md (generated here; never edit it by hand).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# This folder holds bench/quantize.py, named like the `quantize` package: keep it off the import path.

from edgebert.device_tests.files import sha256

TEACHER = ROOT.parent / "shared" / "models" / "minilm-l6-sst2"
BUNDLE = ROOT / "runs" / "default" / "bundle"
WORK = ROOT / "runs" / "compare"
RESULTS = ROOT / "bench" / "results" / "compare.json"
MARKDOWN = ROOT / "BENCHMARKS.md"
PAD = 128
CONDITIONS = ("real", f"pad{PAD}")
TARGETS = {"speedup_vs_1": 12.0, "speedup_vs_2": 3.0, "size_vs_1": 10.0, "accuracy_drop_points": 1.0,
           "gemm_fraction": 0.40}
FULL = {"repeats": 3, "runs": 100, "warmup": 10, "timing_rows": 50, "eval_rows": 0, "gemm_seconds": 1.0,
        "gemm_repeats": 2, "profile_runs": 100, "retry_noisy": 2}
QUICK = {"repeats": 1, "runs": 20, "warmup": 3, "timing_rows": 20, "eval_rows": 200, "gemm_seconds": 0.5,
         "gemm_repeats": 1, "profile_runs": 20, "retry_noisy": 0}
# A repeat during which other processes used more than this many cores (on average) is noisy: it is
# re-run (up to retry_noisy times) and left out of the medians when clean repeats exist.
NOISY_CORES = 0.25
GEMM_SHAPES = ("1024x1024x1024", f"{PAD}x384x1536", "32x384x1536")


def _bench_module(name: str):
    """A helper module of this folder (the folder itself is kept off sys.path, see above)."""
    import importlib.util

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def log(message: str) -> None:
    print(f"compare: {message}", file=sys.stderr, flush=True)


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


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for d in ("torch", "transformers", "onnx", "onnxruntime", "optimum", "optimum-onnx", "litert-torch",
              "ai-edge-litert", "ai-edge-quantizer", "numpy"):
        try:
            out[d] = md.version(d)
        except md.PackageNotFoundError:
            out[d] = None
    return out


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
    (out / "key.json").write_text(stamp)
    return json.loads((out / "info.json").read_text())


# ---------------------------------------------------------------------------------------------
# The eval sets


def eval_sets(teacher: Path, bundle: Path, data_dir: str | None, work: Path, rows: int, seed: int = 0) -> dict:
    """SST-2 dev, tokenized at 128 by the teacher's and by the bundle's tokenizer (the same arrays
    when the tokenizers agree). rows > 0 keeps a seeded random subset (--quick)."""
    from edgebert.data import pretokenize_eval
    from edgebert.tokenizer import load_tokenizer

    out = {}
    arrays_by_who = {}
    for who, folder in (("teacher", teacher), ("student", bundle)):
        arrays = pretokenize_eval("sst2", load_tokenizer(folder), PAD, data_dir=data_dir)
        if rows and rows < len(arrays["lengths"]):
            keep = np.sort(np.random.default_rng(seed).choice(len(arrays["lengths"]), rows, replace=False))
            arrays = {k: v[keep] for k, v in arrays.items()}
        arrays_by_who[who] = arrays
    same = all(np.array_equal(arrays_by_who["teacher"][k], arrays_by_who["student"][k]) for k in arrays_by_who["teacher"])
    for who, arrays in arrays_by_who.items():
        name = "shared" if same else who
        path = work / f"sst2_dev_{name}_t{PAD}.npz"  # never "eval.npz": the harness checks that name against a manifest
        np.savez(path, **arrays)
        out[who] = {"path": path, "lengths": arrays["lengths"].astype(int), "n": len(arrays["lengths"])}
    out["same_tokenization"] = same
    return out


def timing_subset(source: Path, rows: int, seed: int, dest: Path) -> Path:
    with np.load(source) as f:
        arrays = {k: f[k] for k in f.files}
    n = len(arrays["lengths"])
    keep = np.random.default_rng(1000 + seed).choice(n, min(rows, n), replace=False)
    np.savez(dest, **{k: v[keep] for k, v in arrays.items()})
    return dest


# ---------------------------------------------------------------------------------------------
# The student's checkpoint (for FLOPs, and for a seq_128 TFLite the bundle lacks)


def student_checkpoint(bundle: Path, manifest: dict, explicit: str | None) -> tuple[Path | None, str]:
    """The last model stage's checkpoint of the compile that wrote `bundle` (OUT/stages/NN-name-KEY/model)."""
    if explicit:
        return Path(explicit), "given with --student-checkpoint"
    stages = [s for s in manifest.get("stages", []) if "params" in s]
    if not stages:
        return None, "the manifest lists no model stages"
    last = stages[-1]
    candidates = sorted((bundle.parent / "stages").glob(f"*-{last['name']}-*/model"))
    for folder in reversed(candidates):
        try:
            from edgebert import checkpoint
            from edgebert.stats import nbytes, params

            model = checkpoint.load(folder)
        except Exception as e:  # noqa: BLE001  a half-written or foreign folder: try the next
            log(f"skipping {folder}: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}")
            continue
        if params(model)["total"] == last["params"]["total"] and nbytes(model) == last["bytes"]:
            return folder, f"{folder.relative_to(bundle.parent)} (params and bytes match the manifest's {last['name']} stage)"
    return None, f"no {last['name']} checkpoint matching the manifest under {bundle.parent / 'stages'}"


def tflite_int8_options(manifest: dict) -> dict:
    """The DynamicInt8 options the compile used for the bundle's model.tflite."""
    config = manifest.get("verification", {}).get("model.tflite", {}).get("meta", {}).get("config", {})
    return {k: config[k] for k in ("per_channel", "target", "int8_embeddings") if k in config}


# ---------------------------------------------------------------------------------------------
# Models


def _flops(count, config, t) -> int:
    return count(config, int(t), 2)


def model_table(args, manifest: dict, work: Path, mach: dict) -> tuple[list[dict], dict]:
    """Build what is missing and describe each model: how it is run for each input shape."""
    import edgebert
    from edgebert.stats import flops

    teacher = Path(args.teacher)
    bundle = Path(args.bundle)
    teacher_weights = sha256(str(next(iter(sorted(teacher.glob("*.safetensors"))))))
    teacher_config = edgebert.load(teacher).config
    notes = {}

    qname = "avx512_vnni" if mach["vnni"] else "avx2"
    optimum = cached_build("optimum", ["optimum", "--teacher", str(teacher), "--config", qname],
                           {"teacher": teacher_weights, "config": qname, "v": versions()}, work)
    teacher_tfl = cached_build("teacher-tflite", ["tflite", "--model", str(teacher), "--seq-lens", f"16,32,64,{PAD}"],
                               {"model": teacher_weights, "seq": [16, 32, 64, PAD], "v": versions()}, work)
    ckpt, why = student_checkpoint(bundle, manifest, args.student_checkpoint)
    notes["student_checkpoint"] = why
    student_config = None
    if ckpt:
        from edgebert.stats import params

        student = edgebert.load(ckpt)
        student_config = student.config
        split = params(student)
        notes["student_params"] = (
            f"{split['total']:,} parameters: embeddings {split['embeddings']:,} ({split['embeddings'] / split['total']:.0%}; "
            f"the word table alone {student_config.vocab_size:,} × {student_config.embedding_dim} = "
            f"{student_config.vocab_size * student_config.embedding_dim:,}), encoder {split['encoder']:,}, heads "
            f"{split['heads']:,}; layers {student_config.num_layers}, heads per layer "
            f"{[student_config.heads(i) for i in range(student_config.num_layers)]}, FFN "
            f"{[student_config.ffn(i) for i in range(student_config.num_layers)]}")
    student_tfl = None
    tfl_sigs = manifest.get("inputs", {}).get("files", {}).get("model.tflite", {}).get("lengths") or []
    if tfl_sigs and max(tfl_sigs) >= PAD:
        notes["student_tflite_pad"] = f"the bundle's model.tflite has seq_{max(tfl_sigs)}"
    elif ckpt:
        options = tflite_int8_options(manifest)
        student_tfl = cached_build(
            f"student-tflite-{PAD}", ["tflite", "--model", str(ckpt), "--seq-lens", str(PAD), "--int8", json.dumps(options)],
            {"model": sha256(str(ckpt / "model.safetensors")), "seq": [PAD], "int8": options, "v": versions()}, work)
        notes["student_tflite_pad"] = (f"the bundle's model.tflite stops at seq_{max(tfl_sigs) if tfl_sigs else '?'}: "
                                       f"padded-{PAD} figures use a seq_{PAD} file exported here from the student "
                                       f"checkpoint through the same path (litert-torch FP32, then DynamicInt8 {options})")
    else:
        notes["student_tflite_pad"] = (f"n/a: the bundle's model.tflite stops at seq_{max(tfl_sigs) if tfl_sigs else '?'} "
                                       f"and {why}, so no seq_{PAD} file could be exported")

    def harness(path, backend):
        return {"kind": "harness", "path": Path(path), "backend": backend}

    odir = work / "optimum"
    tdir = work / "teacher-tflite"
    real_tfl = harness(bundle / "model.tflite", "litert")
    pad_tfl = harness(work / f"student-tflite-{PAD}" / "int8.tflite", "litert") if student_tfl else None
    if tfl_sigs and max(tfl_sigs) >= PAD:
        pad_tfl = real_tfl
    models = [
        {"id": "pytorch-fp32", "group": "1", "label": "teacher · PyTorch FP32 eager (transformers)", "int8": False,
         "eval": "teacher", "config": teacher_config,
         "how": "AutoModelForSequenceClassification.from_pretrained(teacher), torch.inference_mode(), "
                "torch.set_num_threads(N)",
         "run": {c: {"kind": "torch", "path": teacher} for c in CONDITIONS}},
        {"id": "optimum-o2-int8", "group": "2", "label": "teacher · Optimum ONNX O2 + dynamic INT8", "int8": True,
         "eval": "teacher", "config": teacher_config,
         "how": f"ORTModelForSequenceClassification.from_pretrained(export=True) → ORTOptimizer O2 → ORTQuantizer "
                f"AutoQuantizationConfig.{qname}(is_static=False) (per_channel={optimum['quantization']['per_channel']})",
         "run": {c: harness(odir / optimum["files"]["o2-int8"], "onnxruntime") for c in CONDITIONS}},
        {"id": "optimum-int8", "group": "2", "label": "teacher · Optimum ONNX + dynamic INT8 (no offline O2)",
         "int8": True, "eval": "teacher", "config": teacher_config,
         "how": f"the same export and ORTQuantizer {qname} config on the unoptimized export (ORT fuses at load)",
         "run": {c: harness(odir / optimum["files"]["int8"], "onnxruntime") for c in CONDITIONS}},
        {"id": "tflite-fp32", "group": "3", "label": "teacher · litert-torch TFLite FP32", "int8": False,
         "eval": "teacher", "config": teacher_config,
         "how": f"export.export(TFLiteExport(seq_lens=(16, 32, 64, {PAD}))), one multi-signature file",
         "run": {c: harness(tdir / "fp32.tflite", "litert") for c in CONDITIONS}},
        {"id": "tflite-int8", "group": "3", "label": "teacher · litert-torch TFLite dynamic-range INT8", "int8": True,
         "eval": "teacher", "config": teacher_config,
         "how": "quantize.quantize(fp32.tflite, DynamicInt8()) — ai-edge-quantizer dynamic_wi8_afp32",
         "run": {c: harness(tdir / "int8.tflite", "litert") for c in CONDITIONS}},
        {"id": "student-onnx-int8", "group": "4", "label": "edgebert student · bundle model.onnx (INT8)", "int8": True,
         "eval": "student", "config": student_config, "how": "the bundle's file as is",
         "run": {c: harness(bundle / "model.onnx", "onnxruntime") for c in CONDITIONS}},
        {"id": "student-tflite-int8", "group": "4", "label": "edgebert student · bundle model.tflite (INT8)",
         "int8": True, "eval": "student", "config": student_config,
         "how": "the bundle's file as is" + ("" if pad_tfl is real_tfl else f"; padded {PAD}: " + notes["student_tflite_pad"]),
         "run": {"real": real_tfl, f"pad{PAD}": pad_tfl},
         "na": {f"pad{PAD}": notes["student_tflite_pad"]} if pad_tfl is None else {}},
    ]
    for m in models:
        first = m["run"]["real"]
        if first["kind"] == "torch":
            weights = sorted(Path(first["path"]).glob("*.safetensors"))
            m["file"], m["bytes"] = str(weights[0]), sum(w.stat().st_size for w in weights)
        else:
            m["file"], m["bytes"] = str(first["path"]), first["path"].stat().st_size
        pad = m["run"].get(f"pad{PAD}")
        if pad and pad["kind"] == "harness" and pad["path"] != first["path"]:
            m["file_pad"], m["bytes_pad"] = str(pad["path"]), pad["path"].stat().st_size
        m["flops"] = functools.partial(_flops, flops, m["config"]) if m["config"] is not None else None
    notes["optimum"] = optimum
    notes["teacher_tflite"] = teacher_tfl
    notes["student_tflite_pad_build"] = student_tfl
    return models, notes


# ---------------------------------------------------------------------------------------------
# One measurement


def measure(model: dict, cond: str, inputs: Path, threads: int, warmup: int, runs: int, out: Path,
            env: dict) -> dict:
    spec = model["run"][cond]
    pad = ["--pad-to", str(PAD)] if cond != "real" else []
    if spec["kind"] == "torch":
        argv = [sys.executable, str(ROOT / "bench" / "_timing.py"), "torch", "--model", str(spec["path"])]
    else:
        argv = [sys.executable, "-m", "device_tests", "run", "--model", str(spec["path"]), "--backend", spec["backend"]]
        if spec["backend"] == "litert" and cond == "real":
            argv.append("--truncate")  # the harness says so in warnings if any sentence was cut
    argv += ["--inputs", str(inputs), "--threads", str(threads), "--warmup", str(warmup), "--runs", str(runs),
             *pad, "--json", str(out)]
    child(argv, out.with_suffix(".log"), timeout=1200, env=env)
    return json.loads(out.read_text())


def useful_flops(model: dict, cond: str, lengths: np.ndarray, warmup: int, runs: int) -> float | None:
    """Mean FLOPs per sequence over the rows the run timed, at the true length (padded: at 128)."""
    if model["flops"] is None:
        return None
    if cond != "real":
        return float(model["flops"](PAD))
    timed_rows = _bench_module("_timing").timed_rows
    return float(np.mean([model["flops"](lengths[r]) for r in timed_rows(len(lengths), warmup, runs)]))


# ---------------------------------------------------------------------------------------------
# The run


def run(args) -> dict:
    settings = dict(QUICK if args.quick else FULL)
    for k in settings:
        if getattr(args, k, None) is not None:
            settings[k] = getattr(args, k)
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
        raise SystemExit(f"compare: no bundle at {bundle} (no manifest.json): run `edgebert compile --teacher "
                         f"{args.teacher} --out {bundle.parent}` or pass --bundle")
    manifest = json.loads((bundle / "manifest.json").read_text())

    log("eval sets")
    sets = eval_sets(Path(args.teacher), bundle, args.data, work, settings["eval_rows"])
    log("models")
    models, notes = model_table(args, manifest, work, mach)
    failures = []

    # Accuracy: once per model and input shape, whole dev set, 1 thread.
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
                accuracy[m["id"]][cond] = {"accuracy": r.get("accuracy"), "n": r["n_examples"],
                                           "warnings": r.get("warnings", []),
                                           "signatures_used": r.get("signatures_used")}
            except ChildFailed as e:
                failures.append({"what": f"accuracy {m['id']} {cond}", "error": str(e)})
                log(f"FAILED accuracy {m['id']} {cond}: {e}")

    # GEMM limit: each shape and op in its own process, rotating.
    gemm_jobs = [(op, w, shape) for shape in GEMM_SHAPES for op, w in (("matmulinteger", "s8"), ("matmulinteger", "u8"),
                                                                       ("matmul", "f32"))]
    gemm_raw, gemm_load = [], []
    other = OtherLoad()
    rep, extra = 0, 0
    while rep < settings["gemm_repeats"] + extra:
        other.cores()
        for t in threads:
            order = gemm_jobs[rep % len(gemm_jobs):] + gemm_jobs[:rep % len(gemm_jobs)]
            for op, w, shape in order:
                out = work / "results" / f"gemm-{op}-{w}-{shape}-t{t}-r{rep}.json"
                argv = [sys.executable, str(ROOT / "bench" / "_timing.py"), "gemm", "--op", op, "--shape", shape,
                        "--threads", str(t), "--seconds", str(settings["gemm_seconds"]), "--json", str(out)]
                if op == "matmulinteger":
                    argv += ["--weight", w]
                try:
                    child(argv, out.with_suffix(".log"), timeout=300, env=env)
                    gemm_raw.append({**json.loads(out.read_text()), "repeat": rep})
                except ChildFailed as e:
                    failures.append({"what": f"gemm {op} {w} {shape} t{t}", "error": str(e)})
        gemm_load.append(_load_entry(rep, other.cores()))
        if gemm_load[-1]["noisy"] and extra < settings["retry_noisy"]:
            extra += 1
            log(f"gemm repeat {rep + 1} was noisy (others used {gemm_load[-1]['other_cores']:.2f} cores): one more")
        rep += 1
    log("gemm done")

    # Timing: for each repeat, every model once per (threads, shape), in rotating order.
    raw = {f"t{t}": {c: {m["id"]: [] for m in models} for c in CONDITIONS} for t in threads}
    loads = []
    rep, extra = 0, 0
    while rep < settings["repeats"] + extra:
        other.cores()
        subsets = {who: timing_subset(sets[who]["path"], settings["timing_rows"], rep,
                                      work / f"timing_{who}_r{rep}.npz") for who in ("teacher", "student")}
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

    # Op-level profiles of the INT8 ONNX models (1 thread).
    profiles = {}
    for mid in ("student-onnx-int8", "optimum-o2-int8", "optimum-int8"):
        m = next(x for x in models if x["id"] == mid)
        for cond in CONDITIONS:
            out = work / "results" / f"profile-{mid}-{cond}.json"
            argv = [sys.executable, str(ROOT / "bench" / "_timing.py"), "profile", "--model", str(m["run"][cond]["path"]),
                    "--inputs", str(sets[m["eval"]]["path"]), "--threads", "1", "--runs", str(settings["profile_runs"]),
                    "--json", str(out)] + (["--pad-to", str(PAD)] if cond != "real" else [])
            try:
                child(argv, out.with_suffix(".log"), timeout=600, env=env)
                profiles.setdefault(mid, {})[cond] = json.loads(out.read_text())
            except ChildFailed as e:
                failures.append({"what": f"profile {mid} {cond}", "error": str(e)})

    result = summarize(args, settings, threads, mach, models, notes, sets, accuracy, raw, gemm_raw, profiles,
                       manifest, failures, loads, env, gemm_load)
    result["wall_s"] = round(time.time() - t_start, 1)
    return result


# ---------------------------------------------------------------------------------------------
# Figures


def _load_entry(rep: int, cores: float | None) -> dict:
    return {"repeat": rep, "other_cores": cores, "noisy": cores is not None and cores > NOISY_CORES}


def _clean(entries: list[dict], load: list[dict]) -> set:
    """The repeats to use: the clean ones when there are any, else all (and the table says it was busy)."""
    every = {e.get("repeat", 0) for e in entries}
    clean = every - {x["repeat"] for x in load if x.get("noisy")}
    return clean or every


def _median(values):
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else None


def gemm_summary(gemm_raw: list[dict], threads: list[int], gemm_load: list[dict] | None = None) -> dict:
    out = {}
    use = _clean(gemm_raw, gemm_load or [])
    for t in threads:
        rows = {}
        for r in gemm_raw:
            if r["threads"] != t or r.get("repeat", 0) not in use:
                continue
            key = f"{r['op']}-{r['weight']}-{'x'.join(map(str, r['shape']))}"
            rows.setdefault(key, {"op": r["op"], "weight": r["weight"], "shape": r["shape"], "gops": []})
            rows[key]["gops"].append(r["gops_p50"])
        for v in rows.values():
            v["gops_median"] = _median(v["gops"])
        int8 = [v for v in rows.values() if v["op"] == "matmulinteger" and v["weight"] == "s8"]
        fp32 = [v for v in rows.values() if v["op"] == "matmul"]
        out[f"t{t}"] = {
            "shapes": rows,
            "int8_peak_gops": max((v["gops_median"] for v in int8), default=None),
            "int8_peak_shape": max(int8, key=lambda v: v["gops_median"])["shape"] if int8 else None,
            "fp32_peak_gops": max((v["gops_median"] for v in fp32), default=None),
            "fp32_peak_shape": max(fp32, key=lambda v: v["gops_median"])["shape"] if fp32 else None,
        }
    return out


def summarize(args, settings, threads, mach, models, notes, sets, accuracy, raw, gemm_raw, profiles, manifest,
              failures, loads, env, gemm_load=None) -> dict:
    gemm = gemm_summary(gemm_raw, threads, gemm_load)
    use = _clean([r for by in raw.values() for c in by.values() for runs in c.values() for r in runs], loads)
    timing, baseline2 = {}, {}
    for tk, by_cond in raw.items():
        timing[tk] = {}
        baseline2[tk] = {}
        for cond, all_runs in by_cond.items():
            by_model = {mid: [r for r in runs if r["repeat"] in use] for mid, runs in all_runs.items()}
            # "2" is the faster Optimum variant here (median p50): the baseline is never the weaker one.
            opt = {mid: _median(r["p50"] for r in by_model[mid]) for mid in ("optimum-o2-int8", "optimum-int8")}
            opt = {k: v for k, v in opt.items() if v is not None}
            b2 = min(opt, key=opt.get) if opt else None
            baseline2[tk][cond] = b2
            per_rep = {mid: {r["repeat"]: r for r in runs} for mid, runs in by_model.items()}
            table = {}
            for m in models:
                runs = by_model[m["id"]]
                if not runs:
                    table[m["id"]] = {"na": (m.get("na") or {}).get(cond, "failed: see failures")}
                    continue
                row = {"p50_ms": _median(r["p50"] for r in runs), "p90_ms": _median(r["p90"] for r in runs),
                       "mean_ms": _median(r["mean"] for r in runs), "peak_rss_mb": _median(r["peak_rss_mb"] for r in runs),
                       "p50_by_repeat": [r["p50"] for r in runs], "repeats_used": [r["repeat"] for r in runs],
                       "p50_all_repeats": {str(r["repeat"]): r["p50"] for r in all_runs[m["id"]]}}
                for label, base in (("1", "pytorch-fp32"), ("2", b2)):
                    ratios = [per_rep[base][r["repeat"]]["p50"] / r["p50"] for r in runs
                              if base and r["repeat"] in per_rep.get(base, {})]
                    row[f"speedup_vs_{label}"] = _median(ratios)
                    row[f"speedup_vs_{label}_by_repeat"] = ratios
                # Achieved GOPS: useful FLOPs per sequence over mean latency (total work / total time).
                gops = [r["flops"] / (r["mean"] * 1e6) for r in runs if r["flops"]]
                row["achieved_gops"] = _median(gops)
                peak = gemm.get(tk, {}).get("int8_peak_gops" if m["int8"] else "fp32_peak_gops")
                row["gemm_peak_gops"] = peak
                row["fraction_of_peak"] = row["achieved_gops"] / peak if row["achieved_gops"] and peak else None
                warnings = sorted({w for r in runs for w in r["warnings"]})
                if warnings:
                    row["warnings"] = warnings
                table[m["id"]] = row
            timing[tk][cond] = table

    by_id = {m["id"]: m for m in models}
    sizes = {}
    for m in models:
        sizes[m["id"]] = {"bytes": m["bytes"], "file": m["file"],
                          "size_vs_1": by_id["pytorch-fp32"]["bytes"] / m["bytes"]}
        if "bytes_pad" in m:
            sizes[m["id"]].update({"bytes_pad": m["bytes_pad"], "file_pad": m["file_pad"]})
    # Size against 2: the Optimum variant that is 2 at 1 thread (else the first thread count), real lengths.
    size_b2 = next((baseline2[tk]["real"] for tk in (f"t{threads[0]}", *baseline2) if baseline2.get(tk, {}).get("real")),
                   "optimum-o2-int8")
    for mid, size in sizes.items():
        size["size_vs_2"] = by_id[size_b2]["bytes"] / by_id[mid]["bytes"]
        size["size_baseline_2"] = size_b2

    result = {
        "command": "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": mach,
        "versions": versions(),
        "settings": {**settings, "threads": threads, "quick": bool(args.quick), "pad_to": PAD,
                     "env": env or "inherited (OMP_WAIT_POLICY unset unless the caller set it)",
                     "eval_examples": {who: sets[who]["n"] for who in ("teacher", "student")},
                     "same_tokenization": sets["same_tokenization"]},
        "load_average": loads,
        "gemm_load": gemm_load or [],
        "repeats_used": sorted(use),
        "repeats_dropped_noisy": sorted({x["repeat"] for x in loads if x.get("noisy")} - use),
        "inputs": {"teacher": str(args.teacher), "bundle": str(args.bundle), "data": args.data},
        "models": {m["id"]: {"group": m["group"], "label": m["label"], "how": m["how"], "int8": m["int8"],
                             **sizes[m["id"]], "accuracy": accuracy[m["id"]],
                             "na": m.get("na", {})} for m in models},
        "baseline_2": baseline2,
        "timing": timing,
        "gemm": gemm,
        "profiles": profiles,
        "stages": stage_costs(manifest),
        "notes": {k: v for k, v in notes.items() if isinstance(v, str)},
        "builds": {k: v for k, v in notes.items() if isinstance(v, dict)},
        "failures": failures,
    }
    result["targets"] = targets(result)
    return result


def stage_costs(manifest: dict) -> dict:
    """What each compile stage cost, from the bundle's manifest (measured during the compile)."""
    pareto = {p["stage"]: p for p in manifest.get("pareto", []) if p.get("format") == "pytorch"}
    stages = []
    for s in manifest.get("stages", []):
        metric = s.get("metrics", {}).get(manifest.get("task", {}).get("metric", "accuracy"))
        stages.append({"name": s["name"], "params": s.get("params", {}).get("total"), "bytes": s.get("bytes"),
                       "flops_128": s.get("flops"), "accuracy": metric,
                       "pytorch_p50_ms": pareto.get(s["name"], {}).get("latency_ms"), "wall_s": s.get("wall_s")})
    files = {}
    for name, b in manifest.get("bench_local", {}).items():
        v = manifest.get("verification", {}).get(name, {})
        files[name] = {"p50_ms": b.get("latency_ms", {}).get("p50"), "accuracy": b.get("accuracy"),
                       "bytes": manifest.get("files", {}).get(name, {}).get("bytes"),
                       "method": (v.get("meta") or {}).get("method"),
                       "agreement": (v.get("verify") or {}).get("agreement"),
                       "metric_drop": (v.get("verify") or {}).get("metric_drop")}
    return {"stages": stages, "files": files, "recipe": manifest.get("recipe"),
            "quantization": manifest.get("quantization"),
            "eval_examples": manifest.get("eval", {}).get("examples")}


def targets(result: dict) -> list[dict]:
    """One pass/miss line per target and condition, for the student's INT8 ONNX (its fastest CPU file)."""
    out = []
    s = "student-onnx-int8"
    for tk, by_cond in result["timing"].items():
        for cond, table in by_cond.items():
            row = table.get(s, {})
            where = f"batch 1, {'real lengths' if cond == 'real' else f'padded {PAD}'}, {tk[1:]} thread(s)"
            for key, name in (("speedup_vs_1", "faster than 1 (PyTorch FP32)"),
                              ("speedup_vs_2", f"faster than 2 ({result['baseline_2'][tk][cond]})")):
                v = row.get(key)
                out.append({"target": f"≥ {TARGETS[key]:g}× {name}", "where": where, "value": v,
                            "display": "n/a" if v is None else f"{v:.2f}×",
                            "pass": None if v is None else v >= TARGETS[key]})
            v = row.get("fraction_of_peak")
            out.append({"target": f"INT8 model > {TARGETS['gemm_fraction']:.0%} of the measured INT8 GEMM peak",
                        "where": where, "value": v, "display": "n/a" if v is None else
                        f"{v:.1%} ({row['achieved_gops']:.1f} of {row['gemm_peak_gops']:.1f} GOPS)",
                        "pass": None if v is None else v > TARGETS["gemm_fraction"]})
    v = result["models"][s]["size_vs_1"]
    out.append({"target": f"≥ {TARGETS['size_vs_1']:g}× smaller than 1", "where": "file bytes", "value": v,
                "display": f"{v:.2f}× ({result['models']['pytorch-fp32']['bytes'] / 1e6:.1f} MB → "
                           f"{result['models'][s]['bytes'] / 1e6:.1f} MB)", "pass": v >= TARGETS["size_vs_1"]})
    teacher = result["models"]["pytorch-fp32"]["accuracy"]
    for student in (s, "student-tflite-int8"):
        for cond in CONDITIONS:
            a, b = teacher.get(cond, {}).get("accuracy"), result["models"][student]["accuracy"].get(cond, {}).get("accuracy")
            drop = None if a is None or b is None else (a - b) * 100
            out.append({"target": f"within {TARGETS['accuracy_drop_points']:g} point of the teacher's SST-2 dev accuracy",
                        "where": f"{student}, {'real lengths' if cond == 'real' else f'padded {PAD}'}", "value": drop,
                        "display": "n/a" if drop is None else f"{b * 100:.2f}% vs {a * 100:.2f}% ({-drop:+.2f} points)",
                        "pass": None if drop is None else drop <= TARGETS["accuracy_drop_points"]})
    return out


# ---------------------------------------------------------------------------------------------
# BENCHMARKS.md, generated from the results


def _f(v, fmt="{:.2f}", na="n/a"):
    return na if v is None else fmt.format(v)


def busy(result: dict) -> bool:
    """Other work ran: a load average over 1.5 before the run, or others using > 0.25 core while timing."""
    used = set(result.get("repeats_used", []))
    others = [x.get("other_cores") for x in result["load_average"] if x.get("repeat") in used or not used]
    if not any(c is not None for c in others):
        return result["machine"]["load_average"][0] > 1.5
    return any(c is not None and c > NOISY_CORES for c in others)


def render(result: dict) -> str:
    m = result["machine"]
    models = result["models"]
    lines = [
        "# Benchmarks: edgebert's student against the teacher as users run it today",
        "",
        "<!-- Generated by bench/compare.py (python bench/compare.py --render regenerates it from the results JSON); do not edit by hand. -->",
        "",
        (f"Generated by `{result['command']}` on {result['date']} "
         f"({'QUICK smoke run: fewer runs, a subset of dev — not the reference figures' if result['settings']['quick'] else 'full run'})."),
        "",
        (f"**Machine:** {m.get('cpu_model')} · {m.get('architecture')} · {m.get('cores')} cores "
         f"({m.get('cores_usable')} usable) · ISA {', '.join(m.get('isa_features', []))} · VNNI: "
         f"{'yes' if m.get('vnni') else 'no'} · {m.get('os')} · Python {m.get('python')}.  "),
        f"Load average at start {m['load_average'][0]:.2f}; CPU used by other processes during each timing repeat: "
        + ", ".join(f"{_f(x.get('other_cores'))}" for x in result["load_average"] if "other_cores" in x)
        + " cores (0 = the machine was ours)"
        + (f"; repeat(s) {', '.join(str(r + 1) for r in result['repeats_dropped_noisy'])} ran beside other work, "
           "were re-run and are left out" if result.get("repeats_dropped_noisy") else "")
        + (" — **the machine was busy: treat the latencies as noisy**" if busy(result) else "")
        + f". Wall time {result.get('wall_s', 0) / 60:.1f} min.  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items() if v) + ".",
        "",
        "How: every model runs in its own process (`python -m device_tests run` for ONNX/TFLite files, "
        "`bench/_timing.py torch` for PyTorch), batch 1; for each repeat every model runs once in an order that "
        f"rotates between repeats. Latencies are medians over {result['settings']['repeats']} repeat(s) of "
        f"{result['settings']['runs']} timed runs (after {result['settings']['warmup']} warmup) on "
        f"{result['settings']['timing_rows']} dev sentences drawn per repeat; ratios are taken pair by pair within each "
        "repeat, then the median. *Real lengths*: each sentence at its own token count (TFLite: the smallest "
        f"`seq_T` signature that holds it); *padded {result['settings']['pad_to']}*: every input padded to "
        f"{result['settings']['pad_to']} tokens. Accuracy: "
        + ("the whole SST-2 dev set" if not result["settings"]["eval_rows"] else "a seeded random subset of SST-2 dev")
        + f" ({result['settings']['eval_examples']['teacher']} sentences), 1 thread, scored in the file's runtime.",
        "",
        "## Targets",
        "",
        ("Student = the bundle's INT8 `model.onnx`. 1 = teacher in PyTorch FP32; 2 = teacher through Optimum "
         "(the faster of its two INT8 variants on each line)."),
        "",
        "| | target | where | measured |",
        "|---|---|---|---|",
    ]
    for t in result["targets"]:
        mark = "n/a" if t["pass"] is None else ("PASS" if t["pass"] else "MISS")
        lines.append(f"| {mark} | {t['target']} | {t['where']} | {t['display']} |")
    missed = list(dict.fromkeys(t["target"] for t in result["targets"] if t["pass"] is False))
    lines += ["", f"{sum(t['pass'] is True for t in result['targets'])} of {len(result['targets'])} lines pass."
              + (" Missed: " + "; ".join(missed) + ". Where the time and accuracy go: the per-stage costs and the "
                 "op-level profile below." if missed else "")]
    lines += ["", "## Accuracy and size", "",
              (f"| # | model | dev acc, real lengths | dev acc, padded {result['settings']['pad_to']} | file MB | "
               "smaller than 1 | smaller than 2 |"), "|---|---|---|---|---|---|---|"]
    for mid, mm in models.items():
        acc = {c: mm["accuracy"].get(c, {}).get("accuracy") for c in CONDITIONS}
        mb = f"{mm['bytes'] / 1e6:.1f}" + (f" (seq_{result['settings']['pad_to']} file: {mm['bytes_pad'] / 1e6:.1f})"
                                           if "bytes_pad" in mm else "")
        lines.append(f"| {mm['group']} | {mm['label']} | {_f(acc['real'], '{:.2%}')} | "
                     f"{_f(acc[CONDITIONS[1]], '{:.2%}', mm.get('na', {}).get(CONDITIONS[1], 'n/a'))} | {mb} | "
                     f"{_f(mm['size_vs_1'], '{:.2f}×')} | {_f(mm.get('size_vs_2'), '{:.2f}×')} |")
    lines += [""]
    for tk, by_cond in result["timing"].items():
        for cond, table in by_cond.items():
            shape = "real dev lengths" if cond == "real" else f"padded to {result['settings']['pad_to']}"
            lines += [f"## Latency: {tk[1:]} thread(s), {shape}", "",
                      ("| # | model | p50 ms | p50 range over repeats | p90 ms | peak RSS MB | speedup vs 1 | "
                       "speedup vs 2 | achieved GOPS | of GEMM peak |"), "|---|---|---|---|---|---|---|---|---|---|"]
            for mid, row in table.items():
                mm = models[mid]
                b2 = " ← 2" if result["baseline_2"][tk][cond] == mid else ""
                if "na" in row:
                    lines.append(f"| {mm['group']} | {mm['label']}{b2} | {row['na']} | | | | | | | |")
                    continue
                lines.append(
                    f"| {mm['group']} | {mm['label']}{b2} | {_f(row['p50_ms'])} | "
                    f"{min(row['p50_by_repeat']):.2f}–{max(row['p50_by_repeat']):.2f} | {_f(row['p90_ms'])} | "
                    f"{_f(row['peak_rss_mb'], '{:.0f}')} | {_f(row['speedup_vs_1'], '{:.2f}×')} | "
                    f"{_f(row['speedup_vs_2'], '{:.2f}×')} | {_f(row['achieved_gops'], '{:.1f}')} | "
                    f"{_f(row['fraction_of_peak'], '{:.1%}')} ({'INT8' if mm['int8'] else 'FP32'}) |")
            lines.append("")
    lines += ["## This CPU's limit: GEMM throughput in ONNX Runtime", "",
              ("One MatMulInteger (u8 activations × constant s8 or u8 weights → i32) or MatMul (f32) node, "
               "median GOPS (2·M·K·N per call / p50). The peak is the best shape; *of GEMM peak* above is the model's "
               "achieved GOPS (useful FLOPs per sequence at its true length — `edgebert.stats.flops` — over mean "
               "latency) divided by the INT8 (s8-weight) or FP32 peak at the same thread count."), "",
              "| threads | op | M×K×N | GOPS |", "|---|---|---|---|"]
    for tk, g in result["gemm"].items():
        for v in g["shapes"].values():
            name = "MatMul f32" if v["op"] == "matmul" else f"MatMulInteger u8×{v['weight']}"
            lines.append(f"| {tk[1:]} | {name} | {'×'.join(map(str, v['shape']))} | {_f(v['gops_median'], '{:.1f}')} |")
    lines.append("")
    lines += profile_section(result)
    lines += stage_section(result)
    lines += ["## Notes", ""]
    for k, v in result["notes"].items():
        lines.append(f"- {k.replace('_', ' ')}: {v}")
    for mid, mm in models.items():
        lines.append(f"- {mm['label']}: {mm['how']}.")
    lines.append("- The Optimum O2 graph does not quantize through `ORTQuantizer` as released (\"Unable to find data type "
                 "for weight_name…\"): the build passes ORT's `extra_options={'DefaultTensorType': FLOAT}` "
                 "(the fix users apply, huggingface/optimum PR #1959); the quantization itself is unchanged.")
    warnings = sorted({w for by in result["timing"].values() for t in by.values() for r in t.values()
                       for w in r.get("warnings", [])})
    for w in warnings:
        lines.append(f"- harness warning: {w}")
    if result["failures"]:
        lines += ["", "## Failures", ""] + [f"- {f['what']}: {f['error']}" for f in result["failures"]]
    lines.append("")
    return "\n".join(lines)


def profile_section(result: dict) -> list[str]:
    if not result["profiles"]:
        return []
    lines = ["## Where the INT8 ONNX time goes (ORT profiler, 1 thread)", "",
             "Kernel time per op type, ms per inference (share of kernel time), top 8.", ""]
    for mid, by_cond in result["profiles"].items():
        for cond, p in by_cond.items():
            shape = f"real lengths (mean {p['mean_length']:.1f} tokens)" if cond == "real" else f"padded {p['pad_to']}"
            lines.append(f"**{result['models'][mid]['label']}**, {shape}: {p['kernel_ms']:.2f} ms in kernels, "
                         f"{p['model_run_ms']:.2f} ms per run.  ")
            lines.append(", ".join(f"{o['op']} {o['ms']:.2f} ({o['share']:.0%})" for o in p["ops"][:8]))
            lines.append("")
    return lines


def stage_section(result: dict) -> list[str]:
    st = result["stages"]
    if not st["stages"] and not st["files"]:
        return []
    teacher = result["models"]["pytorch-fp32"]["accuracy"].get("real", {}).get("accuracy")
    lines = ["## What each compile stage costs (from the bundle's manifest, measured during the compile)", "",
             (f"Recipe: {json.dumps(st.get('recipe'))}; accuracy on the compile's eval split "
              f"({st.get('eval_examples')} examples); PyTorch p50 at 1 thread, real lengths, in the compile's process. "
              f"The teacher, measured in this run: {_f(teacher, '{:.2%}')} SST-2 dev accuracy (PyTorch, real lengths)."),
             "",
             "| stage | params | MB | GFLOPs @128 | accuracy | Δ accuracy (points) | PyTorch p50 ms | speedup | wall s |",
             "|---|---|---|---|---|---|---|---|---|"]
    prev = None
    for s in st["stages"]:
        delta = (s["accuracy"] - prev["accuracy"]) * 100 if prev and None not in (s["accuracy"], prev["accuracy"]) else None
        speed = (prev["pytorch_p50_ms"] / s["pytorch_p50_ms"] if prev and prev["pytorch_p50_ms"] and s["pytorch_p50_ms"]
                 else None)
        lines.append(f"| {s['name']} | {_f(s['params'], '{:,}')} | {_f(s['bytes'] and s['bytes'] / 1e6, '{:.1f}')} | "
                     f"{_f(s['flops_128'] and s['flops_128'] / 1e9, '{:.2f}')} | {_f(s['accuracy'], '{:.2%}')} | "
                     f"{_f(delta, '{:+.2f}', '')} | {_f(s['pytorch_p50_ms'])} | {_f(speed, '{:.2f}×', '')} | "
                     f"{_f(s['wall_s'], '{:.0f}')} |")
        prev = s
    for name, f in st["files"].items():
        delta = (f["accuracy"] - prev["accuracy"]) * 100 if prev and None not in (f["accuracy"], prev["accuracy"]) else None
        speed = prev["pytorch_p50_ms"] / f["p50_ms"] if prev and prev["pytorch_p50_ms"] and f["p50_ms"] else None
        lines.append(f"| → {name} ({f['method']}) | | {_f(f['bytes'] and f['bytes'] / 1e6, '{:.1f}')} | | "
                     f"{_f(f['accuracy'], '{:.2%}')} | {_f(delta, '{:+.2f}', '')} | {_f(f['p50_ms'])} (file, harness) | "
                     f"{_f(speed, '{:.2f}×', '')} | |")
    lines.append("")
    return lines


# ---------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--teacher", default=str(TEACHER), help="the fine-tuned teacher checkpoint (Hugging Face folder)")
    p.add_argument("--bundle", default=str(BUNDLE), help="the bundle `edgebert compile --teacher ... --out runs/default` wrote")
    p.add_argument("--data", help="data root (default: EDGEBERT_DATA, else ../shared/data)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 repeat, fewer runs, 200 dev sentences")
    p.add_argument("--work", default=str(WORK), help="built files, per-run JSONs and logs (cached between runs)")
    p.add_argument("--results", help=f"default {RESULTS.relative_to(ROOT)} (--quick: WORK/quick/compare.json)")
    p.add_argument("--markdown", help=f"default {MARKDOWN.relative_to(ROOT)} (--quick: WORK/quick/BENCHMARKS.md)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int)
    p.add_argument("--runs", type=int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--timing-rows", type=int, dest="timing_rows")
    p.add_argument("--student-checkpoint", help="the student's PyTorch checkpoint (default: found beside the bundle)")
    p.add_argument("--omp-passive", action="store_true", help="run children with OMP_WAIT_POLICY=PASSIVE")
    p.add_argument("--wait-quiet", type=float, metavar="MINUTES",
                   help="first wait up to MINUTES until other processes use < 0.25 cores (30 s windows)")
    p.add_argument("--render", action="store_true", help="only regenerate --markdown from --results")
    args = p.parse_args(argv)
    # A smoke run never replaces the reference figures unless told to.
    quick_dir = Path(args.work) / "quick"
    args.results = args.results or str(quick_dir / "compare.json" if args.quick else RESULTS)
    args.markdown = args.markdown or str(quick_dir / "BENCHMARKS.md" if args.quick else MARKDOWN)
    if args.render:
        result = json.loads(Path(args.results).read_text())
    else:
        import torch

        torch.set_num_threads(1)  # this process only tokenizes and loads configs; children do the timing
        result = run(args)
        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
        Path(args.results).write_text(json.dumps(result, indent=1, default=str))
        log(f"results: {args.results}")
    Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
    Path(args.markdown).write_text(render(result))
    log(f"table: {args.markdown}")
    for t in result["targets"]:
        mark = "n/a " if t["pass"] is None else ("PASS" if t["pass"] else "MISS")
        print(f"{mark} {t['target']} [{t['where']}]: {t['display']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
