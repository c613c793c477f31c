"""Recipes: the TOML file `edgebert compile` runs.

    task = "sst2"                      # a known task, or a [data] table for CSV/JSONL files
    model = "minilm"                   # start point: "minilm" (the packaged default) or a checkpoint
    stages = ["finetune", "distill", "prune", "quantize", "export"]

    [distill]
    layers = 4

Each stage's table is checked against that stage's options dataclass; a mistake is reported with its
field path (`distill.layers: expected a positive int, got "four"`).
"""

from __future__ import annotations

import tomllib
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from pathlib import Path

from .errors import EdgebertError
from .passes.distill import DistillConfig
from .passes.finetune import FinetuneConfig
from .passes.prune import PruneConfig
from .passes.share import ShareConfig
from edgebert.quantize.config import host_target


@dataclass(kw_only=True)
class FinetuneStage:
    """Fine-tune the start model on the task (skipped when the recipe starts from a teacher)."""

    options: FinetuneConfig = field(default_factory=FinetuneConfig)


@dataclass(kw_only=True)
class DistillStage:
    """Distil the current model into a student initialised from every k-th of its layers."""

    layers: int = 4
    options: DistillConfig = field(default_factory=lambda: DistillConfig(hidden_weight=1.0))


@dataclass(kw_only=True)
class PruneStage:
    """Remove heads, FFN neurons or layers by Taylor importance, recovering by distillation."""

    options: PruneConfig = field(default_factory=lambda: PruneConfig(heads=0.5, ffn=0.5))


@dataclass(kw_only=True)
class ShareStage:
    """ALBERT-style sharing and factorized embeddings: lowers size, not FLOPs."""

    options: ShareConfig = field(default_factory=lambda: ShareConfig(group_size=2, embedding_size=128))


ONNX_METHODS = ("dynamic", "static", "mixed", "qat", "none")
TFLITE_METHODS = ("dynamic", "full", "qat", "fp16", "none")


@dataclass(kw_only=True)
class QuantizeStage:
    """INT8 model files for each export format, each within `accuracy_budget` of PyTorch or an error."""

    onnx: str = "dynamic"  # dynamic | static | mixed | qat | none (float)
    tflite: str = "dynamic"  # dynamic | full | qat | fp16 | none (float)
    target: str = field(default_factory=host_target)  # x86 (U8/S8) | x86-vnni | arm (S8/S8)
    accuracy_budget: float = 1.0  # points of the task metric an INT8 file may lose, else compile fails
    calibration_size: int = 128  # training examples for static calibration and QAT
    calibration_method: str = "minmax"  # minmax | percentile | entropy

    def __post_init__(self):
        for fmt, choices in (("onnx", ONNX_METHODS), ("tflite", TFLITE_METHODS)):
            if getattr(self, fmt) not in choices:
                raise EdgebertError(f"quantize.{fmt}: unknown method {getattr(self, fmt)!r}; use one of "
                                    f"{', '.join(choices)}")


@dataclass(kw_only=True)
class ExportStage:
    """The bundle's model files, each verified against PyTorch in its own runtime."""

    formats: list[str] = field(default_factory=lambda: ["onnx", "tflite"])
    seq_lens: list[int] = field(default_factory=lambda: [16, 32, 64, 128])
    bench: bool = True  # time the files locally and put the figures in the report


STAGES: dict[str, type] = {"finetune": FinetuneStage, "distill": DistillStage, "prune": PruneStage,
                           "share": ShareStage, "quantize": QuantizeStage, "export": ExportStage}
ORDER = list(STAGES)


@dataclass(kw_only=True)
class Recipe:
    task: str = "sst2"
    model: str = "minilm"
    teacher: str | None = None  # a fine-tuned checkpoint: the finetune stage then starts from it
    max_length: int = 64
    eval_limit: int = 0  # 0 = the whole eval split; set for a quick run
    train_limit: int = 0  # 0 = the whole training split
    seed: int = 42
    stages: list[str] = field(default_factory=lambda: ["finetune", "distill", "prune", "quantize", "export"])
    options: dict[str, object] = field(default_factory=dict)  # stage name -> its options dataclass

    def stage(self, name: str):
        return self.options[name]


_TOP = {f.name for f in fields(Recipe)} - {"options"}


def parse(text: str, *, source: str = "recipe") -> Recipe:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise EdgebertError(f"{source}: not valid TOML ({e})") from None
    top = {k: v for k, v in raw.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in raw.items() if isinstance(v, dict)}
    for key in top:
        if key not in _TOP:
            raise EdgebertError(f"{key}: unknown recipe field; known: {', '.join(sorted(_TOP))}")
    recipe = Recipe(**{k: _check(f"{k}", v, _field_type(Recipe, k), _default(Recipe, k)) for k, v in top.items()})
    _check_stages(recipe.stages)
    for name in tables:
        if name not in STAGES:
            raise EdgebertError(f"[{name}]: unknown stage table; known stages: {', '.join(ORDER)}")
    recipe.options = {name: build(STAGES[name], tables.get(name, {}), name) for name in STAGES}
    if recipe.max_length < 2:
        raise EdgebertError(f"max_length: expected at least 2, got {recipe.max_length}")
    return recipe


def _check_stages(stages: list[str]) -> None:
    for name in stages:
        if name not in STAGES:
            raise EdgebertError(f"stages: unknown stage {name!r}; known stages: {', '.join(ORDER)}")
    if len(set(stages)) != len(stages):
        raise EdgebertError("stages: a stage is listed twice")


def with_stages(recipe: Recipe, stages: list[str]) -> Recipe:
    """The recipe running `stages` instead (the CLI's --stages)."""
    _check_stages(stages)
    return replace(recipe, stages=list(stages))


def load(path: str | Path) -> Recipe:
    path = Path(path)
    if not path.is_file():
        raise EdgebertError(f"recipe {path} does not exist: pass a .toml file (see recipes/)")
    return parse(path.read_text(), source=str(path))


def build(cls: type, table: dict, prefix: str):
    """An options dataclass from a TOML table, checking every field's type.

    A stage that wraps a pass's own config holds it in a field named `options`: the table's keys
    that are not the stage's own go there, so a recipe writes `[distill] temperature = 4`."""
    own = {f.name for f in fields(cls)}
    inline = "options" in own and is_dataclass(_field_type(cls, "options"))
    known = own - {"options"} | ({f.name for f in fields(_field_type(cls, "options"))} if inline else set())
    for key in table:
        if key not in known:
            raise EdgebertError(f"{prefix}.{key}: unknown field; {prefix} takes {', '.join(sorted(known))}")
    values = {k: _check(f"{prefix}.{k}", v, _field_type(cls, k), _default(cls, k)) for k, v in table.items()
              if k in own}
    if inline:
        values["options"] = build(_field_type(cls, "options"), {k: v for k, v in table.items() if k not in own},
                                  prefix)
    try:
        return cls(**values)
    except EdgebertError as e:  # a pass's own check: say which table it came from
        raise EdgebertError(str(e) if str(e).startswith(prefix) else f"{prefix}: {e}") from None


def _field_type(cls: type, name: str):
    return typing.get_type_hints(cls)[name]


def _default(cls: type, name: str):
    f = cls.__dataclass_fields__[name]
    return f.default if f.default is not MISSING else f.default_factory()


def _check(path: str, value, kind, default):
    """`value` if it fits `kind`; ints whose default is positive must be positive (0 keeps 'off')."""
    shown = f'"{value}"' if isinstance(value, str) else repr(value)
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return value
        arms = [a for a in typing.get_args(kind) if a is not type(None)]
        for arm in arms[:-1]:  # `str | int`: the first arm that fits
            try:
                return _check(path, value, arm, default)
            except EdgebertError:
                pass
        kind = arms[-1]
        origin = typing.get_origin(kind)
    if origin is list:
        (item,) = typing.get_args(kind)
        if not isinstance(value, list):
            raise EdgebertError(f"{path}: expected a list of {item.__name__}, got {shown}")
        return [_check(f"{path}[{i}]", v, item, default[0] if default else None) for i, v in enumerate(value)]
    if origin is dict:
        return value
    if is_dataclass(kind):
        if not isinstance(value, dict):
            raise EdgebertError(f"{path}: expected a table, got {shown}")
        return build(kind, value, path)
    if kind is bool:
        if not isinstance(value, bool):
            raise EdgebertError(f"{path}: expected true or false, got {shown}")
    elif kind is int:
        positive = isinstance(default, int) and default > 0
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if positive else 0):
            raise EdgebertError(f"{path}: expected a {'positive' if positive else 'non-negative'} int, got {shown}")
    elif kind is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise EdgebertError(f"{path}: expected a non-negative number, got {shown}")
        value = float(value)
    elif kind is str and not isinstance(value, str):
        raise EdgebertError(f"{path}: expected a string, got {shown}")
    return value
