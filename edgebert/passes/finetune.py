"""fine-tune: train a task model on labeled data (classification, pairs, regression, token tags)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch.nn.functional as F
from torch import nn

from ..config import Config
from ..data import IGNORE, TaskData
from ..errors import EdgebertError
from ..model import MaskedLM, TaskModel
from .train import Objective, Result, TrainConfig, fingerprint, measure, reported, task_evaluator, train


@dataclass(frozen=True, kw_only=True)
class FinetuneConfig(Config):
    """Fine-tuning options; the defaults suit a small BERT on a GLUE-sized task."""

    train: TrainConfig = field(default_factory=lambda: TrainConfig(lr=5e-5, eval_every=300))


def task_loss(model: TaskModel, logits, labels):
    """Cross-entropy for classes and tags (padding labels are -100), MSE for regression."""
    if model.head.kind == "token-classification":
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
    if model.head.num_labels == 1:
        return F.mse_loss(logits.squeeze(-1), labels.float())
    return F.cross_entropy(logits, labels)


class TaskObjective(Objective):
    def forward(self, batch):
        logits = self.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        return task_loss(self.model, logits, batch["labels"])


def check_task_model(model: nn.Module, verb: str, *, embedders: bool = False) -> None:
    """Refuse what `verb` cannot work on; `embedders`: sentence embedders too (they need no labels)."""
    if not isinstance(model, TaskModel) or isinstance(model, MaskedLM) \
            or (model.head.kind == "embedding" and not embedders):
        what = "a classifier, token classifier or embedder" if embedders else "a classifier or token classifier"
        raise EdgebertError(f"{verb} needs {what}, got {type(model).__name__}: "
                            "load one with a sequence- or token-classification head")


def finetune(model: TaskModel, config: FinetuneConfig, data: TaskData, *, teacher: nn.Module | None = None,
             work_dir: str | Path | None = None) -> Result:
    """Train `model` in place on `data.train` (data.EncodedDataset or a list of item dicts).

    With eval data the best evaluation is kept (chosen on `data.validation` when given); the Record
    carries its eval metrics. Fine-tuning learns from labels alone, so a `teacher` is refused rather
    than ignored."""
    if teacher is not None:
        raise EdgebertError("finetune learns from labels and takes no teacher: use distill to learn from one")
    check_task_model(model, "finetune")
    evaluator, metric = task_evaluator(model, data.choose_on)
    result = train(TaskObjective(model), data.train, config=config.train, evaluator=evaluator, metric=metric,
                   work_dir=work_dir, key=fingerprint("finetune", config.key()), name="finetune")
    metrics, chosen = reported(result.model, data, result.metrics)
    details = {"history": result.history, **result.ran_on, **chosen}
    return Result(result.model, measure("finetune", result.model, metrics=metrics, wall_s=result.wall_s,
                                        steps=result.steps, details=details))
