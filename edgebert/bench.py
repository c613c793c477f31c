"""`edgebert bench`: run the device harness on a model or bundle, on one or more targets, and
compare results as a markdown table and a self-contained HTML chart.

Several targets run at once, one lane each for remote ones (ssh, adb: a device fleet); targets on this
machine (local, qemu) share one lane, so their timings do not contend for the same cores.
Emulated runs (qemu) are labeled everywhere and charted apart: their timings are not device latency.
A bundle's model file is first checked on the target (`device_tests verify`: its sha256 and its outputs
on the bundle's golden examples); each result carries that check, the table shows it, and the command
line exits 2 when one failed.
"""

from __future__ import annotations

import argparse
import html
import itertools
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .config import repeated
from .device_tests import runtimes
from .device_tests.files import write_bytes, write_json
from .device_tests.accelerators import DELEGATES, PROVIDERS
from .device_tests.verify import line
from .targets import Adb, BenchError, Job, Local, jobs_for, parse

DEFAULT_RUNS = {"warmup": 10, "runs": 100}
EMULATED_RUNS = {"warmup": 1, "runs": 5}  # emulated float math is 300-500x slower
# A thread more must cut a file's median latency by a tenth for the bundle to recommend it: a phone core spent
# for less is power and heat the app pays for, and a second thread barely moves a small model at batch 1
# (ONNX Runtime's per-op handoff outweighs the split of a 25-token MatMul)
THREAD_GAIN = 0.9
NO_GOLDEN = ("no golden outputs to check it against: a bundle written before them (compile it again) or a file "
             "outside a bundle")


def _log(message: str) -> None:
    print(message, file=sys.stderr)


def recommended_threads(p50_by_threads: dict[int, float]) -> int:
    """The thread count to run a file at, from its median latency at each count measured: the fewest threads
    whose latency no count above them beats by more than THREAD_GAIN."""
    best = min(p50_by_threads)
    for n in sorted(p50_by_threads):
        if p50_by_threads[n] < THREAD_GAIN * p50_by_threads[best]:
            best = n
    return best


def resolve(model_or_bundle, fmt: str | None = None, inputs=None,
            manifest=None) -> list[tuple[Path, Path, Path | None, Path | None]]:
    """(model, eval set, manifest, golden outputs) for each model to bench: every model file of a bundle (of
    format `fmt` alone when given), or one file."""
    path = Path(model_or_bundle)
    if not path.exists():
        raise BenchError(f"{path} does not exist: pass a model file or a bundle folder")
    path = path.resolve()  # absolute: the local harness runs in a temporary folder
    known = runtimes.formats()
    if fmt is not None and fmt not in known:
        raise BenchError(f"unknown format {fmt!r}: use one of {', '.join(known)}")
    suffixes = [known[fmt]] if fmt else list(known.values())
    if path.is_dir():
        models = sorted(p for p in path.iterdir() if runtimes.suffix_of(p) in suffixes)
        if not models:
            raise BenchError(f"bundle {path} has no {' or '.join('*' + s for s in suffixes)} model")
        folder = path
    else:
        if runtimes.suffix_of(path) not in known.values():
            raise BenchError(f"{path} is not a {' or '.join(known.values())} model")
        models, folder = [path], path.parent
    eval_set = Path(inputs).resolve() if inputs else folder / "eval.npz"
    if not eval_set.is_file():
        raise BenchError(f"no eval set at {eval_set}: pass --inputs EVAL.npz (written by the exporter)")
    found = Path(manifest).resolve() if manifest else folder / "manifest.json"
    if manifest and not found.is_file():
        raise BenchError(f"manifest {found} does not exist: fix --manifest")
    found = found if found.is_file() else None
    golden = _golden(found) if found else None
    if golden and not golden.is_file():
        raise BenchError(f"{golden.parent} lacks {golden.name}, which its manifest lists: copy the whole bundle again")
    return [(m, eval_set, found, golden) for m in models]


def _golden(manifest: Path) -> Path | None:
    """The golden.json the manifest records; None for a bundle written before them, or a manifest that is
    unreadable (which the harness then refuses, naming it)."""
    try:
        return manifest.parent / json.loads(manifest.read_text())["golden"]["file"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def bench(model_or_bundle, *, target="local", backend=None, fmt=None, threads=1, warmup=None, runs=None,
          duration=None, batch=1, pad_to=None, truncate=False, inputs=None, manifest=None, logits=False,
          timeout=None, json_out=None, ssh_key=None, ssh_options=(), remote_python=None, remote_dir=None,
          benchmark_model=None, signature=None, provider=None, delegate=None, op_profile=False, log=_log) -> dict:
    """Bench every model of `model_or_bundle` on each target (a name or a list of names), the targets
    concurrently (see the module doc). `provider` (ONNX Runtime) and `delegate` (LiteRT) pick the
    accelerator; `op_profile` asks adb's benchmark_model for its per-op profile.

    Returns {"complete": True, "runs": [one harness result per model and target, in target order]};
    any failure raises BenchError naming every target that failed, so a partial set is never returned
    as complete.
    """
    jobs = resolve(model_or_bundle, fmt, inputs, manifest)
    if provider is not None and provider not in PROVIDERS:
        raise BenchError(f"unknown provider {provider!r}: use one of {', '.join(PROVIDERS)}")
    if backend is not None and backend not in runtimes.RUNTIMES:
        raise BenchError(f"unknown backend {backend!r}: use one of {', '.join(runtimes.RUNTIMES)}")
    names = [target] if isinstance(target, str) else list(target)
    if repeated(names) is not None:
        raise BenchError(f"--target {repeated(names)} is given twice: pass each --target once")
    targets = [parse(name, ssh_key=ssh_key, ssh_options=ssh_options, remote_python=remote_python,
                     remote_dir=remote_dir, benchmark_model=benchmark_model, signature=signature,
                     op_profile=op_profile, log=log) for name in names]
    if op_profile and not all(isinstance(t, Adb) and not t.remote_python for t in targets):
        raise BenchError("--op-profile is benchmark_model's per-op profile: use it with adb targets without "
                         "--remote-python")

    def run_on(t) -> list[dict]:
        counts = EMULATED_RUNS if t.emulated else DEFAULT_RUNS
        settings = {"threads": threads, "warmup": counts["warmup"] if warmup is None else warmup,
                    "runs": counts["runs"] if runs is None else runs, "duration": duration, "batch": batch,
                    "pad_to": pad_to, "truncate": truncate, "logits": logits, "emulated": t.emulated,
                    "provider": provider, "delegate": delegate}
        out = []
        for model, eval_set, found, golden in jobs_for(t, jobs):  # web: the .onnx files alone
            log(f"bench: {model.name} on {t.name}" + (" (emulated: timings are not device latency)" if t.emulated else ""))
            result = t.run(Job(model, eval_set, found, backend, settings, timeout, golden))
            result["target"] = t.name
            result["emulated"] = bool(result.get("emulated")) or t.emulated
            result.setdefault("verify", {"passed": None, "reason": NO_GOLDEN})
            if result["verify"]["passed"] is False:
                log(f"bench: verify FAILED on {t.name}: {line(result['verify'])}")
            out.append(result)
        return out

    def lane(group) -> dict:
        """Run targets one after another; a failure is kept, so the others still run."""
        out = {}
        for t in group:
            try:
                out[t.name] = run_on(t)
            except BenchError as e:
                out[t.name] = e
        return out

    here = [t for t in targets if isinstance(t, Local)]  # local and qemu share this machine's cores
    lanes = ([here] if here else []) + [[t] for t in targets if not isinstance(t, Local)]
    outcome = {}
    with ThreadPoolExecutor(max_workers=len(lanes)) as pool:
        for part in pool.map(lane, lanes):
            outcome.update(part)
    failed = [outcome[t.name] for t in targets if isinstance(outcome[t.name], BenchError)]
    if len(targets) == 1 and failed:
        raise failed[0]
    if failed:
        ok = [t.name for t in targets if not isinstance(outcome[t.name], BenchError)]
        raise BenchError(f"{len(failed)} of {len(targets)} targets failed, so no results were written: "
                         + "; ".join(map(str, failed)) + (f" (finished: {', '.join(ok)})" if ok else ""))
    results = [r for t in targets for r in outcome[t.name]]
    report = {"complete": True, "runs": results}
    if json_out:
        write_json(json_out, report, indent=1)
    return report


def load(paths) -> list[dict]:
    """Results from bench JSONs ({"runs": [...]}) or single harness JSONs; incomplete ones refused."""
    runs = []
    for p in paths:
        try:
            data = json.loads(Path(p).read_text())
        except (OSError, ValueError) as e:
            raise BenchError(f"cannot read result {p} ({e}): pass JSON files written by edgebert bench") from None
        for r in data.get("runs", [data]) if isinstance(data, dict) else []:
            if r.get("complete") is not True or "latency_ms" not in r:
                raise BenchError(f"{p} holds an incomplete result: re-run it; partial results are not compared")
            runs.append(r)
    if not runs:
        raise BenchError("no results to compare: pass JSON files written by edgebert bench")
    return runs


def _label(r: dict) -> str:
    return f"{r['model']['file']} · {r['runtime']['backend']} · {r.get('target', 'local')}"


def _ms(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _verified(r: dict) -> str:
    """The first-run check's verdict for the table: pass, FAIL naming what failed, or n/a where none was made."""
    check = r.get("verify") or {}
    if check.get("passed") is None:
        return "n/a"
    if check["passed"]:
        return "pass"
    failed = [] if check.get("sha256_matches") else ["sha256"]
    if not check.get("outputs_match"):
        failed.append(f"outputs {check['max_abs_diff']:.3g} > {check['tolerance']:.3g}" if "max_abs_diff" in check
                      else "outputs")
    return "FAIL: " + ", ".join(failed)


def table(runs: list[dict]) -> str:
    """A markdown table, one row per result; emulated latencies carry a marker and a footnote."""
    head = ("| model · backend · target | device | verify | p50 ms | p90 ms | p99 ms | seq/s | metric | MB | "
            "peak RSS MB |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in runs:
        lat, mark = r["latency_ms"], "*" if r["emulated"] else ""
        metric = f"{r['metric']} {r[r['metric']]:.4f}" if r.get(r.get("metric")) is not None else "none"
        dev = r.get("device", {})
        device = f"{dev.get('architecture', '?')} {dev.get('cpu_model', '')}".strip()
        size = r["model"].get("bytes")
        rss = r.get("peak_rss_mb")
        rows.append(f"| {_label(r)} | {device} | {_verified(r)} | {_ms(lat['p50'])}{mark} | "
                    f"{_ms(lat['p90'])}{mark} | {_ms(lat['p99'])}{mark} | {r['throughput']:.1f}{mark} | {metric} | "
                    f"{size / 1e6:.2f} | {'n/a' if rss is None else f'{rss:.0f}'} |")
    if any(r["emulated"] for r in runs):
        rows.append("\n\\* emulated (qemu): not device latency; compare emulated runs only with each other.")
    return "\n".join(rows)


def _svg(runs: list[dict], title: str) -> str:
    """Horizontal bars of p50 latency with a p90 whisker, on a scale of their own."""
    width, left, bar, gap = 760, 330, 18, 10
    top = 30
    height = top + len(runs) * (bar + gap) + 20
    peak = max((r["latency_ms"]["p90"] or r["latency_ms"]["p50"]) for r in runs) or 1
    scale = (width - left - 90) / peak
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
             f'<text x="0" y="18" font-weight="bold">{html.escape(title)}</text>']
    for i, r in enumerate(runs):
        y = top + i * (bar + gap)
        p50, p90 = r["latency_ms"]["p50"], r["latency_ms"]["p90"]
        color = "#c77c2e" if r["emulated"] else "#2e6fc7"
        parts.append(f'<text x="{left - 8}" y="{y + 13}" text-anchor="end" font-size="12">{html.escape(_label(r))}</text>')
        parts.append(f'<rect x="{left}" y="{y}" width="{p50 * scale:.1f}" height="{bar}" fill="{color}"/>')
        if p90 is not None:
            x = left + p90 * scale
            parts.append(f'<line x1="{left + p50 * scale:.1f}" y1="{y + bar / 2}" x2="{x:.1f}" y2="{y + bar / 2}" '
                         f'stroke="#333"/><line x1="{x:.1f}" y1="{y + 3}" x2="{x:.1f}" y2="{y + bar - 3}" stroke="#333"/>')
        parts.append(f'<text x="{left + max(p50, p90 or 0) * scale + 6:.1f}" y="{y + 13}" font-size="12">'
                     f'{p50:.3f} ms</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def write_report(runs: list[dict], prefix) -> tuple[Path, Path]:
    """PREFIX.md (the table) and PREFIX.html (table + chart, inline SVG, readable offline)."""
    prefix = Path(prefix)
    md, page = prefix.with_suffix(".md"), prefix.with_suffix(".html")
    write_bytes(md, ("# edgebert bench\n\n" + table(runs) + "\n").encode())
    charts = []
    for emulated, title in ((False, "p50 latency (bar) and p90 (whisker), ms"),
                            (True, "EMULATED (qemu) p50 / p90, ms: not device latency")):
        group = [r for r in runs if r["emulated"] == emulated]
        if group:
            charts.append(_svg(group, title))
    rows = []
    for line in table(runs).splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            tag = "th" if not rows else "td"
            rows.append("<tr>" + "".join(f"<{tag}>{html.escape(c.strip())}</{tag}>" for c in line.strip("|").split("|"))
                        + "</tr>")
    note = "<p>* emulated (qemu): not device latency.</p>" if any(r["emulated"] for r in runs) else ""
    write_bytes(page, ("<!doctype html><meta charset='utf-8'><title>edgebert bench</title>"
                       "<style>body{font-family:sans-serif}td,th{border:1px solid #ccc;padding:2px 6px}"
                       "table{border-collapse:collapse}</style><h1>edgebert bench</h1>"
                       f"<table>{''.join(rows)}</table>{note}" + "".join(f"<p>{c}</p>" for c in charts)
                       + "\n").encode())
    return md, page


def _fresh_prefix() -> Path:
    """./edgebert-bench-YYYYmmdd-HHMMSS[-N], its .md claimed with O_EXCL: two runs in one folder (of one
    bundle or two) each keep their own report, where one default name let the last one win."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in itertools.count(1):
        prefix = Path(f"edgebert-bench-{stamp}" + (f"-{n}" if n > 1 else ""))
        try:
            prefix.with_suffix(".md").open("x").close()
            return prefix
        except FileExistsError:
            continue


def _run(args: argparse.Namespace) -> None:
    if not args.model and not args.compare:
        raise BenchError("nothing to bench: pass a model or bundle, or --compare A.json B.json")
    measured = []
    if args.model:
        measured = bench(args.model, target=args.target or ["local"], backend=args.backend, fmt=args.format,
                         threads=args.threads, warmup=args.warmup, runs=args.runs, duration=args.duration,
                         batch=args.batch, pad_to=args.pad_to, truncate=args.truncate, inputs=args.inputs,
                         manifest=args.manifest, logits=args.logits, timeout=args.timeout, json_out=args.json,
                         ssh_key=args.ssh_key, ssh_options=args.ssh_option, remote_python=args.remote_python,
                         remote_dir=args.remote_dir, benchmark_model=args.benchmark_model,
                         signature=args.signature, provider=args.provider, delegate=args.delegate,
                         op_profile=args.op_profile)["runs"]
    runs = measured + (load(args.compare) if args.compare else [])
    print(table(runs))
    if len(runs) > 1 or args.report:
        prefix = args.report or (Path(args.json).with_suffix("") if args.json else _fresh_prefix())
        md, page = write_report(runs, prefix)
        print(f"\ncomparison: {md}, chart: {page}")
    failed = [r for r in measured if r["verify"]["passed"] is False]
    if failed:
        raise BenchError(f"verify failed for {', '.join(_label(r) for r in failed)}: the file does not give the "
                         "bundle's golden outputs there (see the verify column), so its numbers are not the bundle's")


def register(subparsers) -> argparse.ArgumentParser:
    """Add `bench` to the edgebert CLI's subparsers."""
    p = subparsers.add_parser("bench", help="time and score a model on this machine, a board, a phone or qemu",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", help=f"a model ({'/'.join(runtimes.formats().values())}) or a bundle folder "
                   "(model.*, eval.npz, manifest.json)")
    p.add_argument("--target", action="append", help="local (default), ssh://user@host[:port], adb[:serial], "
                   "qemu-aarch64[:cpu] (cortex-a72, cortex-a76, neoverse-n1), web (ORT Web in headless Chromium, "
                   ".onnx only); repeat for several: they run "
                   "at once and share one comparison table")
    p.add_argument("--format", choices=list(runtimes.formats()), help="bench only this format of a bundle")
    p.add_argument("--backend", choices=runtimes.RUNTIMES.names(), help=f"default: {runtimes.defaults()}")
    p.add_argument("--provider", choices=PROVIDERS, help="onnxruntime execution provider (default cpu); "
                   "the target refuses one its onnxruntime lacks")
    p.add_argument("--delegate", help=f"LiteRT delegate: {', '.join(DELEGATES)} or a delegate library's path "
                   "(adb benchmark_model: --use_xnnpack/--use_gpu/--use_nnapi)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, help="untimed runs (default 10; 1 under emulation)")
    p.add_argument("--runs", type=int, help="timed runs (default 100; 5 under emulation)")
    p.add_argument("--duration", type=float, help="time runs for this many seconds instead of --runs")
    p.add_argument("--batch", type=int, default=1, help="sequences per timed call (default 1)")
    p.add_argument("--pad-to", type=int, help="pad every input to this length (default: each example's length)")
    p.add_argument("--truncate", action="store_true", help="cut inputs longer than the model accepts")
    p.add_argument("--inputs", help="eval.npz (default: the bundle's or the one beside the model)")
    p.add_argument("--manifest", help="manifest.json to verify against (default: the bundle's)")
    p.add_argument("--logits", action="store_true", help="keep every example's logits in the JSON")
    p.add_argument("--timeout", type=float,
                   help="seconds the harness may run (it stops itself); copies and probes get 30 s more")
    p.add_argument("--json", help="write all results here")
    p.add_argument("--report", help="write PREFIX.md and PREFIX.html (default with several results: "
                   "beside --json, else ./edgebert-bench-DATE-TIME, a name no other run has)")
    p.add_argument("--compare", nargs="+", metavar="JSON", help="results of earlier runs to compare")
    p.add_argument("--ssh-key", help="private key for ssh targets (default: ssh config)")
    p.add_argument("--ssh-option", action="append", default=[], help="extra ssh -o option, e.g. Port=2222")
    p.add_argument("--remote-python", help="Python on the target (ssh default python3; adb: use it instead of "
                   "benchmark_model)")
    p.add_argument("--remote-dir", help="work folder on an ssh target (default /tmp/edgebert); each run "
                   "works in a folder of its own under it and removes it when done")
    p.add_argument("--benchmark-model", help="adb: TFLite benchmark_model binary to push")
    p.add_argument("--signature", help="adb benchmark_model: the signature to time (default: fits the median length)")
    p.add_argument("--op-profile", action="store_true", help="adb benchmark_model: time each op "
                   "(--enable_op_profiling) and keep the per-op table in the result")
    p.set_defaults(run=_run)
    return p
