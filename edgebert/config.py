"""The one base of every options dataclass: passes, quantization methods, export formats, recipe stages.

Subclasses are declared `@dataclass(frozen=True, kw_only=True)` and named `XConfig`: frozen, so a
config handed to a pass cannot change under it, and keyword-only, so call sites read as documentation.
Every field is checked against its annotation here, before the subclass's own `__post_init__` runs (which
then checks only ranges and combinations): a choice is a `typing.Literal[...]`, never a hand-written test.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import types
import typing
from typing import ClassVar, Literal

from .errors import EdgebertError


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    added: ClassVar[tuple[str, ...]] = ()  # options newer than runs cached before them: in `key()` only when set
    # the recipe table this config always comes from (DataConfig: "data"): its errors then name `table.field`,
    # as the recipe's writer knows it; else `ClassName.field`
    table: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs):
        """A subclass's own `__post_init__` runs after the fields are checked, so it may compare numbers
        without first asking whether they are numbers."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__post_init__")
        if own is not None:
            def __post_init__(self):
                _check_fields(self)
                own(self)
            cls.__post_init__ = __post_init__

    def __post_init__(self):
        _check_fields(self)

    def replace(self, **changes) -> "Config":
        """A copy with `changes` applied (and checked again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def key(self) -> dict:
        """`to_dict()` less the `added` options left at their defaults, at every level: what cache keys hash,
        so a new option leaves the keys (and cached stages and runs) made before it as they were."""
        d = self.to_dict()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in self.added and value == f.default:
                del d[f.name]
            elif isinstance(value, Config):
                d[f.name] = value.key()
        return d


def repeated(values):
    """The first value listed a second time (None when each is listed once): lists that name things
    (stages, formats, lengths, targets, labels, JSONL keys) refuse repeats by naming the one repeated."""
    seen = []  # a list, not a set: a malformed entry (a TOML table where a name belongs) is unhashable
    for value in values:
        if value in seen:
            return value
        seen.append(value)
    return None


@functools.cache
def _hints(cls: type) -> dict[str, object]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _check_fields(config: Config) -> None:
    """One EdgebertError for the first field whose value does not fit its annotation."""
    for name, hint in _hints(type(config)).items():
        value = getattr(config, name)
        if _fits(value, hint):
            continue
        where = f"{config.table or type(config).__name__}.{name}"
        choices = _choices(hint)
        if choices:
            raise EdgebertError(f"{where}: unknown {name} {value!r}; use one of {', '.join(map(str, choices))}")
        raise EdgebertError(f"{where}: expected {_describe(hint)}, got {value!r}")


def _choices(hint) -> tuple:
    """The values a choice field takes (`Literal[...]`, maybe `| None`); () for any other field."""
    arms = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    arms = [a for a in arms if a is not type(None)]
    if not all(typing.get_origin(a) is Literal for a in arms):
        return ()
    return tuple(c for a in arms for c in typing.get_args(a))


def _fits(value, hint) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any or hint is object:
        return True
    if hint is type(None) or hint is None:
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arm) for arm in args)
    if origin is Literal:
        return any(value == c and type(value) is type(c) for c in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_fits(v, args[0]) for v in value)
        return len(value) == len(args) and all(_fits(v, a) for v, a in zip(value, args))
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items())
    return isinstance(value, origin or hint)


def _describe(hint) -> str:
    """The annotation in words, for the error: `a list of int`, `None or a TrainConfig`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None) or hint is None:
        return "None"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in args)
    if hint is bool:
        return "true or false"
    if hint is float:
        return "a number"
    if hint is str:
        return "a string"
    if origin in (tuple, list, dict):
        items = [_bare(_describe(a)) for a in args if a is not Ellipsis]
        return f"a {origin.__name__} of {' to '.join(items)}"
    name = getattr(hint, "__name__", str(hint))
    return f"{'an' if name[0] in 'AEIOUaeiou' else 'a'} {name}"


def _bare(words: str) -> str:
    """An item's description inside a collection's: `an int` → `int`, `one of 'a', 'b'` → `values from 'a', 'b'`."""
    if words.startswith("one of "):
        return "values from " + words.removeprefix("one of ")
    return words.removeprefix("a ").removeprefix("an ")
