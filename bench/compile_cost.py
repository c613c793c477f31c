"""Issue 31's figures: what a compile of SST-2 costs, stage by stage, on each device, and what its student scores.

    python bench/compile_cost.py [--runs cuts,default,torchrun,quick] [--work runs/cost] [--results bench/results]

Each run is a real `edgebert compile`, as a user types it, into WORK/<run> (started over each time), timed by the
compile itself: the manifest's `time` (the estimate said before the first stage trained, the time each stage and
the whole compile took) and the dev accuracy of the bundle's model.onnx (its verification, on all 872 SST-2 dev
sentences). The runs:
- default: the full default, `edgebert compile` (no teacher given: it fine-tunes MiniLM first), the long
  recipe's pipeline cut to about 30 minutes on 2 CPU cores;
- long: edgebert/recipes/sst2-minilm-long.toml, the default until issue 31 (hours on 2 CPU cores: not among the
  runs unless asked for);
- torchrun: `torchrun --standalone --nproc-per-node 2 -m edgebert compile --quick` (gloo, one bundle), and quick:
  the same in one process, whose accuracy the two processes' should match within noise;
- cuda-quick, cuda: the quick and the full default with `--device cuda` (bench/gpu_check.py runs these; on a
  machine without CUDA they are skipped, and said so);
- cuts: no compile; each change from the long recipe to the default (CUTS), and what the compile's own estimate
  says it saves on this machine.
Writes RESULTS/compile-cost.json (one object per run: device, threads_or_gpus, precision, stage_seconds,
total_s, estimate_s, dev_accuracy, command, commit, machine), the cuts and the machine they were estimated on
(cuts_machine), and compile-cost.md; runs not asked for keep their earlier entry.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from _figures import commit
from _measure import machine_line
from edgebert.device_tests.files import write_bytes, write_json
from edgebert.device_tests.metrics import points
from edgebert.device_tests.versions import versions

ROOT = Path(__file__).resolve().parents[1]
EDGEBERT = [sys.executable, "-m", "edgebert"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
LONG = "edgebert/recipes/sst2-minilm-long.toml"
# run -> (the command after `edgebert`, the launcher, what it needs)
RUNS = {
    "default": (["compile"], EDGEBERT, None),
    "long": (["compile", LONG], EDGEBERT, None),
    "torchrun": (["compile", "--quick"], TORCHRUN + ["-m", "edgebert"], None),
    "quick": (["compile", "--quick"], EDGEBERT, None),  # torchrun's run in one process: the accuracy to match
    "cuda-quick": (["compile", "--quick", "--device", "cuda"], EDGEBERT, "cuda"),
    "cuda": (["compile", "--device", "cuda"], EDGEBERT, "cuda"),
}


def shown(launcher: list[str], args: list[str], out: Path) -> str:
    """The command as a user types it."""
    head = "torchrun --standalone --nproc-per-node 2 -m edgebert" if launcher is not EDGEBERT else "edgebert"
    return " ".join([head, *args, "--out", os.path.relpath(out, ROOT)])


def measure(name: str, work: Path) -> dict:
    """Run `name` into WORK/name and read what its manifest says it cost."""
    import torch

    args, launcher, needs = RUNS[name]
    out = work / name
    if needs == "cuda" and not torch.cuda.is_available():
        return {"skipped": f"no CUDA GPU on this machine (torch {torch.__version__})"}
    shutil.rmtree(out, ignore_errors=True)
    command = [*launcher, *args, "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if launcher is TORCHRUN else None  # one core a process
    started = time.time()
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    took = time.time() - started
    manifest = json.loads((out / "bundle" / "manifest.json").read_text())
    device, precision, peak = _ran_on(out)
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    return {"device": device, "threads_or_gpus": gpus or (2 if launcher is TORCHRUN else torch.get_num_threads()),
            "processes": 2 if launcher is TORCHRUN else 1, "precision": precision,
            "stage_seconds": manifest["time"]["stages"],
            "total_s": round(took, 1), "estimate_s": (manifest["time"]["estimate"] or {}).get("total_s"),
            "dev_accuracy": points(manifest["verification"]["model.onnx"]["verify"]["value"]),
            "peak_gpu_gb": round(peak / 1e9, 2) if peak else None, "command": shown(launcher, args, out)}


def _ran_on(out: Path) -> tuple[str, str, int]:
    """(device type, precision, peak GPU bytes) of the compile's training stages, from their records."""
    device, precision, peak = "cpu", "fp32", 0
    for record in sorted((out / "stages").glob("*/record.json")):
        details = json.loads(record.read_text()).get("details", {})
        for d in [details, *details.get("rounds", [])]:
            if "device" in d:
                device, precision = d["device"].split(":")[0], d["precision"]
                peak = max(peak, d.get("peak_gpu_bytes", 0))
    return device, precision, peak


def _cut(stages=None, **tables):
    """A change to a recipe: its stage list and, per stage table, fields replaced (nested tables as dicts)."""

    def apply(recipe):
        from edgebert.pipeline import recipe as recipes

        options = dict(recipe.options)
        for name, fields in tables.items():
            options[name] = _replaced(options[name], fields)
        changed = replace(recipe, options=options)
        return recipes.with_stages(changed, stages) if stages else changed

    return apply


def _replaced(options, fields: dict):
    return options.replace(**{k: _replaced(getattr(options, k), v) if isinstance(v, dict) else v
                              for k, v in fields.items()})


# From the long recipe (hours on 2 cores) to the default, one change at a time: what each is, and the change.
# The last step must give the default as it is.
CUTS = [
    ("one prune try, not two (seeds 42 and 43, the better on validation kept)", _cut(prune={"tries": 1})),
    ("three word-swapped copies of the training text, not eight (the teacher labels less than half as much)",
     _cut(prune={"recovery": {"augment": {"copies": 3}}})),
    ("9,000 recovery steps, not 25,200", _cut(prune={"recovery": {"train": {"steps": 9000, "eval_every": 1000}}})),
    ("no distill stage: prune removes the 2 layers too, to the same shape (24 of 72 heads and 3,072 of 9,216 FFN "
     "neurons kept in 4 layers), recovering from the fine-tuned model it starts from",
     _cut(stages=["finetune", "prune", "vocab", "quantize", "export"],
          prune={"layers": 2, "heads": 0.6667, "ffn": 0.6667, "recover_from": "unpruned"})),
    ("recovery also matches each surviving layer's hidden states to its own before the cut (costs time)",
     _cut(prune={"recovery": {"hidden_weight": 1.0}})),
    ("the fine-tune keeps a moving average of its weights, the teacher it chooses (costs time)",
     _cut(finetune={"train": {"ema": 0.999}})),
    ("2,400 fine-tuning steps, not 4,200 (at 4,200 the moving average was best on validation at step 1,800)",
     _cut(finetune={"train": {"steps": 2400}})),
    ("recovery stops after three evaluations without a new best (`patience`; the estimate counts every step, so "
     "what it saves is the default run's total against the one before it)",
     _cut(prune={"recovery": {"train": {"patience": 3}}})),
]


def cuts() -> list[dict]:
    """Each cut's estimated saving on this machine: the compile's own estimate of the recipe before and after it
    (no training is run: a warm-up times each model shape once, so that the cuts differ only in the work they
    count, not in the warm-ups' noise)."""
    from edgebert.pipeline import recipe as recipes
    from edgebert.pipeline.context import context, start_model
    from edgebert.pipeline.estimate import Timer, estimate

    recipe = recipes.load(ROOT / LONG)
    ctx = context(recipe, ROOT / "runs" / "cost" / "estimate", None)
    start, timer = start_model(recipe), Timer(ctx)

    def said(r) -> float:
        return sum(estimate(replace(ctx, recipe=r), start, None, r.stages, timer).stages.values())

    rows, before = [], said(recipe)
    rows.append({"cut": "the long recipe", "estimate_s": round(before, 1), "saved_s": None})
    for what, change in CUTS:
        recipe = change(recipe)
        after = said(recipe)
        rows.append({"cut": what, "estimate_s": round(after, 1), "saved_s": round(before - after, 1)})
        before = after
    default = recipes.load(ROOT / "edgebert" / "recipes" / "sst2-minilm.toml")
    if recipe.stages != default.stages or any(recipe.stage(s) != default.stage(s) for s in default.stages):
        sys.exit("compile_cost: CUTS do not lead to the default recipe (sst2-minilm.toml): list the change it makes")
    return rows


def table(results: dict) -> list[str]:
    """The runs and the cuts as markdown: here, and in BENCHMARKS.md (bench/_render.py)."""
    cut_rows = results.get("cuts")
    machines = list(dict.fromkeys([r["machine"] for r in results["runs"].values()]
                                  + ([results["cuts_machine"]] if cut_rows else [])))
    lines = ["From `python bench/compile_cost.py`; each run names its command, commit and machine.", "",
             "| run | command | commit | machine | device | threads or GPUs | precision | stage seconds | total | "
             "estimated | ONNX dev accuracy |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results["runs"].items():
        where = machines.index(r["machine"]) + 1
        if "skipped" in r:
            lines.append(f"| {name} | | {r.get('commit', '')} | {where} | | | | skipped: {r['skipped']} | | | |")
            continue
        stages = ", ".join(f"{k} {v:.0f}" for k, v in r["stage_seconds"].items())
        estimate = f"{r['estimate_s'] / 60:.1f} min" if r["estimate_s"] else "-"
        lines.append(f"| {name} | `{r['command']}` | {r['commit']} | {where} | {r['device']} | "
                     f"{r['threads_or_gpus']} | {r['precision']} | {stages} | {r['total_s'] / 60:.1f} min | {estimate} | "
                     f"{r['dev_accuracy']:.2f}% |")
    lines.append("\nTotal is the command's wall time; stage seconds are each stage's own, the teacher's labels "
                 "included (the rest is loading the data and writing the bundle). Estimated is what the compile said "
                 "before its first stage trained, from a warm-up on its machine.")
    if cut_rows:
        lines += ["", "What each change from the long recipe to the default saves, one at a time, each timed by the "
                  f"compile's own estimate on machine {machines.index(results['cuts_machine']) + 1} (a warm-up "
                  "times every model shape once; no training; the warm-up itself left out). What they "
                  "cost together in accuracy is the default run's figure against the long recipe's in "
                  "BENCHMARKS.md.", "",
                  "| cut | estimate after it | saved |", "|---|---|---|"]
        for row in cut_rows:
            saved = f"{row['saved_s'] / 60:.1f} min" if row["saved_s"] is not None else ""
            lines.append(f"| {row['cut']} | {row['estimate_s'] / 60:.1f} min | {saved} |")
    return lines + [""] + [f"Machine {i}: {m}." for i, m in enumerate(machines, 1)]


def markdown(results: dict) -> str:
    title = f"# What a compile costs (issue 31)\n\nGenerated {results['created']}.\n"
    return "\n".join([title, *table(results)]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="cuts,default,torchrun,quick",
                        help=f"comma-separated, of {', '.join(RUNS)} and cuts (each cut's estimated saving)")
    parser.add_argument("--work", default="runs/cost")
    parser.add_argument("--results", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    names = [n for n in args.runs.split(",") if n]
    unknown = [n for n in names if n not in RUNS and n != "cuts"]
    if unknown:
        sys.exit(f"compile_cost: unknown run(s) {', '.join(unknown)}: choose from {', '.join(RUNS)}")
    results_file = Path(args.results) / "compile-cost.json"
    before = json.loads(results_file.read_text()) if results_file.is_file() else {"runs": {}}
    work = (ROOT / args.work).resolve()
    runs = {**before["runs"], **{name: {**measure(name, work), "commit": commit(), "machine": machine_line()}
                          for name in names if name in RUNS}}
    if "cuts" in names:
        found_cuts, cuts_machine = cuts(), machine_line()
    else:
        found_cuts, cuts_machine = before.get("cuts"), before.get("cuts_machine")
    results = {"commit": commit(), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "versions": versions("edgebert", "torch"), "runs": runs, "cuts": found_cuts,
               "cuts_machine": cuts_machine}
    write_json(results_file, results)
    write_bytes(results_file.with_suffix(".md"), markdown(results).encode())
    print(markdown(results))


if __name__ == "__main__":
    main()
