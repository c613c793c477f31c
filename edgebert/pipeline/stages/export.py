"""export: the bundle's float model files for the formats quantize did not write, each verified
against PyTorch in its own runtime."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from edgebert.config import Config
from edgebert.errors import EdgebertError
from edgebert.export import Budget, export, formats

from ..context import Context, State, task_model
from .quantize import export_config
from .registry import Stage, register

FLOAT_BUDGET = Budget(max_abs_diff=1e-3)


@dataclass(frozen=True, kw_only=True)
class ExportStageConfig(Config):
    """The bundle's model files, each verified against PyTorch in its own runtime."""

    formats: list[str] = field(default_factory=lambda: ["onnx", "tflite"])
    seq_lens: list[int] = field(default_factory=lambda: [16, 32, 64, 128])
    bench: bool = True  # time the files locally and put the figures in the report

    def __post_init__(self):
        known = [f.name for f in formats.all_formats()]
        for name in self.formats:
            if name not in known:
                raise EdgebertError(f"export.formats: unknown format {name!r}; use {' and/or '.join(known)}")


def run(ctx: Context, state: State, options: ExportStageConfig, dest: Path, work: Path) -> dict:
    model = task_model(state.model, ctx.task)  # the start model too gets the task's head (export-only runs)
    record = {"files": {}}
    for name in options.formats:
        fmt = formats.get(name)
        target = dest / f"model{fmt.suffix}"
        if target.name in state.files:  # quantize wrote it
            shutil.copy2(state.files[target.name], target)
            record["files"][target.name] = state.verification[target.name]
            continue
        artifact = export(model, export_config(fmt, options), out=target, eval_data=ctx.eval_arrays,
                          budget=FLOAT_BUDGET)
        record["files"][target.name] = {"meta": artifact.meta, "verify": artifact.verification}
    return record


register(Stage(name="export", options=ExportStageConfig, run=run, keyed_by_code=True))
