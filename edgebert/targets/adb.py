"""The `adb[:serial]` target: a phone, running the harness (--remote-python) or TFLite's benchmark_model."""

from __future__ import annotations

import re
import shlex

from .job import BenchError, Job, call
from .remote import Remote


class Adb(Remote):
    """`adb[:serial]`: a phone. With --remote-python the harness runs there (e.g. Termux); otherwise
    TFLite's benchmark_model measures latency only."""

    ROOT = "/data/local/tmp/edgebert"

    def __init__(self, serial: str | None = None, python: str | None = None, benchmark_model: str | None = None,
                 signature: str | None = None, op_profile: bool = False):
        super().__init__(f"adb:{serial}" if serial else "adb", python or "", self.ROOT)
        self.adb = ["adb", "-s", serial] if serial else ["adb"]
        self.benchmark_model, self.signature, self.op_profile = benchmark_model, signature, op_profile

    def shell(self, command, what, timeout=None, ok=(0,)):
        return call([*self.adb, "shell", command], what, timeout, ok=ok)

    def push(self, paths, what, timeout=None):
        for p in paths:
            call([*self.adb, "push", str(p), f"{self.workdir}/"], what, timeout)

    def pull(self, remote, local, what):
        call([*self.adb, "pull", remote, str(local)], what)

    def run(self, job: Job) -> dict:
        if self.remote_python:
            return super().run(job)
        if job.model.suffix != ".tflite":
            raise BenchError(f"{self.name}: benchmark_model runs .tflite only; for {job.model.name} pass "
                             "--remote-python (a Python with numpy and onnxruntime on the phone)")
        return self._benchmark_model(job)

    def _benchmark_model(self, job: Job) -> dict:
        tool = f"{self.ROOT}/benchmark_model"
        if self.benchmark_model:
            call([*self.adb, "push", self.benchmark_model, tool], f"{self.name}: copying benchmark_model", job.limit)
            self.shell(f"chmod 755 {tool}", f"{self.name}: chmod benchmark_model")
        elif self.shell(f"[ -x {tool} ] && echo yes || echo no", f"{self.name}: looking for benchmark_model"
                        ).stdout.strip() != "yes":
            raise BenchError(f"{self.name}: no {tool} on the device: pass --benchmark-model PATH (TFLite's "
                             "android_aarch64 benchmark_model) or --remote-python")
        with self._workdir(job.model.stat().st_size + (1 << 20), job.limit):
            self.push([job.model], f"{self.name}: copying the model", job.limit)
            return self._time_there(job, tool)

    def _time_there(self, job: Job, tool: str) -> dict:
        """benchmark_model on the model in this run's work dir, its log parsed into the harness's result shape."""
        s = job.settings
        signature = self.signature or _signature(job)
        cmd = [tool, f"--graph={self.workdir}/{job.model.name}", f"--num_threads={s['threads']}",
               f"--warmup_runs={s['warmup']}", f"--num_runs={s['runs']}", f"--signature_to_run_for={signature}",
               "--input_layer_value_range=input_ids,1,99:attention_mask,1,1:token_type_ids,0,0",
               *_delegate_flags(s.get("delegate"), s.get("provider"), self.name)]
        if s.get("duration"):
            cmd += [f"--min_secs={s['duration']}", f"--max_secs={s['duration']}"]
        if self.op_profile:
            cmd.append("--enable_op_profiling=true")
        proc = self.shell(shlex.join(cmd), f"{self.name}: benchmark_model", job.limit)
        text = proc.stdout + proc.stderr
        result = parse_benchmark_model(text)
        if self.op_profile:
            result["op_profile"] = parse_op_profile(text)
        result["model"] = {"file": job.model.name, "bytes": job.model.stat().st_size}
        result["runtime"]["delegate"] = s.get("delegate") or "xnnpack"
        result["settings"] = {"threads": s["threads"], "warmup": s["warmup"], "signature": signature,
                              **result.get("settings", {})}
        if job.golden:
            result["verify"] = {"passed": None, "reason": "benchmark_model runs no Python: pass --remote-python to "
                                                          "check the file's outputs on the phone"}
        return result


# --delegate as benchmark_model flags; "cpu" is its built-in kernels without the default XNNPACK delegate.
BENCHMARK_MODEL_DELEGATES = {"xnnpack": ["--use_xnnpack=true"], "cpu": ["--use_xnnpack=false"],
                             "gpu": ["--use_gpu=true"], "nnapi": ["--use_nnapi=true"]}


def _delegate_flags(delegate: str | None, provider: str | None, where: str) -> list[str]:
    if provider:
        raise BenchError(f"{where}: --provider is for onnxruntime; benchmark_model runs .tflite: pass --delegate")
    if delegate is None:
        return []
    if delegate not in BENCHMARK_MODEL_DELEGATES:
        raise BenchError(f"{where}: benchmark_model takes --delegate {', '.join(BENCHMARK_MODEL_DELEGATES)}, "
                         f"not {delegate!r}")
    return BENCHMARK_MODEL_DELEGATES[delegate]


def _signature(job: Job) -> str:
    """The signature benchmark_model should time: the one --pad-to fits, else the one that fits the
    eval set's median length (read from the model with ai-edge-litert on this machine)."""
    try:
        import numpy as np
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise BenchError("adb: cannot read the model's signatures here (no ai-edge-litert): pass --signature seq_T") from None
    lengths = {int(k.split("_")[1]): k for k in Interpreter(model_path=str(job.model)).get_signature_list()
               if re.fullmatch(r"seq_\d+", k)}
    if not lengths:
        raise BenchError(f"adb: {job.model.name} has no seq_<T> signatures: pass --signature KEY")
    want = job.settings.get("pad_to") or int(np.median(np.load(job.inputs)["lengths"]))
    return lengths[min((t for t in lengths if t >= want), default=max(lengths))]


def parse_op_profile(text: str) -> dict:
    """benchmark_model's "Summary by node type" table (--enable_op_profiling) as
    {"ops": [{op, ms, share, calls_per_run}]}, slowest first, the shape the ONNX profile has."""
    head = text.rfind("Summary by node type")  # the last: the regular runs, after the init profile
    if head < 0:
        raise BenchError("benchmark_model printed no 'Summary by node type' table: is --enable_op_profiling "
                         "supported by this build?")
    ops = []
    for line in text[head:].splitlines()[2:]:
        cells = line.split()
        if cells and cells[0] == "INFO:":
            cells = cells[1:]
        if len(cells) < 7 or not cells[1].isdigit():
            break
        ops.append({"op": cells[0], "ms": float(cells[2]), "share": float(cells[3].rstrip("%")) / 100,
                    "calls_per_run": float(cells[6])})
    if not ops:
        raise BenchError("benchmark_model's op profile table is empty: no op profile")
    return {"ops": sorted(ops, key=lambda o: -o["ms"])}


LATENCY_ONLY = ("benchmark_model times random inputs and measures latency only: no accuracy "
                "(pass --remote-python to run the harness on the phone for that)")


def parse_benchmark_model(text: str) -> dict:
    """TFLite benchmark_model's log as a harness-shaped result: latency only, no accuracy."""
    m = re.search(r"Inference timings in us: Init: ([\d.e+]+), First inference: ([\d.e+]+), "
                  r"Warmup \(avg\): ([\d.e+]+), Inference \(avg\): ([\d.e+]+)", text)
    if not m:
        raise BenchError("benchmark_model printed no 'Inference timings' line: it did not finish; no results")
    init, first, _, avg = (float(g) / 1000 for g in m.groups())
    stats = [dict(re.findall(r"(\w+)=([\d.e+-]+)", line)) for line in text.splitlines() if "count=" in line]
    runs = stats[-1] if stats else {}

    def ms(key):
        return float(runs[key]) / 1000 if key in runs else None
    latency = {"min": ms("min"), "p50": ms("median") or ms("p50"), "p90": ms("p90"), "p99": ms("p99"),
               "max": ms("max"), "mean": avg, "std": ms("std")}
    peak = re.search(r"Overall peak memory footprint \(MB\) via periodic monitoring: ([\d.]+)", text)
    result = {"emulated": False, "complete": True, "runtime": {"backend": "benchmark_model"},
              "load_ms": init, "first_inference_ms": first, "latency_ms": latency,
              "throughput": 1000 / avg, "peak_rss_mb": float(peak.group(1)) if peak else None,
              "warnings": [LATENCY_ONLY]}
    if "count" in runs:
        result["settings"] = {"runs": int(runs["count"])}
    return result
