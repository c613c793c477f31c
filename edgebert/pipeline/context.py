"""What the stages of a compile read and pass on: the prepared inputs (Context), the run's position
between stages (State) and what each stage reports (StageRecord)."""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from edgebert.device_tests.files import sha256
from edgebert.device_tests.metrics import points

from .. import checkpoint, data, tokenizer as tokenization
from ..errors import EdgebertError
from ..checkpoint import TOKENIZER_FILES
from ..config import Config
from ..model import HeadConfig, TaskModel, encoder_of, with_head
from ..passes.train import TrainConfig


@dataclass
class Context:
    """What the stages read: the recipe, the task (registered, or inferred from the user's files), the
    tokenized data, what the manifest records of the data, and where to work."""

    recipe: object  # pipeline.recipe.Recipe
    task: data.Task
    sources: dict  # the data read: each file's path, sha256 and rows; how a carved dev split was made
    out: Path
    tokenizer_dir: Path  # the tokenizer of the current model's ids: the start model's, or a vocab stage's
    data: data.TaskData  # train and eval splits, and the tokenizer, as every pass takes them
    eval_arrays: dict
    calibration: dict
    started: float = field(default_factory=time.time)  # when the compile began: the manifest's time taken


@dataclass
class State:
    """Where the run stands between stages."""

    model: Path  # the current PyTorch checkpoint
    files: dict[str, Path]  # exported model files so far ("model.onnx", "model.tflite")
    verification: dict[str, dict]
    teacher: Path | None = None  # the checkpoint a stage with `sets_teacher` started from, once it has run
    estimate: dict | None = None  # seconds per stage, said before the first stage to run trained (pipeline.estimate)
    took: dict[str, float] = field(default_factory=dict)  # seconds each stage took when it ran, tries and all
    resumed_s: float = 0.0  # of those, the seconds of stages an earlier call ran (--resume found them done)


@dataclass(frozen=True, kw_only=True)
class StageRecord:
    """What a stage reports, and its folder's record.json: the model it made (size, cost, metrics) or the
    model files it wrote (`files`)."""

    name: str
    wall_s: float = 0.0  # the pass's own count (its training, across resumed runs)
    took_s: float = 0.0  # the stage's wall seconds when it ran: its teacher's labels and files too
    params: int | None = None  # None: the stage made no model (it wrote files)
    bytes: int | None = None
    flops_128: int | None = None  # FLOPs per sequence of 128 tokens
    metrics: dict = field(default_factory=dict)  # the task metric(s) on the eval split
    steps: int = 0
    details: dict = field(default_factory=dict)  # the pass's own (rounds, validation, ...)
    files: dict = field(default_factory=dict)  # model file name -> {"meta", "verify"}
    new_tokenizer: bool = False  # its model folder holds a new tokenizer: compile re-encodes the data with it
    folder: str | None = None  # its folder under OUT/stages, set when compile reads it back
    tries: list[dict] | None = None  # a stage run once per seed: each try's seed, folder, metrics, validation, kept

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict) -> StageRecord:
        """The record of a record.json, also one an older edgebert wrote (its keys are a subset of these)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def log(message: str) -> None:
    print(f"edgebert: {message}", file=sys.stderr, flush=True)


def start_model(recipe) -> Path:
    """The checkpoint folder the recipe starts from: its teacher, else its model."""
    source = recipe.teacher or recipe.model
    if source == "minilm":
        return checkpoint.default_checkpoint()
    path = Path(source)
    if not (path / "config.json").is_file():
        what = "teacher" if recipe.teacher else "model"
        raise EdgebertError(f"{what} {source} is not a checkpoint folder (no config.json): pass a folder that "
                            "transformers or edgebert saved, or model = \"minilm\"")
    return path


def start_weights(recipe) -> tuple[Path, list[Path]]:
    """The start model's folder and its weight files (what the start key hashes and the promise sizes up)."""
    start = start_model(recipe)
    return start, sorted(start.glob("*.safetensors"))


def embedding_head(folder: Path) -> HeadConfig:
    """The sentence-embedding head a checkpoint folder declares the way sentence-transformers saves it
    (1_Pooling/config.json: mean or [CLS] pooling; a Normalize module in modules.json: L2-normalised);
    mean pooling, normalised, where it declares none (what most sentence-transformers models use)."""
    modules = folder / "modules.json"
    pooling = next(folder.glob("*_Pooling/config.json"), None)
    if pooling is None:
        return HeadConfig(kind="embedding", pooling="mean", normalize=True)
    try:
        modes = {k for k, v in json.loads(pooling.read_text()).items() if k.startswith("pooling_mode_") and v}
        normalize = modules.is_file() and any(str(m.get("type", "")).endswith(".Normalize")
                                              for m in json.loads(modules.read_text()))
    except (ValueError, AttributeError) as e:
        raise EdgebertError(f"{pooling} or {modules} is not sentence-transformers JSON ({e}): fix or remove "
                            "the file") from None
    known = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
    if len(modes) != 1 or not modes <= set(known):
        raise EdgebertError(f"{pooling} pools by {sorted(modes)}; edgebert embeds with exactly one of "
                            f"{sorted(known)}: set one of them to true")
    return HeadConfig(kind="embedding", pooling=known[modes.pop()], normalize=normalize)


def _head_for(task: data.Task, path: Path) -> HeadConfig:
    if task.kind == "embedding":
        return embedding_head(path)
    if task.kind == "token-classification":
        return HeadConfig(kind="token-classification", num_labels=len(task.labels), labels=list(task.labels),
                          pooler=None)
    if task.kind == "regression":
        return HeadConfig(num_labels=1, labels=["score"])
    return HeadConfig(num_labels=len(task.labels), labels=list(task.labels))


def task_model(path: Path, task: data.Task) -> TaskModel:
    """The checkpoint as a model for `task`: its own head if it fits, else a fresh one."""
    model = checkpoint.load(path)
    head = _head_for(task, path)
    if isinstance(model, TaskModel) and model.head.kind == head.kind and model.head.num_labels == head.num_labels:
        return model
    return with_head(model, head)


def _limited(split: data.Split, limit: int, seed: int) -> data.Split:
    """The first `limit` examples after a seeded shuffle (the whole split when limit is 0)."""
    if not limit or limit >= len(split):
        return split
    order = list(range(len(split)))
    random.Random(seed).shuffle(order)
    return split.subset(sorted(order[:limit]))


def _splits(recipe, data_dir: str | None) -> tuple[data.Split, data.Split, dict]:
    """The train and eval splits (one task) and what the manifest records of the data they came from."""
    if recipe.data is not None:
        return data.load_data(recipe.data, seed=recipe.seed, on_bad_row=recipe.on_bad_row)
    task = data.get_task(recipe.task)
    root = data.data_root(data_dir, task=task.name, rows=recipe.train_limit)
    if root == data.EMBEDDED_DATA:
        log(f"data: no data folder, so the {task.name} sample packaged with edgebert ({root}, SOURCE.md there)")
    splits, sources = {}, {"task": task.name}
    for name in ("train", task.eval_split):
        split = splits[name] = data.load_task(task, name, data_dir=root, on_bad_row=recipe.on_bad_row)
        path = root / task.files[name]
        sources[name] = {"file": str(path), "sha256": sha256(path), "rows": len(split), "skipped": len(split.skipped)}
    return splits["train"], splits[task.eval_split], sources


def context(recipe, out: Path, data_dir: str | None) -> Context:
    """Everything the stages read, after checking the whole recipe against the start model and the
    data: a mistake any stage would hit fails here, in seconds, before `out` is created."""
    if recipe.data is None:
        data.get_task(recipe.task)  # an unknown name fails before the model loads
    tokenizer_dir = start_model(recipe)
    encoder = encoder_of(checkpoint.load(tokenizer_dir)).config
    if not any((tokenizer_dir / name).is_file() for name in TOKENIZER_FILES[3:] + ("tokenizer.json",)):
        raise EdgebertError(f"{tokenizer_dir} has no tokenizer files (tokenizer.json, vocab.txt, ...): copy the "
                            "tokenizer of the model it was trained from into the folder")
    tok = tokenization.load_tokenizer(tokenizer_dir)
    tokenization.check_max_length(tok, recipe.max_length)
    if len(tok) > encoder.vocab_size:
        raise EdgebertError(f"the tokenizer in {tokenizer_dir} has {len(tok)} tokens but the model embeds only "
                            f"{encoder.vocab_size}: use the tokenizer the model was trained with")
    recipe.check(encoder, tok)
    train_split, eval_split, sources = _splits(recipe, data_dir)
    task = train_split.task
    train_split = _limited(train_split, recipe.train_limit, recipe.seed)
    eval_split = _limited(eval_split, recipe.eval_limit, recipe.seed)
    recipe = sized(recipe, len(train_split))
    train_split, validation_split = _validation(train_split, recipe, sources)
    ctx = Context(recipe=recipe, task=task, sources=sources, out=out, tokenizer_dir=tokenizer_dir,
                  **_encoded(recipe, train_split, eval_split, tok, validation_split))
    sources["unk_rate"] = {key: round(_warn_unknown(split.input_ids, tok, f"{task.name} {name} data"), 6)
                           for key, name, split in (("train", "training", ctx.data.train),
                                                    ("eval", "eval", ctx.data.eval))}
    if task.labels:
        labels = np.asarray(ctx.eval_arrays["labels"]).ravel()
        labels = labels[labels != data.IGNORE]
        counts = np.bincount(labels, minlength=len(task.labels))
        sources["majority_baseline"] = {"accuracy": round(float(counts.max() / counts.sum()), 6),
                                        "label": task.labels[int(counts.argmax())]}
        log(f"eval majority-class baseline: accuracy {points(counts.max() / counts.sum()):.2f} "
            f"(always {task.labels[int(counts.argmax())]!r}); the model should beat it by more than a few points")
    return ctx


def sized(recipe, examples: int):
    """The recipe for `examples` training examples: its step counts scaled by examples / `sized_for` (the Recipe
    field says why); the recipe itself when it sets none or the data is the size it was written for."""
    if not recipe.sized_for or examples == recipe.sized_for:
        return recipe
    factor = examples / recipe.sized_for

    def scaled(count: float) -> int:
        return max(1, round(count * factor))

    def resized(train: TrainConfig) -> TrainConfig:
        return train.replace(steps=scaled(train.steps), eval_every=train.eval_every and scaled(train.eval_every),
                             warmup=train.warmup if train.warmup < 1 else scaled(train.warmup))

    log(f"steps: scaled by {factor:.3g} for {examples:,} training examples (the recipe's are for "
        f"{recipe.sized_for:,}: sized_for), so each stage makes the passes over the data it was written for")
    return each_training(recipe, resized)


def each_training(recipe, change):
    """The recipe with `change` applied to every stage's training options, however deep in its table."""

    def apply(options):
        if isinstance(options, TrainConfig):
            return change(options)
        inner = {f.name: apply(getattr(options, f.name)) for f in fields(options)
                 if isinstance(getattr(options, f.name), Config)}
        return options.replace(**inner) if inner else options

    return replace(recipe, options={name: apply(options) for name, options in recipe.options.items()})


def _validation(train: data.Split, recipe, sources: dict) -> tuple[data.Split, data.Split | None]:
    """(train, validation): `recipe.validation` seeded examples carved out of train (at most a tenth of it),
    which "keep the best" chooses checkpoints by, so the eval split's figures are not chosen on it."""
    size = min(recipe.validation, len(train) // 10)
    if size < 1:
        return train, None
    rest, validation = data.carve(train, size, recipe.seed + 2, name="validation")
    dropped = len(train) - len(rest) - len(validation)
    sources["validation"] = {"carved_from": "train", "rows": len(validation), "seed": recipe.seed + 2,
                             "dropped": dropped}
    if dropped:
        log(f"validation: {len(validation):,} training examples held out whole (no held-out text is inside a "
            f"training text or holds one); {dropped:,} phrases they share with training texts are in neither")
    return rest, validation


def _encoded(recipe, train_split: data.Split, eval_split: data.Split, tok,
             validation_split: data.Split | None) -> dict:
    """The Context fields that hold token ids: the passes' data, the eval arrays and the calibration set."""
    calibration_split = _limited(train_split, recipe.calibration_size, recipe.seed + 1)
    validation = data.EncodedDataset(validation_split, tok, recipe.max_length) if validation_split else None
    return {"data": data.TaskData(data.EncodedDataset(train_split, tok, recipe.max_length),
                                  data.EncodedDataset(eval_split, tok, recipe.max_length), tok, validation),
            "eval_arrays": data.pretokenize_eval(eval_split, tok, recipe.max_length),
            "calibration": data.pretokenize_eval(calibration_split, tok, recipe.max_length)}


def retokenize(ctx: Context, folder: Path) -> None:
    """Re-encode `ctx` in place with the tokenizer in `folder` (a vocab stage's model), which the later
    stages, the eval set and the bundle then use: the model's ids are that tokenizer's from here on."""
    tok = tokenization.load_tokenizer(folder)
    validation = ctx.data.validation.split if ctx.data.validation is not None else None
    for name, value in _encoded(ctx.recipe, ctx.data.train.split, ctx.data.eval.split, tok, validation).items():
        setattr(ctx, name, value)
    ctx.tokenizer_dir = folder


UNKNOWN_WARN = 0.05  # above this share of [UNK] tokens the model cannot read the text


def _warn_unknown(input_ids: list[list[int]], tok, what: str) -> float:
    """The share of text tokens that are the unknown token, with a warning when it is high."""
    unk, special = tok.unk_token_id, set(tok.all_special_ids) - {tok.unk_token_id}
    text = [i for ids in input_ids for i in ids if i not in special]
    rate = sum(i == unk for i in text) / max(len(text), 1) if unk is not None else 0.0
    if rate > UNKNOWN_WARN:
        warnings.warn(f"{what}: {rate:.0%} of the tokens are {tok.unk_token} under the model's tokenizer, so the "
                      "model cannot read that text (another script or language?): use a model whose vocabulary "
                      "covers it", stacklevel=2)
    return rate


def eval_file(ctx: Context) -> Path:
    """The eval split as the harness reads it (OUT/work/eval.npz), for every bench a compile runs."""
    path = ctx.out / "work" / "eval.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **ctx.eval_arrays)
    return path


def data_fingerprint(ctx: Context) -> str:
    """What the first stage's cache key takes of the data: the files' sha256 (an edited CSV re-runs the
    stages), the carve of the dev split, and the encoded examples with their labels."""
    contents = {k: {f: v for f, v in s.items() if f != "file"} if isinstance(s, dict) else s
                for k, s in ctx.sources.items()}  # where the data root is does not matter
    h = hashlib.sha256(json.dumps(contents, sort_keys=True).encode())
    h.update(json.dumps(ctx.data.train.labels).encode())
    for ids in ctx.data.train.input_ids:
        h.update(np.asarray(ids, dtype=np.int32).tobytes())
    for a in (ctx.eval_arrays, ctx.calibration):
        for name in sorted(a):
            h.update(a[name].tobytes())
    return h.hexdigest()[:16]


def pass_stage(verb, teacher=None, cache=None):
    """The run function of a stage that is one pass: load the current model for the task, run
    `verb(model, options, data)`, save the result as this stage's model. `teacher(ctx, state, options)`,
    when given, is the checkpoint folder of the pass's `teacher=` (None: the pass's own default);
    `cache(options, root)`, the options with their teacher-output cache under `root`, one folder for every
    stage of a compile (a cache is keyed by the teacher's weights and the text, so stages that label the same
    text with the same teacher build it once)."""

    def run(ctx: Context, state: State, options, dest: Path, work: Path) -> StageRecord:
        import torch

        model = task_model(state.model, ctx.task)
        folder = teacher(ctx, state, options) if teacher is not None else None
        if cache is not None:
            options = cache(options, ctx.out / "work" / "teacher-cache")
        torch.manual_seed(ctx.recipe.seed)
        result = verb(model, options, ctx.data, work_dir=work,
                      teacher=task_model(folder, ctx.task).eval() if folder is not None else None)
        checkpoint.save(result.model, dest / "model", tokenizer_from=ctx.tokenizer_dir)
        return StageRecord.from_dict(result.record.to_dict())

    return run
