"""PyTorch → one .tflite file with a fixed-length signature per sequence bucket.

litert-torch converts at fixed shapes only (dynamic sequence length fails in tracing, and a
quantized file cannot be resized), so each length in `seq_lens` becomes a signature `seq_<T>`
with int32 inputs named like the model's and one output (`logits`, or an embedder's `embeddings`); the runtime picks the
smallest bucket that holds the input (`device_tests.backends.pick_signature`). What is converted is
`graph.for_export`'s graph (the last layer for [CLS] alone where that is all the head reads).
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edgebert.config import Config
from edgebert.device_tests.accelerators import op_kinds
from edgebert.device_tests.files import atomic_path
from edgebert.errors import EdgebertError
from edgebert.model import config_of

from . import formats
from .data import InputSpec
from .graph import for_export


@dataclass(frozen=True, kw_only=True)
class TFLiteExportConfig(Config):
    """TFLite export options. precision: "fp32", or "fp16" (weights stored as float16, computed in float32).

    INT8 variants come from `quantize.quantize(<this file>, DynamicInt8Config() | StaticInt8Config(...) | ...)`."""

    seq_lens: tuple[int, ...] = (16, 32, 64, 128)
    batch_size: int = 1
    precision: str = "fp32"

    def __post_init__(self):
        if not self.seq_lens or any(int(t) < 1 for t in self.seq_lens) or len(set(self.seq_lens)) != len(self.seq_lens):
            raise EdgebertError(f"TFLiteExportConfig seq_lens {self.seq_lens}: give distinct positive lengths, e.g. (16, 32, 64, 128)")
        if self.precision not in ("fp32", "fp16"):
            raise EdgebertError(f"TFLiteExportConfig precision {self.precision!r}: use 'fp32' or 'fp16' "
                                "(INT8 comes from quantize.quantize on the exported file)")
        if self.batch_size < 1:
            raise EdgebertError("TFLiteExportConfig batch_size must be >= 1")


class Named(nn.Module):
    """Keyword inputs in, `{output: ...}` out: the names become the signature's input and output names."""

    def __init__(self, model: nn.Module, output: str):
        super().__init__()
        self.model, self.output = model, output

    def forward(self, **inputs):
        out = self.model(**{k: v.long() for k, v in inputs.items()})
        if not isinstance(out, torch.Tensor):
            raise EdgebertError(f"{type(self.model).__name__} returns {type(out).__name__}, not one output tensor")
        return {self.output: out}


def _max_length(model: nn.Module) -> int | None:
    config = config_of(model)
    return config.max_length if config is not None else None


def convert(model: nn.Module, spec: InputSpec, seq_lens, batch_size: int = 1) -> bytes:
    """The FP32 flatbuffer with one signature per length, conversion logs kept out of the console."""
    import litert_torch

    limit = _max_length(model)
    if limit is not None and max(seq_lens) > limit:
        raise EdgebertError(f"seq_lens {tuple(seq_lens)} exceed the model's {limit} positions: drop the longer lengths")
    wrapped = Named(for_export(model), spec.output).eval()
    converter = None
    for t in sorted(seq_lens):
        sample = {k: torch.zeros(batch_size, t, dtype=torch.int32) for k in spec.names}
        converter = (litert_torch.signature if converter is None else converter.signature)(f"seq_{t}", wrapped,
                                                                                          sample_kwargs=sample)
    log = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            warnings.simplefilter("ignore")
            edge = converter.convert()
    except EdgebertError:
        raise
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise EdgebertError(f"TFLite conversion of {type(model).__name__} failed ({first[:200]}): "
                            "replace the unsupported op; litert-torch converts fixed shapes only") from None
    with tempfile.TemporaryDirectory(prefix="edgebert-tflite-") as tmp:
        path = Path(tmp) / "model.tflite"
        with contextlib.redirect_stdout(log):
            edge.export(str(path))
        return path.read_bytes()


def fp16(flatbuffer: bytes) -> bytes:
    """Weights as float16 (half the bytes), dequantized to float32 at load."""
    from ai_edge_quantizer import algorithm_manager, quantizer

    q = quantizer.Quantizer(bytearray(flatbuffer))
    q.add_weight_only_config(regex=".*", operation_name="*", num_bits=16,
                             algorithm_key=algorithm_manager.AlgorithmName.FLOAT_CASTING)
    return bytes(q.quantize(enable_progress_report=False).quantized_model)


def export_tflite(model: nn.Module, config: TFLiteExportConfig, spec: InputSpec, out: str | Path) -> dict:
    """Write `out` (atomically) and return its metadata."""
    data = convert(model, spec, config.seq_lens, config.batch_size)
    if config.precision == "fp16":
        data = fp16(data)
    with atomic_path(out) as tmp:
        tmp.write_bytes(data)
    return {"format": "tflite", "precision": config.precision, "inputs": list(spec.names), "input_dtype": "int32",
            "outputs": [spec.output], "batch_size": config.batch_size,
            "signatures": {f"seq_{t}": t for t in sorted(config.seq_lens)}}


_MAX_FLATBUFFER = 2**31 - 1  # flatbuffers offsets are 32-bit; phone models are far smaller


def unpack(flatbuffer: bytes):
    """A .tflite file as ai-edge-litert's schema objects (the converter's schema, so no field is dropped), the
    weights ai-edge-quantizer stores after the flatbuffer (offset/size buffers) pulled back inline, 16-byte aligned
    as the schema asks (the generated Pack aligns byte vectors to 1)."""
    from ai_edge_litert import schema_py_generated as fb

    class Aligned(fb.BufferT):
        def Pack(self, builder):
            if self.data is not None and len(self.data):
                builder.Prep(16, len(self.data))
            return super().Pack(builder)

    tree = fb.ModelT.InitFromObj(fb.Model.GetRootAs(flatbuffer, 0))
    inlined = []
    for b in tree.buffers:
        data = b.data
        if b.offset > 1:
            if b.offset + b.size > len(flatbuffer):
                raise EdgebertError("TFLite buffer points past the end of the file: the file is truncated; "
                                    "re-export it")
            data = np.frombuffer(flatbuffer, dtype=np.uint8, count=b.size, offset=b.offset)
        inlined.append(Aligned(data=None if data is None else np.asarray(data, dtype=np.uint8)))
    tree.buffers = inlined
    return tree


def pack(tree) -> bytes:
    """`unpack`'s objects as a .tflite file."""
    import flatbuffers

    total = sum(len(b.data) for b in tree.buffers if b.data is not None)
    if total > _MAX_FLATBUFFER:
        raise EdgebertError(f"model weights are {total} bytes, over the 2 GiB a single TFLite flatbuffer holds: "
                            "quantize or prune the model first")
    builder = flatbuffers.Builder(1024)
    builder.Finish(tree.Pack(builder), b"TFL3")
    return bytes(builder.Output())


def tflite_io(path: Path) -> dict:
    """Each signature's length, input and output tensors (dtype, shape, int8 quantization), and the ops of all
    signatures with their counts."""
    model = formats.get("tflite").open(path)
    signatures = {}
    for t, signature in model.signatures.items():
        runner = signature.runner
        signatures[signature.key] = {
            "length": t, "inputs": {n: _detail(d) for n, d in sorted(runner.get_input_details().items())},
            "outputs": {n: _detail(d) for n, d in sorted(runner.get_output_details().items())}}
    ops = Counter(name for name, _ in op_kinds(str(path)))  # over all signatures: an op resolver needs each
    return {"format": "tflite", "lengths": list(model.signatures), "signatures": signatures,
            "choose": "the smallest seq_<T> with T >= the token count ([CLS] and [SEP] included); "
                      "zero-pad every input to T", "ops": dict(sorted(ops.items()))}


def _detail(d: dict) -> dict:
    out = {"dtype": np.dtype(d["dtype"]).name, "shape": [int(x) for x in d["shape"]]}
    scale, zero = d["quantization"]
    if scale:
        out["quantization"] = {"scale": float(scale), "zero_point": int(zero)}
    return out


TFLITE = formats.register(formats.Format(runtime="litert", config=TFLiteExportConfig, exporter=export_tflite,
                                         io=tflite_io, input_dtype="int32",
                                         quantize_methods=("dynamic", "full", "integer", "qat", "fp16", "none"),
                                         export_methods={"fp16": {"precision": "fp16"}}))
