"""The runtimes the harness can drive, behind one small interface: load, prepare, infer.

`prepare` (cast, pad, pick a signature) happens outside the timed region; `infer` is the only
thing timed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import numpy as np

from . import HarnessError
from .evalset import INPUTS

INSTALL = {"onnxruntime": "onnxruntime", "litert": "ai-edge-litert", "tflite-runtime": "tflite-runtime"}
ONNX_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}
TFLITE_INT8_WARNING = ("tflite-runtime is a legacy runtime whose dynamic-range INT8 kernels gave silently "
                       "wrong outputs on ai-edge-quantizer models: check its accuracy against ai-edge-litert")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _check_names(names: list[str], where: str) -> None:
    unknown = [n for n in names if n not in INPUTS]
    if unknown or "input_ids" not in names:
        raise HarnessError(f"{where} has inputs {names}; the harness feeds {list(INPUTS)} by name: "
                           "export with named inputs (litert-torch: pass sample_kwargs, not sample_args)")


class Onnx:
    """onnxruntime with dynamic batch and sequence axes."""

    name = "onnxruntime"
    max_length = None
    batch_size = None

    def __init__(self, path: str, threads: int):
        try:
            import onnxruntime as ort
        except ImportError as e:
            raise HarnessError(f"backend onnxruntime cannot be imported ({e}): pip install onnxruntime") from None
        self.version = ort.__version__
        self.warnings: list[str] = []
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        try:
            self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001  onnxruntime raises untyped errors for bad files
            raise HarnessError(f"onnxruntime cannot load {path}: {str(e).splitlines()[0]}") from None
        inputs = self.session.get_inputs()
        self.names = [i.name for i in inputs]
        _check_names(self.names, path)
        bad = [f"{i.name}: {i.type}" for i in inputs if i.type not in ONNX_TYPES]
        if bad:
            raise HarnessError(f"{path} declares non-integer inputs ({', '.join(bad)}): expected int64 or int32 ids")
        self.dtypes = {i.name: ONNX_TYPES[i.type] for i in inputs}
        self.output = self.session.get_outputs()[0].name

    def prepare(self, feeds: dict[str, np.ndarray]):
        return {n: np.ascontiguousarray(feeds[n], dtype=self.dtypes[n]) for n in self.names}

    def infer(self, prepared) -> np.ndarray:
        return self.session.run([self.output], prepared)[0]


class TFLite:
    """A .tflite file holding fixed-length signatures (seq_16, seq_32, ...): each batch runs on the
    smallest signature that fits it, zero-padded."""

    def __init__(self, path: str, threads: int, backend: str):
        self.name = backend
        module = "ai_edge_litert.interpreter" if backend == "litert" else "tflite_runtime.interpreter"
        try:
            Interpreter = importlib.import_module(module).Interpreter
        except ImportError as e:
            raise HarnessError(f"backend {backend} cannot be imported ({e}): pip install {INSTALL[backend]}"
                               + (" 'numpy<2'" if backend == "tflite-runtime" else "")) from None
        self.version = _version(INSTALL[backend])
        self.warnings = [TFLITE_INT8_WARNING] if backend == "tflite-runtime" else []
        try:
            self.interpreter = Interpreter(model_path=path, num_threads=threads)
        except (ValueError, RuntimeError) as e:
            raise HarnessError(f"{backend} cannot load {path}: {str(e).splitlines()[0]}") from None
        signatures = self.interpreter.get_signature_list()
        if not signatures:
            raise HarnessError(f"{path} has no signatures: export fixed-length signatures seq_16, seq_32, ...")
        self.signatures = {}  # length -> (key, runner, dtypes, output name)
        for key, io in signatures.items():
            runner = self.interpreter.get_signature_runner(key)
            details = runner.get_input_details()
            names = list(details)
            _check_names(names, f"signature {key} of {path}")
            shape = details["input_ids"]["shape"]
            if len(shape) != 2:
                raise HarnessError(f"signature {key} of {path}: input_ids shape {list(shape)}, expected [batch, length]")
            self.signatures[int(shape[1])] = (key, runner, {n: details[n]["dtype"] for n in names},
                                              io["outputs"][0], int(shape[0]))
        batches = {s[4] for s in self.signatures.values()}
        self.batch_size = batches.pop() if len(batches) == 1 else None
        self.max_length = max(self.signatures)
        self.names = sorted({n for s in self.signatures.values() for n in s[2]})

    def signature_for(self, length: int) -> str:
        return self.signatures[min(t for t in self.signatures if t >= length)][0]

    def prepare(self, feeds: dict[str, np.ndarray]):
        batch, length = feeds["input_ids"].shape
        t = min(t for t in self.signatures if t >= length)
        key, runner, dtypes, output, sig_batch = self.signatures[t]
        if batch != sig_batch:
            raise HarnessError(f"signature {key} takes batch {sig_batch}, not {batch}: use --batch {sig_batch}")
        arrays = {n: np.pad(feeds[n], ((0, 0), (0, t - length))).astype(dtypes[n]) for n in dtypes}
        return runner, arrays, output

    def infer(self, prepared) -> np.ndarray:
        runner, arrays, output = prepared
        return runner(**arrays)[output]


def load(path: str, backend: str, threads: int):
    if backend == "onnxruntime":
        return Onnx(path, threads)
    if backend in ("litert", "tflite-runtime"):
        return TFLite(path, threads, backend)
    raise HarnessError(f"unknown backend {backend!r}: use onnxruntime, litert or tflite-runtime")


def default_backend(path: str) -> str:
    """onnxruntime for .onnx; for .tflite ai-edge-litert, else the legacy tflite-runtime."""
    if path.endswith(".onnx"):
        return "onnxruntime"
    if path.endswith(".tflite"):
        for module, backend in (("ai_edge_litert", "litert"), ("tflite_runtime", "tflite-runtime")):
            if importlib.util.find_spec(module):
                return backend
        raise HarnessError("no TFLite runtime is installed: pip install ai-edge-litert")
    raise HarnessError(f"cannot tell the backend from {path}: pass --backend onnxruntime|litert|tflite-runtime")
