"""Recipes: the TOML file `edgebert compile` runs.

    task = "sst2"                      # a known task, or a [data] table for CSV/JSONL files
    model = "minilm"                   # start point: "minilm" (the packaged default) or a checkpoint
    stages = ["finetune", "distill", "prune", "quantize", "export"]

    [distill]
    layers = 4

Each stage's table is checked against the options dataclass the stage registry gives for it
(`pipeline.stages`: for the passes, the pass's own config); a mistake is reported with its field
path (`distill.layers: expected a positive int, got "four"`).
"""

from __future__ import annotations

import tomllib
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from pathlib import Path

from ..errors import EdgebertError
from .stages import STAGES, order


@dataclass(frozen=True, kw_only=True)
class Recipe:
    task: str = "sst2"
    model: str = "minilm"
    teacher: str | None = None  # a fine-tuned checkpoint: the finetune stage then starts from it
    max_length: int = 64
    eval_limit: int = 0  # 0 = the whole eval split; set for a quick run
    train_limit: int = 0  # 0 = the whole training split
    seed: int = 42
    stages: list[str] = field(default_factory=lambda: ["finetune", "distill", "prune", "quantize", "export"])
    options: dict[str, object] = field(default_factory=dict)  # stage name -> its options (the registry's type)

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
    values = {k: _check(f"{k}", v, _field_type(Recipe, k), _default(Recipe, k)) for k, v in top.items()}
    _check_stages(values.get("stages", _default(Recipe, "stages")))
    for name in tables:
        if name not in STAGES:
            raise EdgebertError(f"[{name}]: unknown stage table; known stages: {', '.join(order())}")
    options = {name: build(stage.options, tables.get(name, {}), name, defaults=stage.defaults)
               for name, stage in STAGES.items()}
    recipe = Recipe(**values, options=options)
    if recipe.max_length < 2:
        raise EdgebertError(f"max_length: expected at least 2, got {recipe.max_length}")
    return recipe


def _check_stages(stages: list[str]) -> None:
    for name in stages:
        if name not in STAGES:
            raise EdgebertError(f"stages: unknown stage {name!r}; known stages: {', '.join(order())}")
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


def build(cls: type, table: dict, prefix: str, *, defaults: dict | None = None):
    """An options dataclass from a TOML table, checking every field's type; `defaults` (a stage's
    own, e.g. distill's `layers = 4`) stand in for the dataclass's where the table is silent."""
    defaults = defaults or {}
    known = {f.name for f in fields(cls)}
    for key in table:
        if key not in known:
            raise EdgebertError(f"{prefix}.{key}: unknown field; {prefix} takes {', '.join(sorted(known))}")
    values = {**defaults, **{k: _check(f"{prefix}.{k}", v, _field_type(cls, k), defaults.get(k, _default(cls, k)))
                             for k, v in table.items()}}
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
