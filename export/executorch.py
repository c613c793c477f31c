"""PyTorch → one ExecuTorch .pte file lowered to the XNNPACK delegate, FP32 or INT8.

Unlike litert-torch, ExecuTorch exports dynamic shapes cleanly, so the file has one method taking int32 [batch, tokens] for every batch up to `max_batch` and every length up to `max_length`: an
input runs at its real length, unpadded. A .pte stores no input names, so the inputs are the model's in
the order `device_tests.evalset.INPUTS` lists them (input_ids, attention_mask[, token_type_ids]), and
the method is named after its one output (`logits` or `embeddings`), as a TFLite signature names it.

INT8 is quantized while exporting (a .pte cannot be requantized): XNNPACK's PT2E quantizer, int8 weights
per output channel and int8 activations quantized per call (dynamic), which XNNPACK runs as int8 GEMMs.
Word tables stay float: the quantized embedding kernels are not in the `executorch` runtime's build.

It runs in `executorch.runtime` (the `executorch` package, which needs torch), or torch-free in
`executorch_numpy_runtime` (PyPI `executorch-numpy-runtime`, Python 3.12+, numpy only), which loads
files written by executorch 1.5.1 although it is built on ExecuTorch 1.3.1.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from edgebert.config import Config
from edgebert.device_tests.evalset import INPUTS
from edgebert.device_tests.files import atomic_path
from edgebert.errors import EdgebertError, on_disk_full

from . import formats
from .data import InputSpec

@dataclass(frozen=True, kw_only=True)
class ExecuTorchExportConfig(Config):
    """ExecuTorch export options. precision: "fp32", or "int8" (per-channel int8 weights, dynamic int8
    activations). max_length: the longest input the method takes (None: the model's positions);
    max_batch: the largest batch (the runtime plans memory for the largest shapes)."""

    precision: Literal["fp32", "int8"] = "fp32"
    max_length: int | None = None
    max_batch: int = 32

    def __post_init__(self):
        if self.max_length is not None and self.max_length < 2:
            raise EdgebertError(f"ExecuTorchExportConfig max_length {self.max_length}: give at least 2 "
                                "([CLS] and [SEP]), or None for the model's positions")
        if self.max_batch < 1:
            raise EdgebertError(f"ExecuTorchExportConfig max_batch {self.max_batch}: give at least 1")


def _program(model, config: ExecuTorchExportConfig, spec: InputSpec, max_length: int):
    """The exported program of `model` (quantized for "int8"), with dynamic batch and sequence axes."""
    import torch

    from .graph import for_export
    from .onnx import Positional

    tokens = torch.export.Dim("tokens", min=1, max=max_length)
    # a batch axis of one size is a fixed one (a Dim needs min < max)
    axes = {1: tokens} if config.max_batch == 1 else {0: torch.export.Dim("batch", min=1, max=config.max_batch), 1: tokens}
    shapes = tuple(dict(axes) for _ in spec.names)
    sample = tuple(torch.ones(min(2, config.max_batch), min(8, max_length), dtype=torch.int32) for _ in spec.names)
    wrapped = Positional(for_export(model), spec.names).eval()
    program = torch.export.export(wrapped, sample, dynamic_shapes=(shapes,), strict=False)  # one spec for *args
    if config.precision == "fp32":
        return program
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (XNNPACKQuantizer,
                                                                         get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))
    graph = prepare_pt2e(program.module(), quantizer)
    graph(*sample)  # dynamic quantization needs no calibration; one call fixes the observers' shapes
    return torch.export.export(convert_pt2e(graph), sample, dynamic_shapes=shapes, strict=False)


def max_length(model, config: ExecuTorchExportConfig) -> int:
    """The longest input the file takes: the config's, else the model's positions."""
    from edgebert.model import config_of

    encoder = config_of(model)
    limit = encoder.max_length if encoder is not None else None
    length = config.max_length or limit
    if length is None:
        raise EdgebertError(f"{type(model).__name__} does not say how many positions it has: "
                            "set ExecuTorchExportConfig(max_length=...)")
    if limit is not None and length > limit:
        raise EdgebertError(f"max_length {length} exceeds the model's {limit} positions: lower it")
    return length


def convert(model, config: ExecuTorchExportConfig, spec: InputSpec) -> tuple[bytes, int]:
    """The .pte bytes and the longest input the method takes, the exporters' logs kept out of the console."""
    if importlib.util.find_spec("executorch") is None:
        raise EdgebertError("ExecuTorch export needs the executorch package: pip install 'edgebert[executorch]'")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    if spec.names != INPUTS[:len(spec.names)]:
        raise EdgebertError(f"inputs {spec.names}: a .pte stores no input names, so edgebert writes {INPUTS} or "
                            f"{INPUTS[:2]} in that order")
    length = max_length(model, config)
    log = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            warnings.simplefilter("ignore")
            program = _program(model, config, spec, length)
            lowered = to_edge_transform_and_lower({spec.output: program}, partitioner=[XnnpackPartitioner()])
            return lowered.to_executorch().buffer, length
    except EdgebertError:
        raise
    except Exception as e:  # torch.export and the lowering raise many types; the first line names the op
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise EdgebertError(f"ExecuTorch export of {type(model).__name__} failed ({first[:200]}): "
                            "replace the unsupported op or export with precision='fp32'") from None


def export_executorch(model, config: ExecuTorchExportConfig, spec: InputSpec, out: str | Path) -> dict:
    """Write `out` (atomically) and return its metadata."""
    data, length = convert(model, config, spec)
    with on_disk_full(f"the disk is full writing {out}: free space there and export again", Path(out).parent):
        with atomic_path(out) as tmp:
            tmp.write_bytes(data)
    return {"format": "executorch", "precision": config.precision, "inputs": list(spec.names), "input_dtype": "int32",
            "outputs": [spec.output], "delegate": "xnnpack", "max_batch": config.max_batch,
            "max_length": length,
            "executorch": importlib.metadata.version("executorch")}


def executorch_io(path: Path) -> dict:
    """The method (named after its output), its inputs and output, and how to feed it. A .pte stores no output
    shape for a dynamic axis, so one two-token call reads the output's width."""
    model = formats.get("executorch").open(path)
    probe = model.run({n: np.ones((1, 2), np.int32) for n in model.names})
    output = ["batch", "tokens", int(probe.shape[2])] if probe.ndim == 3 else ["batch", int(probe.shape[1])]
    return {"format": "executorch", "method": model.output, "delegate": "xnnpack",
            "inputs": {n: {"dtype": "int32", "shape": ["batch", "tokens"]} for n in model.names},
            "outputs": {model.output: {"dtype": "float32", "shape": output}},
            "max_batch": model.max_batch, "max_length": model.max_length,
            "choose": f"the inputs in this order, int32, any batch <= {model.max_batch} and length <= "
                      f"{model.max_length}, unpadded"}


EXECUTORCH = formats.register(formats.Format(runtime="executorch", config=ExecuTorchExportConfig,
                                             exporter=export_executorch, io=executorch_io, input_dtype="int32",
                                             quantize_methods=("dynamic", "none"),
                                             export_methods={"dynamic": {"precision": "int8"}}))
