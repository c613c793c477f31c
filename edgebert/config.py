"""The one base of every options dataclass: passes, quantization methods, export formats, recipe stages.

Subclasses are declared `@dataclass(frozen=True, kw_only=True)` and named `XConfig`: frozen, so a
config handed to a pass cannot change under it, and keyword-only, so call sites read as documentation.
Checks belong in `__post_init__` and raise `EdgebertError` naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    added: ClassVar[tuple[str, ...]] = ()  # options newer than runs cached before them: in `key()` only when set

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
