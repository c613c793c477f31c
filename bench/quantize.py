"""Real check of export + quantization on the SST-2 teacher: size, accuracy, agreement, latency.

    python bench/quantize.py --teacher ../shared/models/minilm-l6-sst2 --data ../shared/data

Each variant is built with the public verbs (`export.export`, `quantize.quantize`), scored on the
872 SST-2 dev sentences in its own runtime, and timed at batch 1 in its OWN subprocess (thread
pools spin and interfere when models share a process). Writes bench/results/quantize.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from edgebert.device_tests.files import write_json

ROOT = Path(__file__).resolve().parents[1]


def tokenize(tokenizer, sentences: list[str], labels: list[int], max_length: int = 128) -> dict:
    enc = tokenizer(sentences, truncation=True, max_length=max_length, padding="max_length", return_tensors="np")
    lengths = enc["attention_mask"].sum(1).astype(np.int32)
    return {"input_ids": enc["input_ids"].astype(np.int32), "attention_mask": enc["attention_mask"].astype(np.int32),
            "token_type_ids": enc["token_type_ids"].astype(np.int32), "lengths": lengths,
            "labels": np.array(labels, dtype=np.int64)}


def read_tsv(path: Path) -> tuple[list[str], list[int]]:
    rows = [line.rstrip("\n").split("\t") for line in path.read_text().splitlines()[1:] if line.strip()]
    return [r[0].strip() for r in rows], [int(r[1]) for r in rows]


def time_model(path: str, arrays_path: str, threads: int, runs: int) -> dict:
    """Child process: p50 latency at batch 1 for real lengths and for padded 128."""
    import torch

    torch.set_num_threads(threads)
    with np.load(arrays_path) as f:
        arrays = {k: f[k] for k in f.files}
    names = ("input_ids", "attention_mask", "token_type_ids")
    if path.endswith((".onnx", ".tflite")):
        from edgebert.export import formats

        model = formats.of_file(path).open(path, threads)

        def run(i: int, t: int):
            model.run({k: arrays[k][i:i + 1, :t] for k in names})
    else:
        from edgebert.checkpoint import load

        net = load(path).eval()

        def run(i: int, t: int):
            with torch.no_grad():
                net(**{k: torch.from_numpy(arrays[k][i:i + 1, :t].astype(np.int64)) for k in names})

    def p50(lengths) -> float:
        for i in range(5):
            run(i, lengths(i))
        times = []
        for i in range(runs):
            start = time.perf_counter()
            run(i, lengths(i))
            times.append((time.perf_counter() - start) * 1000)
        return float(np.median(times))

    real = p50(lambda i: int(arrays["lengths"][i]))
    padded = p50(lambda i: 128)
    return {"p50_ms_real_lengths": round(real, 2), "p50_ms_padded_128": round(padded, 2)}


def timed(path: Path, arrays_path: Path, threads: int, runs: int) -> dict:
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    cmd = [sys.executable, __file__, "--time", str(path), "--arrays", str(arrays_path), "--threads", str(threads),
           "--runs", str(runs)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", default=str(ROOT.parent / "shared/models/minilm-l6-sst2"))
    ap.add_argument("--data", default=str(ROOT.parent / "shared/data"))
    ap.add_argument("--work", default="/tmp/edgebert-bench-quantize")
    ap.add_argument("--out", default=str(ROOT / "bench/results/quantize.json"))
    ap.add_argument("--calibration", type=int, default=256, help="train sentences used for calibration/QAT")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--only", nargs="*", help="variant names to build (default: all)")
    ap.add_argument("--time", help=argparse.SUPPRESS)
    ap.add_argument("--arrays", help=argparse.SUPPRESS)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    if args.time:
        print(json.dumps(time_model(args.time, args.arrays, args.threads, args.runs)))
        return
    run(args)


def sst2_sets(teacher: Path, data: Path, calibration: int) -> tuple[dict, dict]:
    """SST-2 dev (every sentence) and `calibration` train sentences (seed 0), tokenized with the teacher's tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(teacher)
    dev = tokenize(tokenizer, *read_tsv(data / "sst2/dev.tsv"))
    train_s, train_l = read_tsv(data / "sst2/train.tsv")
    pick = np.random.default_rng(0).choice(len(train_s), calibration, replace=False)
    return dev, tokenize(tokenizer, [train_s[i] for i in pick], [train_l[i] for i in pick])


def run(args: argparse.Namespace) -> None:
    """Build, score and time every variant (or those --only names), writing --out after each."""
    import torch

    from edgebert.checkpoint import load
    from edgebert.export import Artifact, InputSpec, compare, torch_logits

    torch.set_num_threads(1)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    teacher = Path(args.teacher)
    dev, calib = sst2_sets(teacher, Path(args.data), args.calibration)
    np.savez(work / "dev.npz", **dev)

    model = load(teacher).eval()
    spec = InputSpec.of(model)
    ref = torch_logits(model, dev, spec)
    parity = float(np.abs(ref - np.load(teacher / "dev_logits.npy")).max())
    results = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
               "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                           "threads": args.threads, "note": "shared 2-core x86 (AVX2, no VNNI) with other jobs "
                                                            "running: latencies are noisy, ratios matter"},
               "teacher": str(teacher), "pytorch_vs_dev_logits_max_abs_diff": parity,
               "calibration": f"{args.calibration} SST-2 train sentences (seed 0)",
               "mixed_precision_note": "sensitivity measured on SST-2 dev (the eval split), as configured",
               "variants": {}}
    if args.only and Path(args.out).is_file():  # a partial rerun updates the recorded variants
        results["variants"] = json.loads(Path(args.out).read_text()).get("variants", {})
        results["command"] += "  (partial rerun; other variants from the previous run)"
    acc_ref = float((ref.argmax(-1) == dev["labels"]).mean() * 100)
    results["pytorch_fp32"] = {"accuracy": acc_ref, "bytes": (teacher / "model.safetensors").stat().st_size,
                               **timed(teacher, work / "dev.npz", args.threads, args.runs)}

    def record(name: str, path: Path, built_s: float, meta: dict) -> dict:
        got = Artifact(path).run(dev)
        c = compare(dev, got, ref)  # fractions; this file records points
        entry = {"file": path.name, "bytes": path.stat().st_size, "accuracy": c["value"] * 100,
                 "accuracy_drop_vs_pytorch": c["metric_drop"] * 100, "agreement_vs_pytorch": c["agreement"],
                 "max_abs_logit_diff": c["max_abs_diff"], "build_s": round(built_s, 1),
                 **timed(path, work / "dev.npz", args.threads, args.runs)}
        for key in ("method", "float", "static", "sensitivity", "int8_embeddings", "optimization", "fused_ops",
                    "fusion_fallback", "signatures"):
            if key in meta:
                entry[key] = meta[key]
        results["variants"][name] = entry
        print(name, json.dumps(entry), flush=True)
        write_json(args.out, results)
        return entry

    build_variants(model, dev, calib, work, args.only, record)
    for name, v in results["variants"].items():
        base = results["variants"].get("tflite_fp32" if name.startswith("tflite") else "onnx_fp32")
        if base:
            v["smaller_than_fp32"] = round(base["bytes"] / v["bytes"], 2)
    write_json(args.out, results)


def build_variants(model, dev: dict, calib: dict, work: Path, only: list[str] | None, record) -> None:
    """Export and quantize each wanted variant with the public verbs, handing each file to `record`."""
    from edgebert.export import Budget, OnnxExportConfig, TFLiteExportConfig, export
    from edgebert.quantize import DynamicInt8Config, MixedPrecisionConfig, StaticInt8Config, quantize

    def want(name: str) -> bool:
        return not only or name in only

    tight = Budget(max_abs_diff=1e-3)
    if any(want(n) for n in ("onnx_fp32", "onnx_dynamic_int8")):
        t = time.time()
        fp32_onnx = export(model, OnnxExportConfig(), out=work / "fp32.onnx", eval_data=dev, budget=tight)
        record("onnx_fp32", fp32_onnx.path, time.time() - t, fp32_onnx.meta)
    if want("onnx_dynamic_int8"):
        t = time.time()
        r = quantize(fp32_onnx.path, DynamicInt8Config(), out=work / "dynamic_int8.onnx", eval_data=dev)
        record("onnx_dynamic_int8", r.path, time.time() - t, r.meta)
    if want("onnx_static_int8_mixed"):
        t = time.time()
        r = quantize(model, MixedPrecisionConfig(budget=Budget(max_metric_drop=0.01)), out=work / "static_mixed.onnx",
                     calibration=calib, eval_data=dev)
        record("onnx_static_int8_mixed", r.path, time.time() - t, r.meta)
    if any(want(n) for n in ("tflite_fp32", "tflite_dynamic_int8", "tflite_full_int8")):
        t = time.time()
        fp32_tfl = export(model, TFLiteExportConfig(), out=work / "fp32.tflite", eval_data=dev, budget=tight)
        record("tflite_fp32", fp32_tfl.path, time.time() - t, fp32_tfl.meta)
        if want("tflite_dynamic_int8"):
            t = time.time()
            r = quantize(fp32_tfl.path, DynamicInt8Config(), out=work / "dynamic_int8.tflite", eval_data=dev)
            record("tflite_dynamic_int8", r.path, time.time() - t, r.meta)
        if want("tflite_full_int8"):
            t = time.time()
            r = quantize(fp32_tfl.path, StaticInt8Config(), out=work / "full_int8.tflite", calibration=calib, eval_data=dev)
            full = record("tflite_full_int8", r.path, time.time() - t, r.meta)
            if full["accuracy_drop_vs_pytorch"] > 1.0:  # let the search decide
                t = time.time()
                r = quantize(fp32_tfl.path, MixedPrecisionConfig(budget=Budget(max_metric_drop=0.01)),
                             out=work / "full_int8_mixed.tflite", calibration=calib, eval_data=dev)
                record("tflite_full_int8_mixed", r.path, time.time() - t, r.meta)


if __name__ == "__main__":
    main()
