"""Export a trained PyTorch encoder to a model file, verified against PyTorch in the file's runtime.

    from edgebert.export import export, OnnxExportConfig, Budget
    artifact = export(model, OnnxExportConfig(), out="model.onnx", eval_data=dev, budget=Budget(max_abs_diff=1e-4))
    artifact.run(arrays)  # logits from onnxruntime

One verb; each format registers itself in `edgebert.export.formats` (`export/onnx.py`,
`export/tflite.py`) with its config dataclass, and `export` dispatches on the config. A format built from another
format's file (the raw-text model, `export/onnx_text.py`) takes that file where the others take a PyTorch model, and is
verified against it in its own runtime:

    export("bundle/model.onnx", OnnxTextConfig(tokenizer="bundle"), out="model.text.onnx", eval_data="bundle/eval.npz")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from torch import nn

from edgebert.device_tests.files import sidecar, write_json
from edgebert.errors import EdgebertError

from . import formats
from .data import InputSpec, load_arrays, torch_logits
from .formats import Format
from .onnx import OnnxExportConfig
from .tflite import TFLiteExportConfig
from .verify import Budget, check, compare

DERIVED_TOLERANCE = 1e-4  # a file built from another runs its graph on the same ids: the difference is rounding

__all__ = ["export", "Artifact", "Format", "formats", "OnnxExportConfig", "TFLiteExportConfig", "InputSpec",
           "Budget", "compare", "load_arrays", "torch_logits"]


@dataclass
class Artifact:
    """A model file, what was done to it (`meta`) and how it verified (`verification`); it runs and
    checks itself in the file's own runtime."""

    path: Path
    meta: dict = field(default_factory=dict)
    verification: dict | None = None

    def __post_init__(self):
        self.path = Path(self.path)

    @property
    def format(self) -> Format:
        return formats.of_file(self.path)

    def run(self, arrays, *, threads: int = 1) -> np.ndarray:
        """Outputs [N, ...] on tokenized arrays (a dict or an .npz with `lengths`), in the file's runtime."""
        return self.format.run(self.path, load_arrays(arrays, what="arrays"), threads)

    def verify(self, arrays, reference: np.ndarray, *, budget: Budget | None = None, against: str = "pytorch") -> dict:
        """Compare with `reference` logits on `arrays`, write `<path>.verify.json`, enforce `budget`."""
        self.verification = check(self.path, load_arrays(arrays), reference, budget=budget, against=against)
        return self.verification


def export(model: nn.Module | str | Path, config, *, out: str | Path, eval_data=None, budget: Budget | None = None,
           inputs: InputSpec | None = None) -> Artifact:
    """Export `model` to `out`, write `<out>.meta.json`; with `eval_data`, verify and write `<out>.verify.json`.

    `model` is a torch nn.Module, or for a format built from another format's file (`Format.source`), that file."""
    fmt = formats.of_config(config)
    if fmt is None:
        raise EdgebertError(f"export config {type(config).__name__}: use one of "
                            f"{[f.config.__name__ for f in formats.all_formats()]}")
    out = Path(out)
    if formats.of_path(out) is not fmt:
        raise EdgebertError(f"{type(config).__name__} writes {fmt.suffix} files, got out={out}: "
                            f"name the output *{fmt.suffix}")
    if fmt.source is not None:
        return _derive(fmt, Path(model) if isinstance(model, (str, Path)) else model, config, out, eval_data, budget)
    if not isinstance(model, nn.Module):
        raise EdgebertError(f"export takes a torch nn.Module, got {type(model).__name__}")
    spec = inputs or InputSpec.of(model)
    arrays = load_arrays(eval_data, spec=spec) if eval_data is not None else None
    meta = fmt.exporter(model, config, spec, out)
    write_json(sidecar(out, "meta"), meta)
    artifact = Artifact(out, meta)
    if arrays is not None:
        artifact.verify(arrays, torch_logits(model, arrays, spec), budget=budget)
    return artifact


def _derive(fmt: Format, source, config, out: Path, eval_data, budget: Budget | None) -> Artifact:
    """A file built from `source` (a file of `fmt.source`) and verified against it on `eval_data`, in each one's own
    runtime: by default within DERIVED_TOLERANCE, since it runs the same graph on the same ids."""
    what = formats.get(fmt.source)
    if not isinstance(source, Path) or formats.of_path(source) is not what or not source.is_file():
        raise EdgebertError(f"{type(config).__name__} builds from a {what.suffix} file: pass its path as the model "
                            f"(got {source if isinstance(source, Path) else type(source).__name__})")
    problem = fmt.missing()
    if problem:
        raise EdgebertError(problem)
    arrays = load_arrays(eval_data) if eval_data is not None else None
    if config.pair is None:  # pairs when the eval set holds them
        config = config.replace(pair=bool(arrays is not None and arrays["token_type_ids"].any()))
    meta = fmt.exporter(source, config, out)
    write_json(sidecar(out, "meta"), meta)
    artifact = Artifact(out, meta)
    if arrays is not None:
        artifact.verify(arrays, what.run(source, arrays, batch_size=1), against=source.name,
                        budget=budget or Budget(max_abs_diff=DERIVED_TOLERANCE))
    return artifact
