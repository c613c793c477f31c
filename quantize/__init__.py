"""Quantize an exported model (or a PyTorch model, exported on the way) to INT8 (INT4 word tables), verified.

    from edgebert.quantize import quantize, DynamicInt8Config, MixedPrecisionConfig
    quantize("model.onnx", DynamicInt8Config(), out="model.int8.onnx", eval_data=dev)
    quantize(model, MixedPrecisionConfig(budget=Budget(max_metric_drop=0.01)), out="m.onnx",
             calibration=train_sample, eval_data=dev)

One verb; each method is a config dataclass (`quantize.config`), and `quantize.registry` files each
(config, format) implementation (`quantize.passes`, `quantize.qat`) under the export format it writes.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from torch import nn

from edgebert.device_tests.files import atomic_path, sidecar, write_json
from edgebert.errors import EdgebertError
from edgebert.export import Artifact, Budget, InputSpec, formats, load_arrays, torch_logits

from . import passes, qat  # noqa: F401  (registers the implementations)
from .config import (DynamicInt8Config, Int4EmbeddingsConfig, Int8EmbeddingsConfig, MixedPrecisionConfig, QATConfig,
                     StaticInt8Config)
from .registry import Job, lookup

__all__ = ["quantize", "DynamicInt8Config", "StaticInt8Config", "MixedPrecisionConfig", "QATConfig",
           "Int8EmbeddingsConfig", "Int4EmbeddingsConfig", "Budget"]


def _spec_of_file(path: Path, fmt: formats.Format) -> InputSpec:
    meta = sidecar(path, "meta")
    if meta.is_file():
        meta = json.loads(meta.read_text())
        return InputSpec(names=tuple(meta["inputs"]), output=meta.get("outputs", ["logits"])[0])
    runtime = fmt.open(path)
    signatures = getattr(runtime, "signatures", None)  # TFLite: the output is named per signature
    output = next(iter(signatures.values())).output if signatures else runtime.output
    return InputSpec(names=tuple(runtime.names), output=output)


def quantize(model: nn.Module | str | Path, config, *, out: str | Path, calibration=None, eval_data=None,
             inputs: InputSpec | None = None, budget: Budget | None = None, export_as=None) -> Artifact:
    """Quantize `model` (a module, or an exported file) with `config` into `out`, of the same format.

    Writes `<out>.meta.json` (what was done, what stayed float) and, with `eval_data`,
    `<out>.verify.json` against PyTorch (or against the float file when given a path).
    `export_as` overrides how a module is exported first (e.g. TFLiteExportConfig(seq_lens=(16, 32)))."""
    out = Path(out)
    fmt = formats.of_path(out)
    if fmt is None:
        raise EdgebertError(f"cannot tell the format of out={out}: name it {formats.suffix_hint()}")
    method = lookup(config, fmt)
    module = model if isinstance(model, nn.Module) else None
    if module is None:
        src_path = Path(model)
        if not src_path.is_file():
            raise EdgebertError(f"model {src_path} does not exist: pass an exported file or an nn.Module")
        if src_path.suffix != out.suffix:
            raise EdgebertError(f"{src_path.name} → {out.name}: quantize keeps the format; export to {out.suffix} first")
        spec = inputs or _spec_of_file(src_path, fmt)
    else:
        spec = inputs or InputSpec.of(module)
    calib = load_arrays(calibration, what="calibration set", spec=spec) if calibration is not None else None
    evals = load_arrays(eval_data, what="eval set", spec=spec) if eval_data is not None else None

    with tempfile.TemporaryDirectory(prefix="edgebert-quantize-") as tmp:
        work = Path(tmp)
        src, src_meta = None, {"input_dtype": fmt.input_dtype}
        if module is not None and method.float_file:
            src = work / f"float{fmt.suffix}"
            how = export_as or method.export_config(config) or fmt.config()
            if not isinstance(how, fmt.config):
                raise EdgebertError(f"export_as={type(how).__name__} cannot produce {out.name}: "
                                    f"use {fmt.config.__name__}")
            src_meta = fmt.exporter(module, how, spec, src)
        elif module is None:
            src = work / f"float{fmt.suffix}"
            shutil.copyfile(model, src)
            if sidecar(Path(model), "meta").is_file():
                src_meta = json.loads(sidecar(Path(model), "meta").read_text())
        reference = None
        if evals is not None:
            reference = torch_logits(module, evals, spec) if module is not None else Artifact(src).run(evals)
        job = Job(src=src, module=module, spec=spec, calibration=calib, eval_data=evals,
                  out=work / f"out{fmt.suffix}", work=work)
        info = method.run(job, config)
        with atomic_path(out) as dst:
            shutil.copyfile(job.out, dst)
    meta = {"format": fmt.name, "inputs": list(spec.names), "input_dtype": src_meta.get("input_dtype"),
            "outputs": [spec.output], **({"signatures": src_meta["signatures"]} if "signatures" in src_meta else {}),
            "source": type(model).__name__ if module is not None else Path(model).name,
            "config": {"type": type(config).__name__, **asdict(config)}, **info}
    write_json(sidecar(out, "meta"), meta)
    artifact = Artifact(out, meta)
    if evals is not None:
        against = "pytorch" if module is not None else Path(model).name
        artifact.verify(evals, reference, budget=budget, against=against)
    return artifact
