"""The stage registry: a stage is its entry, and the entry is everything the pipeline asks of it.

A recipe's `[name]` table is parsed into the stage's `options` (checked field by field, starting from
`defaults`); before any work the recipe runs each listed stage's `check` and memory estimate (`trains`);
`compile` runs `run(ctx, state, options, dest, work)` in the recipe's order and caches the StageRecord
(pipeline.context) it returns under a hash of `cache_key(recipe)`. The pipeline never names a stage: it
asks the entry (the fields below). A new stage is one module in this folder that calls `register`, plus
its import in `__init__.py` (docs/add-a-stage.md).
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
from edgebert.passes.train import fingerprint
from edgebert.registry import Registry

from ..bundle import VERSIONED


@dataclass(frozen=True, kw_only=True)
class Stage:
    # What it is
    name: str  # the recipe's name for it: in `stages = [...]` and as its `[table]`
    options: type  # an edgebert.config.Config subclass, the type of the stage's table
    # values that differ from the options' own defaults, or a function of the recipe's top-level fields
    # (e.g. max_length) that gives them
    defaults: dict | Callable[[dict], dict] = field(default_factory=dict)
    by_default: bool = False  # in the stages of a recipe that lists none
    run: Callable  # (ctx, state, options, dest: Path, work: Path) -> StageRecord; writes into dest

    # What is checked before any work
    check: Callable | None = None  # (recipe, options, encoder, tokenizer): raise what run would refuse hours in
    trains: Callable | None = None  # options -> its peak (resources.Training), None when they train nothing

    # What it costs, for the estimate printed before the first stage trains (pipeline.estimate)
    work: Callable | None = None  # (options, data: TaskData) -> resources.Work; None: next to nothing
    shape: Callable | None = None  # (model, options) -> an untrained model of the shape it makes, to time

    # How compile runs it
    key: Callable | None = None  # recipe -> what the stage's output depends on (default: its options)
    # The stage takes minutes, so its key also holds this edgebert's code (code_version): a changed
    # quantizer or exporter rebuilds its files on --resume. Training stages take hours and are keyed
    # by their options alone, so a refactor does not retrain them (--force, or a new --out, does).
    keyed_by_code: bool = False
    tries: Callable | None = None  # options -> the options of each try, kept the best on validation
    makes_model: bool = False  # writes dest/model, the model the next stage starts from
    fine_tunes: bool = False  # trains the start model on the task: skipped when the recipe starts from a teacher
    sets_teacher: bool = False  # the model it starts from is the teacher of the stages after it (state.teacher)
    writes_files: bool = False  # writes bundle model files (its record's `files`)

    # What the bundle and the search ask of it
    bundle: bool = False  # its options are the bundle's: formats, seq_lens, bench (the one such stage)
    manifest: str | None = None  # the manifest key that records its options
    calibration: Callable | None = None  # options -> the training examples it calibrates on (ctx.calibration)
    searched: dict[str, str] = field(default_factory=dict)  # [search] grid field -> the option it varies

    def cache_key(self, recipe) -> object:
        options = self.key(recipe) if self.key is not None else recipe.stage(self.name).key()
        return {"options": options, "code": code_version()} if self.keyed_by_code else options

    def defaults_for(self, top: dict) -> dict:
        return self.defaults(top) if callable(self.defaults) else self.defaults


@functools.cache
def code_version() -> str:
    """A hash of every source file of the installed edgebert (its subpackages export/, quantize/ and
    device_tests/ too) and of the versions of the libraries that write and run its files."""
    roots = {Path(p) for module in (edgebert, export, quantize, device_tests) for p in module.__path__}
    sources = {str(f.relative_to(root.parent)): sha256(f) for root in roots for f in root.rglob("*.py")}
    return fingerprint(versions(*VERSIONED), sources)


STAGES: Registry[Stage] = Registry("stage")


def register(stage: Stage) -> Stage:
    return STAGES.register(stage.name, stage)


def bundle_stage() -> Stage:
    """The stage whose options are the bundle's (formats, lengths, bench)."""
    return next(s for s in STAGES.values() if s.bundle)
