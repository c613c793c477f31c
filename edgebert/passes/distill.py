"""distill: train a smaller student to imitate a teacher.

Losses (each with its own weight; zero turns it off):
- soft logits: KL(teacher ‖ student) at temperature T, times T² (Hinton et al.); MSE for regression;
- hard labels: the ordinary task loss, when the data has labels;
- hidden states: MSE between mapped layers (a learned projection when widths differ; TinyBERT);
- attention: KL between attention distributions (TinyBERT);
- value relation: KL between softmax(V Vᵀ/√d) per relation head (MiniLM), which needs no equal
  head count.

Teacher logits (and hidden states of the mapped layers, when that loss is on) are computed once
and cached on disk, keyed by a hash of the teacher, the data and the layers, so every student
epoch costs only the student. Attention losses and MLM masking need the teacher online.

On unlabeled text, a MaskedLM student learns from a MaskedLM teacher's MLM distribution on
masked inputs (task-agnostic distillation); an Encoder or Embedder student learns from hidden
states and attention alone.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import shutil
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..data import IGNORE
from ..errors import EdgebertError
from ..model import MaskedLM, TaskModel, describe
from .finetune import task_loss
from .pretrain import mlm_accuracy, mlm_collate
from .surgery import encoder_of, head_norms, keep_top, neuron_norms, remove_heads, remove_layers, remove_neurons
from .train import Objective, Record, TrainConfig, collate, fingerprint, measure, rank_world, task_evaluator, train


@dataclass
class DistillConfig:
    """Distillation options. `layer_map` maps student → teacher hidden-state indices
    (0 = embeddings, i = output of layer i); None spreads the student's layers evenly."""

    train: TrainConfig = field(default_factory=lambda: TrainConfig(lr=1e-4, eval_every=500))
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


def default_layers(student_layers: int, teacher_layers: int) -> list[int]:
    """Teacher layers (1-based) that student layers 1..n imitate and start from: every k-th, ending
    at the last (DistilBERT keeps every other layer)."""
    if not 1 <= student_layers <= teacher_layers:
        raise EdgebertError(f"a student needs 1..{teacher_layers} layers, got {student_layers}")
    return [math.ceil(i * teacher_layers / student_layers) for i in range(1, student_layers + 1)]


def init_student(teacher: nn.Module, *, num_layers: int | None = None, layers: list[int] | None = None,
                 heads: int | None = None, ffn: int | None = None) -> nn.Module:
    """A student copied from the teacher: its layers `layers` (1-based; default every k-th of
    `num_layers`), each narrowed to its `heads` largest heads and `ffn` largest FFN neurons."""
    c = encoder_of(teacher).config
    if layers is None:
        layers = default_layers(num_layers or c.num_layers, c.num_layers)
    if any(not 1 <= i <= c.num_layers for i in layers):
        raise EdgebertError(f"student layers {layers} must be 1-based teacher layers 1..{c.num_layers}")
    student = copy.deepcopy(teacher).train()
    remove_layers(student, [i for i in range(c.num_layers) if i + 1 not in layers])
    if heads is not None:
        remove_heads(student, keep_top(head_norms(student), [min(heads, c.heads(i - 1)) for i in layers]))
    if ffn is not None:
        remove_neurons(student, keep_top(neuron_norms(student), [min(ffn, c.ffn(i - 1)) for i in layers]))
    return student


# ---------------------------------------------------------------------------------------------
# Capturing internal states


@contextmanager
def capture(model: nn.Module, hidden: set[int], qkv: set[int]):
    """Record hidden states (0 = embeddings, i = layer i) and each listed layer's q/k/v outputs.

    q/k/v are read in call order from the attention projections, so layers that share one module
    (ALBERT) are still told apart."""
    encoder = encoder_of(model)
    states: dict = {"hidden": {}, "q": [], "k": [], "v": []}
    handles = []
    if 0 in hidden:
        handles.append(encoder.embeddings.register_forward_hook(lambda m, i, o: states["hidden"].__setitem__(0, o)))
    for i, layer in enumerate(encoder.encoder.layer, start=1):
        if i in hidden:
            handles.append(layer.register_forward_hook(
                lambda m, inp, out, i=i: states["hidden"].__setitem__(i, out)))
    if qkv:
        seen = set()
        for layer in encoder.encoder.layer:
            for name in ("q", "k", "v"):
                module = getattr(layer.attention.self, {"q": "query", "k": "key", "v": "value"}[name])
                if id(module) not in seen:
                    seen.add(id(module))
                    handles.append(module.register_forward_hook(
                        lambda m, inp, out, name=name: states[name].append(out)))
    try:
        yield states
    finally:
        for h in handles:
            h.remove()


def _heads(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.view(x.shape[0], x.shape[1], n, -1).transpose(1, 2)


def _mask_bias(attention_mask: torch.Tensor, dtype) -> torch.Tensor:
    return (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


def _relation_kl(s: torch.Tensor, t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(teacher ‖ student) of row distributions [B, heads, T, T], mean over real query rows."""
    s_log = torch.log_softmax(s + _mask_bias(mask, s.dtype), -1)
    t_log = torch.log_softmax(t + _mask_bias(mask, t.dtype), -1)
    kl = (t_log.exp() * (t_log - s_log)).sum(-1)  # [B, heads, T]
    rows = mask[:, None, :].to(kl.dtype)
    return (kl * rows).sum() / (rows.sum() * kl.shape[1])


def attention_kl(s_q, s_k, t_q, t_k, s_heads, t_heads, mask) -> torch.Tensor:
    """TinyBERT's attention loss; with unequal head counts, the head-averaged distributions."""
    s = _heads(s_q, s_heads) @ _heads(s_k, s_heads).transpose(-1, -2) / math.sqrt(s_q.shape[-1] / s_heads)
    t = _heads(t_q, t_heads) @ _heads(t_k, t_heads).transpose(-1, -2) / math.sqrt(t_q.shape[-1] / t_heads)
    if s_heads == t_heads:
        return _relation_kl(s, t, mask)
    bias = _mask_bias(mask, s.dtype)
    s_p = torch.softmax(s + bias, -1).mean(1, keepdim=True)
    t_p = torch.softmax(t + bias, -1).mean(1, keepdim=True)
    kl = (t_p * (t_p.clamp_min(1e-12).log() - s_p.clamp_min(1e-12).log())).sum(-1)
    rows = mask[:, None, :].to(kl.dtype)
    return (kl * rows).sum() / rows.sum()


def value_relation_kl(s_v, t_v, relation_heads: int, mask) -> torch.Tensor:
    """MiniLM's value-relation loss: split V into `relation_heads` and compare softmax(VVᵀ/√d)."""
    for v in (s_v, t_v):
        if v.shape[-1] % relation_heads:
            raise EdgebertError(f"value width {v.shape[-1]} is not divisible by relation_heads={relation_heads}: "
                                "pick a common divisor of the student's and teacher's widths")
    s, t = _heads(s_v, relation_heads), _heads(t_v, relation_heads)
    return _relation_kl(s @ s.transpose(-1, -2) / math.sqrt(s.shape[-1]),
                        t @ t.transpose(-1, -2) / math.sqrt(t.shape[-1]), mask)


def soft_loss(s: torch.Tensor, t: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(softmax(t/T) ‖ softmax(s/T))·T² over the last dim, mean over rows; MSE for one output."""
    if s.shape[-1] == 1:
        return F.mse_loss(s, t)
    s_log, t_log = torch.log_softmax(s / temperature, -1), torch.log_softmax(t / temperature, -1)
    return (t_log.exp() * (t_log - s_log)).sum(-1).mean() * temperature**2


# ---------------------------------------------------------------------------------------------
# Teacher cache


class TeacherCache:
    """Teacher logits and selected hidden states for every example, in memory-mapped files.

    Rows are ragged: one logit row per sequence (per token for token classification), one hidden
    row per token, stored float16, addressed through offsets. Written to a temporary folder and
    renamed, so a killed computation leaves nothing half-written."""

    def __init__(self, folder: Path):
        self.folder = folder
        meta = json.loads((folder / "meta.json").read_text())
        self.hidden_layers, self.token_logits = meta["hidden"], meta["token_logits"]
        self.offsets = np.load(folder / "offsets.npy")
        self.logit_offsets = np.load(folder / "logit_offsets.npy")
        self.logits = np.load(folder / "logits.npy", mmap_mode="r")
        self.hidden = {i: np.load(folder / f"hidden_{i}.npy", mmap_mode="r") for i in self.hidden_layers}

    @staticmethod
    def key(teacher: nn.Module, dataset: Sequence, hidden: list[int]) -> str:
        h = hashlib.sha256(json.dumps([describe(teacher), sorted(hidden)], sort_keys=True).encode())
        for name, tensor in sorted(teacher.state_dict().items()):
            h.update(name.encode())
            h.update(tensor.detach().contiguous().numpy().tobytes())
        for i in range(len(dataset)):
            item = dataset[i]
            h.update(np.asarray(item["input_ids"], dtype=np.int64).tobytes())
            types = item.get("token_type_ids")
            h.update(np.asarray(types if types is not None else [], dtype=np.int64).tobytes())
            h.update(b"|")
        return h.hexdigest()[:24]

    @classmethod
    @torch.no_grad()
    def build(cls, teacher: nn.Module, dataset: Sequence, hidden: list[int], root: Path, *,
              batch_size: int = 128, progress: bool = True) -> TeacherCache:
        """Load the cache for (teacher, data, hidden layers) from `root`, computing it if absent."""
        from tqdm.auto import tqdm

        folder = root / cls.key(teacher, dataset, hidden)
        if (folder / "meta.json").exists():
            return cls(folder)
        teacher.eval()
        lengths = np.array([len(dataset[i]["input_ids"]) for i in range(len(dataset))])
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        classifier = isinstance(teacher, TaskModel) and teacher.head.kind in ("sequence-classification",
                                                                             "token-classification")
        token_logits = classifier and teacher.head.kind == "token-classification"
        logit_offsets = offsets if token_logits else np.arange(len(dataset) + 1)
        width = teacher.head.num_labels if classifier else 0
        hidden_size = encoder_of(teacher).config.hidden_size
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{folder.name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        logits = np.lib.format.open_memmap(tmp / "logits.npy", "w+", np.float32, (int(logit_offsets[-1]), width))
        states = {i: np.lib.format.open_memmap(tmp / f"hidden_{i}.npy", "w+", np.float16,
                                               (int(offsets[-1]), hidden_size)) for i in hidden}
        order = np.argsort(lengths, kind="stable")
        for start in tqdm(range(0, len(order), batch_size), desc="teacher cache", disable=not progress):
            idx = order[start : start + batch_size].tolist()
            batch = collate(teacher, [dataset[i] for i in idx], idx)
            with capture(teacher, set(hidden), set()) as captured:
                out = teacher(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
            for j, i in enumerate(idx):
                n = lengths[i]
                if width:
                    logits[logit_offsets[i] : logit_offsets[i + 1]] = (out[j, :n] if token_logits else out[j]).numpy()
                for layer in hidden:
                    states[layer][offsets[i] : offsets[i + 1]] = captured["hidden"][layer][j, :n].numpy()
        logits.flush()
        for s in states.values():
            s.flush()
        np.save(tmp / "offsets.npy", offsets)
        np.save(tmp / "logit_offsets.npy", logit_offsets)
        (tmp / "meta.json").write_text(json.dumps({"hidden": hidden, "examples": len(dataset),
                                                     "token_logits": token_logits}))
        try:
            os.replace(tmp, folder)
        except OSError:  # another process finished the same cache first
            shutil.rmtree(tmp, ignore_errors=True)
        return cls(folder)

    def lookup(self, indices: Sequence[int], length: int) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """(logits [B, C] or [B, T, C], {layer: hidden [B, T, H]}) zero-padded to `length`."""
        rows = [self.logits[self.logit_offsets[i] : self.logit_offsets[i + 1]] for i in indices]
        if self.token_logits:
            logits = torch.zeros(len(indices), length, self.logits.shape[1])
            for j, r in enumerate(rows):
                logits[j, : len(r)] = torch.from_numpy(np.asarray(r))
        else:
            logits = torch.from_numpy(np.concatenate(rows).astype(np.float32))
        hidden = {}
        for layer, table in self.hidden.items():
            h = torch.zeros(len(indices), length, table.shape[1])
            for j, i in enumerate(indices):
                r = table[self.offsets[i] : self.offsets[i + 1]]
                h[j, : len(r)] = torch.from_numpy(r.astype(np.float32))
            hidden[layer] = h
        return logits, hidden


# ---------------------------------------------------------------------------------------------
# The objective


class DistillObjective(Objective):
    def __init__(self, student: nn.Module, teacher: nn.Module, config: DistillConfig, layer_map: dict[int, int],
                 cache: TeacherCache | None):
        super().__init__(student)
        object.__setattr__(self, "teacher", teacher)  # not a submodule: never trained, saved or DDP-synced
        self.config, self.layer_map, self.cache = config, layer_map, cache
        s_width = encoder_of(student).config.hidden_size
        t_width = encoder_of(teacher).config.hidden_size
        self.projections = nn.ModuleDict({
            str(s): nn.Linear(s_width, t_width) for s in layer_map if config.hidden_weight and s_width != t_width})
        self.hidden = set(layer_map) if config.hidden_weight else set()
        attn = config.attention_weight or config.value_weight
        self.qkv = {s for s in layer_map if s > 0} if attn else set()

    def _teacher(self, batch):
        if self.cache is not None:
            logits, hidden = self.cache.lookup(batch["index"].tolist(), batch["input_ids"].shape[1])
            return logits, {"hidden": hidden}
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
        elif isinstance(student, TaskModel) and student.head.kind != "embedding":
            if c.logit_weight:
                if student.head.kind == "token-classification":
                    real = mask.bool()
                    loss = loss + c.logit_weight * soft_loss(s_out[real], t_out[real], c.temperature)
                else:
                    loss = loss + c.logit_weight * soft_loss(s_out, t_out, c.temperature)
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


def resolve_layer_map(student: nn.Module, teacher: nn.Module, layer_map: dict[int, int] | None) -> dict[int, int]:
    s_layers, t_layers = encoder_of(student).config.num_layers, encoder_of(teacher).config.num_layers
    if layer_map is None:
        return {i + 1: t for i, t in enumerate(default_layers(s_layers, t_layers))}
    layer_map = {int(s): int(t) for s, t in layer_map.items()}
    for s, t in layer_map.items():
        if not (0 <= s <= s_layers and 0 <= t <= t_layers):
            raise EdgebertError(f"layer_map {s}->{t} is out of range: the student has hidden states 0..{s_layers}, "
                                f"the teacher 0..{t_layers}")
    return layer_map


def _check_pair(student: nn.Module, teacher: nn.Module, config: DistillConfig) -> None:
    if type(student) is not type(teacher):
        raise EdgebertError(f"student is a {type(student).__name__} but the teacher a {type(teacher).__name__}: "
                            "distil between models with the same head")
    if isinstance(student, TaskModel) and student.head.kind != "embedding" and not isinstance(student, MaskedLM) \
            and student.head.num_labels != teacher.head.num_labels:
        raise EdgebertError(f"student has {student.head.num_labels} labels, the teacher {teacher.head.num_labels}")
    if config.temperature <= 0:
        raise EdgebertError(f"temperature must be positive, got {config.temperature}")


def distill(
    student: nn.Module,
    teacher: nn.Module,
    train_data: Sequence,
    eval_data: Sequence | None = None,
    *,
    config: DistillConfig | None = None,
    tokenizer=None,
    work_dir: str | Path | None = None,
) -> tuple[nn.Module, Record]:
    """Train `student` (in place) to imitate `teacher` on `train_data`; returns it and a Record.

    `tokenizer` is needed only for a MaskedLM pair (its mask token and vocabulary drive the MLM
    masking). Labels in the data are used only when `label_weight` > 0."""
    config = config or DistillConfig()
    _check_pair(student, teacher, config)
    layer_map = resolve_layer_map(student, teacher, config.layer_map)
    teacher.eval()
    mlm = isinstance(student, MaskedLM)
    online = mlm or bool(config.attention_weight or config.value_weight)
    cache = None
    if not online:
        root = Path(config.cache_dir) if config.cache_dir else Path(work_dir or ".") / "teacher-cache"
        hidden = sorted({layer_map[s] for s in layer_map}) if config.hidden_weight else []
        rank, world = rank_world()
        if rank != 0:  # under torchrun, rank 0 computes the cache and the others read it
            dist.barrier()
        cache = TeacherCache.build(teacher, train_data, hidden, root, progress=config.train.progress and rank == 0)
        if world > 1 and rank == 0:
            dist.barrier()
    objective = DistillObjective(student, teacher, config, layer_map, cache)
    collate_fn = None
    if mlm:
        if tokenizer is None:
            raise EdgebertError("distilling a MaskedLM masks tokens: pass tokenizer=")
        collate_fn = mlm_collate(tokenizer, config.mlm_probability, config.train.seed)
    key = fingerprint("distill", asdict(config), describe(student), describe(teacher), cache and cache.folder.name)
    if mlm and eval_data is not None:
        evaluator, metric = (lambda m: mlm_accuracy(m, eval_data, tokenizer, probability=config.mlm_probability)), \
            "mlm_accuracy"
    else:
        evaluator, metric = task_evaluator(student, eval_data)
    result = train(objective, train_data, config=config.train, collate_fn=collate_fn, evaluator=evaluator,
                   metric=metric, work_dir=work_dir, key=key, name="distill")
    details = {"history": result.history, "layer_map": layer_map,
               "teacher_cache": str(cache.folder) if cache else None}
    return result.model, measure("distill", result.model, metrics=result.metrics, wall_s=result.wall_s,
                                 steps=result.steps, details=details)
