"""Real check of issue 13: every task a user brings, through `edgebert compile` and `edgebert bench`.

For each task a short recipe starting from the packaged all-MiniLM-L6-v2 (`model = "minilm"`) is written
to WORK/<task>/recipe.toml, compiled with `edgebert compile RECIPE --out WORK/<task> --resume` (a re-run
redoes nothing that is done) and its bundle benched with `edgebert bench BUNDLE --target local` (and for
MRPC, the smallest eval split, also `--target qemu-aarch64`: emulated, so correctness only). Collected
per task: the task metric at each stage (the manifest's stages), each file's host verification (the
manifest's verification), each bench's on-device metric, whether device equals host within noise (see
TOLERANCE), sizes and local p50 latency. Writes bench/results/tasks.json and tasks.md (with --quick:
WORK/tasks.json and WORK/tasks.md, never bench/results/).

    python bench/tasks.py [--only mrpc,stsb,conll2003,embedding,embedding-untrained,csv] [--work runs/tasks]
                          [--quick] [--data DIR] [--rebench]

CoNLL-2003 is research-only data: its bundle stays under WORK (runs/ is not shipped or committed).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from edgebert.data import data_root
from edgebert.device_tests.files import write_bytes, write_json
from edgebert.device_tests.versions import versions

ROOT = Path(__file__).resolve().parents[1]
QEMU_TASK = "mrpc"  # the smallest eval split (408 pairs): emulated float math is 300-500x slower

# Device metric vs host verification, in fractions. The local harness runs the same runtime on the same
# eval arrays as the verification, so its predictions are the same: any difference beyond float noise in
# a correlation is a bug. Under qemu an aarch64 build of the runtime runs the file: FP32 kernels agree to
# ~1e-6, INT8 kernels may round differently and flip an example or two near the decision boundary, so an
# INT8 file there may differ by QEMU_INT8_FLIPS examples' worth of the metric.
TOLERANCE = 1e-4
QEMU_INT8_FLIPS = 3

# The short recipe of each task: what differs between them; SIZES holds the step counts.
TASKS = {
    "mrpc": {"task": "mrpc", "max_length": 128, "metrics": ["f1", "accuracy"]},
    "stsb": {"task": "stsb", "max_length": 128, "metrics": ["pearson", "spearman"]},
    "conll2003": {"task": "conll2003", "max_length": 64, "metrics": ["entity_f1", "precision", "recall"],
                  "note": "research-only data: the bundle stays under the work folder, never shipped"},
    "embedding": {"task": "stsb-embedding", "max_length": 128, "metrics": ["cosine_spearman", "cosine_pearson"],
                  "stages": ["distill", "prune", "quantize", "export"], "accuracy_budget": 1.0,
                  "reference": {"cosine_spearman": 0.866, "what": "the untrained all-MiniLM-L6-v2 (issue 13)"}},
    "embedding-untrained": {"task": "stsb-embedding", "max_length": 128,
                            "metrics": ["cosine_spearman", "cosine_pearson"], "stages": ["export"],
                            "note": "no training: the packaged all-MiniLM-L6-v2 through export only (FP32)",
                            "reference": {"cosine_spearman": 0.866, "what": "issue 13's Python-API figure"}},
    "csv": {"max_length": 64, "metrics": ["accuracy"],
            "note": "a user's CSV written from SST-2's train.tsv and dev.tsv (labels as the strings "
                    "negative/positive), read through a [data] table"},
}
SIZES = {  # minutes per task on 2 cores (full); seconds (quick, a smoke test of the script)
    "full": {"train_limit": 2000, "eval_limit": 0, "finetune": 150, "distill": 100, "prune": 60, "budget": 3.0,
             "sample_batches": 4},
    "quick": {"train_limit": 64, "eval_limit": 48, "finetune": 3, "distill": 2, "prune": 2, "budget": 100.0,
              "sample_batches": 1, "max_length": 32},
}
STAGES = ["finetune", "distill", "prune", "quantize", "export"]


def log(message: str) -> None:
    print(f"tasks: {message}", file=sys.stderr, flush=True)


def toml(table: dict, prefix: str = "") -> str:
    """TOML text of a nested dict (strings, numbers, bools, lists of them; dicts become tables)."""
    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)  # a JSON string is a TOML basic string
        return "[" + ", ".join(value(x) for x in v) + "]"

    lines = [f"{k} = {value(v)}" for k, v in table.items() if not isinstance(v, dict)]
    for k, v in table.items():
        if isinstance(v, dict):
            name = f"{prefix}.{k}" if prefix else k
            scalars = any(not isinstance(x, dict) for x in v.values())  # else only its sub-tables have headers
            lines += ["", f"[{name}]"] if scalars else [""]
            lines.append(toml(v, name))
    return "\n".join(lines).strip("\n")


def recipe(name: str, *, quick: bool, work: Path) -> dict:
    """The recipe of task `name` as a dict (the TOML's tables): SIZES' steps, dynamic INT8 ONNX + TFLite,
    the local bench on. The CSV task's files are written first (`write_csv`); its [data] names them."""
    spec, size = TASKS[name], SIZES["quick" if quick else "full"]
    max_length = min(spec["max_length"], size.get("max_length", spec["max_length"]))
    stages = spec.get("stages", STAGES)
    train = {"lr": 1e-4, "freeze_word_embeddings": True}
    out: dict = {"model": "minilm"}
    if "task" in spec:
        out["task"] = spec["task"]
    out.update(max_length=max_length, train_limit=size["train_limit"], eval_limit=size["eval_limit"], stages=stages)
    if name == "csv":
        folder = work / name / "data"
        out["data"] = {"train": str(folder / "train.csv"), "dev": str(folder / "dev.csv"), "text": "sentence",
                       "label": "label", "name": "sst2-csv"}
    if "finetune" in stages:
        out["finetune"] = {"train": {**train, "steps": size["finetune"], "warmup": 0.1}}
    if "distill" in stages:
        out["distill"] = {"layers": 4, "hidden_weight": 1.0, "train": {**train, "steps": size["distill"]}}
    if "prune" in stages:
        out["prune"] = {"heads": 0.5, "ffn": 0.5, "rounds": 1, "sample_batches": size["sample_batches"],
                        "recovery": {"train": {**train, "steps": size["prune"]}}}
    if "quantize" in stages:
        budget = size["budget"] if quick else spec.get("accuracy_budget", size["budget"])
        out["quantize"] = {"onnx": "dynamic", "tflite": "dynamic", "accuracy_budget": budget}
    lengths = [t for t in (16, 32, 64, 128) if t < max_length] + [max_length]
    out["export"] = {"formats": ["onnx", "tflite"], "seq_lens": lengths, "bench": True}
    return out


def write_csv(data_dir: Path, folder: Path) -> None:
    """train.csv and dev.csv (sentence,label with labels negative/positive) from SST-2's TSV files, as a
    user's own export would look: quoted where a sentence holds a comma or a quote."""
    names = {"0": "negative", "1": "positive"}
    for split in ("train", "dev"):
        target = folder / f"{split}.csv"
        if target.is_file():
            continue
        with open(data_dir / "sst2" / f"{split}.tsv", newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        header, body = rows[0], rows[1:]
        text, label = header.index("sentence"), header.index("label")
        folder.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["sentence", "label"])
            w.writerows([r[text].strip(), names[r[label].strip()]] for r in body)
        os.replace(tmp, target)


def edgebert_cli() -> list[str]:
    """The `edgebert` entry point of this environment."""
    script = Path(sys.executable).with_name("edgebert")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "edgebert.cli"]


def run(cmd: list[str], commands: list[str]) -> float:
    """Run `cmd` (its output on this terminal); record it; its wall time. A failure raises."""
    cli = edgebert_cli()
    shown = " ".join(["edgebert", *cmd[len(cli):]] if cmd[:len(cli)] == cli else cmd)
    commands.append(shown)
    log(shown)
    t0 = time.time()
    done = subprocess.run(cmd)
    if done.returncode:
        raise RuntimeError(f"`{shown}` exited with {done.returncode}")
    return round(time.time() - t0, 1)


def current(report_file: Path, manifest: dict) -> bool:
    """Whether a bench JSON is complete and ran exactly the bundle's files (then a re-run reuses it)."""
    try:
        report = json.loads(report_file.read_text())
    except (OSError, ValueError):
        return False
    files = manifest.get("files", {})
    runs = report.get("runs", [])
    return report.get("complete") is True and bool(runs) and all(
        r["model"]["file"] in files and r["model"].get("sha256") == files[r["model"]["file"]].get("sha256")
        for r in runs)


def within(device: float | None, host: float | None, *, emulated: bool, int8: bool, n: int) -> tuple[bool, float]:
    """(device == host within noise, the tolerance used): see TOLERANCE."""
    tolerance = max(TOLERANCE, QEMU_INT8_FLIPS / max(n, 1)) if emulated and int8 else TOLERANCE
    if device is None or host is None:
        return False, tolerance
    return abs(device - host) <= tolerance, tolerance


def collect(name: str, manifest: dict, benches: dict[str, dict]) -> dict:
    """One task's figures from its bundle manifest and its bench reports ({target: `edgebert bench` JSON})."""
    spec = TASKS[name]
    task = manifest["task"]
    shown = list(spec["metrics"])
    primary = task["metric"]
    stages = [{"stage": s["name"], "params": s["params"]["total"], "bytes": s["bytes"], "wall_s": s["wall_s"],
               "metrics": {m: s["metrics"].get(m) for m in shown}} for s in manifest["stages"]]
    files = {}
    for file, v in manifest["verification"].items():
        check = v.get("verify") or {}
        host = check.get("metrics") or {primary: check.get("value")}
        files[file] = {"stage": v.get("stage"), "bytes": manifest["files"][file]["bytes"],
                       "int8": _int8(v.get("meta") or {}), "host": {m: host.get(m) for m in shown},
                       "max_abs_diff": check.get("max_abs_diff"), "agreement": check.get("agreement"),
                       "device": {}}
    checks = []
    for target, report in benches.items():
        for r in report["runs"]:
            file = r["model"]["file"]
            entry = files.setdefault(file, {"stage": None, "bytes": r["model"].get("bytes"), "int8": None,
                                            "host": {}, "device": {}})
            device = {m: r.get(m) for m in shown}
            n = r.get("n_examples") or 0
            emulated = bool(r.get("emulated"))
            ok, tolerance = within(device.get(primary), entry["host"].get(primary), emulated=emulated,
                                   int8=bool(entry["int8"]), n=n)
            entry["device"][target] = {"metrics": device, "emulated": emulated, "p50_ms": r["latency_ms"]["p50"],
                                       "device": r.get("device", {}).get("cpu_model"),
                                       "runtime": r.get("runtime", {}), "matches_host": ok if entry["host"] else None,
                                       "tolerance": tolerance}
            if entry["host"]:  # a file the manifest does not verify (none today) has nothing to match
                checks.append(ok)
    base = next((f["device"]["local"]["p50_ms"] for n_, f in files.items() if n_ == "model.onnx"
                 and "local" in f["device"]), None)
    for f in files.values():
        local = f["device"].get("local")
        if local and base:
            local["p50_vs_onnx"] = round(local["p50_ms"] / base, 3)
    return {"task": task, "metrics": shown, "stages": stages, "files": files,
            "device_matches_host": all(checks) if checks else None, **{k: spec[k] for k in ("note", "reference")
                                                                         if k in spec}}


def _int8(meta: dict) -> bool:
    """Whether a verified file holds INT8 weights: quantize records its config (DynamicInt8Config, ...)."""
    return "Int8" in str((meta.get("config") or {}).get("type", ""))


def _num(value, scale: float = 100) -> str:
    return "-" if value is None else f"{value * scale:.2f}"


def markdown(results: dict) -> str:
    """The readable tables: per task, the metric at each stage, and each file's host vs device metric."""
    lines = ["# Every task end to end (issue 13's real check)", "",
             f"`{results['command']}` at commit `{results['commit'][:12]}`; load average before "
             f"{results['load']['before']}, after {results['load']['after']} on {results['load']['cpus']} CPUs "
             "(latencies are ratios only on a shared machine).", "",
             f"Device vs host: the local harness must give the host verification's metric to {TOLERANCE} "
             f"(same runtime, same eval arrays); under qemu an INT8 file may differ by {QEMU_INT8_FLIPS} "
             "examples' worth (another build of the INT8 kernels). Metrics in points.", ""]
    for name, r in results["tasks"].items():
        lines.append(f"## {name}")
        lines.append("")
        if "error" in r:
            lines += [f"failed: {r['error']}", ""]
            continue
        for key in ("note",):
            if key in r:
                lines += [f"{r[key]}.", ""]
        if "reference" in r:
            ref = r["reference"]
            lines += [f"reference: cosine Spearman {_num(ref['cosine_spearman'])} ({ref['what']}).", ""]
        metrics = r["metrics"]
        if r["stages"]:
            lines.append("| stage | params | MB | " + " | ".join(metrics) + " | wall s |")
            lines.append("|---" * (len(metrics) + 4) + "|")
            for s in r["stages"]:
                lines.append(f"| {s['stage']} | {s['params']:,} | {s['bytes'] / 1e6:.1f} | "
                             + " | ".join(_num(s["metrics"].get(m)) for m in metrics) + f" | {s['wall_s']:.0f} |")
            lines.append("")
        targets = sorted({t for f in r["files"].values() for t in f["device"]}, key=lambda t: t != "local")
        primary = r["task"]["metric"]
        head = ["file", "MB", *[f"host {m}" for m in metrics], *[f"{t} {primary}" for t in targets],
                "device = host", "local p50 ms", "× model.onnx"]
        lines += ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
        for file, f in r["files"].items():
            local = f["device"].get("local", {})
            match = [("yes" if d["matches_host"] else "NO") + ("*" if d["emulated"] else "")
                     for d in f["device"].values() if d["matches_host"] is not None]
            lines.append("| " + " | ".join([
                file, f"{f['bytes'] / 1e6:.2f}" if f["bytes"] else "-", *[_num(f["host"].get(m)) for m in metrics],
                *[_num(f["device"].get(t, {}).get("metrics", {}).get(primary)) for t in targets],
                ", ".join(match) or "-", f"{local['p50_ms']:.2f}" if local else "-",
                f"{local['p50_vs_onnx']:.2f}" if local.get("p50_vs_onnx") else "-"]) + " |")
        lines.append("")
        if r.get("qemu_skipped"):
            lines += [f"qemu-aarch64: skipped ({r['qemu_skipped']}).", ""]
    if any("qemu-aarch64" in f["device"] for r in results["tasks"].values() if "files" in r for f in r["files"].values()):
        lines += ["\\* qemu-aarch64 (emulated): correctness only; its timings are not device latency.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help=f"comma-separated tasks (default all: {','.join(TASKS)})")
    parser.add_argument("--work", default=str(ROOT / "runs" / "tasks"), help="work folder (default runs/tasks)")
    parser.add_argument("--quick", action="store_true", help="tiny limits for a smoke test; results go under --work")
    parser.add_argument("--data", help="data folder (default: $EDGEBERT_DATA, else ../shared/data)")
    parser.add_argument("--rebench", action="store_true", help="bench again even where a bench JSON of the same "
                        "bundle files exists")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(TASKS)
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        parser.error(f"unknown task {unknown[0]!r}; use {', '.join(TASKS)}")
    work = Path(args.work).resolve()
    results_dir = work if args.quick else ROOT / "bench" / "results"
    cli = edgebert_cli()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    results = {"command": "python " + " ".join([str(Path(sys.argv[0]).resolve().relative_to(ROOT))
                                                if Path(sys.argv[0]).resolve().is_relative_to(ROOT) else sys.argv[0],
                                                *sys.argv[1:]]),
               "commit": commit, "quick": args.quick, "sizes": SIZES["quick" if args.quick else "full"],
               "tolerance": {"fraction": TOLERANCE, "qemu_int8_flips": QEMU_INT8_FLIPS},
               "load": {"cpus": os.cpu_count(), "before": [round(x, 2) for x in os.getloadavg()]},
               "versions": versions("edgebert", "torch", "onnxruntime", "ai-edge-litert", "onnx", "transformers",
                                    "tokenizers", "numpy"),
               "tasks": {}}
    previous = results_dir / "tasks.json"  # a run of some tasks (--only) keeps the others' figures
    if previous.is_file():
        results["tasks"] = {k: v for k, v in json.loads(previous.read_text()).get("tasks", {}).items()
                            if k in TASKS and k not in names}
    for name in names:
        folder = work / name
        commands: list[str] = []
        t0 = time.time()
        try:
            if name == "csv":
                write_csv(data_root(args.data), folder / "data")
            recipe_file = folder / "recipe.toml"
            write_bytes(recipe_file, (f"# bench/tasks.py: the {name} check\n" + toml(recipe(name, quick=args.quick,
                                                                                                  work=work)) + "\n").encode())
            run([*cli, "compile", str(recipe_file), "--out", str(folder), "--resume",
                 *(["--data", args.data] if args.data else [])], commands)
            bundle = folder / "bundle"
            manifest = json.loads((bundle / "manifest.json").read_text())
            targets = ["local"]
            skipped = None
            if name == QEMU_TASK:
                if qemu:
                    targets.append("qemu-aarch64")
                else:
                    skipped = "qemu-aarch64-static is not installed (apt-get install qemu-user-static)"
            benches = {}
            for target in targets:
                out = folder / f"bench-{target}.json"
                if args.rebench or not current(out, manifest):
                    run([*cli, "bench", str(bundle), "--target", target, "--json", str(out),
                         *(["--timeout", "3600"] if target != "local" else [])], commands)
                else:
                    log(f"{name}: {out.name} ran these bundle files already (--rebench to run it again)")
                benches[target] = json.loads(out.read_text())
            entry = collect(name, manifest, benches)
            if skipped:
                entry["qemu_skipped"] = skipped
        except (RuntimeError, OSError, KeyError, ValueError) as e:  # the other tasks still run
            log(f"{name}: failed: {e}")
            entry = {"error": str(e)}
        entry.update(commands=commands, commit=commit, wall_s=round(time.time() - t0, 1), work=str(folder),
                     recipe=str(folder / "recipe.toml"))
        results["tasks"][name] = entry
        results["load"]["after"] = [round(x, 2) for x in os.getloadavg()]
        write_json(results_dir / "tasks.json", results)  # after each task: a killed run keeps what finished
        write_bytes(results_dir / "tasks.md", (markdown(results) + "\n").encode())
    log(f"results: {results_dir / 'tasks.json'}, {results_dir / 'tasks.md'}")
    if any("error" in r or r.get("device_matches_host") is False for r in results["tasks"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
