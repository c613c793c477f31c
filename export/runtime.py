"""Run an exported file in its own runtime: onnxruntime for .onnx, ai-edge-litert for .tflite.

`logits(path, arrays)` is what verification and quantization search call; `pick_signature` is the
bucket choice a deployment makes for a fixed-shape TFLite file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgebert.errors import EdgebertError

from .data import batches, place


def ort_session(path: str | Path, threads: int = 1):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_logits(path: str | Path, arrays: dict, batch_size: int = 32, threads: int = 1) -> np.ndarray:
    session = ort_session(path, threads)
    inputs = {i.name: i.type for i in session.get_inputs()}
    dtype = np.int32 if "int32" in next(iter(inputs.values())) else np.int64
    outs = [(rows, session.run(["logits"], feed)[0])
            for rows, feed in batches(arrays, tuple(inputs), batch_size, dtype)]
    return place(outs, *arrays["input_ids"].shape)


def signature_lengths(interpreter) -> dict[int, str]:
    """{sequence length: signature key} of a multi-signature file (keys `seq_<T>`)."""
    keys = interpreter.get_signature_list()
    found = {int(k[4:]): k for k in keys if k.startswith("seq_") and k[4:].isdigit()}
    if not found:
        raise EdgebertError(f"TFLite file has signatures {sorted(keys)}, none named seq_<T>: export it with export.TFLiteExport")
    return dict(sorted(found.items()))


def pick_signature(length: int, lengths: list[int] | dict[int, str]) -> int:
    """The smallest exported sequence length that holds `length` tokens."""
    for t in sorted(lengths):
        if t >= length:
            return t
    raise EdgebertError(f"input of {length} tokens exceeds the longest signature seq_{max(lengths)}: "
                        "truncate it or export a longer sequence length")


class TFLiteModel:
    """A multi-signature .tflite file behind one `__call__(feed) -> logits` for [1, T] int32 inputs."""

    def __init__(self, path: str | Path, threads: int = 1):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=str(path), num_threads=threads)
        self.lengths = signature_lengths(self.interpreter)
        self.runners = {t: self.interpreter.get_signature_runner(k) for t, k in self.lengths.items()}

    def input_names(self, t: int) -> list[str]:
        return list(self.runners[t].get_input_details())

    def __call__(self, feed: dict[str, np.ndarray], length: int) -> np.ndarray:
        """Pad one example to its bucket, run it, dequantize an int8 output."""
        t = pick_signature(length, self.lengths)
        runner = self.runners[t]
        padded = {}
        for name in self.input_names(t):
            row = np.zeros((1, t), dtype=np.int32)
            row[0, :length] = feed[name][0, :length]
            padded[name] = row
        out = runner(**padded)["logits"]
        detail = runner.get_output_details()["logits"]
        scale, zero = detail["quantization"]
        if out.dtype != np.float32:
            out = (out.astype(np.float32) - zero) * scale
        return out[:, :length] if out.ndim == 3 else out


def tflite_logits(path: str | Path, arrays: dict, threads: int = 1) -> np.ndarray:
    model = TFLiteModel(path, threads)
    names = tuple(model.input_names(next(iter(model.lengths))))
    outs = []
    for rows, feed in batches(arrays, names, 1, np.int32):
        outs.append((rows, model(feed, int(arrays["lengths"][rows][0]))))
    return place(outs, *arrays["input_ids"].shape)


def logits(path: str | Path, arrays: dict, threads: int = 1) -> np.ndarray:
    """Logits [N, ...] of an exported file on validated arrays, in the file's own runtime."""
    suffix = Path(path).suffix
    if suffix == ".onnx":
        return onnx_logits(path, arrays, threads=threads)
    if suffix == ".tflite":
        return tflite_logits(path, arrays, threads=threads)
    raise EdgebertError(f"cannot run {path}: expected a .onnx or .tflite file")
