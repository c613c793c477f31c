"""Issue 32's batch check, measured: what the batch does to a dynamic-INT8 ONNX file's answers and speed, with ORT's
ranges over the whole batch tensor (`DynamicInt8Config(by_row=False)`, as Optimum's file has them) and with each
row run alone (edgebert's default, `quantize.onnx_ptq.by_row`).

    python bench/batch.py [--model DIR ...] [--data ../shared/data] [--threads 1 2] [--results bench/results]

Each model (default: the shared SST-2 teacher; a compile's student is OUT/stages/NN-vocab-*/model) is exported
once and quantized both ways from the same float file. On SST-2 dev: the accuracy at batch 1, each example at its
own length; how many labels flip, and the largest logit change, at batch 8 and 32 (each batch cut to its longest
row) and at batch 32 padded to 128; and the milliseconds per sentence over the whole dev set at batch 1, 8 and 32,
each file timed in a process of its own, the two files taking turns, the median of `--repeats`.
Writes RESULTS/batch.json and prints one line per file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _figures import commit

ROOT = Path(__file__).resolve().parents[1]
TEACHER = ROOT.parent / "shared" / "models" / "minilm-l6-sst2"
BATCHES = (1, 8, 32)
PADDED = 128


def build(model_dir: Path, work: Path) -> dict[str, Path]:
    """{"plain": whole-batch ranges, "by_row": each row alone} of one float export of `model_dir`, otherwise alike."""
    from edgebert import load
    from edgebert.export import OnnxExportConfig, export
    from edgebert.quantize import DynamicInt8Config, quantize

    fp32 = export(load(str(model_dir)).eval(), OnnxExportConfig(), out=work / "fp32.onnx").path
    return {name: quantize(fp32, DynamicInt8Config(by_row=name == "by_row"), out=work / f"{name}.onnx").path
            for name in ("plain", "by_row")}


def answers(path: Path, arrays: dict) -> dict:
    from edgebert.device_tests import backends

    model = backends.load(str(path), "onnxruntime", 1)
    alone = backends.logits(model, arrays, batch_size=1)
    out = {"accuracy": round(100 * float((alone.argmax(1) == arrays["labels"]).mean()), 2)}
    padded = {**arrays, "lengths": np.full_like(arrays["lengths"], PADDED)}
    for name, size, feed in (("batch_8", 8, arrays), ("batch_32", 32, arrays),
                             (f"batch_32_padded_{PADDED}", 32, padded)):
        got = backends.logits(model, feed, batch_size=size)
        out[name] = {"label_flips": int((got.argmax(1) != alone.argmax(1)).sum()),
                     "max_abs_diff": float(np.abs(got - alone).max())}
    return out


def time_file(path: str, arrays_path: str, threads: int, batch: int) -> float:
    """Child process: ms per sentence over the dev set at `batch` (after one pass to warm up)."""
    from edgebert.device_tests import backends

    with np.load(arrays_path) as f:
        arrays = {k: f[k] for k in f.files}
    model = backends.load(path, "onnxruntime", threads)
    backends.logits(model, arrays, batch_size=batch)
    start = time.perf_counter()
    backends.logits(model, arrays, batch_size=batch)
    return 1000 * (time.perf_counter() - start) / len(arrays["lengths"])


def timed(files: dict[str, Path], arrays_path: Path, threads: int, batch: int, repeats: int) -> dict[str, float]:
    runs: dict[str, list[float]] = {name: [] for name in files}
    for _ in range(repeats):
        for name, path in files.items():
            child = subprocess.run([sys.executable, __file__, "--time", str(path), str(arrays_path), str(threads),
                                    str(batch)], capture_output=True, text=True, check=True)
            runs[name].append(float(child.stdout.strip().splitlines()[-1]))
    return {name: round(statistics.median(v), 4) for name, v in runs.items()}


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--time":
        print(time_file(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", type=Path, help="an edgebert or Hugging Face checkpoint folder")
    parser.add_argument("--data", default=None, help="the data root (default: EDGEBERT_DATA or ../shared/data)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)

    from _measure import machine

    from edgebert.data import pretokenize_eval
    from edgebert.tokenizer import load_tokenizer

    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    results = {"command": "python bench/batch.py " + " ".join(sys.argv[1:] if argv is None else argv),
               "commit": commit() + ("+changes" if dirty else ""),
               "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "machine": machine(), "eval": "SST-2 dev (872 sentences, max_length 128)", "models": {}}
    for model_dir in args.model or [TEACHER]:
        with tempfile.TemporaryDirectory(prefix="edgebert-batch-") as tmp:
            work = Path(tmp)
            arrays = pretokenize_eval("sst2", load_tokenizer(model_dir), PADDED, split="dev", data_dir=args.data)
            np.savez(work / "dev.npz", **arrays)
            files = build(model_dir, work)
            entry = {name: {"bytes": path.stat().st_size, **answers(path, arrays)} for name, path in files.items()}
            for threads in args.threads:
                for batch in BATCHES:
                    for name, ms in timed(files, work / "dev.npz", threads, batch, args.repeats).items():
                        entry[name][f"ms_per_sentence_{threads}t_batch_{batch}"] = ms
            results["models"][str(model_dir)] = entry
        for name, row in entry.items():
            flips = ", ".join(f"{k}: {v['label_flips']} flips (max |d| {v['max_abs_diff']:.3g})"
                              for k, v in row.items() if k.startswith("batch_"))
            speed = ", ".join(f"{k[len('ms_per_sentence_'):]} {v} ms" for k, v in row.items() if k.startswith("ms_"))
            print(f"{Path(model_dir).name} {name}: {row['accuracy']}% at batch 1; {flips}; {speed}", flush=True)
    from edgebert.device_tests.files import write_json

    write_json(args.results / "batch.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
