"""Issue 30's table: does each task keep the promise against its own teacher? One row per task.

    python bench/promise.py [--only sst2,mrpc,stsb,conll2003,embedding,csv] [--work runs/promise] [--data DIR]
                            [--results bench/results] [--repeats 3]

Each row is a real `edgebert compile`, typed as a user types it (ROWS), into WORK/<row> with --resume, so a re-run
redoes nothing that is done. A task with no recipe named gets the packaged recipe of its kind. Then, per row:
- `teacher`: the compile's teacher (its fine-tuned model, else the model it started from) scored in PyTorch on
  the row's split;
- `onnx`, `tflite`: the bundle's files scored in their runtimes by the device_tests harness on the same split,
  tokenized by the bundle's tokenizer;
- `smaller`: the teacher's FP32 bytes over the larger file's (the compile's promise record);
- `vs_optimum_1t`: Optimum's dynamic INT8 of the same teacher (bench/_build.py optimum, the ORTModel class of the
  task's kind) against model.onnx, both timed by the harness at batch 1, 1 thread, real lengths, on the same
  rows, alternating, `--repeats` times: the median of the per-repeat ratios of p50s;
- `compile_s`: the compile's own seconds per stage, each as it took when it ran, and its wall time in all: a
  re-run's (`--resume`) plus what the stages it found done took when they ran.
Writes RESULTS/promise.json ({"rows": [...], "commit"}; each row names its commit and machine); BENCHMARKS.md
shows it (compare.py --render).
CoNLL-2003 is research-only: its bundle stays under WORK. Timings are ratios: run it alone on the machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _figures import DISTS, commit
from _measure import ROOT, cached_build, child, log, machine, machine_line, optimum_config

from edgebert.device_tests.files import write_json
from edgebert.device_tests.metrics import points
from edgebert.device_tests.versions import versions

RESULTS = ROOT / "bench" / "results"
# row -> the compile's arguments after `edgebert compile` ({work}: the row's folder), the metric the row reports
# (a key of the task's metrics, in points), what is shown beside it, the split it is scored on, and the task
# whose data it reads (the csv row is MRPC written as a user's CSV: it must give the built-in route's numbers)
ROWS = {
    "sst2": {"args": [], "metric": "accuracy", "task": "sst2"},
    "mrpc": {"args": ["--task", "mrpc"], "metric": "f1", "beside": ["accuracy"], "task": "mrpc"},
    "stsb": {"args": ["--task", "stsb"], "metric": "spearman", "beside": ["pearson"], "task": "stsb"},
    "conll2003": {"args": ["edgebert/recipes/conll2003-minilm.toml"], "metric": "entity_f1", "split": "test",
                  "task": "conll2003"},
    "embedding": {"args": ["edgebert/recipes/stsb-minilm-embedding.toml"], "metric": "cosine_spearman",
                  "task": "stsb-embedding"},
    "csv": {"args": ["--task", "{work}/mrpc-train.csv", "--dev-file", "{work}/mrpc-dev.csv", "--text-column",
                     "sentence1", "--pair-column", "sentence2"], "metric": "f1", "beside": ["accuracy"],
            "task": "mrpc", "same_as": "mrpc"},
}
# MRPC's labels as a user's strings, named so they sort as the built-in task's (not_equivalent, equivalent): F1
# counts the second class
CSV_LABELS = ("different", "paraphrase")


def write_csv(data: Path, work: Path) -> None:
    """MRPC's train and dev files as a user's CSV with named labels (the csv row's data)."""
    from edgebert.data import load_task

    for split in ("train", "dev"):
        rows = [(e.text, e.text_pair, CSV_LABELS[e.label]) for e in load_task("mrpc", split, data_dir=data).examples]
        with open(work / f"mrpc-{split}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence1", "sentence2", "label"])
            writer.writerows(rows)


def compiled(name: str, work: Path, data: Path) -> tuple[Path, list[str], float]:
    """(the row's output folder, the command as a user types it in the repository, its wall seconds in this
    call)."""
    out = work / name
    out.mkdir(parents=True, exist_ok=True)
    if name == "csv":
        write_csv(data, out)
    args = [a.format(work=out) for a in ROWS[name]["args"]]
    command = ["compile", *args, "--out", str(out)]
    shown = ["edgebert"] + [str(Path(a).relative_to(ROOT)) if a.startswith(f"{ROOT}/") else a for a in command]
    log(f"{name}: {' '.join(shown)}")
    started = time.time()
    subprocess.run([sys.executable, "-m", "edgebert", *command, "--resume", "--data", str(data)], cwd=ROOT,
                   check=True)
    return out, shown, time.time() - started


def teacher_of(out: Path, manifest: dict) -> Path:
    """The compile's teacher: its fine-tuned model (the first stage's, when it fine-tunes), else its start model."""
    from edgebert.checkpoint import default_checkpoint

    first = manifest["stages"][0] if manifest["stages"] else {}
    if first.get("name") == "finetune":
        return out / first["checkpoint"]
    start = manifest["recipe"]["teacher"] or manifest["recipe"]["model"]
    return default_checkpoint() if start == "minilm" else Path(start)


def scoring_sets(row: dict, out: Path, teacher: Path, length: int, data: Path) -> dict[str, Path]:
    """The row's split as eval arrays: for the bundle's files (its own tokenizer; the bundle's eval.npz when the
    split is the one it was verified on) and for Optimum's files (the teacher's tokenizer, without labels: timing
    only, since Optimum's outputs are not the bundle's)."""
    from edgebert.data import pretokenize_eval
    from edgebert.tokenizer import load_tokenizer

    split = row.get("split")
    sets = {"student": out / "bundle" / "eval.npz"}
    if split:
        arrays = pretokenize_eval(row["task"], load_tokenizer(out / "bundle"), length, split=split, data_dir=data)
        np.savez(out / f"{split}.npz", **arrays)
        sets["student"] = out / f"{split}.npz"
    arrays = pretokenize_eval(row["task"], load_tokenizer(teacher), length, split=split, data_dir=data)
    np.savez(out / "optimum-timing.npz", **{k: v for k, v in arrays.items() if k not in ("labels", "task")})
    sets["optimum"] = out / "optimum-timing.npz"
    return sets


def teacher_scores(row: dict, teacher: Path, length: int, data: Path) -> dict:
    """The teacher's metrics (points) on the row's split, in PyTorch."""
    from edgebert.data import EncodedDataset, get_task, load_task
    from edgebert.passes import evaluate
    from edgebert.pipeline.context import task_model
    from edgebert.tokenizer import load_tokenizer

    task = get_task(row["task"])
    split = load_task(task, row.get("split") or task.eval_split, data_dir=data)
    scores = evaluate(task_model(teacher, task), EncodedDataset(split, load_tokenizer(teacher), length))
    return {k: points(v) for k, v in scores.items() if isinstance(v, float)}


def harness(model: Path, inputs: Path, out: Path, runs: int) -> dict:
    """One harness run at batch 1, 1 thread, real lengths."""
    child([sys.executable, "-m", "device_tests", "run", "--model", str(model), "--inputs", str(inputs),
           "--threads", "1", "--warmup", "20", "--runs", str(runs), "--truncate", "--json", str(out)],
          out.with_suffix(".log"), timeout=1800)
    return json.loads(out.read_text())


def identity(teacher: Path) -> str:
    """What tells one teacher from another: a recompiled row's fine-tune is a new stage folder, or the same folder
    written again."""
    return json.dumps([str(teacher), sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns)
                                            for f in teacher.iterdir() if f.is_file())])


def optimum_teacher(name: str, teacher: Path, stamp: str, work: Path) -> Path:
    """The row's teacher as a Hugging Face folder for Optimum, made again when its identity (`stamp`) changes."""
    hf, made_from = work / "teachers" / name, work / "teachers" / f"{name}.from"
    if not made_from.is_file() or made_from.read_text() != stamp:
        from edgebert.checkpoint import load, save_hf

        shutil.rmtree(hf, ignore_errors=True)
        save_hf(load(teacher), hf, tokenizer_from=teacher)
        made_from.write_text(stamp)
    return hf


def row_of(name: str, work: Path, data: Path, repeats: int, runs: int) -> dict:
    row = ROWS[name]
    out, command, wall = compiled(name, work, data)
    manifest = json.loads((out / "bundle" / "manifest.json").read_text())
    teacher, length = teacher_of(out, manifest), manifest["recipe"]["max_length"]
    sets = scoring_sets(row, out, teacher, length, data)
    kind = manifest["task"]["kind"]
    stamp = identity(teacher)  # Optimum's copy of the teacher and its INT8 build are both redone when it changes
    hf = optimum_teacher(name, teacher, stamp, work)
    qname = optimum_config(machine())
    optimum = cached_build(f"optimum-{name}", ["optimum", "--teacher", str(hf), "--config", qname, "--kind", kind],
                           {"teacher": stamp, "config": qname, "kind": kind, "v": versions(*DISTS)}, work)
    peer = work / f"optimum-{name}" / optimum["files"]["int8"]
    scores, ratios = {}, []
    for r in range(repeats):
        student = harness(out / "bundle" / "model.onnx", sets["student"], out / f"onnx-{r}.json", runs)
        base = harness(peer, sets["optimum"], out / f"optimum-{r}.json", runs)
        ratios.append(base["latency_ms"]["p50"] / student["latency_ms"]["p50"])
        scores["onnx"] = student
    scores["tflite"] = harness(out / "bundle" / "model.tflite", sets["student"], out / "tflite.json", 1)
    metric = row["metric"]
    teacher_points = teacher_scores(row, teacher, length, data)
    files = manifest["promise"]["files"]
    return {
        "task": name, "metric": metric,
        "teacher": round(teacher_points[metric], 2),
        "onnx": round(points(scores["onnx"][metric]), 2), "tflite": round(points(scores["tflite"][metric]), 2),
        "beside": {m: {"teacher": round(teacher_points[m], 2), "onnx": round(points(scores["onnx"][m]), 2),
                       "tflite": round(points(scores["tflite"][m]), 2)} for m in row.get("beside", [])},
        "split": row.get("split") or "dev",
        "smaller": min(f["smaller"] for f in files.values()),
        "vs_optimum_1t": round(float(np.median(ratios)), 2), "vs_optimum_1t_by_repeat": [round(x, 2) for x in ratios],
        "optimum_file": optimum["files"]["int8"],
        "compile_s": {**manifest["time"]["stages"], "total": round(manifest["time"]["took_s"]
                                                                    + manifest["time"].get("resumed_s", 0.0), 1)},
        "compile_wall_s_this_call": round(wall, 1),
        "max_drop": manifest["promise"]["max_drop"], "promise_said": manifest["promise"]["within"],
        "command": " ".join(command),
    }


def judged(row: dict) -> dict:
    """The promise, per row: both files within 1 point, 10x smaller, 3x Optimum at 1 thread."""
    drop = max(row["teacher"] - row["onnx"], row["teacher"] - row["tflite"])
    return {**row, "drop": round(drop, 2),
            "kept": drop <= 1.0 and row["smaller"] >= 10.0 and row["vs_optimum_1t"] >= 3.0}


def table(results: dict) -> list[str]:
    """The rows as markdown: in BENCHMARKS.md (bench/_render.py). Rows are run one at a time (--only), maybe in
    different sessions on different CPUs, so each names its own commit and machine."""
    machines = list(dict.fromkeys(r["machine"] for r in results["rows"]))
    lines = [f"From `python bench/promise.py --only TASK` on the commit and machine in each row's last columns; "
             "each row's command is in bench/results/promise.json. Metrics in points on the split named; vs Optimum "
             "is batch 1, 1 thread, real lengths, so compare it within a row.", "",
             "| task | metric | teacher | ONNX | TFLite | drop | smaller | vs Optimum | compile | kept | commit "
             "| machine |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["rows"]:
        lines.append(f"| {r['task']} | {r['metric']} ({r['split']}) | {r['teacher']:.2f} | {r['onnx']:.2f} | "
                     f"{r['tflite']:.2f} | {-r['drop']:+.2f} | {r['smaller']:.1f}× | {r['vs_optimum_1t']:.2f}× | "
                     f"{r['compile_s']['total'] / 60:.0f} min | {'yes' if r['kept'] else 'no'} | "
                     f"{r['commit']} | {machines.index(r['machine']) + 1} |")
    return lines + [""] + [f"Machine {i}: {m}." for i, m in enumerate(machines, 1)]


def main(argv=None) -> int:
    from edgebert.data import data_root

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(ROWS), help="comma-separated rows (default: all)")
    p.add_argument("--work", default=str(ROOT / "runs" / "promise"))
    p.add_argument("--data", help="data root (default: EDGEBERT_DATA, else ../shared/data)")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--runs", type=int, default=300, help="timed rows per harness run")
    args = p.parse_args(argv)
    names = args.only.split(",")
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        p.error(f"unknown row {unknown[0]!r}; rows: {', '.join(ROWS)}")
    data, work = data_root(args.data), Path(args.work)
    path = Path(args.results) / "promise.json"
    kept = {r["task"]: r for r in json.loads(path.read_text())["rows"]} if path.is_file() else {}
    here = machine_line()
    for name in names:
        kept[name] = {**judged(row_of(name, work, data, args.repeats, args.runs)), "commit": commit(), "machine": here}
    for name, row in kept.items():
        twin = kept.get(ROWS[name].get("same_as", ""))
        if twin:
            row["same_as_built_in"] = all(row[k] == twin[k] for k in ("teacher", "onnx", "tflite"))
    results = {"rows": [kept[n] for n in ROWS if n in kept], "commit": commit()}
    write_json(path, results, indent=1)
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
