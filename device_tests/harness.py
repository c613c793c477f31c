"""One benchmark run: load, cold first inference, warmup, timed runs, then the metric in a separate
untimed pass over the whole eval set (as MLPerf keeps accuracy and performance runs apart)."""

from __future__ import annotations

import os
import platform
import resource
import signal
import sys
import time

import numpy as np

from . import HarnessError, __version__, backends, device, files, manifest, runtimes
from .evalset import EvalSet, metric


class _Clock:
    """Tracks the current phase so a --timeout names where the run stopped."""

    def __init__(self, timeout: float | None):
        self.phase = "start"
        if timeout:
            signal.signal(signal.SIGALRM, self._expired)
            signal.setitimer(signal.ITIMER_REAL, timeout)
            self.timeout = timeout

    def _expired(self, *_):
        raise HarnessError(f"timed out after {self.timeout:g} s during {self.phase}; no results were written "
                           "(raise --timeout or lower --runs)")

    @staticmethod
    def stop():
        signal.setitimer(signal.ITIMER_REAL, 0)


def peak_rss_mb() -> float:
    """VmHWM (peak resident memory) of this process; ru_maxrss where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def latency_stats(ms: list[float]) -> dict:
    a = np.asarray(ms, dtype=np.float64)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"min": float(a.min()), "p50": float(p50), "p90": float(p90), "p99": float(p99),
            "max": float(a.max()), "mean": float(a.mean()), "std": float(a.std(ddof=1)) if len(a) > 1 else 0.0}


class _Inputs:
    """Batches of the eval set at their true length (or --pad-to), cut to what the model accepts."""

    def __init__(self, data: EvalSet, model, batch: int, pad_to: int | None, truncate: bool):
        self.data, self.model, self.batch, self.pad_to, self.truncate = data, model, batch, pad_to, truncate
        self.truncated = set()
        limit = model.max_length
        if pad_to and limit and pad_to > limit:
            raise HarnessError(f"--pad-to {pad_to} exceeds the model's longest signature ({limit})")

    def rows(self, i: int) -> list[int]:
        return [(i * self.batch + j) % self.data.n for j in range(self.batch)]

    def feeds(self, rows: list[int]) -> dict:
        need = int(self.data.lengths[rows].max())
        length = self.pad_to or need
        limit = self.pad_to or self.model.max_length
        if limit and need > limit:
            if not self.truncate:
                where = f"--pad-to {self.pad_to}" if self.pad_to else f"the longest signature ({limit} tokens)"
                raise HarnessError(f"example {rows[0]} has {need} tokens, more than {where}: export a longer "
                                   "signature or pass --truncate")
            self.truncated.update(r for r in rows if self.data.lengths[r] > limit)
            length = limit
        return self.data.batch(rows, length)


def _timed(model, inputs: _Inputs, clock: _Clock, warmup: int, runs: int, duration: float | None) -> list[float]:
    clock.phase = "warmup"
    for i in range(warmup):
        model.infer(model.prepare(inputs.feeds(inputs.rows(i))))
    clock.phase = "timed runs"
    ms, i, start = [], 0, time.perf_counter()
    while (time.perf_counter() - start < duration) if duration else (i < runs):
        prepared = model.prepare(inputs.feeds(inputs.rows(warmup + i)))
        t0 = time.perf_counter_ns()
        model.infer(prepared)
        ms.append((time.perf_counter_ns() - t0) / 1e6)
        i += 1
    return ms


def _evaluate(model, data: EvalSet, pad_to: int | None, truncate: bool) -> tuple[np.ndarray, _Inputs]:
    """Outputs of every example, batch 1, in order: the untimed metric pass (per-token outputs
    cut to each example's length, then zero-padded back to the eval set's)."""
    inputs = _Inputs(data, model, 1, pad_to, truncate)
    outputs = []
    for r in range(data.n):
        feeds = inputs.feeds([r])
        out = model.run(feeds)
        outputs.append((slice(r, r + 1), out[:, : min(int(data.lengths[r]), feeds["input_ids"].shape[1])]
                        if out.ndim == 3 else out))
    return backends.place(outputs, data.n, data.arrays["input_ids"].shape[1]), inputs


def _verify(args) -> tuple[str, dict, str | None]:
    """The model's sha256 and its manifest check (a warning when there is none to check it against)."""
    digest = files.sha256(args.model)
    verified, unverified = manifest.check(args.model, digest, args.manifest)
    if unverified:
        print(f"device_tests: warning: {unverified}", file=sys.stderr, flush=True)
    return digest, verified, unverified


def _eval_set(args, verified: dict) -> EvalSet:
    """The eval set, checked against the manifest's record of it and its tokenizer's vocabulary."""
    if verified["manifest"]:
        manifest.verify(verified["manifest"], args.inputs, files.sha256(args.inputs))
    data = EvalSet(args.inputs)
    vocab = manifest.vocab_size(verified["manifest"]) if verified["manifest"] else None
    if vocab is not None:
        data.check_vocabulary(vocab, f"the tokenizer in {verified['manifest']}")
    return data


def _load(args, clock: _Clock) -> tuple[str, backends.Model, float]:
    """(runtime name, the loaded model, ms it took): the runtime asked for, else the first installed one
    for the file's suffix."""
    backend = args.backend or runtimes.choose(args.model).name
    clock.phase = "loading the model"
    t0 = time.perf_counter()
    model = backends.load(args.model, backend, args.threads, provider=args.provider, delegate=args.delegate)
    return backend, model, (time.perf_counter() - t0) * 1000


def _inputs(args, model: backends.Model, data: EvalSet) -> _Inputs:
    """The timed runs' batches, once the model is known to take this eval set at --batch."""
    missing = [n for n in model.names if n not in data.arrays]
    if missing:
        raise HarnessError(f"the model needs {missing} but {args.inputs} lacks them: re-export the eval set")
    if model.batch_size and args.batch != model.batch_size:
        raise HarnessError(f"{args.model} has batch {model.batch_size} signatures: use --batch {model.batch_size}")
    return _Inputs(data, model, args.batch, args.pad_to, args.truncate)


def _first_ms(model: backends.Model, inputs: _Inputs, clock: _Clock) -> float:
    clock.phase = "first inference"
    prepared = model.prepare(inputs.feeds(inputs.rows(0)))
    t0 = time.perf_counter_ns()
    model.infer(prepared)
    return (time.perf_counter_ns() - t0) / 1e6


def _scores(args, data: EvalSet, logits: np.ndarray, truncated: set) -> tuple[dict, list[str]]:
    """The task metric's result fields (and logits with --logits), and what the reader must know about them."""
    fields, warnings = {}, []
    if data.labels is not None:
        scores, predictions = metric(logits, data.labels, data.task)
        fields.update(task=data.task["kind"], metric=data.task["metric"], **scores, predictions=predictions)
    else:
        warnings.append(f"{args.inputs} has no labels: no task metric")
    if args.logits:
        fields["logits"] = logits.astype(np.float64).tolist()
    if truncated:
        warnings.append(f"{len(truncated)} examples were truncated (--truncate): the metric is not the full-length one")
    return fields, warnings


def _files(*given: tuple[str, str, str]) -> None:
    """Each (path, flag, an example file name) names a file: a folder or a missing path is one line."""
    for path, flag, example in given:
        if os.path.isdir(path):
            raise HarnessError(f"{flag} {path} is a folder: pass the file in it (e.g. {path.rstrip('/')}/{example})")
        if not os.path.isfile(path):
            raise HarnessError(f"{flag} {path} does not exist")


def run(args) -> dict:
    """Everything `python -m device_tests run` measures, as the result dict."""
    clock = _Clock(args.timeout)
    clock.phase = "checking files"
    _files((args.model, "--model", "model.onnx"), (args.inputs, "--inputs", "eval.npz"))
    digest, verified, unverified = _verify(args)
    data = _eval_set(args, verified)
    backend, model, load_ms = _load(args, clock)
    inputs = _inputs(args, model, data)
    first_ms = _first_ms(model, inputs, clock)
    ms = _timed(model, inputs, clock, args.warmup, args.runs, args.duration)
    clock.phase = "the metric pass"
    logits, eval_inputs = _evaluate(model, data, args.pad_to, args.truncate)
    clock.stop()

    details = model.details([args.pad_to] if args.pad_to else data.lengths)  # may add to model.warnings
    scores, notes = _scores(args, data, logits, inputs.truncated | eval_inputs.truncated)
    return {
        "harness": __version__,
        "emulated": args.emulated,
        "complete": True,
        "device": device.describe(),
        "runtime": {"backend": backend, "version": model.version, **model.accelerator, "numpy": np.__version__,
                    "python": platform.python_version()},
        "model": {"file": os.path.basename(args.model), "bytes": os.path.getsize(args.model), "sha256": digest,
                  **verified},
        "settings": {"threads": args.threads, "warmup": args.warmup, "runs": len(ms), "duration_s": args.duration,
                     "batch": args.batch, "pad_to": args.pad_to, "truncate": args.truncate},
        "load_ms": load_ms,
        "first_inference_ms": first_ms,
        "latency_ms": latency_stats(ms),
        "latency_runs_ms": [round(x, 4) for x in ms],  # each timed run, in order: the distribution
        "throughput": args.batch * len(ms) / (sum(ms) / 1000),
        "peak_rss_mb": peak_rss_mb(),
        "n_examples": data.n,
        **details,
        **scores,
        "warnings": [w for w in (unverified,) if w] + model.warnings + notes
                    + (["emulated run: timings are not device latency"] if args.emulated else []),
    }


def run_text(args) -> dict:
    """`run --text FILE`: each line tokenized with the bundle's tokenizer.json (a raw-text model tokenizes in its
    graph) and read back as labels, entity spans, a score or a vector (device_tests.text), in line order."""
    from . import text

    clock = _Clock(args.timeout)
    clock.phase = "checking files"
    _files((args.model, "--model", "model.onnx"))
    for flag, value in (("--pad-to", args.pad_to), ("--duration", args.duration), ("--logits", args.logits),
                        ("--batch", args.batch != 1)):
        if value:
            raise HarnessError(f"{flag} times or scores the eval set and does not apply to --text: drop it")
    lines = text.read_lines(args.text)
    folder = os.path.dirname(os.path.abspath(args.model))
    digest, verified, unverified = _verify(args)
    backend, model, _ = _load(args, clock)
    if model.batch_size not in (None, 1):
        raise HarnessError(f"{args.model} has batch {model.batch_size} signatures; --text runs one line at a time")
    takes_text = bool(model.texts)  # a raw-text model: strings in
    if takes_text and args.tokenizer:
        raise HarnessError(f"{args.model} tokenizes in its graph: drop --tokenizer")
    tokenizer_path = None if takes_text else args.tokenizer or os.path.join(folder, "tokenizer.json")
    tokenizer = None if takes_text else text.load_tokenizer(tokenizer_path, model.max_length)
    labels = text.read_labels(args.labels or os.path.join(folder, "labels.txt"))
    clock.phase = "the text"
    results = []
    for line, pair in lines:
        if takes_text:
            if (pair is None) != (len(model.texts) == 1):
                raise HarnessError(f"{os.path.basename(args.model)} takes {'a pair' if len(model.texts) == 2 else 'one text'}"
                                   " a line: write " + ("two tab-separated texts" if len(model.texts) == 2 else
                                                        "one text, no tab"))
            found = model.read({name: np.array([value], dtype=object)
                                for name, value in zip(model.texts, (line, pair))})
            output, encoding, cut = found[model.output], None, bool(found["truncated"][0])
        else:
            encoding = tokenizer.encode(line, pair)
            feeds = text.feeds(encoding)
            output, cut = model.run({n: feeds[n] for n in model.names}), bool(len(encoding.overflowing))
        results.append(text.read_out(output, model.output, encoding, line, pair, labels, cut))
    clock.stop()
    cut = [number for number, line in enumerate(results, 1) if line.get("truncated")]
    limit = model.max_length if takes_text else tokenizer.truncation["max_length"]
    notes = [f"{len(cut)} of {len(results)} lines are longer than the model's {limit} tokens and were cut "
             f"to them (line {', '.join(map(str, cut[:5]))}{', ...' if len(cut) > 5 else ''}; `truncated` in the "
             "output): their answers read only the start"] if cut else []
    for note in notes:  # on screen, as the manifest warning is: a reader of the lines may never look
        print(f"device_tests: warning: {note}", file=sys.stderr, flush=True)
    return {"harness": __version__, "complete": True,
            "model": {"file": os.path.basename(args.model), "sha256": digest, **verified},
            "runtime": {"backend": backend, "version": model.version, **model.accelerator},
            "tokenizer": "in the model" if takes_text else os.path.basename(tokenizer_path), "labels": labels,
            "output": model.output, "lines": results,
            "warnings": [w for w in (unverified,) if w] + list(model.warnings) + notes}


def write(result: dict, path: str) -> None:
    """Write atomically: a reader never sees a half-written result."""
    try:
        files.write_json(path, result, indent=1)
    except OSError as e:
        raise HarnessError(f"cannot write {path}: {e.strerror}; free some space or pick another --json") from None
