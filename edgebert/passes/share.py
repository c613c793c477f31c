"""share: ALBERT-style cross-layer parameter sharing and factorized embeddings, with recovery.

Sharing makes the layers of a group hold the same module objects (all of a layer, its attention,
or its FFN), initialised from the group's mean or one member. Factorizing replaces the V×H token
table by V×E and an E×H projection, initialised from a truncated SVD. Both lower the size of the
model, never its FLOPs: every layer still runs, and the projection adds a little compute.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import torch
from torch import nn

from ..config import Config
from ..data import TaskData
from ..errors import EdgebertError
from ..model import EmbeddingParts, LayerNorm, MaskedLM, blocks, embeddings, encoder_of
from .distill import DistillConfig, distill
from .surgery import set_config
from .train import Result, TrainConfig, measure, task_evaluator

Parts = Literal["all", "attention", "ffn"]
PARTS = get_args(Parts)


@dataclass(frozen=True, kw_only=True)
class ShareConfig(Config):
    """Sharing in groups of `group_size` adjacent layers (0 = one group of all layers)."""

    group_size: int = 2
    parts: Parts | Literal["none"] = "all"
    # "mean", a member's position in its group (0 = first), or "best" (needs eval data)
    init: Literal["mean", "best"] | int = "mean"
    embedding_size: int | None = None  # factorize the token table to E < hidden_size
    recovery: DistillConfig | None = field(
        default_factory=lambda: DistillConfig(train=TrainConfig(steps=1000, lr=1e-4, eval_every=250)))

    def __post_init__(self):
        if self.group_size < 0:
            raise EdgebertError(f"ShareConfig.group_size must be ≥ 0 (0 = all layers), got {self.group_size}")
        if isinstance(self.init, int) and self.init < 0:
            raise EdgebertError(f"ShareConfig.init must be 'mean', 'best' or a member index, got {self.init!r}")
        if self.recovery is not None and self.recovery.makes_student:
            raise EdgebertError("ShareConfig.recovery distils the shared model itself: leave its layers/keep_layers/"
                                "heads/ffn unset")


def share_layers(model: nn.Module, *, group_size: int = 2, parts: str = "all", init: str | int = "mean") -> nn.Module:
    """Make each group of `group_size` adjacent layers use one set of weights, in place."""
    if parts not in PARTS:
        raise EdgebertError(f"parts must be one of {PARTS}, got {parts!r}")
    c = encoder_of(model).config
    if c.attention_groups is not None or c.ffn_groups is not None:
        raise EdgebertError("the model already shares layers: share once, from an unshared model")
    size = group_size or c.num_layers
    groups = [i // size for i in range(c.num_layers)]
    kinds = ["attention", "ffn"] if parts == "all" else [parts]
    layers = blocks(model)
    for g in sorted(set(groups)):
        members = [i for i in range(c.num_layers) if groups[i] == g]
        for kind in kinds:
            spans = {(c.window(i), i == 0 and not c.first_attention_norm) for i in members}
            if kind == "attention" and len(spans) > 1:
                raise EdgebertError(f"layers {members} differ in attention span (global vs sliding window) or in the "
                                    "norm before attention, so they cannot share one attention: use parts='ffn'")
            width = c.heads if kind == "attention" else c.ffn
            if len({width(i) for i in members}) > 1:
                raise EdgebertError(f"layers {members} have different {kind} widths {[width(i) for i in members]}: "
                                    "prune with per_layer=True before sharing")
            if isinstance(init, int):
                if init >= len(members):
                    raise EdgebertError(f"init={init} but group {members} has {len(members)} members")
                keep = layers[members[init]].units(kind)
            else:
                keep = {name: copy.deepcopy(m) for name, m in layers[members[0]].units(kind).items()}
                with torch.no_grad():
                    for name, module in keep.items():
                        for pname, p in module.named_parameters():
                            stack = [dict(layers[i].units(kind)[name].named_parameters())[pname] for i in members]
                            p.copy_(torch.stack([q.detach() for q in stack]).mean(0))
            for i in members:
                layers[i].set_units(keep)
    set_config(model, **{f"{k}_groups": groups for k in kinds})
    return model


def _orthonormal_complement_of_ones(e: int) -> torch.Tensor:
    """E×(E−1) orthonormal columns all orthogonal to the ones vector."""
    centered = torch.eye(e, dtype=torch.float64) - 1.0 / e
    q, _ = torch.linalg.qr(centered[:, : e - 1])
    return q


@torch.no_grad()
def factorize_embeddings(model: nn.Module, embedding_size: int, *,
                         frequencies: list[torch.Tensor] | None = None) -> dict[str, float]:
    """Replace the V×H token table by V×E plus an E×H projection, in place; returns the errors.

    The embedding LayerNorm now acts at width E, before the projection. To keep the output close,
    the tables are projected onto the top E−1 directions Q of the (row-centred) second moment of a
    token's summed embedding, embedded in the E−1 dimensions orthogonal to the ones vector so the
    width-E LayerNorm subtracts nothing and only rescales; the projection √(H/E)·diag(γ)·Q then
    restores the original LayerNorm's output γ⊙LN(x)+β up to the truncation. Without an embedding
    LayerNorm it is a plain rank-E projection.

    `frequencies` (counts of token ids, positions and segment ids of the tables the model has, e.g. from
    `token_frequencies`; a rotary model has no position table)
    weight each table row by how often the data uses it, so frequent tokens are kept accurately;
    without them every row counts the same.

    Returns `table_error` (relative RMS error of the rank-k approximation of a token's embedding
    sum, from the discarded eigenvalues) and `output_error` (relative error of the embedding
    output, measured on 4096 token/position/segment triples drawn from the same distribution)."""
    if isinstance(model, MaskedLM):
        raise EdgebertError("factorizing a MaskedLM would break its tied decoder: factorize the task model instead")
    c = encoder_of(model).config
    emb = embeddings(model)
    if c.embedding_size is not None:
        raise EdgebertError(f"the embeddings are already factorized (E={c.embedding_size})")
    if not 2 <= embedding_size < c.hidden_size:
        raise EdgebertError(f"embedding_size must be in 2..{c.hidden_size - 1} (below hidden_size), got {embedding_size}")
    roles = [role for role in ("word", "position", "token_type") if getattr(emb, role) is not None]
    tables = [getattr(emb, role).weight.detach().double() for role in roles]
    with_ln = emb.norm is not None
    if with_ln:
        tables = [t - t.mean(1, keepdim=True) for t in tables]  # the LayerNorm removes each vector's mean
    # Second moment of one token's sum w + p + t, each row drawn independently as often as the data does.
    if frequencies is None:
        frequencies = [torch.ones(len(t)) for t in tables]
    if [len(f) for f in frequencies[: len(tables)]] != [len(t) for t in tables]:
        raise EdgebertError(f"frequencies have {[len(f) for f in frequencies]} entries for tables of "
                            f"{[len(t) for t in tables]} rows: count {', '.join(roles)} ids")
    weights = [f.double() / f.double().sum() for f in frequencies[: len(tables)]]
    means = [w @ t for w, t in zip(weights, tables)]
    moment = sum(t.T @ (w[:, None] * t) for w, t in zip(weights, tables))
    for i, a in enumerate(means):
        for j, b in enumerate(means):
            if i != j:
                moment += torch.outer(a, b)
    eigenvalues, eigenvectors = torch.linalg.eigh(moment)
    k = embedding_size - 1 if with_ln else embedding_size
    q = eigenvectors[:, -k:]  # H×k, top directions
    table_error = math.sqrt(max(0.0, float(eigenvalues[:-k].clamp_min(0).sum() / eigenvalues.clamp_min(0).sum())))
    m = _orthonormal_complement_of_ones(embedding_size) if with_ln else torch.eye(k, dtype=torch.float64)
    down = q @ m.T  # H×E: table row (H) → E

    sample = dict(zip(roles, _sample_rows(weights, 4096)))
    reference = _embed(emb, sample).detach().clone()
    h = c.hidden_size
    projection = nn.Linear(embedding_size, h)
    if with_ln:
        gamma = emb.norm.weight.detach().double()
        projection.weight.copy_(math.sqrt(h / embedding_size) * gamma[:, None] * down)
        projection.bias.copy_(emb.norm.bias.detach().double() if emb.norm.bias is not None else 0.0)
        emb.norm = LayerNorm(embedding_size, eps=c.layer_norm_eps, bias=c.bias)
    else:
        projection.weight.copy_(down)
        projection.bias.zero_()
    frozen = not emb.word.weight.requires_grad
    for role, rows in zip(roles, tables):
        setattr(emb, role, _table(rows, down, c.pad_token_id if role == "word" else None))
    emb.word.weight.requires_grad_(not frozen)
    emb.projection = projection
    set_config(model, embedding_size=embedding_size)
    output = _embed(emb, sample)
    output_error = float((output - reference).norm() / reference.norm())
    return {"table_error": table_error, "output_error": output_error}


def _table(rows: torch.Tensor, down: torch.Tensor, padding_idx: int | None) -> nn.Embedding:
    table = nn.Embedding(rows.shape[0], down.shape[1], padding_idx=padding_idx)
    table.weight.data.copy_((rows @ down).float())
    return table


def _sample_rows(weights: list[torch.Tensor], n: int) -> list[torch.Tensor]:
    """n draws of a row index from each table (token, position, segment), seeded."""
    g = torch.Generator().manual_seed(0)
    return [torch.multinomial(w.float(), n, replacement=True, generator=g) for w in weights]


def _embed(emb: EmbeddingParts, rows: dict[str, torch.Tensor]) -> torch.Tensor:
    """The embedding output of single tokens given table rows: Embeddings.forward without dropout."""
    x = sum(getattr(emb, role)(index) for role, index in rows.items())
    if emb.norm is not None:
        x = emb.norm(x)
    return emb.projection(x) if emb.projection is not None else x


def token_frequencies(model: nn.Module, dataset: Sequence) -> list[torch.Tensor]:
    """How often the data uses each token id, position and segment id (+1 smoothing), for the tables the
    model has (no positions when they are rotary or relative)."""
    c = encoder_of(model).config
    counts = [torch.ones(c.vocab_size), torch.ones(c.max_positions), torch.ones(max(c.type_vocab_size, 1))]
    for i in range(len(dataset)):
        item = dataset[i]
        ids = torch.as_tensor(item["input_ids"])
        counts[0] += torch.bincount(ids, minlength=c.vocab_size)[: c.vocab_size]
        counts[1][c.position_offset : c.position_offset + len(ids)] += 1
        types = item.get("token_type_ids")
        if types is not None and c.type_vocab_size:
            counts[2] += torch.bincount(torch.as_tensor(types), minlength=c.type_vocab_size)[: c.type_vocab_size]
    tables = [True, embeddings(model).position is not None, bool(c.type_vocab_size)]
    return [n for n, present in zip(counts, tables) if present]


def share(model: nn.Module, config: ShareConfig, data: TaskData | None, *, teacher: nn.Module | None = None,
          work_dir: str | Path | None = None) -> Result:
    """Share layers and/or factorize embeddings (in place), then recover by distillation from
    `teacher` (default: a copy of the model before sharing) on `data.train`. With `data=None`
    only the surgery runs: embedding rows count the same and there is no recovery."""
    train_data, choose_on = (data.train, data.choose_on) if data is not None else (None, None)
    before = measure("before", model)
    teacher = teacher if teacher is not None else copy.deepcopy(model).eval()
    evaluator, metric = task_evaluator(model, choose_on)  # init = "best" is chosen on it
    details: dict = {"before": {"params": before.params, "bytes": before.bytes, "flops_128": before.flops_128}}
    if config.parts != "none":
        init = config.init
        if init == "best":
            if evaluator is None:
                raise EdgebertError("ShareConfig.init='best' compares initialisations on eval data: pass eval_data")
            layers = encoder_of(model).config.num_layers
            group = config.group_size or layers
            smallest = layers - (layers - 1) // group * group  # the last group may be shorter
            scores = {}
            for candidate in ["mean", *range(smallest)]:
                trial = share_layers(copy.deepcopy(model), group_size=config.group_size, parts=config.parts,
                                     init=candidate)
                scores[str(candidate)] = evaluator(trial)[metric]
            init = max(scores, key=scores.get)
            init = init if init == "mean" else int(init)
            details["init_scores"] = scores
        share_layers(model, group_size=config.group_size, parts=config.parts, init=init)
        details["init"] = init
    if config.embedding_size is not None:
        frequencies = token_frequencies(model, train_data) if train_data is not None else None
        details["factorization"] = {**factorize_embeddings(model, config.embedding_size, frequencies=frequencies),
                                    "weighted_by": "uniform rows" if frequencies is None else "train data"}
    scorer, _ = task_evaluator(model, data.eval if data is not None else None)  # what is reported: the eval split
    if scorer is not None:
        details["before_recovery"] = scorer(model)
    metrics, wall, steps = details.get("before_recovery", {}), 0.0, 0
    if train_data is not None and config.recovery is not None and config.recovery.train.steps:
        rec = distill(model, config.recovery, data, teacher=teacher,
                      work_dir=Path(work_dir) / "recovery" if work_dir else None, name="share").record
        metrics, wall, steps = rec.metrics, rec.wall_s, rec.steps
        details.update(history=rec.details["history"], **rec.ran_on)
    details["note"] = "sharing lowers parameters and bytes, not FLOPs: every layer still runs"
    record = measure("share", model, metrics=metrics, wall_s=wall, steps=steps, details=details)
    record.details["saved_params"] = before.params - record.params
    return Result(model, record)
