"""report.html: the per-stage table and the accuracy / latency / size trade-off, readable offline.

One self-contained file (inline CSS and SVG, no scripts, nothing fetched), so it opens from a bundle
on any machine. It holds no timestamps or wall times: its bytes depend only on the recorded stages
and measurements, like every other hashed file of the bundle.
"""

from __future__ import annotations

import json
import math
from html import escape

WIDTH, HEIGHT = 760, 440
LEFT, RIGHT, TOP, BOTTOM = 70, 170, 20, 50
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")
CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;
vertical-align:top}th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
code{background:#f6f6f6;padding:0 3px}.note{color:#666;font-size:13px}svg text{font:12px system-ui,sans-serif}"""


def render(record: dict, points: list[dict]) -> str:
    """The report for a bundle record (the manifest without files and versions) and its Pareto points."""
    task = record.get("task")
    title = f"edgebert bundle: {task}" if isinstance(task, str) else "edgebert bundle"
    head = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{escape(title)}</h1>")
    parts = [head, _summary(record),
             "<h2>Stages</h2>", _stages(record.get("stages") or []),
             "<h2>Accuracy, latency and size</h2>", _pareto(points),
             "<h2>Input contract</h2>", _contract(record),
             "</body></html>\n"]
    return "\n".join(parts)


def _summary(record: dict) -> str:
    inputs = record.get("inputs", {})
    tok = inputs.get("tokenizer", {})
    rows = [("Labels", ", ".join(record.get("labels") or []) or "none (regression or token task)"),
            ("Files", ", ".join(inputs.get("files", {})) or "none"),
            ("Max length", inputs.get("max_length")),
            ("Tokenizer", f"{tok.get('type')}, {'lower-cases' if tok.get('lowercase') else 'cased'}, "
                          f"{tok.get('vocab_size')} tokens" if tok else None),
            ("Quantization", _short(record.get("quantization")) if record.get("quantization") else None),
            ("MediaPipe", _mediapipe(record.get("mediapipe")))]
    return _table(None, [[k, v] for k, v in rows if v is not None])


def _mediapipe(info: dict | None) -> str | None:
    if not info:
        return None
    if "file" in info:
        return f"{info['file']}: signature {info['signature']}, up to {info['max_length']} tokens"
    return f"no classifier.tflite: {info.get('skipped')}"


def _stages(stages: list[dict]) -> str:
    if not stages:
        return "<p class='note'>No stage records were given.</p>"
    rows = [[s["name"], _short(s.get("params")), _bytes(s.get("bytes")), _flops(s.get("flops")),
             _short(s.get("metrics"))] for s in stages]
    return _table(["Stage", "Parameters", "Size", "FLOPs / sequence", "Metrics"], rows, numeric={2, 3})


def _pareto(points: list[dict]) -> str:
    if not points:
        return "<p class='note'>No latency measurements were given, so there is no trade-off chart.</p>"
    best = optimal(points)
    rows = [[p["stage"], p["format"], f"{p['latency_ms']:.3f}", f"{p['metric']:.2f}", _bytes(p["bytes"]),
             "yes" if ok else ""] for p, ok in zip(points, best)]
    name = points[0]["metric_name"]
    return "\n".join([_chart(points, best), "<p class='note'>x: latency p50; y: " + escape(name) +
                      "; bubble area: file size. Filled, outlined points are Pareto-optimal: no other point is at "
                      "least as accurate, as fast and as small. Hover a point for its numbers.</p>",
                      _table(["Stage", "Format", "Latency p50 (ms)", escape(name), "Size", "Pareto-optimal"], rows,
                             numeric={2, 3, 4})])


def optimal(points: list[dict]) -> list[bool]:
    """For each point: True unless another is at least as good on metric, latency and bytes, and better on one."""
    def dominates(q, p):
        at_least = q["metric"] >= p["metric"] and q["latency_ms"] <= p["latency_ms"] and q["bytes"] <= p["bytes"]
        return at_least and (q["metric"], -q["latency_ms"], -q["bytes"]) != (p["metric"], -p["latency_ms"], -p["bytes"])
    return [not any(dominates(q, p) for q in points) for p in points]


def _chart(points: list[dict], best: list[bool]) -> str:
    xs = [p["latency_ms"] for p in points]
    ys = [p["metric"] for p in points]
    log = max(xs) / min(xs) > 20
    xt = _log_ticks(min(xs), max(xs)) if log else _ticks(min(xs), max(xs))
    yt = _ticks(min(ys), max(ys))
    x0, x1 = (min(xt[0], min(xs)), max(xt[-1], max(xs)))
    y0, y1 = (min(yt[0], min(ys)), max(yt[-1], max(ys)))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(v):
        f = (math.log10(v) - math.log10(x0)) / ((math.log10(x1) - math.log10(x0)) or 1) if log \
            else (v - x0) / ((x1 - x0) or 1)
        return LEFT + 15 + f * (plot_w - 30)

    def sy(v):
        return TOP + plot_h - 15 - (v - y0) / ((y1 - y0) or 1) * (plot_h - 30)

    formats = sorted({p["format"] for p in points})
    colour = {f: PALETTE[i % len(PALETTE)] for i, f in enumerate(formats)}
    biggest = max(p["bytes"] for p in points)
    svg = [(f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' "
            f"viewBox='0 0 {WIDTH} {HEIGHT}' role='img' aria-label='accuracy against latency, bubble size = size'>"),
           f"<rect x='{LEFT}' y='{TOP}' width='{plot_w}' height='{plot_h}' fill='#fafafa' stroke='#999'/>"]
    for t in xt:
        x = sx(t)
        svg.append(f"<line x1='{x:.1f}' y1='{TOP}' x2='{x:.1f}' y2='{TOP + plot_h}' stroke='#e3e3e3'/>"
                   f"<text x='{x:.1f}' y='{TOP + plot_h + 16}' text-anchor='middle'>{_num(t)}</text>")
    for t in yt:
        y = sy(t)
        svg.append(f"<line x1='{LEFT}' y1='{y:.1f}' x2='{LEFT + plot_w}' y2='{y:.1f}' stroke='#e3e3e3'/>"
                   f"<text x='{LEFT - 6}' y='{y + 4:.1f}' text-anchor='end'>{_num(t)}</text>")
    svg.append(f"<text x='{LEFT + plot_w / 2:.1f}' y='{HEIGHT - 10}' text-anchor='middle'>latency p50 (ms"
               f"{', log scale' if log else ''})</text><text transform='translate(16,{TOP + plot_h / 2:.1f}) "
               f"rotate(-90)' text-anchor='middle'>{escape(points[0]['metric_name'])}</text>")
    front = sorted((p for p, ok in zip(points, best) if ok), key=lambda p: (p["latency_ms"], -p["metric"]))
    frontier, top = [], -math.inf
    for p in front:  # the 2-D frontier: each step right must buy accuracy
        if p["metric"] > top:
            frontier.append(f"{sx(p['latency_ms']):.1f},{sy(p['metric']):.1f}")
            top = p["metric"]
    if len(frontier) > 1:
        svg.append(f"<polyline points='{' '.join(frontier)}' fill='none' stroke='#555' stroke-dasharray='4 3'/>")
    order = sorted(range(len(points)), key=lambda i: -points[i]["bytes"])  # small bubbles drawn on top
    for i in order:
        p, ok = points[i], best[i]
        r = 4 + 18 * math.sqrt(p["bytes"] / biggest)
        tip = f"{p['stage']} ({p['format']}): {p['latency_ms']:.3f} ms, {p['metric']:.2f}, {_bytes(p['bytes'])}"
        x, y = sx(p["latency_ms"]), sy(p["metric"])
        svg.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='{r:.1f}' "
                   f"fill='{colour[p['format']]}' fill-opacity='{0.8 if ok else 0.25}' "
                   f"stroke='{'#000' if ok else colour[p['format']]}' stroke-width='{1.5 if ok else 1}'>"
                   f"<title>{escape(tip)}</title></circle>"
                   f"<text x='{x + r + 3:.1f}' y='{y + 4:.1f}'>{escape(p['stage'])}</text>")
    for i, f in enumerate(formats):
        y = TOP + 14 + 20 * i
        svg.append(f"<circle cx='{WIDTH - RIGHT + 24}' cy='{y}' r='6' fill='{colour[f]}'/>"
                   f"<text x='{WIDTH - RIGHT + 36}' y='{y + 4}'>{escape(f)}</text>")
    svg.append("</svg>")
    return "\n".join(svg)


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values (steps of 1, 2 or 5 × 10^k) covering [lo, hi]."""
    span = hi - lo or abs(hi) or 1.0
    step = 10 ** math.floor(math.log10(span / n))
    step *= next(m for m in (1, 2, 5, 10) if span / (step * m) <= n)
    start = math.floor(lo / step) * step
    return [round(start + i * step, 10) for i in range(math.ceil((hi - start) / step - 1e-9) + 1)]


def _log_ticks(lo: float, hi: float) -> list[float]:
    ticks = [m * 10 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1) for m in (1, 2, 5)]
    inside = [t for t in ticks if lo <= t <= hi]
    return [max(t for t in ticks if t <= lo), *inside, min(t for t in ticks if t >= hi)]


def _contract(record: dict) -> str:
    inputs = record.get("inputs", {})
    tok = inputs.get("tokenizer", {})
    special = ", ".join(f"{v['token']}={v['id']}" for v in tok.get("special_tokens", {}).values())
    head = (f"<p>Inputs <code>{escape(', '.join(inputs.get('names', [])))}</code>, right-padded; "
            f"text as <code>{escape(str(tok.get('single_template')))}</code>, pairs as "
            f"<code>{escape(str(tok.get('pair_template')))}</code>; special tokens {escape(special)}. "
            "The full contract is in manifest.json under <code>inputs</code>.</p>")
    rows = []
    for name, io in inputs.get("files", {}).items():
        graphs = io["signatures"].items() if "signatures" in io else [("", io)]  # one graph, or one per length
        for key, graph in graphs:
            rows.append([name, io["format"], key, _tensors(graph["inputs"]), _tensors(graph["outputs"])])
    return head + _table(["File", "Format", "Signature", "Inputs", "Outputs"], rows)


def _tensors(tensors: dict) -> str:
    return "; ".join(f"{n} {t['dtype']}{t['shape']}" for n, t in tensors.items())


def _table(columns: list[str] | None, rows: list[list], numeric: set[int] = frozenset()) -> str:
    """Cells are escaped; `columns` are trusted markup."""
    head = "<tr>" + "".join(f"<th>{h}</th>" for h in columns) + "</tr>" if columns else ""
    body = "".join("<tr>" + "".join(f"<td{' class=n' if i in numeric else ''}>{escape(str(v))}</td>"
                                    for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def _short(value) -> str:
    if not value:
        return ""
    if isinstance(value, dict):
        return "; ".join(f"{k}={_short(v) if isinstance(v, (dict, list)) else _num(v)}" for k, v in value.items())
    return json.dumps(value, separators=(",", ":"), default=str)


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _bytes(n) -> str:
    if n is None:
        return ""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def _flops(n) -> str:
    if n is None:
        return ""
    return f"{n / 1e9:.3f} G" if n >= 1e7 else f"{n / 1e6:.3f} M"
