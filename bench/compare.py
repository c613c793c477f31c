"""Every figure side by side, from one run on this machine: the SST-2 teacher as users run it today
(PyTorch FP32 eager; Hugging Face Optimum ONNX + O2 + dynamic INT8; litert-torch TFLite FP32 and
dynamic-range INT8) and model2vec distilled from it, against edgebert's compiled student (the bundle's
ONNX INT8 and TFLite INT8, and an ExecuTorch INT8 .pte: the bundle's, else exported from the student
checkpoint) and its static tier (the static bundle's ONNX INT8 and TFLite INT8, when there is one), and
this CPU's own INT8/FP32 GEMM limit.

    python bench/compare.py [--teacher DIR] [--bundle DIR] [--static-bundle DIR] [--data DIR] [--quick]
    python bench/compare.py --render          # BENCHMARKS.md again from bench/results/compare.json

BENCHMARKS.md also shows bench/results/compile-cost.json (python bench/compile_cost.py) as it finds it.

--quick (1 repeat, 20 runs, 200 dev sentences) writes runs/compare/quick/{compare.json,BENCHMARKS.md}
unless --results/--markdown say otherwise, so a smoke run never replaces the reference figures.

Every model is timed in its own process (`python -m device_tests run` for ONNX, TFLite and .pte files,
bench/_timing.py for PyTorch and model2vec): for each repeat, every model runs once, in an order that rotates
from repeat to repeat, so drift hits all of them; figures are medians over repeats, and each ratio
is taken pair by pair within a repeat before its median. Accuracy is scored once per model and
input shape over the whole SST-2 dev set (872), at 1 thread. Built files are cached under --work.
Results: bench/results/compare.json, and BENCHMARKS.md (generated here; never edit it by hand).

This file is the command line: the runs are bench/_measure.py, the figures bench/_figures.py and
the table bench/_render.py (which --render uses alone, without running anything).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from _figures import stage_costs, targets
from _measure import ROOT, log, run
from _render import render

from edgebert.device_tests.files import write_bytes, write_json
from edgebert.pipeline.report import frontier_charts

TEACHER = ROOT.parent / "shared" / "models" / "minilm-l6-sst2"
BUNDLE = ROOT / "runs" / "default" / "bundle"
STATIC_BUNDLE = ROOT / "runs" / "static-tier" / "bundle"
STATIC_COMMAND = "edgebert compile edgebert/recipes/sst2-minilm-static.toml --teacher ... --out runs/static-tier"
MRPC_BUNDLE = ROOT / "runs" / "mrpc" / "bundle"
MRPC_COMMAND = "edgebert compile edgebert/recipes/mrpc-minilm.toml --out runs/mrpc"
COMPILE_COST = ROOT / "bench" / "results" / "compile-cost.json"
PROMISE = ROOT / "bench" / "results" / "promise.json"
WORK = ROOT / "runs" / "compare"
RESULTS = ROOT / "bench" / "results" / "compare.json"
MARKDOWN = ROOT / "BENCHMARKS.md"
PROMISE_DROP = 1.0  # points: the promise, and every recipe's default max_drop


def frontier(result: dict, folder: Path) -> dict[str, Path]:
    """FOLDER/pareto-{latency,size}.svg: every peer and edgebert file of the run, SST-2 dev accuracy against p50 (1
    thread, real lengths) and against size, the teacher's accuracy as a line and the promise's 1-point floor under
    it; the frontier dashed."""
    points = []
    for key, model in result["models"].items():
        p50 = result["timing"]["t1"]["real"].get(key, {}).get("p50_ms")
        accuracy = (model.get("accuracy") or {}).get("real", {}).get("accuracy")
        if p50 is None or accuracy is None:
            continue
        who, _, how = model["label"].partition(" · ")
        points.append({"stage": who, "format": how, "metric": 100 * accuracy, "latency_ms": p50,
                       "bytes": model["bytes"], "metric_name": "SST-2 dev accuracy"})
    teacher = 100 * result["models"]["pytorch-fp32"]["accuracy"]["real"]["accuracy"]
    paths = {}
    for name, svg in frontier_charts(points, teacher=teacher, max_drop=PROMISE_DROP).items():
        paths[name] = folder / f"pareto-{name}.svg"
        write_bytes(paths[name], svg.encode())
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--teacher", default=str(TEACHER), help="the fine-tuned teacher checkpoint (Hugging Face folder)")
    p.add_argument("--bundle", default=str(BUNDLE), help="the bundle `edgebert compile --teacher ... "
                   "--out runs/default` wrote (from the teacher the run compares against)")
    p.add_argument("--static-bundle", default=str(STATIC_BUNDLE),
                   help=f"the static tier's bundle `{STATIC_COMMAND}` wrote (its rows are left out when it is absent)")
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
    p.add_argument("--mrpc-bundle", default=str(MRPC_BUNDLE),
                   help="the MRPC bundle of `edgebert compile edgebert/recipes/mrpc-minilm.toml --out runs/mrpc` "
                        "(its figures go beside SST-2's when it exists)")
    p.add_argument("--render", action="store_true", help="only regenerate --markdown from --results")
    args = p.parse_args(argv)
    # A smoke run never replaces the reference figures unless told to.
    quick_dir = Path(args.work) / "quick"
    args.results = args.results or str(quick_dir / "compare.json" if args.quick else RESULTS)
    args.markdown = args.markdown or str(quick_dir / "BENCHMARKS.md" if args.quick else MARKDOWN)
    if args.render:
        result = json.loads(Path(args.results).read_text())
        result["targets"] = targets(result)  # targets added since the run: n/a where it lacks their rows
    else:
        import torch

        if not (Path(args.static_bundle) / "manifest.json").is_file():
            log(f"no static bundle at {args.static_bundle} (`{STATIC_COMMAND}` writes it): its rows are left out "
                "and the static tier's targets are n/a")
            args.static_bundle = None

        torch.set_num_threads(1)  # this process only tokenizes and loads configs; children do the timing
        result = run(args)
        mrpc = Path(args.mrpc_bundle) / "manifest.json"
        if mrpc.is_file():
            result["mrpc"] = {**stage_costs(json.loads(mrpc.read_text())), "command": MRPC_COMMAND}
        write_json(args.results, result, indent=1)
        log(f"results: {args.results}")
    # bench/compile_cost.py's and bench/promise.py's results are their own commands' figures (each names its
    # commit): shown as they left them
    others = {key: json.loads(path.read_text()) for key, path in (("compile_cost", COMPILE_COST), ("promise", PROMISE))
              if path.is_file()}
    charts = frontier(result, Path(args.results).parent)
    write_bytes(args.markdown, render({**result, **others, "charts": {k: os.path.relpath(v, Path(args.markdown).parent)
                                                                    for k, v in charts.items()}}).encode())
    log(f"table: {args.markdown}, charts: {', '.join(map(str, charts.values()))}")
    for t in result["targets"]:
        mark = "n/a " if t["pass"] is None else ("PASS" if t["pass"] else "MISS")
        print(f"{mark} {t['target']} [{t['where']}]: {t['display']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
