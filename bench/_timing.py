"""Children of bench/compare.py that time something in a process of their own (thread pools spin:
two models timed in one process, or beside a busy one, inflate each other's latency).

    python bench/_timing.py torch --model DIR --inputs EVAL.npz --threads N --warmup W --runs R [--pad-to L] --json OUT
    python bench/_timing.py model2vec --model DIR --inputs EVAL.npz --threads N --warmup W --runs R --json OUT
    python bench/_timing.py gemm --op matmulinteger|matmul --shape MxKxN --threads N --seconds S --json OUT
    python bench/_timing.py profile --model FILE.onnx --inputs EVAL.npz --threads N --runs R [--pad-to L] --json OUT

ONNX and TFLite files are timed by the project's harness (`python -m device_tests run`), never here.
`torch` mirrors that harness for a Hugging Face checkpoint in PyTorch eager, and `model2vec` for a model2vec
pipeline: the same rows, warmup, timed region (the model's call only), statistics, peak RSS and separate
untimed accuracy pass.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

from edgebert.device_tests.evalset import INPUTS, EvalSet, metric
from edgebert.device_tests.files import write_json
from edgebert.device_tests.harness import latency_stats, peak_rss_mb
from edgebert.device_tests.profile import profile_onnx


def timed_rows(n: int, warmup: int, runs: int) -> list[int]:
    """The eval rows the harness (and `torch` below) times at batch 1: row (warmup + i) mod n."""
    return [(warmup + i) % n for i in range(runs)]


def _feed_length(data: EvalSet, row: int, pad_to: int | None) -> int:
    return pad_to or int(data.lengths[row])


def _timed(data: EvalSet, prepare, infer, warmup: int, runs: int) -> tuple[float, list[float], np.ndarray]:
    """The harness's protocol: a first call, `warmup` untimed calls, the timed rows (the call only, its input
    prepared before the clock starts), then every row once, untimed, for the scores: (first ms, timed ms, outputs)."""
    feed = prepare(0)
    t0 = time.perf_counter_ns()
    infer(feed)
    first_ms = (time.perf_counter_ns() - t0) / 1e6
    for i in range(warmup):
        infer(prepare(i % data.n))
    ms = []
    for row in timed_rows(data.n, warmup, runs):
        feed = prepare(row)
        t0 = time.perf_counter_ns()
        infer(feed)
        ms.append((time.perf_counter_ns() - t0) / 1e6)
    return first_ms, ms, np.concatenate([infer(prepare(r)) for r in range(data.n)])


def _result(args, data: EvalSet, runtime: dict, model: dict, load_ms: float, timed: tuple) -> dict:
    """The harness's JSON for a run of `_timed`."""
    first_ms, ms, outputs = timed
    result = {
        "complete": True,
        "runtime": {**runtime, "python": platform.python_version()},
        "model": model,
        "settings": {"threads": args.threads, "warmup": args.warmup, "runs": len(ms), "batch": 1,
                     "pad_to": getattr(args, "pad_to", None)},
        "load_ms": load_ms,
        "first_inference_ms": first_ms,
        "latency_ms": latency_stats(ms),
        "throughput": len(ms) / (sum(ms) / 1000),
        "peak_rss_mb": peak_rss_mb(),
        "n_examples": data.n,
        "warnings": [],
    }
    if data.labels is not None:
        scores, predictions = metric(outputs, data.labels, data.task)
        result.update(scores)
        result["predictions"] = predictions
    return result


def run_torch(args) -> dict:
    """A transformers checkpoint (AutoModelForSequenceClassification, as its users load it) in FP32 eager."""
    import torch

    torch.set_num_threads(args.threads)
    import transformers
    from transformers import AutoModelForSequenceClassification

    data = EvalSet(args.inputs)
    t0 = time.perf_counter()
    model = AutoModelForSequenceClassification.from_pretrained(args.model).eval()
    load_ms = (time.perf_counter() - t0) * 1000

    def prepare(row: int) -> dict:
        b = data.batch([row], _feed_length(data, row, args.pad_to))
        return {k: torch.from_numpy(np.ascontiguousarray(b[k], dtype=np.int64)) for k in INPUTS if k in b}

    def infer(feed) -> np.ndarray:
        return model(**feed).logits.numpy()

    with torch.inference_mode():
        timed = _timed(data, prepare, infer, args.warmup, args.runs)
    weights = sorted(Path(args.model).glob("*.safetensors")) or sorted(Path(args.model).glob("pytorch_model*.bin"))
    return _result(args, data, {"backend": "pytorch", "version": torch.__version__,
                                "transformers": transformers.__version__,
                                "attn_implementation": getattr(model.config, "_attn_implementation", None)},
                   {"file": weights[0].name if weights else Path(args.model).name,
                    "bytes": sum(p.stat().st_size for p in weights)}, load_ms, timed)


def run_model2vec(args) -> dict:
    """A model2vec pipeline (StaticModelPipeline, as its users load it) called on each sentence's text, as its users
    call it: its tokenizer runs inside the timed call, where the harness's models get token ids (the eval set's
    `text` rows are the same sentences)."""
    import model2vec
    from model2vec.inference import StaticModelPipeline
    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads)  # numpy's BLAS; the tokenizer is single-threaded at batch 1
    data = EvalSet(args.inputs)
    with np.load(args.inputs) as f:
        texts = f["text"].tolist()
    t0 = time.perf_counter()
    pipeline = StaticModelPipeline.from_pretrained(args.model)
    load_ms = (time.perf_counter() - t0) * 1000
    timed = _timed(data, lambda row: [texts[row]], pipeline.predict_proba, args.warmup, args.runs)
    return _result(args, data, {"backend": "model2vec", "version": model2vec.__version__},
                   {"file": Path(args.model).name, "bytes": model2vec_bytes(args.model)}, load_ms, timed)


def model2vec_bytes(folder) -> int:
    """A model2vec model's size: every file save_pretrained writes (vectors, head, tokenizer, config), as shipped."""
    return sum(f.stat().st_size for f in Path(folder).iterdir() if f.is_file())


# ---------------------------------------------------------------------------------------------
# GEMM throughput: one MatMulInteger or MatMul node, the weight a constant as in a real model.


def gemm_model(op: str, m: int, k: int, n: int, weight: str = "s8"):
    """A one-node ONNX model: A [M, K] (u8 or f32) input times a constant B [K, N] (s8/u8 or f32)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    if op == "matmulinteger":
        wdtype = np.int8 if weight == "s8" else np.uint8
        b = rng.integers(-128 if weight == "s8" else 0, 128 if weight == "s8" else 256, size=(k, n)).astype(wdtype)
        inputs = [helper.make_tensor_value_info("A", TensorProto.UINT8, [m, k])]
        zero_a = numpy_helper.from_array(np.array(128, dtype=np.uint8), "a_zero")
        zero_b = numpy_helper.from_array(np.array(0, dtype=wdtype), "b_zero")
        node = helper.make_node("MatMulInteger", ["A", "B", "a_zero", "b_zero"], ["Y"])
        out = helper.make_tensor_value_info("Y", TensorProto.INT32, [m, n])
        inits = [numpy_helper.from_array(b, "B"), zero_a, zero_b]
    elif op == "matmul":
        b = rng.standard_normal((k, n)).astype(np.float32)
        inputs = [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])]
        node = helper.make_node("MatMul", ["A", "B"], ["Y"])
        out = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])
        inits = [numpy_helper.from_array(b, "B")]
    else:
        raise SystemExit(f"unknown op {op}: use matmulinteger or matmul")
    graph = helper.make_graph([node], "gemm", inputs, [out], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def run_gemm(args) -> dict:
    import onnxruntime as ort

    m, k, n = (int(x) for x in args.shape.lower().split("x"))
    model = gemm_model(args.op, m, k, n, args.weight)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    a = (rng.integers(0, 256, size=(m, k)).astype(np.uint8) if args.op == "matmulinteger"
         else rng.standard_normal((m, k)).astype(np.float32))
    feed = {"A": a}
    for _ in range(3):
        session.run(None, feed)
    ms, start = [], time.perf_counter()
    while time.perf_counter() - start < args.seconds or len(ms) < 5:
        t0 = time.perf_counter_ns()
        session.run(None, feed)
        ms.append((time.perf_counter_ns() - t0) / 1e6)
    ops = 2 * m * k * n
    p50 = float(np.median(ms))
    return {"complete": True, "op": args.op, "weight": args.weight if args.op == "matmulinteger" else "f32",
            "shape": [m, k, n], "threads": args.threads, "calls": len(ms), "ops_per_call": ops,
            "latency_ms": latency_stats(ms), "gops_p50": ops / (p50 * 1e6), "gops_best": ops / (min(ms) * 1e6),
            "onnxruntime": ort.__version__}


# ---------------------------------------------------------------------------------------------
# Op-level profile: ORT's own profiler, aggregated per op type (edgebert.device_tests.profile).


def run_profile(args) -> dict:
    data = EvalSet(args.inputs)
    rows = timed_rows(data.n, args.warmup, args.runs)
    return {"complete": True, **profile_onnx(args.model, data, rows, threads=args.threads, warmup=args.warmup,
                                             pad_to=args.pad_to)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    for timed in ("torch", "profile", "model2vec"):  # a model timed on an eval set, in this process
        t = sub.add_parser(timed)
        t.add_argument("--model", required=True)
        t.add_argument("--inputs", required=True)
        t.add_argument("--threads", type=int, default=1)
        t.add_argument("--warmup", type=int, default=10)
        t.add_argument("--runs", type=int, default=100)
        if timed != "model2vec":  # it averages its tokens' vectors: there is nothing to pad
            t.add_argument("--pad-to", type=int)
        t.add_argument("--json", required=True)
    g = sub.add_parser("gemm")
    g.add_argument("--op", required=True, choices=("matmulinteger", "matmul"))
    g.add_argument("--weight", default="s8", choices=("s8", "u8"), help="MatMulInteger weight type (A is u8)")
    g.add_argument("--shape", default="1024x1024x1024")
    g.add_argument("--threads", type=int, default=1)
    g.add_argument("--seconds", type=float, default=2.0)
    g.add_argument("--json", required=True)
    args = p.parse_args(argv)
    result = {"torch": run_torch, "model2vec": run_model2vec, "gemm": run_gemm, "profile": run_profile}[args.what](args)
    write_json(args.json, result, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
