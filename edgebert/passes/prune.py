"""prune: remove the least important attention heads, FFN neurons, hidden units and layers, with recovery.

Importance is first-order Taylor (Michel et al. 2019): the gradient of the loss with respect to a
gate on each unit, which for a head equals Σ grad⊙weight over the head's columns of the attention
output projection, for an FFN neuron over its column of the FFN output projection (a gated FFN's
neuron is its value and gate rows together, removed as one), for a hidden unit over every weight
slice at that unit (embeddings, projections, LayerNorms, head: zeroing them all is removing it), and
for a layer Σ grad⊙(layer output − layer input). Absolute values are summed over a data sample; head
and neuron scores are normalised per layer before a global ranking.

Width pruning (`width`, as CoFi does) removes the same hidden units everywhere; LayerNorms keep the
statistics of the full width (see `surgery.remove_hidden`). Layer removal keeps a model's attention
layout: ModernBERT's global layers stay at their positions (`surgery.layer_choice`).

Pruning goes in `rounds`, each followed by distillation from the unpruned model (or, `recover_from =
"teacher"`, from the teacher it was distilled from), and yields a physically smaller dense model. With
`int4_words`, the frozen word table is first moved onto the INT4 grid (`int4.py`), so recovery trains
around that error and the INT4 files hold the table PyTorch was trained with. `unstructured` (magnitude
pruning) only zeroes weights: that shrinks a compressed file, not the dense compute, so it is reported as
a size-only measure.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from .. import checkpoint
from ..config import Config
from ..data import BucketBatchSampler, TaskData
from ..errors import EdgebertError
from ..model import Embedder, EncoderConfig, blocks, embeddings, encoder_of, hidden_parts
from ..stats import flops
from .distill import DistillConfig, distill
from .finetune import check_task_model, task_loss
from .int4 import BLOCK_SIZES, int4_grid
from .surgery import check_unshared, layer_choice, remove_heads, remove_hidden, remove_layers, remove_neurons
from .train import Record, Result, TrainConfig, collate, lengths_of, measure, seed_all, task_evaluator


@dataclass(frozen=True, kw_only=True)
class PruneConfig(Config):
    """What to remove. Give fractions (`heads`, `ffn`), or a budget (`params` or `flops` per
    128-token sequence) that is met by removing heads and neurons in equal proportion."""

    added = ("recover_from", "int4_words", "tries")

    heads: float = 0.0  # fraction of attention heads to remove
    ffn: float = 0.0  # fraction of FFN neurons to remove
    layers: int = 0  # whole layers to remove
    width: float = 0.0  # fraction of hidden units to remove from every embedding, projection and LayerNorm
    params: int | None = None  # target parameter count (instead of heads/ffn)
    flops: int | None = None  # target FLOPs per 128-token sequence (instead of heads/ffn)
    per_layer: bool = False  # the same count removed in every layer (layers can then be shared)
    rounds: int = 1  # prune gradually, with distillation recovery after each round
    sample_batches: int = 16  # batches scored for importance
    batch_size: int = 32
    unstructured: float = 0.0  # fraction of encoder weights zeroed by magnitude at the end (size only)
    recovery: DistillConfig | None = field(
        default_factory=lambda: DistillConfig(train=TrainConfig(steps=500, lr=1e-4, eval_every=250)))
    recover_from: Literal["unpruned", "teacher"] = "unpruned"  # recovery's teacher: a copy of the unpruned model, or "teacher" (given: teacher=)
    int4_words: int | None = None  # INT4 block size: the frozen word table moves onto that grid before recovery
    seed: int = 42
    # the compile prunes this many times, with seeds seed, seed + 1, ... (the importance sample, the recovery's
    # randomness), and keeps the result best on the recipe's validation split: one sample can cost a point
    tries: int = 1

    def __post_init__(self):
        for name in ("heads", "ffn", "width", "unstructured"):
            if not 0 <= getattr(self, name) < 1:
                raise EdgebertError(f"PruneConfig.{name} is a fraction in [0, 1), got {getattr(self, name)}")
        if self.params is not None and self.flops is not None:
            raise EdgebertError("give PruneConfig.params or PruneConfig.flops, not both")
        if (self.params is not None or self.flops is not None) and (self.heads or self.ffn):
            raise EdgebertError("a params/flops budget decides the head and FFN fractions: leave heads/ffn at 0")
        if self.rounds < 1:
            raise EdgebertError(f"PruneConfig.rounds must be at least 1, got {self.rounds}")
        if self.tries < 1:
            raise EdgebertError(f"PruneConfig.tries must be at least 1, got {self.tries}")
        if self.int4_words is not None:
            if self.int4_words not in BLOCK_SIZES:
                raise EdgebertError(f"PruneConfig.int4_words {self.int4_words}: use one of {BLOCK_SIZES}, the INT4 "
                                    "block size the quantize stage writes")
            if self.recovery is None or not self.recovery.train.freeze_word_embeddings:
                raise EdgebertError("PruneConfig.int4_words puts the word table on its INT4 grid for recovery to train "
                                    "around: set recovery.train.freeze_word_embeddings = true so it stays there")


# ---------------------------------------------------------------------------------------------
# Importance


@dataclass
class Importance:
    heads: list[torch.Tensor]  # per layer, [heads]
    neurons: list[torch.Tensor]  # per layer, [ffn]
    layers: torch.Tensor  # [num_layers]
    hidden: torch.Tensor  # [hidden_size]


def importance(model: nn.Module, dataset: Sequence, *, batches: int = 16, batch_size: int = 32,
               seed: int = 42) -> Importance:
    """First-order Taylor importance of every head, FFN neuron and layer over a data sample.

    The loss is the task loss on the data's labels, or on the model's own predictions when the
    data has none. An Embedder has no labels: its loss is r·e for a random unit direction r per
    sentence, whose gradient's square is, in expectation over r, how far the unit moves the vector e."""
    check_task_model(model, "prune", embedders=True)
    embedder = isinstance(model, Embedder)
    directions = torch.Generator().manual_seed(seed)
    c = encoder_of(model).config
    layers = blocks(model)
    was_training = model.training
    model.eval()  # no dropout: scores of the model as it will be used
    heads = [torch.zeros(c.heads(i)) for i in range(c.num_layers)]
    neurons = [torch.zeros(c.ffn(i)) for i in range(c.num_layers)]
    layer_scores = torch.zeros(c.num_layers)
    hidden = torch.zeros(c.hidden_size)
    parts = hidden_parts(model)

    def gate(i: int):
        """Layer i as x + ξ·(f(x) − x): dL/dξ at ξ=1 is Σ grad ⊙ (f(x) − x)."""
        def hook(module, inputs, output):
            delta = (output - inputs[0]).detach()
            output.register_hook(lambda g: _add(layer_scores, i, (g * delta).sum()))
        return hook

    handles = [b.module.register_forward_hook(gate(i)) for i, b in enumerate(layers)]
    sampler = BucketBatchSampler(lengths_of(dataset), batch_size, seed=seed)
    try:
        for n, indices in enumerate(sampler):
            if n == batches:
                break
            batch = collate(model, [dataset[i] for i in indices], indices)
            model.zero_grad(set_to_none=True)
            logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
            labels = batch.get("labels")
            if embedder:
                loss = (logits * F.normalize(torch.randn(logits.shape, generator=directions), dim=-1)).sum()
            else:
                if labels is None:
                    if model.head.num_labels == 1:
                        raise EdgebertError("pruning a regression model needs labeled data to score importance")
                    labels = logits.detach().argmax(-1).masked_fill(batch["attention_mask"] == 0, -100) \
                        if logits.dim() == 3 else logits.detach().argmax(-1)
                loss = task_loss(model, logits, labels)
            loss.backward()
            for i, b in enumerate(layers):
                d = c.head_size
                w = b.attention_out.weight
                gw = (w.grad * w).detach()  # [H, heads*d]
                heads[i] += gw.view(gw.shape[0], -1, d).sum((0, 2)).abs()
                w = b.ffn_out.weight
                neurons[i] += (w.grad * w).detach().sum(0).abs()
            unit = torch.zeros(c.hidden_size)
            for module, dims in parts:
                for p, along in ((module.weight, dims), (getattr(module, "bias", None), (0,) if 0 in dims else ())):
                    if p is not None and p.grad is not None:
                        for dim in along:
                            gw = (p.grad * p).detach()
                            unit += gw.sum(1 - dim) if gw.dim() == 2 else gw
            hidden += unit.abs()
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    return Importance(heads, neurons, layer_scores, hidden)


def _add(scores: torch.Tensor, i: int, value: torch.Tensor) -> None:
    scores[i] += value.detach().abs()


def _normalised(scores: list[torch.Tensor]) -> list[torch.Tensor]:
    """Michel et al.: divide each layer's scores by their L2 norm before ranking across layers."""
    return [s / s.norm().clamp_min(1e-12) for s in scores]


def choose(scores: list[torch.Tensor], remove: int | list[int]) -> dict[int, list[int]]:
    """{layer: units to remove}: per layer the `remove[i]` lowest-scored units, or for one number
    the globally lowest (scores normalised per layer); at least one unit stays in every layer."""
    if isinstance(remove, list):
        return {i: torch.argsort(s, stable=True)[: min(n, len(s) - 1)].tolist()
                for i, (s, n) in enumerate(zip(scores, remove)) if n > 0}
    left = [len(s) for s in scores]
    drop: dict[int, list[int]] = {i: [] for i in range(len(scores))}
    for _, i, j in sorted((float(v), i, j) for i, s in enumerate(_normalised(scores)) for j, v in enumerate(s)):
        if remove <= 0:
            break
        if left[i] > 1:
            drop[i].append(j)
            left[i], remove = left[i] - 1, remove - 1
    return drop


# ---------------------------------------------------------------------------------------------
# Budgets


def _layer_params(c: EncoderConfig, heads: int, ffn: int) -> int:
    h, d = c.hidden_size, c.head_size
    attention = heads * (4 * h * d + 3 * d) + h + 2 * h
    return attention + ffn * ((3 if c.gated_ffn else 2) * h + 1) + h + 2 * h


def _shape_after(c: EncoderConfig, heads: list[int], ffn: list[int], fraction: float,
                 per_layer: bool) -> EncoderConfig:
    """The shape `prune` leaves after removing `fraction` of heads and neurons. Cost is linear in
    the total count of each, so only how many go matters, not from which layer."""

    def after(widths: list[int]) -> list[int]:
        if per_layer:
            return [max(1, w - round(fraction * w)) for w in widths]
        remove, left = round(fraction * sum(widths)), list(widths)
        for i in sorted(range(len(left)), key=left.__getitem__, reverse=True):
            take = min(remove, left[i] - 1)
            left[i], remove = left[i] - take, remove - take
        return left

    return dataclasses.replace(c, layer_heads=after(heads), layer_ffn=after(ffn))


def budget_fraction(model: nn.Module, config: PruneConfig) -> float:
    """The share of heads and neurons to remove (in equal proportion) to meet a params/flops budget."""
    c = encoder_of(model).config
    heads, ffn = [c.heads(i) for i in range(c.num_layers)], [c.ffn(i) for i in range(c.num_layers)]
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    fixed = total - sum(_layer_params(c, heads[i], ffn[i]) for i in range(c.num_layers))
    if config.width:  # the width cut narrows the embeddings and the head too
        narrow = c.hidden_size - round(config.width * c.hidden_size)
        fixed = round(fixed * narrow / c.hidden_size)
        c = dataclasses.replace(c, hidden_size=narrow, norm_width=c.norm_width or c.hidden_size)
    labels = 0 if isinstance(model, Embedder) else model.head.num_labels

    def cost(fraction: float) -> int:
        s = _shape_after(c, heads, ffn, fraction, config.per_layer)
        if config.params is not None:
            return fixed + sum(_layer_params(s, s.heads(i), s.ffn(i)) for i in range(s.num_layers))
        return flops(s, min(128, s.max_length), labels)

    target = config.params if config.params is not None else config.flops
    if cost(0.0) <= target:
        return 0.0
    if cost(1.0) > target:
        raise EdgebertError(f"a budget of {target:,} cannot be met by pruning heads and neurons (one of each per "
                            f"layer costs {cost(1.0):,}): also remove layers, or raise the budget")
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if cost(mid) <= target else (mid, hi)
    return hi


def magnitude_prune(model: nn.Module, fraction: float) -> float:
    """Zero the smallest-magnitude `fraction` of the encoder layers' matrix weights, in place.

    Size only: dense kernels run zeros at full cost; the saving shows in a compressed or sparse
    file. Returns the sparsity reached over those weights."""
    weights = {id(m.weight): m.weight for b in blocks(model) for m in b.module.modules() if isinstance(m, nn.Linear)}
    if not fraction or not weights:
        return 0.0
    flat = torch.cat([w.detach().abs().flatten() for w in weights.values()])
    k = math.ceil(fraction * flat.numel())
    threshold = torch.kthvalue(flat, k).values if k else flat.min() - 1
    zeros = 0
    with torch.no_grad():
        for w in weights.values():
            w.masked_fill_(w.abs() <= threshold, 0.0)
            zeros += int((w == 0).sum())
    return zeros / flat.numel()


# ---------------------------------------------------------------------------------------------
# The pass


def _shape(model: nn.Module) -> dict:
    c = encoder_of(model).config
    return {"layers": c.num_layers, "hidden": c.hidden_size, "heads": [c.heads(i) for i in range(c.num_layers)],
            "ffn": [c.ffn(i) for i in range(c.num_layers)]}


def _check(model: nn.Module, config: PruneConfig, teacher: nn.Module | None) -> None:
    if config.recovery is not None and config.recovery.makes_student:
        raise EdgebertError("PruneConfig.recovery distils the pruned model itself: leave its layers/keep_layers/"
                            "heads/ffn unset")
    if config.tries > 1:
        raise EdgebertError(f"PruneConfig.tries = {config.tries} is the compile's (one prune stage per seed, the best "
                            "on validation kept): call prune once per seed, or leave tries at 1")
    check_task_model(model, "prune", embedders=True)
    check_unshared(model, "prune")
    if config.recover_from == "teacher" and teacher is None:
        raise EdgebertError("PruneConfig.recover_from = 'teacher' distils from the model the student was distilled "
                            "from: pass teacher= (a compile passes its distill stage's teacher)")


def _cut(model: nn.Module, scores: Importance, config: PruneConfig, share: float, start: dict, original: dict,
         fractions: dict) -> dict:
    """Remove, by `scores`, what brings `model` to `share` of the way from its `start` shape to the pruned one:
    layers, then heads and FFN neurons (`fractions` of each), then hidden units. Returns `original`, the
    starting heads and neurons, of the layers that survive."""
    drop_layers = round(config.layers * share) - (start["layers"] - encoder_of(model).config.num_layers)
    if drop_layers > 0:
        now = encoder_of(model).config
        keep = layer_choice(now, now.num_layers - drop_layers, lambda j, i: float(scores.layers[i]))
        remove_layers(model, [i for i in range(now.num_layers) if i not in keep])
        scores = Importance([scores.heads[i] for i in keep], [scores.neurons[i] for i in keep], scores.layers[keep],
                            scores.hidden)
        original = {k: [v[i] for i in keep] for k, v in original.items()}
    shape = _shape(model)
    plan = {}
    for kind, fraction in fractions.items():
        if config.per_layer:  # each layer loses the same share of its original width
            plan[kind] = [now - (orig - round(fraction * share * orig))
                          for now, orig in zip(shape[kind], original[kind])]
        else:
            plan[kind] = round(fraction * share * sum(start[kind])) - (sum(start[kind]) - sum(shape[kind]))
    if config.per_layer or plan["heads"] > 0:
        remove_heads(model, choose(scores.heads, plan["heads"]))
    if config.per_layer or plan["ffn"] > 0:
        remove_neurons(model, choose(scores.neurons, plan["ffn"]))
    narrow = round(config.width * share * start["hidden"]) - (start["hidden"] - shape["hidden"])
    if narrow > 0:
        remove_hidden(model, torch.argsort(scores.hidden, stable=True)[:narrow].tolist())
    return original


def _fractions(model: nn.Module, config: PruneConfig) -> dict:
    """The share of heads and of FFN neurons to remove: the config's, or what meets its budget."""
    if config.params is not None or config.flops is not None:
        return dict.fromkeys(("heads", "ffn"), budget_fraction(model, config))
    return {"heads": config.heads, "ffn": config.ffn}


def _mapped(recovery: DistillConfig, config: PruneConfig, original: dict) -> DistillConfig:
    """Recovery from the unpruned model matches each surviving layer's hidden states (and attention) to those of
    the layer it was, not to an evenly spread one: what it computed before the cut is what it is closest to."""
    layerwise = recovery.hidden_weight or recovery.attention_weight or recovery.value_weight
    if not layerwise or recovery.layer_map is not None or config.recover_from != "unpruned" \
            or "layers" not in original:  # a round saved before positions were kept: as it was trained
        return recovery
    return recovery.replace(layer_map={j + 1: i + 1 for j, i in enumerate(original["layers"])})


def pruned_shape(model: nn.Module, config: PruneConfig) -> nn.Module:
    """A copy of `model` cut to the shape `prune` leaves, its units picked by no importance at all: what a
    compile's estimate times (pipeline.estimate), not a model to use."""
    model = copy.deepcopy(model)
    c, start = encoder_of(model).config, _shape(model)
    flat = Importance([torch.zeros(c.heads(i)) for i in range(c.num_layers)],
                      [torch.zeros(c.ffn(i)) for i in range(c.num_layers)], torch.zeros(c.num_layers),
                      torch.zeros(c.hidden_size))
    _cut(model, flat, config, 1.0, start, {"heads": list(start["heads"]), "ffn": list(start["ffn"])},
         _fractions(model, config))
    return model


def _details(before: Record, start: dict, model: nn.Module, rounds: list[dict], fractions: dict,
             sparsity: float) -> dict:
    last = rounds[-1] if rounds else {}  # its recovery's validation figures, device and precision
    details = {"before": {"params": before.params, "bytes": before.bytes, "flops_128": before.flops_128, **start},
               "after": _shape(model), "rounds": rounds, "head_fraction": fractions["heads"],
               "ffn_fraction": fractions["ffn"],
               **{k: last[k] for k in ("validation", "device", "precision") if k in last}}
    if sparsity:
        details["unstructured_sparsity"] = sparsity
        details["note"] = ("unstructured zeros shrink a compressed file only; dense kernels run them at full cost, "
                           "so FLOPs and latency are unchanged")
    return details


def prune(model: nn.Module, config: PruneConfig, data: TaskData, *, teacher: nn.Module | None = None,
          work_dir: str | Path | None = None) -> Result:
    """Prune `model` (in place) by importance on `data.train`, recovering by distillation from
    `teacher` (default: a copy of the unpruned model; required with `recover_from = "teacher"`) after each round."""
    _check(model, config, teacher)
    seed_all(config.seed)
    teacher = teacher if teacher is not None else copy.deepcopy(model).eval()
    before = measure("before", model)
    start_shape = _shape(model)
    work = Path(work_dir) if work_dir is not None else None
    fractions = _fractions(model, config)
    # the surviving layers' starting heads and neurons, and (`layers`) their starting positions
    original = {"heads": list(start_shape["heads"]), "ffn": list(start_shape["ffn"]),
                "layers": list(range(start_shape["layers"]))}
    metrics, wall, steps, rounds = {}, 0.0, 0, []
    recovery = config.recovery
    if recovery is not None and work is not None:  # one teacher, one cache for all rounds
        recovery = recovery.cached_in(work / "teacher-cache")
    for r in range(1, config.rounds + 1):
        folder = work / f"round{r}" if work else None
        if folder is not None and (folder / "round.json").exists():  # finished before an interruption
            model = checkpoint.load(folder / "model").train()
            saved = json.loads((folder / "round.json").read_text())
            original, metrics = saved["original"], saved["round"]["metrics"]
            wall, steps = wall + saved["wall_s"], steps + saved["steps"]
            rounds.append(saved["round"])
            continue
        scores = importance(model, data.train, batches=config.sample_batches, batch_size=config.batch_size,
                            seed=config.seed + r)
        original = _cut(model, scores, config, r / config.rounds, start_shape, original, fractions)
        if config.int4_words is not None:
            word = embeddings(model).word
            word.weight.data = int4_grid(word.weight, config.int4_words)
        round_wall, round_steps, chosen, ran_on = 0.0, 0, {}, {}
        if config.recovery is not None and config.recovery.train.steps:
            rec = distill(model, _mapped(recovery, config, original), data, teacher=teacher,
                          work_dir=folder / "recovery" if folder else None, name="prune").record
            metrics, round_wall, round_steps, ran_on = rec.metrics, rec.wall_s, rec.steps, rec.ran_on
            chosen = {k: rec.details[k] for k in ("validation", "layer_map") if k in rec.details}
        wall, steps = wall + round_wall, steps + round_steps
        rounds.append({"round": r, **_shape(model), "metrics": metrics, **chosen, **ran_on})
        if folder is not None:
            checkpoint.save(model, folder / "model")
            (folder / "round.json").write_text(json.dumps({"round": rounds[-1], "original": original,
                                                           "wall_s": round_wall, "steps": round_steps}))
    sparsity = magnitude_prune(model, config.unstructured)
    evaluator, _ = task_evaluator(model, data.eval)
    if evaluator is not None and (sparsity or not metrics):
        metrics = evaluator(model)
    details = _details(before, start_shape, model, rounds, fractions, sparsity)
    return Result(model, measure("prune", model, metrics=metrics, wall_s=wall, steps=steps, details=details))
