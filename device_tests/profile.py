"""Where an ONNX model's time goes: ONNX Runtime's own profiler (`enable_profiling`), aggregated per op
type. A profiled session is slower than a plain one, so this is a pass of its own, never the timed runs."""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict

import numpy as np

from . import runtimes
from .evalset import EvalSet


# Ops whose kernel runs a graph of other ops (a Scan over the batch rows, a Loop, an If): the profiler times each
# node inside too, so counting the container as well would count its body twice. What it adds of its own is
# outside the kernels (model_run_ms - kernel_ms).
CONTAINERS = frozenset({"Scan", "Loop", "If"})
# Matrix products: at batch 1 and a sentence's length, the only ops ONNX Runtime splits over its threads.
GEMM_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul", "MatMulInteger", "MatMulIntegerToFloat", "QLinearMatMul",
                      "DynamicQuantizeMatMul", "QGemm", "MatMulNBits", "QAttention", "Attention"})


def aggregate_profile(events: list[dict], runs: int) -> dict:
    """Kernel time per op type (ms per inference and share), and the matrix products' part of it (gemm_ms), from
    an ORT enable_profiling trace."""
    per_op, calls, total_run = defaultdict(float), defaultdict(int), 0.0
    model_runs = 0
    for e in events:
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time"):
            op = e.get("args", {}).get("op_name", "?")
            if op in CONTAINERS:
                continue
            per_op[op] += e.get("dur", 0) / 1000
            calls[op] += 1
        elif e.get("cat") == "Session" and e.get("name") == "model_run":
            total_run += e.get("dur", 0) / 1000
            model_runs += 1
    kernels = sum(per_op.values())
    ops = sorted(per_op, key=per_op.get, reverse=True)
    return {
        "runs": runs,
        "model_run_ms": total_run / max(model_runs, 1),
        "kernel_ms": kernels / max(runs, 1),
        "gemm_ms": sum(per_op[op] for op in GEMM_OPS & per_op.keys()) / max(runs, 1),
        "ops": [{"op": op, "ms": per_op[op] / max(runs, 1), "share": per_op[op] / kernels if kernels else 0.0,
                 "calls_per_run": calls[op] / max(runs, 1)} for op in ops],
    }


def profile_onnx(model: str, data: EvalSet, rows: list[int], *, threads: int = 1, warmup: int = 10,
                 pad_to: int | None = None) -> dict:
    """Profile `model` at batch 1 on eval `rows` (true length, or `pad_to`) after `warmup` unprofiled-in-the-result
    runs; the result holds only the events of the timed rows."""
    runtime = runtimes.choose(model)  # onnxruntime, or the one that registers a raw-text model's custom ops
    with tempfile.TemporaryDirectory(prefix="edgebert-profile-") as tmp:
        loaded = runtime.open(model, threads, profile=os.path.join(tmp, "ort"))
        session = loaded.session

        def feed(row):
            return loaded.prepare(data.batch([row], pad_to or int(data.lengths[row])))

        for i in range(warmup):
            session.run(None, feed(i % data.n))
        for f in [feed(r) for r in rows]:
            session.run(None, f)
        with open(session.end_profiling()) as f:
            events = json.load(f)
    # The trace also holds the warmup runs: keep the events from the first timed model_run on.
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    keep = runs[-len(rows):]
    start = keep[0]["ts"] if keep else 0
    result = aggregate_profile([e for e in events if e.get("ts", 0) >= start], len(rows))
    result.update({"model": os.path.basename(model), "threads": threads, "pad_to": pad_to,
                   "onnxruntime": loaded.version,
                   "mean_length": float(np.mean([pad_to or int(data.lengths[r]) for r in rows]))})
    return result
