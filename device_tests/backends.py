"""The runtimes a model file runs in, behind one small interface (`Model`): load, prepare, infer, run.

`prepare` (cast, pad, pick a signature) happens outside the timed region; `infer` is the only
thing the harness times; `run` adds what a caller needs to read the outputs (a dequantized int8
output, token-level outputs cut back to the input length). `logits` runs a whole right-padded
eval set in order. This is the one wrapper: the host side (export verification, quantization,
bundles) loads files through it too. Which class runs which file is `runtimes`' table.
"""

from __future__ import annotations

import ctypes
import os
from abc import ABC, abstractmethod
from typing import Iterator, NamedTuple

import numpy as np

from . import HarnessError, accelerators, runtimes
from .accelerators import DELEGATE_LIBRARIES, DELEGATES, PROVIDERS
from .evalset import INPUTS
from .versions import versions

ONNX_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


def check_names(names: list[str], where: str) -> None:
    """`names` (a file's inputs) are ones the harness feeds, input_ids among them: every runtime checks this."""
    unknown = [n for n in names if n not in INPUTS]
    if unknown or "input_ids" not in names:
        raise HarnessError(f"{where} has inputs {names}; the harness feeds {list(INPUTS)} by name: "
                           "export with named inputs (litert-torch: pass sample_kwargs, not sample_args)")


def pick_signature(length: int, lengths) -> int:
    """The smallest exported sequence length that holds `length` tokens."""
    for t in sorted(lengths):
        if t >= length:
            return t
    raise HarnessError(f"input of {length} tokens exceeds the longest signature seq_{max(lengths)}: "
                       "truncate it or export a longer sequence length")


class Model(ABC):
    """A model file loaded in its runtime, as the harness uses it. A runtime's class is called as
    `(path, threads, accelerator, runtime=entry)` (see `runtimes.Runtime.open`) and sets these attributes."""

    name: str  # the runtime's name
    version: str  # the runtime's version
    warnings: list[str]  # caveats the result carries
    accelerator: dict  # what runs it, for the result: {"provider": ...}, {"delegate": ...}
    names: list[str]  # the inputs it takes (of evalset.INPUTS), in the order it takes them
    output: str  # the name of the output it returns
    max_length: int | None = None  # the longest input it takes (None: any)
    batch_size: int | None = None  # the one batch size it takes (None: any)
    texts: tuple[str, ...] | list[str] = ()  # a raw-text model's string inputs ("text", "pair"), read with `read`; empty: it takes ids

    @abstractmethod
    def prepare(self, feeds: dict[str, np.ndarray]):
        """Everything before the timed call: casts, padding, picking an entry point."""

    @abstractmethod
    def infer(self, prepared) -> np.ndarray:
        """The timed call, on what `prepare` returned."""

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Outputs as float32 for `feeds`, token-level ones as long as the input."""
        return self.infer(self.prepare(feeds))

    def details(self, lengths) -> dict:
        """Result fields of its own for a run over inputs of these `lengths` (none by default)."""
        return {}


def onnx_session(ort, path: str | bytes, threads: int, provider: str | None, *, library: str | None = None,
                 profile: str | None = None):
    """(an ONNX Runtime session on `path` (or a model's bytes), the accelerator record): `provider` (default cpu) with
    the CPU as fallback, `library` a custom-op library to register first, `profile` a profiler file prefix
    (`profile.profile_onnx`)."""
    provider = provider or "cpu"
    if provider not in PROVIDERS:
        raise HarnessError(f"unknown execution provider {provider!r}: use one of {', '.join(PROVIDERS)}")
    available = ort.get_available_providers()
    if PROVIDERS[provider] not in available:
        have = ", ".join(k for k, v in PROVIDERS.items() if v in available)
        raise HarnessError(f"this onnxruntime {ort.__version__} has no {PROVIDERS[provider]}; available here: "
                           f"{have}: install a build with it (onnxruntime-android, onnxruntime-qnn, ...) "
                           "or pass --provider cpu")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    if library:
        opts.register_custom_ops_library(library)
    if profile:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile
    providers = [PROVIDERS["cpu"]]
    if provider != "cpu":
        # XNNPACK brings its own thread pool: ORT's would spin against it.
        options = {"intra_op_num_threads": threads} if provider == "xnnpack" else {}
        if provider == "xnnpack":
            opts.intra_op_num_threads = 1
        providers = [(PROVIDERS[provider], options), PROVIDERS["cpu"]]
    try:
        session = ort.InferenceSession(path, opts, providers=providers)
    except Exception as e:  # noqa: BLE001  onnxruntime raises untyped errors for bad files
        raise HarnessError(f"onnxruntime cannot load {path if isinstance(path, str) else 'the model'}: "
                           f"{str(e).splitlines()[0]}") from None
    return session, {"provider": provider, "providers": session.get_providers()}


class Onnx(Model):
    """onnxruntime with dynamic batch and sequence axes."""

    def __init__(self, path: str, threads: int, provider: str | None = None, *,
                 runtime: runtimes.Runtime | None = None, profile: str | None = None):
        runtime = runtime or runtimes.get("onnxruntime")
        ort = runtime.import_module()
        self.name, self.version = runtime.name, ort.__version__
        self.warnings = [runtime.warning] if runtime.warning else []
        self.session, self.accelerator = onnx_session(ort, path, threads, provider, profile=profile)
        inputs = self.session.get_inputs()
        self.names = [i.name for i in inputs]
        check_names(self.names, path)
        bad = [f"{i.name}: {i.type}" for i in inputs if i.type not in ONNX_TYPES]
        if bad:
            raise HarnessError(f"{path} declares non-integer inputs ({', '.join(bad)}): expected int64 or int32 ids")
        self.dtypes = {i.name: ONNX_TYPES[i.type] for i in inputs}
        self.output = self.session.get_outputs()[0].name

    def prepare(self, feeds: dict[str, np.ndarray]):
        return {n: np.ascontiguousarray(feeds[n], dtype=self.dtypes[n]) for n in self.names}

    def infer(self, prepared) -> np.ndarray:
        return self.session.run([self.output], prepared)[0]


class Signature(NamedTuple):
    """One fixed-shape entry point of a .tflite file."""

    key: str  # seq_<T>
    runner: object
    dtypes: dict  # input name -> numpy dtype
    output: str
    batch: int
    quantization: tuple[float, int]  # the output's (scale, zero point); scale 0 = float output


class TFLite(Model):
    """A .tflite file holding fixed-length signatures (seq_16, seq_32, ...): each batch runs on the
    smallest signature that fits it, zero-padded. `content` loads the flatbuffer from bytes instead of `path`."""

    def __init__(self, path: str, threads: int, delegate: str | None = None, *,
                 runtime: runtimes.Runtime | None = None, content: bytes | None = None):
        runtime = runtime or runtimes.get("litert")
        interpreter = runtime.import_module()
        self.path, self.name = path, runtime.name
        self.version = versions(runtime.package).get(runtime.package, "unknown")
        self.warnings = [runtime.warning] if runtime.warning else []
        delegate = delegate or "xnnpack"
        options = _delegate_options(interpreter, delegate, runtime.name)
        self.accelerator = {"delegate": delegate}
        try:
            source = {"model_content": bytes(content)} if content is not None else {"model_path": path}
            self.interpreter = interpreter.Interpreter(**source, num_threads=threads, **options)
        except (ValueError, RuntimeError) as e:
            raise HarnessError(f"{runtime.name} cannot load {path}" + (f" with delegate {delegate}" if options else "")
                               + f": {str(e).splitlines()[0]}") from None
        signatures = self.interpreter.get_signature_list()
        if not signatures:
            raise HarnessError(f"{path} has no signatures: export fixed-length signatures seq_16, seq_32, ...")
        found = {}
        for key, io in signatures.items():
            runner = self.interpreter.get_signature_runner(key)
            details = runner.get_input_details()
            names = list(details)
            check_names(names, f"signature {key} of {path}")
            shape = details["input_ids"]["shape"]
            if len(shape) != 2:
                raise HarnessError(f"signature {key} of {path}: input_ids shape {list(shape)}, expected [batch, length]")
            output = io["outputs"][0]
            scale, zero = runner.get_output_details()[output]["quantization"]
            found[int(shape[1])] = Signature(key, runner, {n: details[n]["dtype"] for n in names}, output,
                                             int(shape[0]), (float(scale), int(zero)))
        self.signatures = dict(sorted(found.items()))  # length -> Signature, shortest first
        batches = {s.batch for s in self.signatures.values()}
        self.batch_size = batches.pop() if len(batches) == 1 else None
        self.max_length = max(self.signatures)
        self.names = [n for n in INPUTS if any(n in s.dtypes for s in self.signatures.values())]
        self.output = next(iter(self.signatures.values())).output

    def signature_for(self, length: int) -> str:
        return self.signatures[pick_signature(length, self.signatures)].key

    def prepare(self, feeds: dict[str, np.ndarray]):
        batch, length = feeds["input_ids"].shape
        t = pick_signature(length, self.signatures)
        signature = self.signatures[t]
        if batch != signature.batch:
            raise HarnessError(f"signature {signature.key} takes batch {signature.batch}, not {batch}: "
                               f"use --batch {signature.batch}")
        arrays = {n: np.pad(feeds[n], ((0, 0), (0, t - length))).astype(d) for n, d in signature.dtypes.items()}
        return signature, arrays

    def infer(self, prepared) -> np.ndarray:
        signature, arrays = prepared
        return signature.runner(**arrays)[signature.output]

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Outputs as float32 (an int8 output dequantized), token-level ones cut back to the input length."""
        prepared = self.prepare(feeds)
        out = self.infer(prepared)
        scale, zero = prepared[0].quantization
        if out.dtype != np.float32:
            out = (out.astype(np.float32) - zero) * scale
        return out[:, : feeds["input_ids"].shape[1]] if out.ndim == 3 else out

    def details(self, lengths) -> dict:
        """The signatures inputs of these lengths ran on, and which delegates could take the file whole."""
        found = {"signatures_used": sorted({self.signature_for(min(int(n), self.max_length)) for n in lengths})}
        try:
            found["delegate_fit"] = accelerators.fit(self.path)
        except HarnessError as e:
            self.warnings.append(f"no delegate check: {e}")
        return found


def _delegate_options(runtime, delegate: str, backend: str) -> dict:
    """Interpreter keyword arguments for `delegate`: a name from DELEGATES or a delegate library's path."""
    if delegate == "xnnpack":
        return {}
    if delegate == "cpu":
        return {"experimental_op_resolver_type": runtime.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    if delegate not in DELEGATE_LIBRARIES and ".so" not in delegate and os.sep not in delegate:
        raise HarnessError(f"unknown delegate {delegate!r}: use one of {', '.join(DELEGATES)} or a delegate "
                           "library's path (e.g. libedgetpu.so.1)")
    library = DELEGATE_LIBRARIES.get(delegate, delegate)
    try:
        ctypes.CDLL(library)  # load_delegate's own failure also prints a traceback from Delegate.__del__
        return {"experimental_delegates": [runtime.load_delegate(library)]}
    except (ValueError, OSError, RuntimeError) as e:
        raise HarnessError(f"delegate {delegate}: cannot load {library} ({str(e).splitlines()[0]}); available "
                           f"here: cpu, xnnpack ({backend} ships no {delegate} delegate library): build it and "
                           "pass --delegate /path/to/its.so") from None


def load(path: str, backend: str, threads: int, *, provider: str | None = None, delegate: str | None = None) -> Model:
    """`path` loaded in the runtime named `backend`; `provider` (ONNX Runtime) or `delegate` (LiteRT) picks
    the accelerator of a runtime that takes that flag."""
    runtime = runtimes.get(backend)
    given = {flag: value for flag, value in (("provider", provider), ("delegate", delegate)) if value}
    for flag, value in given.items():
        if flag != runtime.accelerator_flag:
            takers = [r.name for r in runtimes.RUNTIMES.values() if r.accelerator_flag == flag]
            instead = f"pass --{runtime.accelerator_flag}" if runtime.accelerator_flag else "drop it"
            raise HarnessError(f"--{flag} {value} is for {', '.join(takers)}: for {backend} {instead}")
    return runtime.open(path, threads, given.get(runtime.accelerator_flag))


def batches(arrays: dict, names, batch_size: int, dtype=np.int64) -> Iterator[tuple[slice, dict]]:
    """Feeds of right-padded `arrays` (with `lengths`) in order, each batch cut to its longest example
    (right padding makes that exact)."""
    n = len(arrays["lengths"])
    for start in range(0, n, batch_size):
        rows = slice(start, min(start + batch_size, n))
        t = int(arrays["lengths"][rows].max())
        yield rows, {k: np.ascontiguousarray(arrays[k][rows, :t], dtype=dtype) for k in names}


def place(outputs: list[tuple[slice, np.ndarray]], n: int, t: int) -> np.ndarray:
    """Stack per-batch outputs into [N, ...]; token-level outputs are zero-padded back to T."""
    first = outputs[0][1]
    token_level = first.ndim == 3
    shape = (n, t, first.shape[-1]) if token_level else (n, *first.shape[1:])
    full = np.zeros(shape, dtype=np.float32)
    for rows, out in outputs:
        if token_level:
            full[rows, : out.shape[1]] = out
        else:
            full[rows] = out
    return full


def logits(model, arrays: dict, batch_size: int = 32) -> np.ndarray:
    """Outputs [N, ...] of `model` (a loaded backend) on right-padded `arrays` with `lengths`, in order.

    A file with a fixed batch gets batches of that size, the last one padded with empty rows."""
    size = model.batch_size or batch_size
    outs = []
    for rows, feed in batches(arrays, model.names, size):
        real = rows.stop - rows.start
        if model.batch_size and real < size:
            feed = {k: np.pad(v, ((0, size - real), (0, 0))) for k, v in feed.items()}
        outs.append((rows, model.run(feed)[:real]))
    return place(outs, *arrays["input_ids"].shape)
