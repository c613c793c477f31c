"""The stage registry: a stage is its options dataclass, its run function and its cache key.

A recipe's `[name]` table is parsed into the stage's `options` (checked field by field, starting
from `defaults`); `compile` runs `run(ctx, state, options, dest, work)` in the recipe's order
and caches the result under a hash of `key(recipe)`. A new stage is one module in this folder
that calls `register`, plus its import in `__init__.py`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import edgebert
from edgebert import device_tests, export, quantize
from edgebert.device_tests.files import sha256
from edgebert.device_tests.versions import versions
from edgebert.errors import EdgebertError
from edgebert.passes.train import fingerprint

from ..bundle import VERSIONED


@dataclass(frozen=True, kw_only=True)
class Stage:
    name: str  # the recipe's name for it: in `stages = [...]` and as its `[table]`
    options: type  # an edgebert.config.Config subclass, the type of the stage's table
    run: Callable  # (ctx, state, options, dest: Path, work: Path) -> record dict; writes into dest
    key: Callable | None = None  # recipe -> what the stage's output depends on (default: its options)
    defaults: dict = field(default_factory=dict)  # values that differ from the options' own defaults
    # The stage takes minutes, so its key also holds this edgebert's code (code_version): a changed
    # quantizer or exporter rebuilds its files on --resume. Training stages take hours and are keyed
    # by their options alone, so a refactor does not retrain them (--force, or a new --out, does).
    keyed_by_code: bool = False

    def cache_key(self, recipe) -> object:
        options = self.key(recipe) if self.key is not None else recipe.stage(self.name).key()
        return {"options": options, "code": code_version()} if self.keyed_by_code else options


@functools.cache
def code_version() -> str:
    """A hash of every source file of the installed edgebert (its subpackages export/, quantize/ and
    device_tests/ too) and of the versions of the libraries that write and run its files."""
    roots = {Path(p) for module in (edgebert, export, quantize, device_tests) for p in module.__path__}
    sources = {str(f.relative_to(root.parent)): sha256(f) for root in roots for f in root.rglob("*.py")}
    return fingerprint(versions(*VERSIONED), sources)


STAGES: dict[str, Stage] = {}


def register(stage: Stage) -> Stage:
    if stage.name in STAGES:
        raise EdgebertError(f"stage {stage.name!r} is registered twice: give the new stage its own name")
    STAGES[stage.name] = stage
    return stage


def order() -> list[str]:
    """Stage names in registration order, as errors list them."""
    return list(STAGES)
