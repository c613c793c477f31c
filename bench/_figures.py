"""bench/compare.py's figures: from the raw per-repeat measurements to the results JSON (medians over
clean repeats, ratios pair by pair within a repeat, the Optimum baseline, pass/miss per target).
Pure computation (and the commit it ran on): nothing here runs a model."""

from __future__ import annotations

import datetime
import math
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from edgebert.device_tests.versions import versions

ROOT = Path(__file__).resolve().parents[1]
PAD = 128
CONDITIONS = ("real", f"pad{PAD}")
TARGETS = {"speedup_vs_1": 12.0, "speedup_vs_2": 3.0, "speedup_vs_peer": 4.0, "thread_scaling": 1.6,
           "size_vs_1": (10.0, 14.0), "accuracy_drop_points": (1.0, 0.5), "gemm_fraction": 0.40,
           "static_accuracy": 0.84, "static_bytes": 2_000_000, "static_p50_ms": 0.1}
OPTIMUM = ("optimum-o2-int8", "optimum-int8")  # baseline 2 is the faster of these on each line
PEERS = (*OPTIMUM, "tflite-int8")  # the fastest peer: the fastest INT8 file of the teacher on each line
STATIC = ("static-onnx-int8", "static-tflite-int8")  # the static tier's rows (a run with --static-bundle)
# A repeat during which other processes used more than this many cores (on average) is noisy: it is
# re-run (up to retry_noisy times) and left out of the medians when clean repeats exist.
NOISY_CORES = 0.25
# The packages whose versions a result (and a cached build's key) records.
DISTS = ("torch", "transformers", "onnx", "onnxruntime", "optimum", "optimum-onnx", "litert-torch", "ai-edge-litert",
         "ai-edge-quantizer", "executorch", "torchao", "numpy")


def _f(v, fmt="{:.2f}", na="n/a"):
    return na if v is None else fmt.format(v)


def _load_entry(rep: int, cores: float | None) -> dict:
    return {"repeat": rep, "other_cores": cores, "noisy": cores is not None and cores > NOISY_CORES}


def _clean(entries: list[dict], load: list[dict]) -> set:
    """The repeats to use: the clean ones when there are any, else all (and the table says it was busy)."""
    every = {e.get("repeat", 0) for e in entries}
    clean = every - {x["repeat"] for x in load if x.get("noisy")}
    return clean or every


def _median(values):
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else None


def gemm_summary(gemm_raw: list[dict], threads: list[int], gemm_load: list[dict] | None = None) -> dict:
    out = {}
    use = _clean(gemm_raw, gemm_load or [])
    for t in threads:
        rows = {}
        for r in gemm_raw:
            if r["threads"] != t or r.get("repeat", 0) not in use:
                continue
            key = f"{r['op']}-{r['weight']}-{'x'.join(map(str, r['shape']))}"
            rows.setdefault(key, {"op": r["op"], "weight": r["weight"], "shape": r["shape"], "gops": []})
            rows[key]["gops"].append(r["gops_p50"])
        for v in rows.values():
            v["gops_median"] = _median(v["gops"])
        int8 = [v for v in rows.values() if v["op"] == "matmulinteger" and v["weight"] == "s8"]
        fp32 = [v for v in rows.values() if v["op"] == "matmul"]
        out[f"t{t}"] = {
            "shapes": rows,
            "int8_peak_gops": max((v["gops_median"] for v in int8), default=None),
            "int8_peak_shape": max(int8, key=lambda v: v["gops_median"])["shape"] if int8 else None,
            "fp32_peak_gops": max((v["gops_median"] for v in fp32), default=None),
            "fp32_peak_shape": max(fp32, key=lambda v: v["gops_median"])["shape"] if fp32 else None,
        }
    return out


def ratios_by_repeat(base: dict, row: dict) -> list[float]:
    """base's p50 over row's, from their timing rows, each pair from one repeat (drift between repeats cancels)."""
    by_repeat = dict(zip(base.get("repeats_used", []), base.get("p50_by_repeat", [])))
    return [by_repeat[r] / p for r, p in zip(row.get("repeats_used", []), row.get("p50_by_repeat", []))
            if r in by_repeat]


def _fastest(table: dict, ids: tuple[str, ...]) -> str | None:
    """Of `ids`, the one with the lowest p50 in this line's timing table (None when none of them ran)."""
    p50 = {mid: table[mid]["p50_ms"] for mid in ids if table.get(mid, {}).get("p50_ms") is not None}
    return min(p50, key=p50.get) if p50 else None


def _timing_row(m: dict, runs: list[dict], all_runs: list[dict], gemm: dict) -> dict:
    """One model's figures at one thread count and shape: medians over the repeats used, and the share of the GEMM
    peak it reaches."""
    row = {"p50_ms": _median(r["p50"] for r in runs), "p90_ms": _median(r["p90"] for r in runs),
           "mean_ms": _median(r["mean"] for r in runs), "peak_rss_mb": _median(r["peak_rss_mb"] for r in runs),
           "p50_by_repeat": [r["p50"] for r in runs], "repeats_used": [r["repeat"] for r in runs],
           "p50_all_repeats": {str(r["repeat"]): r["p50"] for r in all_runs}}
    # Achieved GOPS: useful FLOPs per sequence over mean latency (total work / total time).
    gops = [r["flops"] / (r["mean"] * 1e6) for r in runs if r["flops"]]
    row["achieved_gops"] = _median(gops)
    peak = gemm.get("int8_peak_gops" if m["int8"] else "fp32_peak_gops")
    row["gemm_peak_gops"] = peak
    row["fraction_of_peak"] = row["achieved_gops"] / peak if row["achieved_gops"] and peak else None
    warnings = sorted({w for r in runs for w in r["warnings"]})
    if warnings:
        row["warnings"] = warnings
    return row


def _timing(raw: dict, models: list[dict], use: set, gemm: dict) -> tuple[dict, dict]:
    """(timing table per thread count and shape, the Optimum variant that is baseline 2 in each). Speedups are
    pair by pair: each repeat against the baseline's same repeat."""
    timing, baseline2 = {}, {}
    for tk, by_cond in raw.items():
        timing[tk] = {}
        baseline2[tk] = {}
        for cond, all_runs in by_cond.items():
            by_model = {mid: [r for r in runs if r["repeat"] in use] for mid, runs in all_runs.items()}
            table = {m["id"]: (_timing_row(m, by_model[m["id"]], all_runs[m["id"]], gemm.get(tk, {}))
                               if by_model[m["id"]] else {"na": (m.get("na") or {}).get(cond, "failed: see failures")})
                     for m in models}
            # "2" is the faster Optimum variant here (median p50): the baseline is never the weaker one.
            b2 = baseline2[tk][cond] = _fastest(table, OPTIMUM)
            for row in table.values():
                if "na" in row:
                    continue
                for label, base in (("1", "pytorch-fp32"), ("2", b2)):
                    ratios = ratios_by_repeat(table[base], row) if base in table else []
                    row[f"speedup_vs_{label}"] = _median(ratios)
                    row[f"speedup_vs_{label}_by_repeat"] = ratios
            timing[tk][cond] = table
    return timing, baseline2


def _sizes(models: list[dict], baseline2: dict, threads: list[int]) -> dict:
    """Each model's file size, against 1 and against 2: the Optimum variant that is 2 at 1 thread (else the
    first thread count), real lengths."""
    by_id = {m["id"]: m for m in models}
    sizes = {}
    for m in models:
        sizes[m["id"]] = {"bytes": m["bytes"], "file": m["file"],
                          "size_vs_1": by_id["pytorch-fp32"]["bytes"] / m["bytes"] if m["bytes"] else None}
        if "bytes_pad" in m:
            sizes[m["id"]].update({"bytes_pad": m["bytes_pad"], "file_pad": m["file_pad"]})
    size_b2 = next((baseline2[tk]["real"] for tk in (f"t{threads[0]}", *baseline2) if baseline2.get(tk, {}).get("real")),
                   "optimum-o2-int8")
    for mid, size in sizes.items():
        size["size_vs_2"] = by_id[size_b2]["bytes"] / by_id[mid]["bytes"] if by_id[mid]["bytes"] else None
        size["size_baseline_2"] = size_b2
    return sizes


def commit() -> str:
    """The commit this checkout is at: the code a results file's figures come from."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()


def summarize(args, settings, threads, mach, models, notes, sets, accuracy, raw, gemm_raw, profiles, manifest,
              failures, loads, env, gemm_load=None, student_profiles=None) -> dict:
    gemm = gemm_summary(gemm_raw, threads, gemm_load)
    use = _clean([r for by in raw.values() for c in by.values() for runs in c.values() for r in runs], loads)
    timing, baseline2 = _timing(raw, models, use, gemm)
    sizes = _sizes(models, baseline2, threads)
    result = {
        "command": "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": mach,
        "versions": versions(*DISTS),
        "settings": {**settings, "threads": threads, "quick": bool(args.quick), "pad_to": PAD,
                     "env": env or "inherited (OMP_WAIT_POLICY unset unless the caller set it)",
                     "eval_examples": {who: v["n"] for who, v in sets.items()},
                     "same_tokenization": sets["student"]["path"] == sets["teacher"]["path"]},
        "load_average": loads,
        "gemm_load": gemm_load or [],
        "repeats_used": sorted(use),
        "repeats_dropped_noisy": sorted({x["repeat"] for x in loads if x.get("noisy")} - use),
        "inputs": {"teacher": str(args.teacher), "bundle": str(args.bundle), "static_bundle": args.static_bundle,
                   "data": args.data},
        "models": {m["id"]: {"group": m["group"], "label": m["label"], "how": m["how"], "int8": m["int8"],
                             **sizes[m["id"]], "accuracy": accuracy[m["id"]],
                             "na": m.get("na", {})} for m in models},
        "baseline_2": baseline2,
        "timing": timing,
        "gemm": gemm,
        "profiles": profiles,
        "student_profiles": student_profiles or {},
        "stages": stage_costs(manifest),
        "notes": {k: v for k, v in notes.items() if isinstance(v, str)},
        "builds": {k: v for k, v in notes.items() if isinstance(v, dict)},
        "failures": failures,
    }
    result["targets"] = targets(result)
    return result


def stage_costs(manifest: dict) -> dict:
    """What each compile stage cost, from the bundle's manifest (measured during the compile)."""
    pareto = {p["stage"]: p for p in manifest.get("pareto", []) if p.get("format") == "pytorch"}
    stages = []
    task_metric = manifest.get("task", {}).get("metric", "accuracy")
    for s in manifest.get("stages", []):
        stages.append({"name": s["name"], "params": s.get("params", {}).get("total"), "bytes": s.get("bytes"),
                       "flops_128": s.get("flops"), "accuracy": s.get("metrics", {}).get(task_metric),
                       "validation": s.get("validation", {}).get(task_metric),
                       "pytorch_p50_ms": pareto.get(s["name"], {}).get("latency_ms"), "wall_s": s.get("wall_s"),
                       "tries": [{"seed": t["seed"], "validation": t["validation"],
                                  "accuracy": t["metrics"].get(task_metric), "kept": t["kept"]}
                                 for t in s.get("tries", [])]})
    files = {}
    for name, b in manifest.get("bench_local", {}).items():
        v = manifest.get("verification", {}).get(name, {})
        files[name] = {"p50_ms": b.get("latency_ms", {}).get("p50"), "accuracy": b.get("metrics", {}).get(task_metric),
                       "bytes": manifest.get("files", {}).get(name, {}).get("bytes"),
                       "recommended_threads": b.get("recommended_threads"),
                       "method": (v.get("meta") or {}).get("method"),
                       "agreement": (v.get("verify") or {}).get("agreement"),
                       "metric_drop": (v.get("verify") or {}).get("metric_drop")}
    return {"stages": stages, "files": files, "recipe": manifest.get("recipe"), "metric": task_metric,
            "quantization": manifest.get("quantization"),
            "eval_examples": manifest.get("eval", {}).get("examples"),
            "validation_rows": (manifest.get("data") or {}).get("validation", {}).get("rows")}


def paired(teacher: dict, student: dict) -> dict | None:
    """The student's accuracy minus the teacher's on the same sentences, with its 95% interval (the paired
    difference of two proportions): only the sentences one gets right and the other wrong move it, so this
    says whether a drop of a point on 872 sentences is more than which few sentences flipped."""
    if "wrong" not in teacher or "wrong" not in student:  # a results file from before these were kept
        return None
    n, t, s = teacher["n"], set(teacher["wrong"]), set(student["wrong"])
    only_teacher, only_student = len(s - t), len(t - s)
    d = (only_student - only_teacher) / n
    half = 1.96 * math.sqrt(only_student + only_teacher - (only_student - only_teacher) ** 2 / n) / n
    return {"only_teacher": only_teacher, "only_student": only_student,
            "interval_points": [round((d - half) * 100, 2), round((d + half) * 100, 2)]}


def _shape(cond: str) -> str:
    return "real lengths" if cond == "real" else f"padded {PAD}"


def _where(cond: str, tk: str = "t1") -> str:
    return f"batch 1, {_shape(cond)}, {tk[1:]} thread(s)"


def _line(target: str, where: str, value, display, ok: bool, na: str = "n/a", **extra) -> dict:
    """One target line: display() says the figures, or `na` (pass None) when nothing was measured."""
    return {"target": target, "where": where, "value": value, "display": na if value is None else display(),
            **extra, "pass": None if value is None else ok}


def targets(result: dict) -> list[dict]:
    """One pass/miss line per target and condition, for the student's INT8 ONNX: ONNX Runtime is the runtime
    Optimum's baselines run too, so its ratios compare the models, not the runtimes (the TFLite file's timings
    are in the tables beside it; on some machines it is the faster file). The fastest-peer and accuracy targets
    take the TFLite file too, and the static tier's both of the static bundle's files. Pure computation on the
    results, so --render scores a run made before a target existed (n/a where it lacks the rows)."""
    out = []
    s, tfl = "student-onnx-int8", "student-tflite-int8"
    models, timing = result["models"], result["timing"]
    for tk, by_cond in timing.items():
        for cond, table in by_cond.items():
            row = table.get(s, {})
            for key, name in (("speedup_vs_1", "faster than 1 (PyTorch FP32)"),
                              ("speedup_vs_2", f"faster than 2 ({result['baseline_2'][tk][cond]})")):
                v = row.get(key)
                out.append(_line(f"≥ {TARGETS[key]:g}× {name}", _where(cond, tk), v, lambda: f"{v:.2f}×",
                                 v is not None and v >= TARGETS[key]))
            v = row.get("fraction_of_peak")
            out.append(_line(f"INT8 model > {TARGETS['gemm_fraction']:.0%} of the measured INT8 GEMM peak",
                             _where(cond, tk), v,
                             lambda: f"{v:.1%} ({row['achieved_gops']:.1f} of {row['gemm_peak_gops']:.1f} GOPS)",
                             v is not None and v > TARGETS["gemm_fraction"]))
    line = timing.get("t1", {}).get("real", {})
    peer = _fastest(line, PEERS)
    for student in (s, tfl):
        v = _median(ratios_by_repeat(line[peer], line.get(student, {}))) if peer else None
        out.append(_line(f"≥ {TARGETS['speedup_vs_peer']:g}× the fastest peer",
                         f"{student}, {_where('real')}", v,
                         lambda: f"{v:.2f}× ({peer} {line[peer]['p50_ms']:.2f} ms → "
                                 f"{line[student]['p50_ms']:.3f} ms)",
                         v is not None and v >= TARGETS["speedup_vs_peer"], peer=peer))
    for cond in CONDITIONS:
        one, two = (timing.get(tk, {}).get(cond, {}).get(s, {}) for tk in ("t1", "t2"))
        v = _median(ratios_by_repeat(one, two))
        why = _scaling_reason(result, cond)
        out.append(_line(f"≥ {TARGETS['thread_scaling']:g}× 1→2 threads",
                         f"{s}, batch 1, {_shape(cond)}", v,
                         lambda: f"{v:.2f}× ({one['p50_ms']:.3f} ms → {two['p50_ms']:.3f} ms)" + (why and f"; {why}"),
                         v is not None and v >= TARGETS["thread_scaling"], reason=why))
    v = models[s]["size_vs_1"]
    for floor in TARGETS["size_vs_1"]:
        out.append(_line(f"≥ {floor:g}× smaller", "file bytes against 1 (the teacher's FP32 weights)", v,
                         lambda: f"{v:.2f}× ({models['pytorch-fp32']['bytes'] / 1e6:.1f} MB → "
                                 f"{models[s]['bytes'] / 1e6:.1f} MB)",
                         v is not None and v >= floor))
    out += _accuracy_targets(models)
    out += _static_targets(models, line)
    return out


def _scaling_reason(result: dict, cond: str) -> str:
    """Why a second thread moves the student so little, from its op profiles at 1 and 2 threads ("" in a run
    without them): the matrix products are the only work ONNX Runtime splits at batch 1, so their share of a run
    bounds the gain; and the thread count the bundle recommends, from the compile's own bench."""
    one = result["profiles"].get("student-onnx-int8", {}).get(cond, {})
    two = result.get("student_profiles", {}).get("t2", {}).get(cond, {})
    if "gemm_ms" not in one or "gemm_ms" not in two:
        return ""
    (g1, r1), (g2, r2) = ((p["gemm_ms"], p["model_run_ms"]) for p in (one, two))
    recommended = result["stages"]["files"].get("model.onnx", {}).get("recommended_threads")
    return (f"matrix products are {g1 / r1:.0%} of a profiled run ({g1:.3f} of {r1:.3f} ms), so halving them would "
            f"give {r1 / (r1 - g1 / 2):.2f}× at most; 2 threads take them to {g2:.3f} ms and the rest from "
            f"{r1 - g1:.3f} to {r2 - g2:.3f} ms"
            + (f"; the bundle recommends {recommended} thread{'s' if recommended > 1 else ''}" if recommended else ""))


def _accuracy_targets(models: dict) -> list[dict]:
    """Each student file's SST-2 dev accuracy against the teacher's, per condition, with the paired interval."""
    teacher = models["pytorch-fp32"]["accuracy"]
    out = []
    for points in TARGETS["accuracy_drop_points"]:
        for student in ("student-onnx-int8", "student-tflite-int8"):
            for cond in CONDITIONS:
                t, st = teacher.get(cond, {}), models[student]["accuracy"].get(cond, {})
                a, b = t.get("accuracy"), st.get("accuracy")
                drop = None if a is None or b is None else (a - b) * 100
                pair = None if drop is None else paired(t, st)
                interval = "" if pair is None else (
                    f"; 95% interval {pair['interval_points'][0]:+.2f} to {pair['interval_points'][1]:+.2f}: "
                    f"{pair['only_teacher']} sentences only the teacher gets right, {pair['only_student']} only the "
                    "student")
                out.append(_line(f"within {points:g} point{'' if points == 1 else 's'}",
                                 f"{student}, {_shape(cond)}, SST-2 dev accuracy against the teacher's",
                                 drop, lambda: f"{b * 100:.2f}% vs {a * 100:.2f}% ({-drop:+.2f} points{interval})",
                                 drop is not None and drop <= points, paired=pair))
    return out


def _static_targets(models: dict, line: dict) -> list[dict]:
    """The static tier: both of the static bundle's files at once (n/a in a run without one)."""
    where = "the static bundle's model.onnx and model.tflite"
    small = f"static tier ≥ {TARGETS['static_accuracy']:.0%} at ≤ {TARGETS['static_bytes'] / 1e6:g} MB"
    fast = f"static tier ≤ {TARGETS['static_p50_ms']:g} ms"
    if not all(mid in models for mid in STATIC):
        return [_line(target, where, None, None, False, na="n/a: no static bundle in this run (--static-bundle)")
                for target in (small, fast)]
    names = {mid: "model.onnx" if "onnx" in mid else "model.tflite" for mid in STATIC}
    acc = {mid: models[mid]["accuracy"].get("real", {}).get("accuracy") for mid in STATIC}
    measured = None if None in acc.values() else min(acc.values())
    out = [_line(small, f"{where}, SST-2 dev accuracy at real lengths, file bytes", measured,
                 lambda: "; ".join(f"{names[mid]} {acc[mid]:.2%}, {models[mid]['bytes']:,} bytes" for mid in STATIC),
                 measured is not None and all(acc[mid] >= TARGETS["static_accuracy"]
                                              and models[mid]["bytes"] <= TARGETS["static_bytes"] for mid in STATIC))]
    p50 = {mid: line.get(mid, {}).get("p50_ms") for mid in STATIC}
    slowest = None if None in p50.values() else max(p50.values())
    out.append(_line(fast, f"{where}, {_where('real')}", slowest,
                     lambda: "; ".join(f"{names[mid]} {p50[mid]:.3f} ms" for mid in STATIC),
                     slowest is not None and slowest <= TARGETS["static_p50_ms"]))
    return out
