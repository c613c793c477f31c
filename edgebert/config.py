"""The one base of every options dataclass: passes, quantization methods, export formats, recipe stages.

Subclasses are declared `@dataclass(frozen=True, kw_only=True)` and named `XConfig`: frozen, so a
config handed to a pass cannot change under it, and keyword-only, so call sites read as documentation.
Checks belong in `__post_init__` and raise `EdgebertError` naming the field and the fix.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    def replace(self, **changes) -> "Config":
        """A copy with `changes` applied (and checked again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
