"""Recipes: the TOML file `edgebert compile` runs.

    task = "sst2"                      # a registered task, or your own file: task = "data/train.csv"
    model = "minilm"                   # start point: "minilm" (the packaged default) or a checkpoint
    stages = [...]                     # the registered stages (pipeline.stages) to run, in their order

    [distill]                          # a stage's options, as its registry entry declares them
    layers = 4

Your own data is a `[data]` table instead of `task` (the fields: `edgebert.data.DataConfig`):

    [data]
    train = "data/train.csv"           # .csv, .tsv or .jsonl; dev = "data/dev.csv", else dev_fraction carved
    text = "sentence"                  # pair = "question" for pair tasks; label = "label"
    # kind = "regression"              # inferred: scores like 3.8 → regression, else the class names sorted

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

from ..config import repeated
from ..data import DataConfig, get_task, is_data_file, load_data
from ..errors import EdgebertError
from ..passes.train import Accelerator, TrainConfig
from .context import each_training
from .resources import available_memory, check_memory
from .search import SearchConfig
from .stages import STAGES


@dataclass(frozen=True, kw_only=True)
class Recipe:
    task: str | None = "sst2"  # a registered task; None when `data` names the user's own
    data: DataConfig | None = None  # the [data] table (or `task = "FILE"`): the user's files and columns
    model: str = "minilm"
    teacher: str | None = None  # a fine-tuned checkpoint: the finetune stage then starts from it
    max_length: int = 64
    eval_limit: int = 0  # 0 = the whole eval split; set for a quick run
    train_limit: int = 0  # 0 = the whole training split
    validation: int = 1000  # training examples held out whole (data.carve) to choose checkpoints by (at most a
    # tenth); 0 = the eval split
    seed: int = 42
    # training examples the step counts are written for (before `validation` is carved): a compile on N scales
    # every training run's steps, eval_every and warmup by N / sized_for, so its passes over the data stay (a
    # sentence recipe written for SST-2's 67,349 gives 5,000 sentences 312 fine-tune steps, not 4,200); 0 = as
    # written
    sized_for: int = 0
    # the promise: points of the task metric each bundle file may lose against the teacher (the finetune stage's
    # model, else the start model); a student that loses more is still written, and the compile says so
    max_drop: float = 1.0
    on_bad_row: str = "error"  # a malformed data row: "error" stops at it (file:line), "skip" counts and warns
    stages: list[str] = field(default_factory=lambda: [s.name for s in STAGES.values() if s.by_default])
    options: dict[str, object] = field(default_factory=dict)  # stage name -> its options (the registry's type)
    search: SearchConfig = field(default_factory=SearchConfig)  # the [search] grid `compile --budget` tries

    def stage(self, name: str):
        return self.options[name]

    def check(self, encoder, tokenizer) -> None:
        """What the stages would refuse hours in, checked against the start model's `encoder` config and
        `tokenizer`: each listed stage's memory estimate and its entry's own checks."""
        available = available_memory()
        for name in self.stages:
            stage, options = STAGES.get(name), self.stage(name)
            peak = stage.trains(options) if stage.trains else None
            if peak is not None:
                check_memory(name, peak, encoder, self.max_length, available)
            if stage.check:
                stage.check(self, options, encoder, tokenizer)

    @property
    def kind(self) -> str | None:
        """The task's kind where it is known before the data loads: a built-in task's, or the [data] table's `kind`
        (None: the user's labels will say, when the data loads)."""
        return self.data.kind if self.data is not None else get_task(self.task).kind

    @property
    def calibration_size(self) -> int:
        """The training examples the calibrating stage reads (ctx.calibration), whether it runs or not: the set
        is in every run's start key."""
        return max(s.calibration(self.stage(s.name)) for s in STAGES.values() if s.calibration)


RECIPES = Path(__file__).resolve().parents[1] / "recipes"  # the packaged recipes
# the packaged recipe `edgebert compile --task` starts from when it names no recipe: the one for the task's kind
BY_KIND = {"classification": "sst2-minilm.toml", "pair-classification": "mrpc-minilm.toml",
           "regression": "stsb-minilm.toml", "token-classification": "conll2003-minilm.toml",
           "embedding": "stsb-minilm-embedding.toml"}

_TOP = {f.name for f in fields(Recipe)} - {"options", "data", "search"}
OFF_AT_ZERO = {"validation"}  # int fields whose default is positive but where 0 means "none"


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
    if "data" in tables:
        if "task" in values:
            raise EdgebertError(f"task: the recipe names its data twice (task = \"{values['task']}\" and a [data] "
                                "table); keep one")
        values.update(task=None, data=build(DataConfig, tables.pop("data"), "data"))
    elif is_data_file(values.get("task") or ""):
        values.update(task=None, data=DataConfig(train=values["task"]))
    if "search" in tables:
        values["search"] = build(SearchConfig, tables.pop("search"), "search")
    for name in tables:
        if name not in STAGES:
            raise EdgebertError(f"[{name}]: unknown stage table; known stages: {', '.join(STAGES.names())}")
    top = {name: values.get(name, _default(Recipe, name)) for name in _TOP}
    options = {stage.name: build(stage.options, tables.get(stage.name, {}), stage.name,
                                 defaults=stage.defaults_for(top)) for stage in STAGES.values()}
    if top["max_length"] < 2:
        raise EdgebertError(f"max_length: expected at least 2, got {top['max_length']}")
    recipe = Recipe(**values, options=options)
    check_bad_row(recipe.on_bad_row)
    tried = [name for name in recipe.stages
             if STAGES.get(name).tries and len(STAGES.get(name).tries(options[name])) > 1]
    if tried and not recipe.validation:
        raise EdgebertError(f"{tried[0]}.tries keeps the try best on the validation split, and validation = 0 "
                            "chooses on the eval split: set validation to the training examples to hold out, or "
                            "tries = 1")
    return recipe


def check_bad_row(value: str) -> None:
    if value not in ("error", "skip"):
        raise EdgebertError(f'on_bad_row: expected "error" or "skip", got {value!r}')


def _check_stages(stages: list[str]) -> None:
    for name in stages:
        if name not in STAGES:
            raise EdgebertError(f"stages: unknown stage {name!r}; known stages: {', '.join(STAGES.names())}")
    if repeated(stages) is not None:
        raise EdgebertError(f"stages: {repeated(stages)!r} is listed twice; list each stage once")
    known = STAGES.names()
    rank = {name: i for i, name in enumerate(known)}
    for a, b in zip(stages, stages[1:]):
        if rank[a] > rank[b]:
            raise EdgebertError(f"stages: {b!r} cannot run after {a!r} (each stage works on the one before's "
                                f"output); list them in the order {', '.join(s for s in known if s in stages)}")


def with_data(recipe: Recipe, task: str | None = None, **fields) -> Recipe:
    """The recipe after the CLI's `--task` and data flags: a registered task replaces the recipe's data; a
    file becomes `[data] train`, keeping the table's other fields; `fields` (DataConfig's) set the rest."""
    fields = {k: v for k, v in fields.items() if v is not None}
    if task is not None and not is_data_file(task):
        if fields:
            raise EdgebertError(f"data.{next(iter(fields))}: set for your own files, but the task is {task!r}; "
                                "pass --task FILE.csv (or .tsv, .jsonl) with it")
        return replace(recipe, task=task, data=None)
    if task is not None:  # a file: it replaces an online dataset too
        fields.update(train=task, dataset=None, dataset_config=None)
    if not fields:
        return recipe
    if recipe.data is None and "train" not in fields:
        raise EdgebertError(f"data.{next(iter(fields))}: set for your own files, but the recipe reads the registered "
                            f"task {recipe.task!r}; pass --task FILE.csv (or .tsv, .jsonl) too")
    data = recipe.data.replace(**fields) if recipe.data else DataConfig(**fields)
    return replace(recipe, task=None, data=data)


def for_task(task: str | None = None, *, on_bad_row: str = "error", **fields) -> Path:
    """The packaged recipe for `task` and the data flags `fields` (the CLI's --task, --pair-column, ...; no task:
    SST-2): its kind's (BY_KIND). A file's kind is its `kind` field, else what load_data reads in its labels,
    bad rows handled as the compile will handle them."""
    if task is None:
        return RECIPES / BY_KIND["classification"]
    if not is_data_file(task):
        return RECIPES / BY_KIND[get_task(task).kind]
    data = with_data(Recipe(), task, **fields).data
    kind = data.kind or load_data(data, seed=Recipe.seed, on_bad_row=on_bad_row)[0].task.kind
    return RECIPES / BY_KIND[kind]


def with_stages(recipe: Recipe, stages: list[str]) -> Recipe:
    """The recipe running `stages` instead (the CLI's --stages)."""
    _check_stages(stages)
    return replace(recipe, stages=list(stages))


def with_device(recipe: Recipe, device: str | None = None, precision: str | None = None) -> Recipe:
    """The recipe training on `device` in `precision` (the CLI's --device and --precision; None: as its tables
    say, auto unless they set one): every stage's training options, however deep in its table, get them. Each is
    resolved here, so a device or precision this machine lacks is refused before any work."""

    def on_device(train: TrainConfig) -> TrainConfig:
        train = train.replace(device=device or train.device, precision=precision or train.precision)
        Accelerator.resolve(train.device, train.precision)
        return train

    return each_training(recipe, on_device)


def load(path: str | Path) -> Recipe:
    path = Path(path)
    if not path.is_file():
        raise EdgebertError(f"recipe {path} does not exist: pass a .toml file (see recipes/)")
    return _beside(parse(path.read_text(), source=str(path)), path.parent)


def _beside(recipe: Recipe, folder: Path) -> Recipe:
    """The recipe with its [data] files read relative to the recipe file's folder, not wherever compile runs."""
    if recipe.data is None:
        return recipe
    files = {key: str(folder / value) for key in ("train", "dev")
             if (value := getattr(recipe.data, key)) and not Path(value).is_absolute()}
    return replace(recipe, data=recipe.data.replace(**files)) if files else recipe


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
        positive = isinstance(default, int) and default > 0 and path not in OFF_AT_ZERO
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if positive else 0):
            raise EdgebertError(f"{path}: expected a {'positive' if positive else 'non-negative'} int, got {shown}")
    elif kind is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise EdgebertError(f"{path}: expected a non-negative number, got {shown}")
        value = float(value)
    elif kind is str and not isinstance(value, str):
        raise EdgebertError(f"{path}: expected a string, got {shown}")
    return value
