"""pretrain: masked-LM (+ next-sentence) training on unlabeled text.

For domain adaptation before fine-tuning, and to recover a compressed MaskedLM before
task-agnostic distillation. Masks come from data.MLMCollator, reseeded from (seed, step) so a
resumed run draws the same masks as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..config import Config
from ..data import IGNORE, MLMCollator, TaskData, nsp_pairs
from ..errors import EdgebertError
from ..model import MaskedLM
from ..tokenizer import encode
from .train import Objective, Result, TrainConfig, device_of, fingerprint, lengths_of, measure, place, train


@dataclass(frozen=True, kw_only=True)
class PretrainConfig(Config):
    train: TrainConfig = field(default_factory=lambda: TrainConfig(lr=1e-4, eval_every=500))
    mlm_probability: float = 0.15
    nsp_weight: float = 1.0  # used when the model has an NSP head


def pretraining_data(tokenizer, texts: Sequence[str] | Sequence[Sequence[str]], *, max_length: int,
                     nsp: bool = False, seed: int = 0) -> list[dict]:
    """Encoded items from texts, or with `nsp` from documents (lists of sentences) as BERT's
    IsNext/NotNext sentence pairs (data.nsp_pairs)."""
    if nsp:
        pairs = nsp_pairs(texts, seed=seed)
        encoded = encode(tokenizer, [a for a, _, _ in pairs], [b for _, b, _ in pairs], max_length=max_length,
                         source="pretraining pairs")
        labels = [label for _, _, label in pairs]
    else:
        if any(not isinstance(t, str) for t in texts):
            raise EdgebertError("pretraining texts must be strings; pass documents (lists of sentences) with nsp=True")
        encoded = encode(tokenizer, list(texts), max_length=max_length, source="pretraining texts")
        labels = None
    items = []
    for i, (ids, types) in enumerate(zip(encoded.input_ids, encoded.token_type_ids)):
        item = {"input_ids": ids, "token_type_ids": types}
        if labels is not None:
            item["nsp_label"] = labels[i]
        items.append(item)
    return items


def mlm_collate(tokenizer, probability: float, seed: int):
    """collate_fn(items, indices, step) for train(): data.MLMCollator reseeded from (seed, step),
    plus NSP labels when the items carry them."""
    collator = MLMCollator(tokenizer, probability=probability, seed=seed)

    def collate_fn(items, indices, step):
        collator.generator.manual_seed(seed * 1_000_003 + step)
        batch = collator([{k: v for k, v in item.items() if k != "labels"} for item in items])
        batch["index"] = torch.as_tensor(list(indices), dtype=torch.int64)
        if "nsp_label" in items[0]:
            batch["nsp_labels"] = torch.tensor([item["nsp_label"] for item in items])
        return batch

    return collate_fn


class MLMObjective(Objective):
    def __init__(self, model: MaskedLM, nsp_weight: float):
        super().__init__(model)
        self.nsp_weight = nsp_weight

    def forward(self, batch):
        out = self.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        mlm, nsp = out if isinstance(out, tuple) else (out, None)
        loss = F.cross_entropy(mlm.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE)
        if nsp is not None:
            if "nsp_labels" not in batch:
                raise EdgebertError("the model has an NSP head but the data has no sentence pairs: "
                                    "build it with pretraining_data(..., nsp=True)")
            loss = loss + self.nsp_weight * F.cross_entropy(nsp, batch["nsp_labels"])
        return loss


@torch.no_grad()
def mlm_accuracy(model: MaskedLM, dataset: Sequence, tokenizer, *, probability: float = 0.15, seed: int = 0,
                 batch_size: int = 64) -> dict[str, float]:
    """Masked-token accuracy and loss on `dataset` with fixed masks (comparable across runs)."""
    collate_fn = mlm_collate(tokenizer, probability, seed)
    was_training = model.training
    model.eval()
    device = device_of(model)
    correct = total = 0
    loss = 0.0
    order = sorted(range(len(dataset)), key=lengths_of(dataset).__getitem__)
    for n, start in enumerate(range(0, len(order), batch_size)):
        idx = order[start : start + batch_size]
        batch = place(collate_fn([dataset[i] for i in idx], idx, n), device)
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        mlm = out[0] if isinstance(out, tuple) else out
        picked = batch["labels"] != IGNORE
        correct += int((mlm[picked].argmax(-1) == batch["labels"][picked]).sum())
        loss += float(F.cross_entropy(mlm[picked], batch["labels"][picked], reduction="sum"))
        total += int(picked.sum())
    model.train(was_training)
    return {"mlm_accuracy": correct / max(total, 1), "mlm_loss": loss / max(total, 1)}


def pretrain(model: MaskedLM, config: PretrainConfig, data: TaskData, *, teacher: nn.Module | None = None,
             work_dir: str | Path | None = None) -> Result:
    """Masked-LM (+ NSP when the model has that head) training on `data.train`, in place; the
    Record's metrics are masked-token accuracy on `data.eval`. `data.tokenizer` drives the masking."""
    if not isinstance(model, MaskedLM):
        raise EdgebertError(f"pretrain needs a MaskedLM, got {type(model).__name__}: "
                            "build one with HeadConfig(kind='masked-lm')")
    if teacher is not None:
        raise EdgebertError("pretrain learns from the text alone and takes no teacher: use distill to learn from one")
    tokenizer = data.tokenizer
    if tokenizer is None:
        raise EdgebertError("pretraining masks tokens: pass TaskData(..., tokenizer=)")
    evaluator = (lambda m: mlm_accuracy(m, data.eval, tokenizer, probability=config.mlm_probability)) \
        if data.eval is not None else None
    result = train(MLMObjective(model, config.nsp_weight), data.train, config=config.train,
                   collate_fn=mlm_collate(tokenizer, config.mlm_probability, config.train.seed),
                   evaluator=evaluator, metric="mlm_accuracy" if evaluator else None, work_dir=work_dir,
                   key=fingerprint("pretrain", config.key()), name="pretrain")
    return Result(result.model, measure("pretrain", result.model, metrics=result.metrics, wall_s=result.wall_s,
                                        steps=result.steps, details={"history": result.history, **result.ran_on}))
