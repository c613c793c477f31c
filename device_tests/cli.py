"""`python -m device_tests run ...` / `verify ...` / `probe ...`: errors print as one line (exit 2), never a
traceback; `verify` exits 1 when a check fails."""

from __future__ import annotations

import argparse
import os
import sys

from . import HarnessError, runtimes
from .accelerators import DELEGATES, PROVIDERS


def _positive(kind):
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def _non_negative(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    packages = [r.package for r in runtimes.RUNTIMES.values()]
    p = argparse.ArgumentParser(prog="python -m device_tests", description="edgebert on-device benchmark harness. "
                                f"Needs numpy and one runtime ({', '.join(packages[:-1])} or {packages[-1]}); "
                                "run --text also needs tokenizers. Nothing else: no torch, no edgebert.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="time a model and score it on the eval set (--inputs), or read raw text "
                       "through it (--text); writes one JSON")
    r.add_argument("--model", required=True, help=" or ".join(f"model{s}" for s in runtimes.formats().values()))
    source = r.add_mutually_exclusive_group(required=True)
    source.add_argument("--inputs", help="eval.npz from the exporter: time the model and score the task metric")
    source.add_argument("--text", help="a UTF-8 file, one sentence or tab-separated pair a line: tokenize each with "
                        "tokenizer.json (needs `pip install tokenizers`; a model.text.onnx tokenizes in its graph) and "
                        "print labels with scores, entity spans with words and labels, a score, or a vector, one JSON "
                        "line per input line")
    r.add_argument("--tokenizer", help="--text: the tokenizer.json to use (default: the one beside the model)")
    r.add_argument("--labels", help="--text: labels.txt naming the outputs (default: the one beside the model)")
    r.add_argument("--backend", choices=runtimes.RUNTIMES.names(), help=f"default: {runtimes.defaults()}")
    r.add_argument("--provider", choices=PROVIDERS, help="onnxruntime execution provider, "
                   "CPU as fallback (default cpu); refused when this onnxruntime build lacks it")
    r.add_argument("--delegate", help=f"LiteRT delegate: {', '.join(DELEGATES)} or a delegate library's "
                   "path (default xnnpack, LiteRT's own CPU delegate; cpu = built-in kernels without it)")
    r.add_argument("--threads", type=_positive(int), default=1)
    r.add_argument("--warmup", type=_non_negative, default=10, help="untimed runs before timing (default 10)")
    r.add_argument("--runs", type=_positive(int), default=100, help="timed runs (default 100)")
    r.add_argument("--duration", type=_positive(float), help="time runs for this many seconds instead of --runs")
    r.add_argument("--batch", type=_positive(int), default=1, help="sequences per timed call (default 1)")
    r.add_argument("--pad-to", type=_positive(int), help="pad every input to this length (default: true length)")
    r.add_argument("--truncate", action="store_true", help="cut inputs longer than the model accepts, not fail")
    r.add_argument("--manifest", help="manifest.json to verify against (default: the one beside the model)")
    r.add_argument("--logits", action="store_true", help="store every example's logits in the JSON")
    r.add_argument("--emulated", action="store_true", help="mark the run as emulated: timings are not device latency")
    r.add_argument("--timeout", type=_positive(float), help="give up after this many seconds")
    r.add_argument("--json", help="write the result here (default: print it)")
    v = sub.add_parser("verify", help="the first-run check: each model file's sha256 against manifest.json and its "
                       "outputs on the bundle's golden examples against golden.json, in each runtime installed here; "
                       "exit 0 when all pass, 1 when one fails")
    v.add_argument("bundle", help="a bundle folder (every model file in it), or one model file in a bundle")
    v.add_argument("--format", choices=list(runtimes.formats()), help="check only this format's files")
    v.add_argument("--backend", choices=runtimes.RUNTIMES.names(),
                   help="check with this runtime only (default: every one installed here, for each file)")
    v.add_argument("--provider", choices=PROVIDERS, help="onnxruntime execution provider (default cpu)")
    v.add_argument("--delegate", help=f"LiteRT delegate: {', '.join(DELEGATES)} or a library's path (default xnnpack)")
    v.add_argument("--manifest", help="the bundle's manifest.json (default: the one in the bundle folder); "
                   "golden.json is read beside it")
    v.add_argument("--json", help="also write the result here")
    pr = sub.add_parser("probe", help="print which of numpy and the runtimes import here, as JSON")
    pr.add_argument("--backends", default=",".join(runtimes.RUNTIMES),
                    help="comma-separated runtimes to check (numpy is always checked)")
    return p


def _summary(result: dict) -> str:
    lat = result["latency_ms"]
    name = result.get("metric")
    score = f"{name} {result[name]:.4f}" if result.get(name) is not None else "no metric"
    tag = " (emulated)" if result["emulated"] else ""
    return (f"{result['model']['file']} on {result['runtime']['backend']}{tag}: p50 {lat['p50']:.3f} ms, "
            f"p90 {lat['p90']:.3f} ms, {result['throughput']:.1f} seq/s, {score} on {result['n_examples']}")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "probe":
            from . import probe
            return probe.main([b for b in args.backends.split(",") if b])
        try:
            from . import harness, verify
        except ImportError as e:
            raise HarnessError(f"the harness needs numpy ({e}): pip install numpy") from None
        import json

        if args.command == "verify":
            result = verify.run(args)
            for check in result["checks"]:
                print(verify.line(check))
            for skip in result["skipped"]:
                print(f"SKIP {skip['file']}: {skip['reason']}")
            failed, total = sum(not c["passed"] for c in result["checks"]), len(result["checks"])
            print(f"verify: FAIL, {failed} of {total} checks failed" if failed
                  else f"verify: PASS, {total} check{'s' if total > 1 else ''}")
            if args.json:
                harness.write(result, args.json)
            return 1 if failed else 0
        result = harness.run_text(args) if args.text else harness.run(args)
        if args.json:
            harness.write(result, args.json)
            print(f"{len(result['lines'])} lines read through {result['model']['file']}" if args.text
                  else _summary(result))
        elif args.text:
            for line in result["lines"]:
                print(json.dumps(line, ensure_ascii=False))
        else:
            print(json.dumps(result, indent=1))
    except HarnessError as e:
        print(f"device_tests: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("device_tests: interrupted; no results were written", file=sys.stderr)
        return 130
    except Exception as e:  # a bug or a runtime's own failure: one line, the traceback in a log (exit 1)
        import tempfile
        import traceback

        log = os.path.join(tempfile.gettempdir(), f"device_tests-crash-{os.getpid()}.log")
        with open(log, "w") as f:
            f.write("".join(traceback.format_exception(e)))
        print(f"device_tests: internal error ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}); "
              f"the traceback is in {log}", file=sys.stderr)
        return 1
    return 0
