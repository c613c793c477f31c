"""Physical model surgery: remove attention heads, FFN neurons, hidden units and whole layers.

The result is a smaller dense model whose config (`layer_heads`, `layer_ffn`, `hidden_size`, `num_layers`)
describes it exactly, so it saves, reloads and exports like any other. Pruning and student
initialisation both use these.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ..errors import EdgebertError
from ..model import Embedder, EncoderConfig, LayerNorm, blocks, encoder_of, hidden_parts, keep_layers


def set_config(model: nn.Module, **changes) -> EncoderConfig:
    """Replace the encoder config (validated) on the model and its encoder, which share it."""
    encoder = encoder_of(model)
    config = dataclasses.replace(encoder.config, **changes)
    encoder.config = config
    if model is not encoder:
        model.config = config
    return config


def check_unshared(model: nn.Module, verb: str) -> None:
    c = encoder_of(model).config
    if c.attention_groups is not None or c.ffn_groups is not None:
        raise EdgebertError(f"{verb} works on unshared layers and this model shares them: {verb} before `share`")


def _slice_linear(linear: nn.Linear, keep: torch.Tensor, dim: int) -> nn.Linear:
    """A copy of `linear` keeping output rows (dim 0) or input columns (dim 1) `keep`."""
    weight = linear.weight.detach().index_select(dim, keep).clone()
    bias = linear.bias.detach().clone() if linear.bias is not None else None
    if dim == 0 and bias is not None:
        bias = bias.index_select(0, keep).clone()
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    out.weight = nn.Parameter(weight, requires_grad=linear.weight.requires_grad)
    if bias is not None:
        out.bias = nn.Parameter(bias, requires_grad=linear.bias.requires_grad)
    return out


def _checked_drop(where: str, drop, count: int, units: str, unit: str, advice: str) -> list[int]:
    """The sorted, de-duplicated indices to remove from `where` ("layer 3") of `count` units, or one error line."""
    drop = sorted(set(drop))
    if drop and (drop[0] < 0 or drop[-1] >= count):
        bad = drop[0] if drop[0] < 0 else drop[-1]
        raise EdgebertError(f"{where} has {count} {units}, cannot remove {unit} {bad}")
    if len(drop) >= count:
        raise EdgebertError(f"removing all {count} {units} of {where}: {advice}")
    return drop


def remove_heads(model: nn.Module, heads: dict[int, list[int]]) -> nn.Module:
    """Remove attention heads in place: {layer index (0-based): [head indices]}. Keeps ≥1 per layer."""
    check_unshared(model, "removing heads")
    c = encoder_of(model).config
    layers = blocks(model)
    counts = [c.heads(i) for i in range(c.num_layers)]
    for i, drop in heads.items():
        if not 0 <= i < c.num_layers:
            raise EdgebertError(f"layer {i} does not exist: the model has {c.num_layers} layers")
        drop = _checked_drop(f"layer {i}", drop, counts[i], "heads", "head", "keep at least one per layer")
        if not drop:
            continue
        d = c.head_size
        kept = [h for h in range(counts[i]) if h not in drop]
        keep = torch.tensor([h * d + j for h in kept for j in range(d)])
        block = layers[i]
        block.query, block.key, block.value = (_slice_linear(m, keep, 0) for m in (block.query, block.key, block.value))
        block.attention_out = _slice_linear(block.attention_out, keep, 1)
        for part in ("pos_key", "pos_query"):  # DeBERTa's own position projections (None when shared)
            if getattr(block, part) is not None:
                setattr(block, part, _slice_linear(getattr(block, part), keep, 0))
        block.heads = counts[i] = len(kept)
    set_config(model, layer_heads=counts)
    return model


def remove_neurons(model: nn.Module, neurons: dict[int, list[int]]) -> nn.Module:
    """Remove FFN neurons in place: {layer index: [neuron indices]}. Keeps ≥1 per layer."""
    check_unshared(model, "removing neurons")
    c = encoder_of(model).config
    layers = blocks(model)
    widths = [c.ffn(i) for i in range(c.num_layers)]
    for i, drop in neurons.items():
        if not 0 <= i < c.num_layers:
            raise EdgebertError(f"layer {i} does not exist: the model has {c.num_layers} layers")
        drop_set = set(_checked_drop(f"layer {i}", drop, widths[i], "FFN neurons", "neuron", "keep at least one"))
        if not drop_set:
            continue
        keep = torch.tensor([j for j in range(widths[i]) if j not in drop_set])
        block = layers[i]
        block.ffn_in = _slice_linear(block.ffn_in, keep, 0)
        if block.ffn_gate is not None:
            block.ffn_gate = _slice_linear(block.ffn_gate, keep, 0)
        block.ffn_out = _slice_linear(block.ffn_out, keep, 1)
        widths[i] = len(keep)
    set_config(model, layer_ffn=widths)
    return model


def remove_layers(model: nn.Module, layers: list[int]) -> nn.Module:
    """Remove whole transformer layers in place (0-based indices). Keeps ≥1 layer."""
    check_unshared(model, "removing layers")
    c = encoder_of(model).config
    drop = set(layers)
    if any(not 0 <= i < c.num_layers for i in drop):
        raise EdgebertError(f"layer indices {sorted(drop)} out of range for {c.num_layers} layers")
    kept = [i for i in range(c.num_layers) if i not in drop]
    if not kept:
        raise EdgebertError("removing every layer: keep at least one")
    # The config places sliding windows and layer 0's missing norm by position: they must stay put.
    if [c.window(i) for i in kept] != [c.window(j) for j in range(len(kept))] or \
            (not c.first_attention_norm and kept[0] != 0):
        raise EdgebertError(f"keeping layers {kept} would move this model's global-attention layers or its "
                            f"first layer: keep layer 0 and drop whole groups of {c.global_every} layers")
    keep_layers(model, kept)
    set_config(model, num_layers=len(kept),
               layer_heads=[c.heads(i) for i in kept] if c.layer_heads else None,
               layer_ffn=[c.ffn(i) for i in kept] if c.layer_ffn else None)
    return model


def head_norms(model: nn.Module) -> list[torch.Tensor]:
    """Per layer, the L2 norm of each head's query/key/value rows and output columns: a data-free
    importance, used to pick which heads a student keeps."""
    c = encoder_of(model).config
    out = []
    for i, b in enumerate(blocks(model)):
        h, d = c.heads(i), c.head_size
        sq = sum(m.weight.detach().view(h, d, -1).pow(2).sum((1, 2)) for m in (b.query, b.key, b.value))
        sq = sq + b.attention_out.weight.detach().view(-1, h, d).pow(2).sum((0, 2))
        out.append(sq.sqrt())
    return out


def neuron_norms(model: nn.Module) -> list[torch.Tensor]:
    """Per layer, the L2 norm of each FFN neuron's input (and gate) row and output column."""
    out = []
    for b in blocks(model):
        rows = [m.weight.detach() for m in (b.ffn_in, b.ffn_gate) if m is not None]
        sq = sum(w.pow(2).sum(1) for w in rows) + b.ffn_out.weight.detach().pow(2).sum(0)
        out.append(sq.sqrt())
    return out


def keep_top(scores: list[torch.Tensor], keep: list[int]) -> dict[int, list[int]]:
    """{layer: indices to remove} so that each layer keeps its `keep[i]` highest-scoring units."""
    drop = {}
    for i, s in enumerate(scores):
        order = torch.argsort(s, descending=True, stable=True)
        drop[i] = sorted(order[keep[i]:].tolist())
    return drop


def remove_hidden(model: nn.Module, drop: list[int]) -> nn.Module:
    """Remove hidden units in place (width pruning, as CoFi does): the same indices from every
    embedding table, projection, LayerNorm and head that carries the hidden width (`model.hidden_parts`).

    LayerNorms keep averaging over the width before pruning (`EncoderConfig.norm_width`), counting the
    removed units as zeros: a model whose removed units carried zeros computes exactly what it did, and
    one whose removed units were small keeps nearly the statistics it had. Shared modules stay shared.
    An embedder's vectors keep their width (`Embedder.keep_vector_width`)."""
    c = encoder_of(model).config
    drop = set(_checked_drop("the model", drop, c.hidden_size, "hidden units", "unit", "keep at least one"))
    if not drop:
        return model
    keep = torch.tensor([j for j in range(c.hidden_size) if j not in drop])
    stats = c.norm_width or c.hidden_size
    if isinstance(model, Embedder):
        model.keep_vector_width()
    with torch.no_grad():
        for module, dims in hidden_parts(model):
            _narrow(module, dims, keep, stats)
    set_config(model, hidden_size=len(keep), norm_width=stats)
    return model


def _narrow(module: nn.Module, dims: tuple[int, ...], keep: torch.Tensor, stats_width: int) -> None:
    """Keep indices `keep` of `module`'s weight along `dims` (and of its bias along dim 0), in place."""

    def narrowed(p: nn.Parameter, dim: int) -> nn.Parameter:
        return nn.Parameter(p.detach().index_select(dim, keep).clone(), requires_grad=p.requires_grad)

    for dim in dims:
        module.weight = narrowed(module.weight, dim)
        if dim == 0 and getattr(module, "bias", None) is not None:
            module.bias = narrowed(module.bias, 0)
    if isinstance(module, LayerNorm):
        module.normalized_shape = (len(keep),)
        module.stats_width = stats_width
    elif isinstance(module, nn.Linear):
        module.out_features, module.in_features = module.weight.shape
    elif isinstance(module, nn.Embedding):
        module.embedding_dim = len(keep)
    else:
        raise EdgebertError(f"width pruning cannot narrow a {type(module).__name__}: add it to model.hidden_parts")


def layer_choice(c: EncoderConfig, n: int, score) -> list[int]:
    """The n layers (0-based, in order) of maximal Σ score(j, i) (layer i at student position j) that keep
    the model's layout: each at a position of the same attention span, and layer 0 first where its
    attention reads the embedding norm (ModernBERT). The first n layers always qualify."""
    kind = [(c.window(i), i == 0 and not c.first_attention_norm) for i in range(c.num_layers)]
    best: dict[tuple[int, int], tuple[float, int | None]] = {}
    for j in range(n):
        for i in range(j, c.num_layers - (n - 1 - j)):
            if kind[i] != kind[j]:
                continue
            if j == 0:
                best[j, i] = (score(j, i), None)
                continue
            prev = [(best[j - 1, p][0], p) for p in range(j - 1, i) if (j - 1, p) in best]
            if prev:
                total, p = max(prev)
                best[j, i] = (total + score(j, i), p)
    last = max((v[0], i) for (j, i), v in best.items() if j == n - 1)[1]
    kept = [last]
    for j in range(n - 1, 0, -1):
        kept.append(best[j, kept[-1]][1])
    return kept[::-1]
