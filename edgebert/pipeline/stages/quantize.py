"""quantize: an INT8 (or FP16) file for each export format, each within `accuracy_budget` of
PyTorch on the eval split, or an error."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Literal

from edgebert.config import Config
from edgebert.errors import EdgebertError
from edgebert.export import Budget, export, formats
from edgebert.quantize import (DynamicInt8Config, Int4EmbeddingsConfig, MixedPrecisionConfig, QATConfig,
                               StaticInt8Config, quantize)
from edgebert.quantize.config import Method, Target, host_target

from ..context import Context, StageRecord, State, task_model
from ..resources import Work
from .registry import Stage, bundle_stage, register


@dataclass(frozen=True, kw_only=True)
class _Shared(Config):
    """The options every format's file shares (the per-format method fields are added below)."""

    table = "quantize"
    target: Target = field(default_factory=host_target)  # x86 (U8/S8) | x86-vnni | arm (S8/S8)
    accuracy_budget: float = 1.0  # points of the task metric an INT8 file may lose, else compile fails
    calibration_size: int = 128  # training examples for static calibration and QAT
    calibration_method: Method = "minmax"
    embeddings: Literal["int8", "int4"] = "int8"  # int4: a block-wise word table (a runtime without the kernel keeps INT8, recorded)

    def __post_init__(self):
        no_int4 = [f"{fmt.name} = 'qat'" for fmt in formats.all_formats() if self.method(fmt) == "qat"]
        if self.embeddings == "int4" and no_int4:
            raise EdgebertError(f"quantize.embeddings = 'int4' does not apply to {', '.join(no_int4)}: "
                                "use embeddings = 'int8' or another method")

    def method(self, fmt: formats.Format) -> str:
        """The recipe's method for `fmt`'s file ("none": the export stage writes it: float, or built from another
        format's file, which has no method of its own)."""
        return getattr(self, fmt.name) if fmt.quantize_methods else "none"

    @property
    def budget(self) -> Budget:
        return Budget(max_metric_drop=self.accuracy_budget / 100)  # the recipe says points, Budget fractions


# One field per registered format that has quantize methods, named after it ([quantize] onnx = "static"), taking
# them, the first by default: a new format needs no edit here.
QuantizeStageConfig = make_dataclass(
    "QuantizeStageConfig", [(f.name, Literal[f.quantize_methods], field(default=f.quantize_methods[0]))
                            for f in formats.all_formats() if f.quantize_methods],
    bases=(_Shared,), frozen=True, kw_only=True)
QuantizeStageConfig.__module__ = __name__
QuantizeStageConfig.__doc__ = "INT8 model files for each export format, each within `accuracy_budget` of PyTorch or an error."


def check_lengths(recipe, options, encoder, tokenizer) -> None:
    """The lengths the file stages export (export.seq_lens) are ones the tokenizer fills."""
    too_long = [t for t in recipe.stage("export").seq_lens if t > recipe.max_length]
    if too_long:
        raise EdgebertError(f"export.seq_lens: {too_long[0]} is longer than max_length {recipe.max_length}, so the "
                            f"tokenizer never fills it; use lengths up to {recipe.max_length}")


def check(recipe, options, encoder, tokenizer) -> None:
    """The export lengths, and a file to write: with every method "none" only the export stage writes any."""
    check_lengths(recipe, options, encoder, tokenizer)
    exporter = bundle_stage().name
    if exporter not in recipe.stages and all(options.method(formats.get(f)) == "none"
                                             for f in recipe.stage(exporter).formats):
        raise EdgebertError(f"quantize: every format's method is \"none\" and no stage exports, so the recipe "
                            f"exports nothing; add \"{exporter}\" to stages")


def export_config(fmt: formats.Format, export_options, **changes):
    """The format's export config with the recipe's choices it takes (the lengths of a TFLite file)."""
    own = {f.name for f in fields(fmt.config)}
    chosen = {"seq_lens": tuple(export_options.seq_lens)} if "seq_lens" in own else {}
    return fmt.config(**chosen, **changes)


SEARCHED = ("mixed", "integer")  # methods that search which op kinds to keep wider, a file built per kind


def _method_config(method: str, q: _Shared, export_options):
    int4 = {"int4_embeddings": Int4EmbeddingsConfig()} if q.embeddings == "int4" else {}
    if method == "dynamic":
        return DynamicInt8Config(target=q.target, **int4)
    if method in ("static", "full"):
        return StaticInt8Config(target=q.target, method=q.calibration_method, **int4)
    if method in SEARCHED:  # integer: full integer, the sensitive kinds at 16-bit activations
        return MixedPrecisionConfig(budget=q.budget, target=q.target, method=q.calibration_method,
                                    keep="int16" if method == "integer" else "float", **int4)
    return QATConfig(target=q.target, seq_lens=tuple(export_options.seq_lens))


def run(ctx: Context, state: State, options: _Shared, dest: Path, work: Path) -> StageRecord:
    model = task_model(state.model, ctx.task)  # the start model too gets the task's head (export-only runs)
    export_options = ctx.recipe.stage("export")
    evals = {"eval_data": ctx.eval_arrays, "budget": options.budget}
    files = {}
    for name in export_options.formats:
        fmt = formats.get(name)
        method, target = options.method(fmt), dest / f"model{fmt.suffix}"
        if method == "none":
            continue
        if method in fmt.export_methods:
            artifact = export(model, export_config(fmt, export_options, **fmt.export_methods[method]), out=target,
                              **evals)
            if options.embeddings == "int4":  # said, not silently dropped: the exporter keeps its own table
                artifact.meta["embeddings"] = f"int4 not applied: {name} = {method!r} writes its own word table"
        else:
            lengths = "seq_lens" in {f.name for f in fields(fmt.config)}
            artifact = quantize(model, _method_config(method, options, export_options), out=target,
                                calibration=ctx.calibration, export_as=export_config(fmt, export_options)
                                if lengths else None, **evals)
        files[target.name] = {"meta": artifact.meta, "verify": artifact.verification}
    return StageRecord(name="quantize", files=files)


def key(recipe) -> dict:
    """Quantized files also depend on which formats are exported and at which lengths."""
    export_options = recipe.stage("export")
    quantized = [f for f in export_options.formats if formats.get(f).quantize_methods]  # not a file built from another
    return {**recipe.stage("quantize").to_dict(), "formats": quantized, "seq_lens": export_options.seq_lens}


def work(options: _Shared, data) -> Work:
    """About 30 s, and each searched file (mixed, integer) about 220 s more: the search builds and scores a
    file per op kind on 2 CPU cores (an SST-2 student's full-integer TFLite took 252 s in all)."""
    searched = sum(options.method(f) in SEARCHED for f in formats.all_formats())
    return Work(seconds=30 + 220 * searched)


register(Stage(name="quantize", options=QuantizeStageConfig, run=run, key=key, keyed_by_code=True, by_default=True,
               check=check, work=work, writes_files=True, manifest="quantization",
               calibration=lambda o: o.calibration_size, searched={"embeddings": "embeddings"}))
