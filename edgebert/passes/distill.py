"""distill: train a smaller student to imitate a teacher.

Losses (`losses.py`; each with its own weight, zero turns it off):
- soft logits: KL(teacher ‖ student) at temperature T, times T² (Hinton et al.); MSE for regression;
  for an Embedder the output loss is 1 − cos(student vector, teacher vector) (`logit_weight` too);
- hard labels: the ordinary task loss, when the data has labels;
- hidden states: MSE between mapped layers (a learned projection when widths differ; TinyBERT);
- attention: KL between attention distributions (TinyBERT);
- value relation: KL between softmax(V Vᵀ/√d) per relation head (MiniLM), which needs no equal
  head count.

With `augment`, the student also learns from copies of the training text with words swapped for
embedding neighbours (`augment.py`, TinyBERT's augmentation), labelled by the teacher.

The student is either made from the model (`DistillConfig(layers=4)`: `student.py` copies every
k-th layer, optionally narrowed) or is the model itself, distilled from `teacher=`.

Teacher logits (and hidden states of the mapped layers, when that loss is on) are computed once
and cached on disk (`teacher.py`), so every student epoch costs only the student. Attention losses
and MLM masking need the teacher online.

On unlabeled text, a MaskedLM student learns from a MaskedLM teacher's MLM distribution on
masked inputs (task-agnostic distillation); an Embedder student learns from its teacher's sentence
vectors (and hidden states and attention, when weighted); an Encoder from hidden states and attention alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..config import Config
from ..data import IGNORE, TaskData
from ..errors import EdgebertError
from ..model import MaskedLM, TaskModel, describe, encoder_of
from .augment import AugmentConfig, augment
from .capture import capture
from .finetune import task_loss
from .losses import attention_kl, output_loss, soft_loss, value_relation_kl
from .pretrain import mlm_accuracy, mlm_collate
from .student import init_student, resolve_layer_map
from .teacher import TeacherCache
from .train import (CPU, Accelerator, Objective, Result, TrainConfig, collate, fingerprint, measure, place, reported,
                    task_evaluator, train)


@dataclass(frozen=True, kw_only=True)
class DistillConfig(Config):
    """Distillation options. `layer_map` maps student → teacher hidden-state indices
    (0 = embeddings, i = output of layer i); None spreads the student's layers evenly.

    The student's shape (`layers`, `keep_layers`, `heads`, `ffn`): when any is set, distill makes
    the student from the model it is given, which is then the teacher; when none is, the model is
    the student and `teacher=` is required."""

    train: TrainConfig = field(default_factory=lambda: TrainConfig(lr=1e-4, eval_every=500))
    layers: int | None = None  # student depth: every k-th teacher layer, ending at the last
    keep_layers: list[int] | None = None  # or exactly these teacher layers (1-based)
    heads: int | None = None  # narrow each student layer to its largest heads
    ffn: int | None = None  # and its largest FFN neurons
    temperature: float = 2.0
    logit_weight: float = 1.0
    label_weight: float = 0.0
    hidden_weight: float = 0.0
    attention_weight: float = 0.0
    value_weight: float = 0.0
    relation_heads: int | None = None  # MiniLM relation heads; default: the teacher's head count
    layer_map: dict[int, int] | None = None
    cache_dir: str | None = None  # teacher outputs; default: <work_dir>/teacher-cache
    mlm_probability: float = 0.15  # task-agnostic distillation of a MaskedLM
    augment: AugmentConfig | None = None  # also learn from word-swapped copies the teacher labels

    def __post_init__(self):
        if self.temperature <= 0:
            raise EdgebertError(f"DistillConfig.temperature must be positive, got {self.temperature}")
        if self.augment is not None and self.label_weight:
            raise EdgebertError("DistillConfig.augment: swapped copies have no gold labels, so label_weight must be 0 "
                                "(the teacher's soft labels teach them)")

    def cached_in(self, root) -> "DistillConfig":
        """These options with the teacher-output cache under `root`, unless they name a cache of their own."""
        return self if self.cache_dir else self.replace(cache_dir=str(root))

    @property
    def makes_student(self) -> bool:
        return any(v is not None for v in (self.layers, self.keep_layers, self.heads, self.ffn))


class DistillObjective(Objective):
    def __init__(self, student: nn.Module, teacher: nn.Module, config: DistillConfig, layer_map: dict[int, int]):
        super().__init__(student)
        object.__setattr__(self, "teacher", teacher)  # not a submodule: never trained, saved, DDP-synced or moved
        self.config, self.layer_map = config, layer_map
        s_width = encoder_of(student).config.hidden_size
        t_width = encoder_of(teacher).config.hidden_size
        self.projections = nn.ModuleDict({
            str(s): nn.Linear(s_width, t_width) for s in layer_map if config.hidden_weight and s_width != t_width})
        self.hidden = set(layer_map) if config.hidden_weight else set()
        attn = config.attention_weight or config.value_weight
        self.qkv = {s for s in layer_map if s > 0} if attn else set()

    def _teacher(self, batch):
        if "teacher_logits" in batch:  # looked up in the cache by `cached_collate`
            return batch["teacher_logits"], {"hidden": batch["teacher_hidden"]}
        t_hidden = {self.layer_map[s] for s in self.hidden}
        t_qkv = {self.layer_map[s] for s in self.qkv}
        with torch.no_grad(), capture(self.teacher, t_hidden, t_qkv) as states:
            logits = self.teacher(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        return logits, states

    def forward(self, batch):
        c, student = self.config, self.model
        mask = batch["attention_mask"]
        with capture(student, self.hidden, self.qkv) as s_states:
            s_out = student(batch["input_ids"], mask, batch["token_type_ids"])
        t_out, t_states = self._teacher(batch)
        loss = s_out.new_zeros(()) if torch.is_tensor(s_out) else s_out[0].new_zeros(())
        labels = batch.get("labels")
        if isinstance(student, MaskedLM):
            s_mlm, t_mlm = (s_out[0], t_out[0]) if isinstance(s_out, tuple) else (s_out, t_out)
            picked = labels != IGNORE
            if c.logit_weight:
                loss = loss + c.logit_weight * soft_loss(s_mlm[picked], t_mlm[picked], c.temperature)
            if c.label_weight:
                loss = loss + c.label_weight * F.cross_entropy(s_mlm[picked], labels[picked])
        elif isinstance(student, TaskModel):
            if c.logit_weight:
                if student.head.kind == "token-classification":
                    real = mask.bool()
                    loss = loss + c.logit_weight * soft_loss(s_out[real], t_out[real], c.temperature)
                else:
                    loss = loss + c.logit_weight * output_loss(student, s_out, t_out, c.temperature)
            if c.label_weight and labels is not None:
                loss = loss + c.label_weight * task_loss(student, s_out, labels)
        weights = mask[..., None].to(loss.dtype)
        for s in sorted(self.hidden):
            h = s_states["hidden"][s]
            if str(s) in self.projections:
                h = self.projections[str(s)](h)
            diff = (h - t_states["hidden"][self.layer_map[s]]).pow(2) * weights
            loss = loss + c.hidden_weight * diff.sum() / (weights.sum() * h.shape[-1]) / len(self.hidden)
        if self.qkv:
            s_enc, t_enc = encoder_of(student).config, encoder_of(self.teacher).config
            rel = c.relation_heads or t_enc.num_heads
            for s in sorted(self.qkv):
                t = self.layer_map[s]
                if c.attention_weight:
                    loss = loss + c.attention_weight / len(self.qkv) * attention_kl(
                        s_states["q"][s - 1], s_states["k"][s - 1], t_states["q"][t - 1], t_states["k"][t - 1],
                        s_enc.heads(s - 1), t_enc.heads(t - 1), mask)
                if c.value_weight:
                    loss = loss + c.value_weight / len(self.qkv) * value_relation_kl(
                        s_states["v"][s - 1], t_states["v"][t - 1], rel, mask)
        return loss


def cached_layers(layer_map: dict[int, int], config: DistillConfig) -> list[int]:
    """The teacher's layers whose hidden states its cache keeps beside the logits: those the layer map matches."""
    return sorted(set(layer_map.values())) if config.hidden_weight else []


def cached_collate(student: nn.Module, cache: TeacherCache):
    """collate_fn(items, indices, step) for train(): padded batches carrying the teacher's cached outputs, so they
    move to the device with the batch."""

    def collate_fn(items, indices, step):
        batch = collate(student, items, indices)
        batch["teacher_logits"], batch["teacher_hidden"] = cache.lookup(list(indices), batch["input_ids"].shape[1])
        return batch

    return collate_fn


def _check_pair(student: nn.Module, teacher: nn.Module) -> None:
    if type(student) is not type(teacher):
        raise EdgebertError(f"student is a {type(student).__name__} but the teacher a {type(teacher).__name__}: "
                            "distil between models with the same head")
    if isinstance(student, TaskModel) and student.head.kind == "embedding" \
            and (student.head.pooling, student.head.normalize) != (teacher.head.pooling, teacher.head.normalize):
        raise EdgebertError(f"the student pools {student.head.pooling!r} (normalize={student.head.normalize}) but the "
                            f"teacher {teacher.head.pooling!r} (normalize={teacher.head.normalize}): give both the "
                            "same embedding head")
    if isinstance(student, TaskModel) and student.head.kind != "embedding" and not isinstance(student, MaskedLM) \
            and student.head.num_labels != teacher.head.num_labels:
        raise EdgebertError(f"student has {student.head.num_labels} labels, the teacher {teacher.head.num_labels}")


def distill(model: nn.Module, config: DistillConfig, data: TaskData, *, teacher: nn.Module | None = None,
            work_dir: str | Path | None = None, name: str = "distill") -> Result:
    """Distil into a student on `data.train`; the Result holds the trained student and its Record.

    With a student shape in `config` (e.g. `layers=4`) the student is made from `model`, which is
    the teacher; without one `model` is the student (trained in place) and `teacher` is required.
    `data.tokenizer` is needed only for a MaskedLM pair (its mask token and vocabulary drive the
    MLM masking). Labels in the data are used only when `label_weight` > 0. `name` labels the progress (a pass
    that recovers by distillation gives its own)."""
    if config.makes_student:
        if teacher is not None:
            raise EdgebertError("DistillConfig sets a student shape, so the model is the teacher: drop teacher=, "
                                "or leave layers/keep_layers/heads/ffn unset to distil the model from teacher=")
        teacher = model
        student = init_student(model, layers=config.layers, keep_layers=config.keep_layers, heads=config.heads,
                               ffn=config.ffn)
    elif teacher is None:
        raise EdgebertError("distill needs a teacher: pass teacher=, or set DistillConfig(layers=N) to make a "
                            "student from the model")
    else:
        student = model
    _check_pair(student, teacher)
    if config.label_weight and isinstance(student, TaskModel) and student.head.kind == "embedding":
        raise EdgebertError("an embedder learns from its teacher's vectors, not labels: set label_weight = 0")
    layer_map = resolve_layer_map(student, teacher, config.layer_map)
    teacher.eval()
    train_data, augmented = data.train, {}
    if config.augment is not None:
        if data.tokenizer is None:
            raise EdgebertError("distill.augment swaps words: pass TaskData(..., tokenizer=)")
        train_data = augment(data.train, teacher, data.tokenizer, config.augment)
        augmented = {"augmented": train_data.summary}
    mlm = isinstance(student, MaskedLM)
    if mlm and data.tokenizer is None:
        raise EdgebertError("distilling a MaskedLM masks tokens: pass TaskData(..., tokenizer=)")
    online = mlm or bool(config.attention_weight or config.value_weight)
    accelerator, cache = Accelerator.current(config.train), None
    if online:
        collate_fn = mlm_collate(data.tokenizer, config.mlm_probability, config.train.seed) if mlm else None
    else:
        root = Path(config.cache_dir) if config.cache_dir else Path(work_dir or ".") / "teacher-cache"
        hidden = cached_layers(layer_map, config)
        if not accelerator.main:  # under torchrun, rank 0 computes the cache and the others read it
            accelerator.barrier()
        cache = TeacherCache.build(teacher, train_data, hidden, root, progress=config.train.progress and
                                   accelerator.main, accelerator=accelerator)
        if accelerator.main:
            accelerator.barrier()
        collate_fn = cached_collate(student, cache)
    objective = DistillObjective(student, teacher, config, layer_map)
    # where the cache lives changes no output (its folder's name, the cache's own key, is in this key)
    options = {k: v for k, v in config.key().items() if k != "cache_dir"}
    key = fingerprint("distill", options, describe(student), describe(teacher), cache and cache.folder.name)
    choose_on = data.choose_on
    if mlm and choose_on is not None:
        evaluator, metric = (lambda m: mlm_accuracy(m, choose_on, data.tokenizer,
                                                    probability=config.mlm_probability)), "mlm_accuracy"
    else:
        evaluator, metric = task_evaluator(student, choose_on)
    if online:  # it runs beside the student
        accelerator.place(teacher)
    try:
        result = train(objective, train_data, config=config.train, collate_fn=collate_fn, evaluator=evaluator,
                       metric=metric, work_dir=work_dir, key=key, name=name)
    finally:
        place(teacher, CPU)
    metrics, chosen = (result.metrics, {}) if mlm else reported(result.model, data, result.metrics)
    details = {"history": result.history, **result.ran_on, "layer_map": layer_map,
               "teacher_cache": str(cache.folder) if cache else None, **chosen, **augmented}
    return Result(result.model, measure("distill", result.model, metrics=metrics, wall_s=result.wall_s,
                                        steps=result.steps, details=details))
