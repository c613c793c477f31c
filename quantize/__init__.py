"""Quantize an exported model (or a PyTorch model, exported on the way) to INT8, verified.

    from edgebert.quantize import quantize, DynamicInt8, StaticInt8, MixedPrecision, QAT, Int8Embeddings
    quantize("model.onnx", DynamicInt8(), out="model.int8.onnx", eval_data=dev)
    quantize(model, MixedPrecision(budget=Budget(max_metric_drop=1.0)), out="m.onnx",
             calibration=train_sample, eval_data=dev)

One verb; each method is a config dataclass (`quantize.config`), and `quantize.registry` maps
(config, format) to its implementation (`quantize.passes`, `quantize.qat`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from torch import nn

from edgebert.errors import EdgebertError
from edgebert.export import Exported, OnnxExport, TFLiteExport
from edgebert.export._files import atomic_path, sidecar, write_json
from edgebert.export.data import InputSpec, load_arrays, torch_logits
from edgebert.export.onnx import export_onnx
from edgebert.export.runtime import logits as runtime_logits
from edgebert.export.tflite import export_tflite
from edgebert.export.verify import Budget, verify

from . import passes, qat  # noqa: F401  (registers the implementations)
from .config import QAT, DynamicInt8, Int8Embeddings, MixedPrecision, StaticInt8
from .registry import Job, lookup

__all__ = ["quantize", "DynamicInt8", "StaticInt8", "MixedPrecision", "QAT", "Int8Embeddings", "Budget"]

_FORMATS = {".onnx": "onnx", ".tflite": "tflite"}


def _spec_of_file(path: Path) -> InputSpec:
    meta = sidecar(path, "meta")
    if meta.is_file():
        return InputSpec(names=tuple(json.loads(meta.read_text())["inputs"]))
    if path.suffix == ".onnx":
        import onnx

        return InputSpec(names=tuple(i.name for i in onnx.load(str(path), load_external_data=False).graph.input))
    from edgebert.export.runtime import TFLiteModel

    m = TFLiteModel(path)
    return InputSpec(names=tuple(n for n in ("input_ids", "attention_mask", "token_type_ids")
                                 if n in m.input_names(next(iter(m.lengths)))))


def quantize(model: nn.Module | str | Path, config, *, out: str | Path, calibration=None, eval_data=None,
             inputs: InputSpec | None = None, budget: Budget | None = None,
             export_as: OnnxExport | TFLiteExport | None = None) -> Exported:
    """Quantize `model` (a module, or an exported .onnx/.tflite) with `config` into `out`.

    Writes `<out>.meta.json` (what was done, what stayed float) and, with `eval_data`,
    `<out>.verify.json` against PyTorch (or against the float file when given a path).
    `export_as` overrides how a module is exported first (e.g. TFLiteExport(seq_lens=(16, 32)))."""
    out = Path(out)
    if out.suffix not in _FORMATS:
        raise EdgebertError(f"cannot tell the format of out={out}: name it *.onnx or *.tflite")
    fmt = _FORMATS[out.suffix]
    impl = lookup(config, fmt)
    module = model if isinstance(model, nn.Module) else None
    if module is None:
        src_path = Path(model)
        if not src_path.is_file():
            raise EdgebertError(f"model {src_path} does not exist: pass an exported file or an nn.Module")
        if src_path.suffix != out.suffix:
            raise EdgebertError(f"{src_path.name} → {out.name}: quantize keeps the format; export to {out.suffix} first")
        spec = inputs or _spec_of_file(src_path)
    else:
        spec = inputs or InputSpec.of(module)
    calib = load_arrays(calibration, what="calibration set", spec=spec) if calibration is not None else None
    evals = load_arrays(eval_data, what="eval set", spec=spec) if eval_data is not None else None

    with tempfile.TemporaryDirectory(prefix="edgebert-quantize-") as tmp:
        work = Path(tmp)
        src, src_meta = None, {"input_dtype": "int32" if fmt == "tflite" else "int64"}
        if module is not None and not isinstance(config, QAT):
            src = work / f"float{out.suffix}"
            if fmt == "onnx":
                static = isinstance(config, (StaticInt8, MixedPrecision))
                how = export_as or OnnxExport(optimize="basic" if static else "fused")
                if not isinstance(how, OnnxExport):
                    raise EdgebertError(f"export_as={type(how).__name__} cannot produce {out.name}: use OnnxExport")
                src_meta = export_onnx(module, how, spec, src)
            else:
                how = export_as or TFLiteExport()
                if not isinstance(how, TFLiteExport):
                    raise EdgebertError(f"export_as={type(how).__name__} cannot produce {out.name}: use TFLiteExport")
                src_meta = export_tflite(module, how, spec, src)
        elif module is None:
            src = work / f"float{out.suffix}"
            shutil.copyfile(model, src)
            if sidecar(Path(model), "meta").is_file():
                src_meta = json.loads(sidecar(Path(model), "meta").read_text())
        reference = None
        if evals is not None:
            reference = torch_logits(module, evals, spec) if module is not None else runtime_logits(src, evals)
        job = Job(src=src, module=module, spec=spec, calibration=calib, eval_data=evals,
                  out=work / f"out{out.suffix}", work=work)
        info = impl(job, config)
        with atomic_path(out) as dst:
            shutil.copyfile(job.out, dst)
    meta = {"format": fmt, "inputs": list(spec.names), "input_dtype": src_meta.get("input_dtype"),
            "outputs": ["logits"], **({"signatures": src_meta["signatures"]} if "signatures" in src_meta else {}),
            "source": type(model).__name__ if module is not None else Path(model).name,
            "config": {"type": type(config).__name__, **asdict(config)}, **info}
    write_json(sidecar(out, "meta"), meta)
    result = None
    if evals is not None:
        against = "pytorch" if module is not None else Path(model).name
        result = verify(out, evals, reference, budget=budget, against=against)
    return Exported(out, meta, result)
