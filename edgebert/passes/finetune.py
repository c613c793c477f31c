"""fine-tune: train a task model on labeled data (classification, pairs, regression, token tags)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch.nn.functional as F
from torch import nn

from ..data import IGNORE
from ..errors import EdgebertError
from ..model import MaskedLM, TaskModel
from .train import Objective, Record, TrainConfig, fingerprint, measure, task_evaluator, train


@dataclass
class FinetuneConfig:
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


def check_task_model(model: nn.Module, verb: str) -> None:
    if not isinstance(model, TaskModel) or isinstance(model, MaskedLM) or model.head.kind == "embedding":
        raise EdgebertError(f"{verb} needs a classifier or token classifier, got {type(model).__name__}: "
                            "load one with a sequence- or token-classification head")


def finetune(
    model: TaskModel,
    train_data: Sequence,
    eval_data: Sequence | None = None,
    *,
    config: FinetuneConfig | None = None,
    work_dir: str | Path | None = None,
) -> tuple[TaskModel, Record]:
    """Train `model` in place on `train_data` (data.EncodedDataset or a list of item dicts).

    With `eval_data` the best evaluation is kept; the Record carries its metrics."""
    config = config or FinetuneConfig()
    check_task_model(model, "finetune")
    evaluator, metric = task_evaluator(model, eval_data)
    result = train(TaskObjective(model), train_data, config=config.train, evaluator=evaluator, metric=metric,
                   work_dir=work_dir, key=fingerprint("finetune", asdict(config)), name="finetune")
    return result.model, measure("finetune", result.model, metrics=result.metrics, wall_s=result.wall_s,
                                 steps=result.steps, details={"history": result.history})
