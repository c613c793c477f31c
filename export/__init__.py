"""Export a trained PyTorch encoder to ONNX or TFLite, verified against PyTorch in the file's runtime.

    from edgebert.export import export, OnnxExport, TFLiteExport, Budget
    export(model, OnnxExport(), out="model.onnx", eval_data=dev, budget=Budget(max_abs_diff=1e-4))

One verb; each format is a config dataclass, and `_EXPORTERS` maps configs to implementations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from edgebert.errors import EdgebertError

from ._files import sidecar, write_json
from .data import InputSpec, load_arrays, torch_logits
from .onnx import OnnxExport, export_onnx
from .runtime import logits, pick_signature
from .tflite import TFLiteExport, export_tflite
from .verify import Budget, verify

__all__ = ["export", "Exported", "OnnxExport", "TFLiteExport", "InputSpec", "Budget", "verify", "logits",
           "pick_signature", "load_arrays"]

_EXPORTERS = {OnnxExport: (export_onnx, ".onnx"), TFLiteExport: (export_tflite, ".tflite")}


@dataclass
class Exported:
    """What an export or quantization produced: the file, what was done to it, and how it verified."""

    path: Path
    meta: dict = field(default_factory=dict)
    verify: dict | None = None


def export(model: nn.Module, config: OnnxExport | TFLiteExport, *, out: str | Path, inputs: InputSpec | None = None,
           eval_data=None, budget: Budget | None = None) -> Exported:
    """Export `model` to `out`, write `<out>.meta.json`; with `eval_data`, verify and write `<out>.verify.json`."""
    if not isinstance(model, nn.Module):
        raise EdgebertError(f"export takes a torch nn.Module, got {type(model).__name__}")
    if type(config) not in _EXPORTERS:
        raise EdgebertError(f"export config {type(config).__name__}: use one of {[c.__name__ for c in _EXPORTERS]}")
    impl, suffix = _EXPORTERS[type(config)]
    out = Path(out)
    if out.suffix != suffix:
        raise EdgebertError(f"{type(config).__name__} writes {suffix} files, got out={out}: name the output *{suffix}")
    spec = inputs or InputSpec.of(model)
    arrays = load_arrays(eval_data, spec=spec) if eval_data is not None else None
    meta = impl(model, config, spec, out)
    write_json(sidecar(out, "meta"), meta)
    result = None
    if arrays is not None:
        result = verify(out, arrays, torch_logits(model, arrays, spec), budget=budget)
    return Exported(out, meta, result)
