"""export: the bundle's float model files for the formats quantize did not write, each verified
against PyTorch in its own runtime; then the files built from another format's file and the tokenizer (the raw-text
model), each verified against that file."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from edgebert.config import Config, repeated
from edgebert.errors import EdgebertError
from edgebert.export import Budget, export, formats

from ..context import Context, StageRecord, State, task_model
from ..resources import Work
from .quantize import check_lengths, export_config
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
        if not self.formats:
            raise EdgebertError(f"export.formats: empty, so the bundle would hold no model; list one or more of "
                                f"{', '.join(known)}")
        for name in self.formats:
            if name not in known:
                raise EdgebertError(f"export.formats: unknown format {name!r}; use {' and/or '.join(known)}")
            fmt = formats.get(name)
            if fmt.source is not None and fmt.source not in self.formats:
                raise EdgebertError(f"export.formats: {name} is built from the {fmt.source} file: list "
                                    f"\"{fmt.source}\" too")
            problem = fmt.missing()
            if problem:
                raise EdgebertError(f"export.formats: {problem}")
        if not self.seq_lens:
            raise EdgebertError("export.seq_lens: empty; list the lengths to export, e.g. [16, 32, 64]")
        for name, values in (("formats", self.formats), ("seq_lens", self.seq_lens)):
            twice = repeated(values)
            if twice is not None:
                raise EdgebertError(f"export.{name}: {twice!r} is listed twice; list each once")


def lengths_up_to(top: dict) -> dict:
    """The default lengths, up to the recipe's max_length."""
    lengths, longest = ExportStageConfig().seq_lens, top["max_length"]
    return {"seq_lens": [t for t in lengths if t < longest] + [longest] if max(lengths) >= longest else lengths}


def check(recipe, options: ExportStageConfig, encoder, tokenizer) -> None:
    """The export lengths, and no format asked for a task it cannot serve (the raw-text model, a token task)."""
    check_lengths(recipe, options, encoder, tokenizer)
    kind = recipe.kind  # None: the user's data, checked at export
    for name in options.formats:
        reason = formats.get(name).skips.get(kind)
        if reason:
            raise EdgebertError(f"export.formats: {name} for {recipe.task}: {reason}; drop \"{name}\"")


def run(ctx: Context, state: State, options: ExportStageConfig, dest: Path, work: Path) -> StageRecord:
    model = task_model(state.model, ctx.task)  # the start model too gets the task's head (export-only runs)
    files = {}
    for name in sorted(options.formats, key=lambda f: formats.get(f).source is not None):  # sources first
        fmt = formats.get(name)
        target = dest / f"model{fmt.suffix}"
        if fmt.source is not None:  # built from the source's file (the one this stage just wrote or copied)
            source = dest / f"model{formats.get(fmt.source).suffix}"
            config = fmt.config(tokenizer=str(ctx.tokenizer_dir), max_length=ctx.recipe.max_length)
            artifact = export(source, config, out=target, eval_data=ctx.eval_arrays)
            files[target.name] = {"meta": artifact.meta, "verify": artifact.verification}
            continue
        if target.name in state.files:  # quantize wrote it
            shutil.copy2(state.files[target.name], target)
            files[target.name] = state.verification[target.name]
            continue
        artifact = export(model, export_config(fmt, options), out=target, eval_data=ctx.eval_arrays,
                          budget=FLOAT_BUDGET)
        files[target.name] = {"meta": artifact.meta, "verify": artifact.verification}
    return StageRecord(name="export", files=files)


register(Stage(name="export", options=ExportStageConfig, run=run, keyed_by_code=True, defaults=lengths_up_to,
               by_default=True, work=lambda o, data: Work(seconds=2 * len(o.formats)), check=check,
               writes_files=True, bundle=True))
