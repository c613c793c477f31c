"""What ONNX Runtime's fusions do for DeBERTa-v3 and ModernBERT, and what that costs next to a BERT of the
same size (issue 11, item 5).

    python bench/families.py [--work runs/families] [--lengths 32,128] [--repeats 5] [--runs 40]

ORT's transformers optimizer has no DeBERTa or ModernBERT model type, so edgebert runs its "bert" fusions
on every family and keeps them only where the fused graph still matches the unfused one. This script
builds random-init classifiers of one size (4 layers, hidden 384, 12 heads, FFN 1536, a 30,522-token
vocabulary) as transformers writes them, loads each with `edgebert.load`, exports it to fused ONNX
(`edgebert.export`) and to dynamic INT8 (`edgebert.quantize`), counts the op types left in each graph,
and times every file at batch 1, 1 thread, at fixed lengths, each run in its own process
(`python -m edgebert.device_tests run`), families alternating inside each repeat. Latency is reported
as medians and as ratios to the BERT timed in the same repeat (and of the best repeats, the least
disturbed): on a shared machine only the ratios mean anything. Writes bench/results/families.json
and bench/results/families.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from edgebert.device_tests.files import write_bytes, write_json

ROOT = Path(__file__).resolve().parents[1]
SIZE = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=4, num_attention_heads=12, intermediate_size=1536,
            max_position_embeddings=512, pad_token_id=0)
FAMILIES = {  # transformers config class, and what makes it that family's typical checkpoint
    "bert": ("BertConfig", {}),
    "deberta": ("DebertaV2Config", dict(relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=256,
                                        max_relative_positions=-1, share_att_key=True, norm_rel_ebd="layer_norm",
                                        position_biased_input=False, type_vocab_size=0, pooler_hidden_act="gelu",
                                        layer_norm_eps=1e-7)),
    "modernbert": ("ModernBertConfig", dict(local_attention=128, global_attn_every_n_layers=3)),
}
STEM = {"bert": "Bert", "deberta": "DebertaV2", "modernbert": "ModernBert"}
# The ops the tables show: ORT's fused kernels first, then what stays unfused.
FUSED = ("Attention", "EmbedLayerNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
         "BiasGelu", "FastGelu", "Gelu", "QAttention", "DynamicQuantizeMatMul", "MatMulIntegerToFloat")
UNFUSED = ("MatMul", "MatMulInteger", "DynamicQuantizeLinear", "Softmax", "LayerNormalization", "GatherElements",
           "Add", "Mul")


def log(message: str) -> None:
    print(f"families: {message}", file=sys.stderr, flush=True)


def build(family: str, folder: Path) -> None:
    """A random-init ...ForSequenceClassification saved by transformers, as a user's checkpoint would be."""
    import torch
    import transformers as T

    cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    model = getattr(T, f"{STEM[family]}ForSequenceClassification")(getattr(T, cls)(**SIZE, **extra, num_labels=2))
    model.eval().save_pretrained(folder)


def eval_set(length: int, rows: int, path: Path) -> Path:
    """`rows` sequences of exactly `length` random tokens (no padding): every model sees the same ids."""
    rng = np.random.default_rng(length)
    ids = rng.integers(1000, SIZE["vocab_size"], (rows, length)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 101, 102
    np.savez(path, input_ids=ids, attention_mask=np.ones_like(ids), token_type_ids=np.zeros_like(ids),
             lengths=np.full(rows, length, np.int32), labels=rng.integers(0, 2, rows))
    return path


def op_counts(path: Path) -> dict[str, int]:
    import onnx

    return dict(sorted(Counter(n.op_type for n in onnx.load(str(path)).graph.node).items()))


def export_all(family: str, work: Path, verify: Path) -> dict:
    """The fused FP32 and dynamic-INT8 files of one family, their metadata and op counts."""
    from edgebert import load
    from edgebert.export import OnnxExportConfig, export
    from edgebert.quantize import DynamicInt8Config, quantize
    from edgebert.stats import summary

    folder = work / "hf" / family
    if not (folder / "config.json").is_file():
        build(family, folder)
    model = load(folder).eval()
    fp32 = export(model, OnnxExportConfig(), out=work / f"{family}.fp32.onnx", eval_data=verify)
    int8 = quantize(fp32.path, DynamicInt8Config(), out=work / f"{family}.int8.onnx", eval_data=verify)
    facts = summary(model, lengths=(32, 128))
    return {"facts": facts, "files": {
        "fp32": {"path": str(fp32.path), "bytes": fp32.path.stat().st_size, "optimization": fp32.meta["optimization"],
                 "fusion_fallback": fp32.meta.get("fusion_fallback"), "fused_ops": fp32.meta.get("fused_ops", {}),
                 "ops": op_counts(fp32.path), "verification": _verified(fp32.verification)},
        "int8": {"path": str(int8.path), "bytes": int8.path.stat().st_size, "ops": op_counts(int8.path),
                 "verification": _verified(int8.verification)}}}


def _verified(v: dict | None) -> dict | None:
    return None if v is None else {k: v.get(k) for k in ("max_abs_diff", "agreement", "cosine") if k in v}


def time_file(model: Path, inputs: Path, runs: int, warmup: int, out: Path) -> float:
    """p50 ms of one harness run in a process of its own."""
    argv = [sys.executable, "-m", "edgebert.device_tests", "run", "--model", str(model), "--inputs", str(inputs),
            "--threads", "1", "--warmup", str(warmup), "--runs", str(runs), "--json", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"})
    if proc.returncode != 0:
        raise SystemExit(f"families: timing {model.name} failed: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return float(json.loads(out.read_text())["latency_ms"]["p50"])


def median(xs) -> float:
    return float(np.median(xs))


def render(result: dict) -> str:
    """bench/results/families.md: the fusion table and the latency table, from the JSON."""
    fams, lengths = list(result["families"]), result["settings"]["lengths"]
    lines = ["# Families next to a BERT of the same size: ORT fusions and latency", "",
             f"_Generated by `{result['command']}` on {result['date']}. {result['note']}_", "",
             f"All three: {SIZE['num_hidden_layers']} layers, hidden {SIZE['hidden_size']}, "
             f"{SIZE['num_attention_heads']} heads, FFN {SIZE['intermediate_size']}, "
             f"vocabulary {SIZE['vocab_size']:,}; "
             "random init, transformers' own configs (DeBERTa-v3: c2p+p2c, 256 log buckets, shared key, norm_rel_ebd; "
             "ModernBERT: rotary, global every 3rd layer, 128-token window elsewhere, GeGLU, no biases).", "",
             "## Ops in the exported graphs", "",
             "| family | file | optimization | " + " | ".join(FUSED + UNFUSED) + " |",
             "|---|---|---|" + "---:|" * len(FUSED + UNFUSED)]
    for f in fams:
        for kind, info in result["families"][f]["files"].items():
            opt = info["optimization"] if kind == "fp32" else "dynamic INT8"
            counts = " | ".join(str(info["ops"].get(op, "")) for op in FUSED + UNFUSED)
            lines.append(f"| {f} | {kind} | {opt} | {counts} |")
    lines += ["", "## Size, FLOPs and latency (batch 1, 1 thread, ONNX Runtime CPU)", "",
              "FLOPs are `edgebert.stats.flops`: what the graph computes per sequence (sliding-window layers at full "
              "T×T, as the padded graph computes them; in brackets `flops_windowed`, the pairs inside "
              "the window). ×BERT: this family's p50 over the BERT's in the same repeat, median over repeats; in "
              "brackets, the ratio of the two best repeats (the least disturbed).", "",
              "| family | params | FLOPs " + " | FLOPs ".join(map(str, lengths)) + " | "
              + " | ".join(f"{k} p50 ms @{t} | {k} ×BERT @{t}" for k in ("fp32", "int8") for t in lengths) + " |",
              "|---|---:|" + "---:|" * len(lengths) + "---:|---:|" * 2 * len(lengths)]
    for f in fams:
        r = result["families"][f]
        windowed = r["facts"].get("flops_windowed", {})
        cells = [f"{r['facts']['params']:,}"] + [
            f"{r['facts']['flops'][str(t)] / 1e9:.3f} G" + (f" ({windowed[str(t)] / 1e9:.3f} G windowed)"
                                                           if windowed.get(str(t), r['facts']['flops'][str(t)])
                                                           != r['facts']['flops'][str(t)] else "")
            for t in lengths]
        for kind in ("fp32", "int8"):
            for t in lengths:
                lat = r["latency"][kind][str(t)]
                cells += [f"{lat['p50_ms']:.2f}", f"{lat['ratio_to_bert']:.2f} ({lat['ratio_to_bert_best']:.2f})"]
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    lines += ["", "## What it means", "", *result["findings"], ""]
    return "\n".join(lines)


def findings(result: dict) -> list[str]:
    """The fusions each family gets, in words, from the op counts (no hand-written figures)."""
    out = []
    bert = result["families"]["bert"]["files"]["fp32"]["fused_ops"]
    for f, r in result["families"].items():
        fp32 = r["files"]["fp32"]
        fused = ", ".join(f"{k} {v}" for k, v in fp32["fused_ops"].items()) or "none"
        missing = sorted(set(bert) - set(fp32["fused_ops"]))
        base = result["families"]["bert"]["latency"]

        def spread(kind: str, t: int) -> str:
            ratios = [a / b for a, b in zip(r["latency"][kind][str(t)]["p50_ms_per_repeat"],
                                            base[kind][str(t)]["p50_ms_per_repeat"])]
            median_ratio = r["latency"][kind][str(t)]["ratio_to_bert"]
            return f"{median_ratio:.2f}× at {t} (repeats {min(ratios):.2f}–{max(ratios):.2f})"

        ratio = ", ".join(spread("fp32", t) for t in result["settings"]["lengths"])
        int8 = ", ".join(spread("int8", t) for t in result["settings"]["lengths"])
        flop = ", ".join(f"{r['facts']['flops'][str(t)] / result['families']['bert']['facts']['flops'][str(t)]:.2f}× "
                         f"at {t}" for t in result["settings"]["lengths"])
        out.append(f"- **{f}**: {fp32['optimization']}; fused {fused}"
                   + (f"; not fused (BERT has them): {', '.join(missing)}" if missing else "")
                   + (f"; unfused MatMul {fp32['ops'].get('MatMul', 0)}, Softmax {fp32['ops'].get('Softmax', 0)}"
                      if f != "bert" else "")
                   + (f". FP32 latency {ratio} BERT's, for {flop} its FLOPs; INT8 latency {int8} BERT's INT8."
                      if f != "bert" else "."))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default=str(ROOT / "runs" / "families"), help="models, files and run logs")
    p.add_argument("--lengths", default="32,128")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--runs", type=int, default=40, help="timed runs per harness call")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rows", type=int, default=20, help="distinct sequences per length")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "families.json"))
    args = p.parse_args(argv)
    from edgebert.device_tests.device import describe

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    lengths = [int(t) for t in args.lengths.split(",")]
    t_start, load_before = time.time(), os.getloadavg()
    verify = eval_set(16, 8, work / "verify_t16.npz")
    results = {}
    for f in FAMILIES:
        log(f"{f}: build, export, quantize")
        results[f] = export_all(f, work, verify)
    sets = {t: eval_set(t, args.rows, work / f"timing_t{t}.npz") for t in lengths}
    p50 = {(f, k, t): [] for f in FAMILIES for k in ("fp32", "int8") for t in lengths}
    names = list(FAMILIES)
    for rep in range(args.repeats):
        order = names[rep % len(names):] + names[:rep % len(names)]  # who goes first rotates
        for t in lengths:
            for kind in ("fp32", "int8"):
                for f in order:
                    out = work / "runs" / f"{f}-{kind}-t{t}-r{rep}.json"
                    out.parent.mkdir(exist_ok=True)
                    p50[f, kind, t].append(time_file(Path(results[f]["files"][kind]["path"]), sets[t], args.runs,
                                                     args.warmup, out))
        log(f"repeat {rep + 1}/{args.repeats} done")
    for f in FAMILIES:
        results[f]["latency"] = {k: {str(t): {
            "p50_ms": median(p50[f, k, t]), "p50_ms_per_repeat": [round(x, 3) for x in p50[f, k, t]],
            "ratio_to_bert": median([a / b for a, b in zip(p50[f, k, t], p50["bert", k, t])]),
            "ratio_to_bert_best": min(p50[f, k, t]) / min(p50["bert", k, t])}
            for t in lengths} for k in ("fp32", "int8")}
        for info in results[f]["files"].values():
            info["path"] = Path(info["path"]).name
    result = {
        "command": "python bench/families.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "note": ("Taken on a 2-core machine (load average "
                 f"{load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after): absolute milliseconds are noisy, "
                 "the in-run ratios to BERT are the figures to read."),
        "machine": describe(),
        "settings": {"lengths": lengths, "repeats": args.repeats, "runs": args.runs, "warmup": args.warmup,
                     "rows": args.rows, "threads": 1, "batch": 1, "size": SIZE},
        "families": results,
        "wall_s": round(time.time() - t_start, 1),
    }
    result["findings"] = findings(result)
    out = Path(args.out)
    write_json(out, result, indent=1)
    write_bytes(out.with_suffix(".md"), render(result).encode())
    log(f"wrote {out} and {out.with_suffix('.md')} ({result['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
