"""report.html: what a bundle is, how it was made and how it runs, readable offline.

One self-contained file (inline CSS and SVG charts, no scripts, nothing fetched), so it opens from a
bundle on any machine. The page is a jinja2 template (templates/report.html.j2); the charts are
matplotlib figures written as SVG with a fixed hash salt and no date, so the bytes depend only on the
recorded stages and measurements, like every other hashed file of the bundle. It holds no wall times.

Every task metric is shown in points (accuracy 0.9014 → 90.14): the manifest keeps fractions, the
Pareto points arrive in points (compile converts them, `bundle.write_bundle` documents it).
"""

from __future__ import annotations

import math
from io import StringIO
from pathlib import Path

import numpy as np

from edgebert.device_tests.metrics import IGNORE, points
from edgebert.errors import EdgebertError

TEMPLATES = Path(__file__).parent / "templates"
TOP_OPS = 8
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#e377c2", "#7f7f7f",
           "#bcbd22")
MARKERS = ("o", "s", "D", "^", "v", "P", "X")


def render(record: dict, chart: list[dict]) -> str:
    """The report for a bundle record (the manifest before its file list) and its Pareto points."""
    try:
        import jinja2
    except ImportError as e:
        raise EdgebertError(f"report.html needs jinja2 and matplotlib ({e}): pip install 'edgebert[convert]'") from None
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(size=_bytes, flops=_flops, num=_num, ms=_ms)
    task = record.get("task")
    task = task if isinstance(task, dict) else {"name": task, "metric": chart[0]["metric_name"] if chart
                                                else "accuracy", "kind": None}
    files = _files(record)
    best = optimal(chart)
    runs = {name: f["latency_runs_ms"] for name, f in files.items() if f.get("latency_runs_ms")}
    return env.get_template("report.html.j2").render(
        title=f"edgebert bundle: {task['name']}" if task.get("name") else "edgebert bundle",
        task=task, summary=_summary(record), stages=_stages(record, files, task["metric"]), files=files,
        pareto=[{**p, "optimal": ok} for p, ok in zip(chart, best)],
        pareto_chart=_pareto_chart(chart, best) if chart else None,
        latency_chart=_latency_chart(runs) if runs else None,
        machine=_machine(record), versions=record.get("versions") or {},
        baselines=record.get("baselines"), contract=_contract(record), top_ops=TOP_OPS,
        search=record.get("search")) + "\n"


# ---------------------------------------------------------------------------------------------
# What the compile gathers for the report (it lands in the manifest, so the report is reproducible).


def error_breakdown(predictions, labels, names: list[str]) -> dict | None:
    """A confusion matrix (classification; for token tasks over the tags of the labeled first pieces) or
    the residuals (regression) of one file on the eval set."""
    if predictions is None or labels is None:
        return None
    labels = np.asarray(labels)
    if labels.ndim == 2:  # the harness gives each example's tags at its labeled positions, in order
        if len(predictions) != len(labels):
            return None
        predictions = np.array([t for row in predictions for t in row], dtype=np.int64)
        labels = labels[labels != IGNORE]
    predictions = np.asarray(predictions)
    if predictions.shape != labels.shape:
        return None
    if labels.dtype.kind == "f":
        residual = predictions.astype(np.float64) - labels
        edges = np.linspace(-max(abs(residual).max(), 1e-9), max(abs(residual).max(), 1e-9), 11)
        counts, _ = np.histogram(residual, edges)
        return {"kind": "residuals", "n": int(len(residual)), "mean": float(residual.mean()),
                "mae": float(abs(residual).mean()), "rmse": float(np.sqrt((residual ** 2).mean())),
                "percentiles": dict(zip(("p5", "p25", "p50", "p75", "p95"),
                                        map(float, np.percentile(residual, [5, 25, 50, 75, 95])))),
                "histogram": {"edges": edges.tolist(), "counts": counts.tolist()}}
    n = max(len(names), int(predictions.max()) + 1, int(labels.max()) + 1)
    matrix = np.bincount(labels.astype(np.int64) * n + predictions.astype(np.int64), minlength=n * n).reshape(n, n)
    return {"kind": "confusion", "labels": [names[i] if i < len(names) else str(i) for i in range(n)],
            "matrix": matrix.tolist()}


def baselines(compare: dict) -> dict:
    """bench/compare.py's models (teacher, Optimum, student) at 1 thread on real lengths, compactly."""
    timing = compare.get("timing", {}).get("t1", {}).get("real", {})
    rows = []
    for key, m in compare.get("models", {}).items():
        t = timing.get(key, {})
        rows.append({"id": key, "label": m.get("label", key), "bytes": m.get("bytes"),
                     "accuracy": (m.get("accuracy", {}).get("real") or {}).get("accuracy"),
                     "p50_ms": t.get("p50_ms"), "p90_ms": t.get("p90_ms"), "peak_rss_mb": t.get("peak_rss_mb"),
                     "speedup_vs_baseline": t.get("speedup_vs_2"), "student": key.startswith("student")})
    machine = compare.get("machine", {})
    return {"date": compare.get("date"), "command": compare.get("command"),
            "machine": f"{machine.get('cpu_model', '?')} ({machine.get('architecture', '?')}, "
                       f"{machine.get('cores', '?')} cores)",
            "baseline": compare.get("baseline_2", {}).get("t1", {}).get("real"), "rows": rows}


# ---------------------------------------------------------------------------------------------
# The page's rows.


BASELINE_MARGIN = 0.02  # a trained model this close to always answering the commonest class learned little


def near_baseline(accuracy: float | None, baseline: dict | None) -> bool:
    """Whether an accuracy (a fraction) is within BASELINE_MARGIN of the majority-class baseline's."""
    return accuracy is not None and baseline is not None and accuracy - baseline["accuracy"] < BASELINE_MARGIN


def _summary(record: dict) -> list[tuple[str, str]]:
    inputs = record.get("inputs", {})
    tok = inputs.get("tokenizer", {})
    baseline, unknown = (record.get("data") or {}).get("majority_baseline"), (record.get("data") or {}).get("unk_rate")
    rows = [("Labels", ", ".join(record.get("labels") or []) or "none (regression or token task)"),
            ("Files", ", ".join(inputs.get("files", {})) or "none"),
            ("Max length", inputs.get("max_length")),
            ("Tokenizer", f"{tok.get('type')}, {'lower-cases' if tok.get('lowercase') else 'cased'}, "
                          f"{tok.get('vocab_size')} tokens" if tok else None),
            ("Quantization", _short(record.get("quantization")) if record.get("quantization") else None),
            ("MediaPipe", _mediapipe(record.get("mediapipe"))),
            ("Majority-class baseline", f"accuracy {points(baseline['accuracy']):.2f} (always {baseline['label']!r} "
                                        f"on the eval set): a trained model should beat it by more than "
                                        f"{BASELINE_MARGIN * 100:.0f} points" if baseline else None),
            ("[UNK] tokens", ", ".join(f"{v:.1%} of {k}" for k, v in unknown.items()) if unknown else None),
            ("Promise", " ".join(promise_lines(record["promise"])) if record.get("promise") else None)]
    return [(k, str(v)) for k, v in rows if v is not None]


def promise_lines(record: dict, *, missed_only: bool = False) -> list[str]:
    """The manifest's `promise` (pipeline.promise) in words: a line for the metric, one for the size (with
    missed_only, only a line that says what missed)."""
    metric, teacher, max_drop, files = record["metric"], record["teacher"], record["max_drop"], record["files"]
    out = []
    each = ", ".join(f"{name} {f['metric']:.2f} ({-f['drop']:+.2f})" for name, f in files.items())
    drop = f"{max_drop:g} point{'' if max_drop == 1 else 's'}"
    if not record["within"]:
        out.append(f"promise: NOT kept: {each} against the teacher's {metric} {teacher:.2f}, more than max_drop "
                   f"{drop} under it; the bundle holds the best this recipe found (recover longer, prune less, or "
                   f"raise max_drop)")
    elif not missed_only:
        out.append(f"promise: kept: {each}, each within {drop} of the teacher's {metric} {teacher:.2f}")
    sizes = ", ".join(f"{name} {f['smaller']:.1f}x" for name, f in files.items() if f["smaller"] is not None)
    if sizes and not record["small"]:
        out.append(f"promise: size NOT kept: {sizes} smaller than the teacher's FP32 weights, under "
                   f"{record['smaller_target']:g}x (prune more, or quantize the word table to INT4)")
    elif sizes and not missed_only:
        out.append(f"promise: {sizes} smaller than the teacher's FP32 weights")
    return out


def _mediapipe(info: dict | None) -> str | None:
    if not info:
        return None
    if "file" in info:
        return f"{info['file']}: signature {info['signature']}, up to {info['max_length']} tokens"
    return f"no MediaPipe file: {info.get('skipped')}"


def _files(record: dict) -> dict[str, dict]:
    """Each final model file: its verification against PyTorch and its local bench, metrics in points."""
    verification, bench = record.get("verification") or {}, record.get("bench_local") or {}
    task = record.get("task")
    metric = task.get("metric") if isinstance(task, dict) else None
    out = {}
    for name in [*verification, *(n for n in bench if n not in verification)]:  # in the order stages wrote them
        v, b = verification.get(name) or {}, bench.get(name) or {}
        check, meta = v.get("verify") or {}, v.get("meta") or {}
        method = meta.get("method") or (meta.get("config") or {}).get("type") or meta.get("precision")
        device = (b.get("metrics") or {}).get(metric or b.get("metric"))
        out[name] = {
            "stage": v.get("stage", "export"), "format": meta.get("format") or Path(name).suffix.lstrip("."),
            "method": method or "float", "bytes": check.get("bytes") or b.get("bytes"),
            "metric": points(check.get("value")), "metric_name": check.get("metric"),
            "device_metric": points(device), "agreement": points(check.get("agreement")),
            "max_abs_diff": check.get("max_abs_diff"), "examples": check.get("examples"),
            "latency": b.get("latency_ms"), "latency_runs_ms": b.get("latency_runs_ms"),
            "load_ms": b.get("load_ms"), "first_ms": b.get("first_inference_ms"), "peak_rss_mb": b.get("peak_rss_mb"),
            "threads": b.get("threads"), "runtime": b.get("runtime"), "profile": _profile(b.get("profile")),
            "p50_by_threads": {n: f"{ms:.3g}" for n, ms in (b.get("p50_ms_by_threads") or {}).items()},
            "recommended_threads": b.get("recommended_threads"),
            "errors": _errors(b.get("errors"))}
    return out


def _profile(profile: dict | None) -> dict | None:
    if not profile:
        return None
    ops = profile.get("ops", [])
    shown = ops[:TOP_OPS]
    return {"runs": profile.get("runs"), "kernel_ms": profile.get("kernel_ms"),
            "model_run_ms": profile.get("model_run_ms"), "mean_length": profile.get("mean_length"),
            "ops": [{**o, "share": o["share"] * 100} for o in shown],
            "rest": sum(o["share"] for o in ops[TOP_OPS:]) * 100, "rest_count": len(ops) - len(shown)}


def _errors(errors: dict | None) -> dict | None:
    if not errors or errors.get("kind") != "confusion":
        return errors
    matrix = np.asarray(errors["matrix"])
    totals = matrix.sum(1, keepdims=True)
    share = np.where(totals > 0, matrix / np.maximum(totals, 1) * 100, 0.0)
    return {**errors, "rows": [{"label": label, "cells": [{"count": int(c), "share": float(s)} for c, s in zip(r, p)],
                                "total": int(t), "recall": float(p[i])}
                               for i, (label, r, p, t) in enumerate(zip(errors["labels"], matrix, share, totals[:, 0]))]}


def _stages(record: dict, files: dict[str, dict], metric: str) -> list[dict]:
    """Every stage through the final files: the training passes, then one row per file quantize/export wrote."""
    rows, last = [], {}
    baseline = (record.get("data") or {}).get("majority_baseline")
    for s in record.get("stages") or []:
        params = dict(s.get("params") or {})
        total = params.pop("total", None)
        metrics = s.get("metrics") or {}
        others = [f"{k} {points(v):.2f}" for k, v in metrics.items() if k != metric and isinstance(v, (int, float))]
        others += [f"try from seed {t['seed']}: validation {points(t['validation']):.2f}, {metric} "
                   f"{points(t['metrics'].get(metric)):.2f}" + (" (kept: the best on validation)" if t["kept"] else "")
                   for t in s.get("tries", [])]
        rows.append({"name": s["name"], "output": "PyTorch checkpoint", "params": total, "bytes": s.get("bytes"),
                     "flops": s.get("flops"), "metric": points(metrics.get(metric)), "others": "; ".join(others),
                     "settings": _short(params), "agreement": None, "max_abs_diff": None,
                     "near_baseline": near_baseline(metrics.get("accuracy"), baseline)})
        last = rows[-1]
    for name, f in files.items():
        rows.append({"name": f["stage"], "output": f"{name} ({f['method']})", "params": last.get("params"),
                     "bytes": f["bytes"], "flops": last.get("flops"), "metric": f["metric"], "others": "",
                     "settings": "", "agreement": f["agreement"], "max_abs_diff": f["max_abs_diff"],
                     "near_baseline": metric == "accuracy" and near_baseline(
                         None if f["metric"] is None else f["metric"] / 100, baseline)})
    return rows


def _machine(record: dict) -> list[tuple[str, str]]:
    """Where the local bench ran: the harness's device description, threads and runtimes."""
    benched = [b for b in (record.get("bench_local") or {}).values() if b.get("device")]
    if not benched:
        return []
    d = benched[0]["device"]
    runtimes = sorted({f"{b['runtime']['backend']} {b['runtime']['version']}" for b in benched if b.get("runtime")})
    rows = [("CPU", f"{d.get('cpu_model')} ({d.get('architecture')})"),
            ("Cores", f"{d.get('cores_usable')} usable of {d.get('cores')}"),
            ("ISA features", ", ".join(d.get("isa_features") or []) or "none found"),
            ("OS", d.get("os")), ("Python", d.get("python")),
            ("Threads", ", ".join(sorted({str(b.get("threads")) for b in benched}))),
            ("Runtimes", ", ".join(runtimes))]
    return [(k, str(v)) for k, v in rows if v]


def _contract(record: dict) -> dict:
    inputs = record.get("inputs", {})
    tok = inputs.get("tokenizer", {})
    rows = []
    for name, io in inputs.get("files", {}).items():
        graphs = io["signatures"].items() if "signatures" in io else [("", io)]  # one graph, or one per length
        for i, (key, graph) in enumerate(graphs):
            ops = ", ".join(f"{op} ×{n}" for op, n in io.get("ops", {}).items()) if i == 0 else ""
            rows.append([name, io["format"], key, _tensors(graph["inputs"]), _tensors(graph["outputs"]), ops])
    providers = [[name, provider.upper() if provider != "coreml" else "CoreML",
                  f"{fit['fraction']:.0%} ({fit['taken']} of {fit['nodes']})", fit["partitions"],
                  ", ".join(fit["cpu_ops"])]
                 for name, io in inputs.get("files", {}).items()
                 for provider, fit in io.get("accelerators", {}).items() if isinstance(fit, dict)]
    return {"names": ", ".join(inputs.get("names", [])), "single": str(tok.get("single_template")),
            "pair": str(tok.get("pair_template")),
            "special": ", ".join(f"{v['token']}={v['id']}" for v in tok.get("special_tokens", {}).values()),
            "rows": rows, "providers": providers,
            "qnn": next((io["accelerators"]["qnn"] for io in inputs.get("files", {}).values() if "accelerators" in io),
                        None)}


def _tensors(tensors: dict) -> str:
    return "; ".join(f"{n} {t['dtype']}{t['shape']}" for n, t in tensors.items())


def optimal(points: list[dict]) -> list[bool]:
    """For each point: True unless another is at least as good on metric, latency and bytes, and better on one."""
    def dominates(q, p):
        at_least = q["metric"] >= p["metric"] and q["latency_ms"] <= p["latency_ms"] and q["bytes"] <= p["bytes"]
        return at_least and (q["metric"], -q["latency_ms"], -q["bytes"]) != (p["metric"], -p["latency_ms"], -p["bytes"])
    return [not any(dominates(q, p) for q in points) for p in points]


# ---------------------------------------------------------------------------------------------
# Charts: matplotlib figures as inline SVG. Labels live in a legend beside the axes, never on the points,
# so they cannot overlap whatever the numbers.


def _svg(fig) -> str:
    import matplotlib

    buf = StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "edgebert-report", "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _figure(width: float, height: float):
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise EdgebertError(f"report.html needs jinja2 and matplotlib ({e}): pip install 'edgebert[convert]'") from None
    fig = Figure(figsize=(width, height), dpi=96)
    return fig, fig.add_subplot()


def _pareto_chart(points: list[dict], best: list[bool], *, x: str = "latency_ms", teacher: float | None = None,
                  max_drop: float | None = None) -> str:
    """Metric against `x` (latency_ms, or bytes), every point with its figures in the legend, the 2-D frontier
    dashed; with `teacher`, its metric as a line and, with `max_drop`, the promise's floor under it."""
    from matplotlib.lines import Line2D

    fig, ax = _figure(8.6, 4.6)
    formats = sorted({p["format"] for p in points})
    marker = {f: MARKERS[i % len(MARKERS)] for i, f in enumerate(formats)}
    biggest = max(p["bytes"] for p in points)
    handles = []
    for i, (p, ok) in enumerate(zip(points, best)):
        colour = PALETTE[i % len(PALETTE)]
        area = 40 + 500 * p["bytes"] / biggest if x == "latency_ms" else 90
        ax.scatter([p[x]], [p["metric"]], s=area, marker=marker[p["format"]], color=colour,
                   alpha=0.85 if ok else 0.35, edgecolors="black" if ok else colour, linewidths=1.5 if ok else 0.8,
                   zorder=3)
        handles.append(Line2D([], [], linestyle="", marker=marker[p["format"]], markersize=8, color=colour,
                              markeredgecolor="black" if ok else colour,
                              label=f"{p['stage']} · {p['format']}: {p['metric']:.2f}, {p['latency_ms']:.3g} ms, "
                                    f"{_bytes(p['bytes'])}{' ★' if ok else ''}"))
    front = sorted((p for p, ok in zip(points, best) if ok), key=lambda p: (p[x], -p["metric"]))
    line, top = [], -math.inf
    for p in front:  # the 2-D frontier: each step right must buy accuracy
        if p["metric"] > top:
            line.append(p)
            top = p["metric"]
    if len(line) > 1:
        ax.plot([p[x] for p in line], [p["metric"] for p in line], "--", color="#555", lw=1, zorder=2)
    if teacher is not None:
        ax.axhline(teacher, color="#2ca02c", lw=1, zorder=1)
        handles.append(Line2D([], [], color="#2ca02c", lw=1, label=f"the teacher: {teacher:.2f}"))
        if max_drop is not None:
            ax.axhline(teacher - max_drop, color="#2ca02c", lw=1, ls=":", zorder=1)
            handles.append(Line2D([], [], color="#2ca02c", lw=1, ls=":",
                                  label=f"the promise: within {max_drop:g} point of it"))
    xs = [p[x] for p in points]
    if max(xs) / min(xs) > 20:
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}" if x == "latency_ms" else _bytes(v)))
    elif x == "bytes":
        from matplotlib.ticker import FuncFormatter

        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _bytes(v)))
    ax.margins(0.12)
    ax.grid(True, color="#e3e3e3", zorder=0)
    ax.set_xlabel("latency p50, batch 1 (ms)" if x == "latency_ms" else "size on disk")
    ax.set_ylabel(f"{points[0]['metric_name']} (points)")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False, fontsize=9,
              title="stage · format (★ Pareto-optimal)", title_fontsize=9, alignment="left")
    return _svg(fig)


def frontier_charts(points: list[dict], *, teacher: float | None = None, max_drop: float | None = None) -> dict:
    """{"latency": svg, "size": svg}: the Pareto charts of `points` ({stage, format, metric, latency_ms, bytes,
    metric_name}) against latency and against size, for bench/compare.py's peers and tiers."""
    best = optimal(points)
    return {"latency": _pareto_chart(points, best, teacher=teacher, max_drop=max_drop),
            "size": _pareto_chart(points, best, x="bytes", teacher=teacher, max_drop=max_drop)}


def _latency_chart(runs: dict[str, list[float]]) -> str:
    fig, ax = _figure(8.6, 3.6)
    for i, (name, ms) in enumerate(runs.items()):
        a = np.sort(np.asarray(ms, dtype=np.float64))
        y = np.arange(1, len(a) + 1) / len(a) * 100
        p50, p90, p99 = np.percentile(a, [50, 90, 99])
        ax.step(a, y, where="post", color=PALETTE[i % len(PALETTE)], lw=1.6,
                label=f"{name}: p50 {p50:.3g}, p90 {p90:.3g}, p99 {p99:.3g} ms ({len(a)} runs)")
    for q in (50, 90, 99):
        ax.axhline(q, color="#bbb", lw=0.8, ls=":", zorder=0)
    every = np.concatenate([np.asarray(ms, dtype=np.float64) for ms in runs.values()])
    if every.max() / every.min() > 10:  # one stall would squash every curve into the left edge
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylim(0, 101)
    ax.set_yticks([0, 25, 50, 75, 90, 100])  # 99 is the dotted line below 100: a label there would collide
    ax.grid(True, axis="x", color="#e3e3e3")
    ax.set_xlabel(f"latency of one run, batch 1 (ms{', log scale' if ax.get_xscale() == 'log' else ''})")
    ax.set_ylabel("runs at or below (%)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False, fontsize=9, title="file",
              title_fontsize=9, alignment="left")
    return _svg(fig)


# ---------------------------------------------------------------------------------------------
# Formatting (template filters).


def _short(value) -> str:
    if not value:
        return ""
    if isinstance(value, dict):
        return "; ".join(f"{k}={_short(v) if isinstance(v, (dict, list)) else _num(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def _num(v, digits: int = 4) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10_000:
        return f"{v:,}"
    return str(v)


def _ms(v) -> str:
    return "–" if v is None else f"{v:.3f}"


def _bytes(n) -> str:
    if n is None:
        return "–"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def _flops(n) -> str:
    if n is None:
        return "–"
    return f"{n / 1e9:.3f} G" if n >= 1e7 else f"{n / 1e6:.3f} M"
