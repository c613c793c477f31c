"""quantize: an INT8 (or FP16) file for each export format, each within `accuracy_budget` of
PyTorch on the eval split, or an error."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from edgebert.config import Config
from edgebert.errors import EdgebertError
from edgebert.export import Budget, export, formats
from edgebert.quantize import (DynamicInt8Config, Int4EmbeddingsConfig, MixedPrecisionConfig, QATConfig,
                               StaticInt8Config, quantize)
from edgebert.quantize.config import host_target

from ..context import Context, State, task_model
from .registry import Stage, register

# The recipe's method names per format; "none" leaves the format to the export stage (float).
METHODS = {"onnx": ("dynamic", "static", "mixed", "qat", "none"),
           "tflite": ("dynamic", "full", "qat", "fp16", "none")}


@dataclass(frozen=True, kw_only=True)
class QuantizeStageConfig(Config):
    """INT8 model files for each export format, each within `accuracy_budget` of PyTorch or an error."""

    onnx: str = "dynamic"  # dynamic | static | mixed | qat | none (float)
    tflite: str = "dynamic"  # dynamic | full | qat | fp16 | none (float)
    target: str = field(default_factory=host_target)  # x86 (U8/S8) | x86-vnni | arm (S8/S8)
    accuracy_budget: float = 1.0  # points of the task metric an INT8 file may lose, else compile fails
    calibration_size: int = 128  # training examples for static calibration and QAT
    calibration_method: str = "minmax"  # minmax | percentile | entropy
    embeddings: str = "int8"  # int8 | int4 (block-wise word table; a runtime without the kernel keeps INT8, recorded)

    def __post_init__(self):
        for fmt, choices in METHODS.items():
            if getattr(self, fmt) not in choices:
                raise EdgebertError(f"quantize.{fmt}: unknown method {getattr(self, fmt)!r}; use one of "
                                    f"{', '.join(choices)}")
        if self.embeddings not in ("int8", "int4"):
            raise EdgebertError(f"quantize.embeddings: unknown precision {self.embeddings!r}; use int8 or int4")
        no_int4 = [f"{fmt} = {getattr(self, fmt)!r}" for fmt in METHODS if getattr(self, fmt) in ("qat", "fp16")]
        if self.embeddings == "int4" and no_int4:
            raise EdgebertError(f"quantize.embeddings = 'int4' does not apply to {', '.join(no_int4)}: "
                                "use embeddings = 'int8' or another method")

    @property
    def budget(self) -> Budget:
        return Budget(max_metric_drop=self.accuracy_budget / 100)  # the recipe says points, Budget fractions


def export_config(fmt: formats.Format, export_options, **changes):
    """The format's export config with the recipe's choices it takes (the lengths of a TFLite file)."""
    own = {f.name for f in fields(fmt.config)}
    chosen = {"seq_lens": tuple(export_options.seq_lens)} if "seq_lens" in own else {}
    return fmt.config(**chosen, **changes)


def _method_config(method: str, q: QuantizeStageConfig, export_options):
    int4 = {"int4_embeddings": Int4EmbeddingsConfig()} if q.embeddings == "int4" else {}
    if method == "dynamic":
        return DynamicInt8Config(target=q.target, **int4)
    if method in ("static", "full"):
        return StaticInt8Config(target=q.target, method=q.calibration_method, **int4)
    if method == "mixed":
        return MixedPrecisionConfig(budget=q.budget, target=q.target, method=q.calibration_method, **int4)
    return QATConfig(target=q.target, seq_lens=tuple(export_options.seq_lens))


def run(ctx: Context, state: State, options: QuantizeStageConfig, dest: Path, work: Path) -> dict:
    model = task_model(state.model, ctx.task)  # the start model too gets the task's head (export-only runs)
    export_options = ctx.recipe.stage("export")
    evals = {"eval_data": ctx.eval_arrays, "budget": options.budget}
    record = {"files": {}}
    for name in export_options.formats:
        fmt, method = formats.get(name), getattr(options, name)
        target = dest / f"model{fmt.suffix}"
        if method == "none":
            continue
        if method == "fp16":
            artifact = export(model, export_config(fmt, export_options, precision="fp16"), out=target, **evals)
        else:
            lengths = "seq_lens" in {f.name for f in fields(fmt.config)}
            artifact = quantize(model, _method_config(method, options, export_options), out=target,
                                calibration=ctx.calibration, export_as=export_config(fmt, export_options)
                                if lengths else None, **evals)
        record["files"][target.name] = {"meta": artifact.meta, "verify": artifact.verification}
    return record


def key(recipe) -> dict:
    """Quantized files also depend on which formats are exported and at which lengths."""
    export_options = recipe.stage("export")
    return {**recipe.stage("quantize").to_dict(), "formats": export_options.formats,
            "seq_lens": export_options.seq_lens}


register(Stage(name="quantize", options=QuantizeStageConfig, run=run, key=key, keyed_by_code=True))
