"""The stage registry: a stage is its options dataclass, its run function and its cache key.

A recipe's `[name]` table is parsed into the stage's `options` (checked field by field, starting
from `defaults`); `compile` runs `run(ctx, state, options, dest, work)` in the recipe's order
and caches the result under a hash of `key(recipe)`. A new stage is one module in this folder
that calls `register`, plus its import in `__init__.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from edgebert.errors import EdgebertError


@dataclass(frozen=True, kw_only=True)
class Stage:
    name: str  # the recipe's name for it: in `stages = [...]` and as its `[table]`
    options: type  # an edgebert.config.Config subclass, the type of the stage's table
    run: Callable  # (ctx, state, options, dest: Path, work: Path) -> record dict; writes into dest
    key: Callable | None = None  # recipe -> what the stage's output depends on (default: its options)
    defaults: dict = field(default_factory=dict)  # values that differ from the options' own defaults

    def cache_key(self, recipe) -> object:
        if self.key is not None:
            return self.key(recipe)
        return recipe.stage(self.name).key()


STAGES: dict[str, Stage] = {}


def register(stage: Stage) -> Stage:
    if stage.name in STAGES:
        raise EdgebertError(f"stage {stage.name!r} is registered twice: give the new stage its own name")
    STAGES[stage.name] = stage
    return stage


def order() -> list[str]:
    """Stage names in registration order, as errors list them."""
    return list(STAGES)
