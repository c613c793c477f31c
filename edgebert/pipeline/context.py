"""What the stages of a compile read and pass on: the prepared inputs (Context) and the run's
position between stages (State)."""

from __future__ import annotations

import hashlib
import random
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .. import checkpoint, data, tokenizer as tokenization
from ..errors import EdgebertError
from ..model import HeadConfig, TaskModel, with_head


@dataclass
class Context:
    """What the stages read: the recipe, the tokenized data, and where to work."""

    recipe: object  # pipeline.recipe.Recipe
    out: Path
    tokenizer_dir: Path
    data: data.TaskData  # train and eval splits, and the tokenizer, as every pass takes them
    eval_arrays: dict
    calibration: dict


@dataclass
class State:
    """Where the run stands between stages."""

    model: Path  # the current PyTorch checkpoint
    files: dict[str, Path]  # exported model files so far ("model.onnx", "model.tflite")
    verification: dict[str, dict]


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


def _head_for(task: data.Task) -> HeadConfig:
    if task.kind == "token-classification":
        return HeadConfig(kind="token-classification", num_labels=len(task.labels), labels=list(task.labels),
                          pooler=None)
    if task.kind == "regression":
        return HeadConfig(num_labels=1, labels=["score"])
    return HeadConfig(num_labels=len(task.labels), labels=list(task.labels))


def task_model(path: Path, task: data.Task) -> TaskModel:
    """The checkpoint as a model for `task`: its own head if it fits, else a fresh one."""
    model = checkpoint.load(path)
    head = _head_for(task)
    if isinstance(model, TaskModel) and model.head.kind == head.kind and model.head.num_labels == head.num_labels:
        return model
    return with_head(model, head)


def _limited(split: data.Split, limit: int, seed: int) -> data.Split:
    """The first `limit` examples after a seeded shuffle (the whole split when limit is 0)."""
    if not limit or limit >= len(split):
        return split
    order = list(range(len(split)))
    random.Random(seed).shuffle(order)
    return replace(split, examples=[split.examples[i] for i in sorted(order[:limit])])


def context(recipe, out: Path, data_dir: str | None) -> Context:
    task = data.get_task(recipe.task)
    tokenizer_dir = start_model(recipe)
    tok = tokenization.load_tokenizer(tokenizer_dir)
    tokenization.check_max_length(tok, recipe.max_length)
    train_split = _limited(data.load_task(task, "train", data_dir=data_dir), recipe.train_limit, recipe.seed)
    eval_split = _limited(data.load_task(task, task.eval_split, data_dir=data_dir), recipe.eval_limit, recipe.seed)
    calibration_split = _limited(train_split, recipe.stage("quantize").calibration_size, recipe.seed + 1)
    return Context(
        recipe=recipe, out=out, tokenizer_dir=tokenizer_dir,
        data=data.TaskData(data.EncodedDataset(train_split, tok, recipe.max_length),
                           data.EncodedDataset(eval_split, tok, recipe.max_length), tok),
        eval_arrays=data.pretokenize_eval(eval_split, tok, recipe.max_length),
        calibration=data.pretokenize_eval(calibration_split, tok, recipe.max_length),
    )


def data_fingerprint(ctx: Context) -> str:
    h = hashlib.sha256()
    for ids in ctx.data.train.input_ids:
        h.update(np.asarray(ids, dtype=np.int32).tobytes())
    for a in (ctx.eval_arrays, ctx.calibration):
        for name in sorted(a):
            h.update(a[name].tobytes())
    return h.hexdigest()[:16]


def pass_stage(verb):
    """The run function of a stage that is one pass: load the current model for the task, run
    `verb(model, options, data)`, save the result as this stage's model."""

    def run(ctx: Context, state: State, options, dest: Path, work: Path) -> dict:
        import torch

        model = task_model(state.model, data.get_task(ctx.recipe.task))
        torch.manual_seed(ctx.recipe.seed)
        result = verb(model, options, ctx.data, work_dir=work)
        checkpoint.save(result.model, dest / "model", tokenizer_from=ctx.tokenizer_dir)
        return result.record.to_dict()

    return run
