"""The graph an exporter traces: an edgebert model with its inference-only rewrites, each a wrapper module.

`for_export(model)` returns a copy of the model that holds the same weights, with wrappers swapped in where
they apply (the model itself is left as it is):

- `ClsOnly`: when the head reads the [CLS] row alone (`TaskModel.reads_cls_alone`), the last layer computes
  that row alone. Exact: the other rows of its attention output and FFN are work nothing reads. Not with
  DeBERTa's relative attention, which `ClsOnly` does not spell, so its last layer keeps every row.
- `OrtAttention` (`ort_attention`): plain attention (no rotary positions, no window) as ONNX Runtime's
  com.microsoft MultiHeadAttention node, for a graph only ONNX Runtime runs.
- `LayerNormNode` (`layer_norm_node`): a width-pruned LayerNorm as one LayerNormalization node, for ONNX.

Each wrapper owns its forward and calls the wrapped model's own modules. An exporter traces `for_export(model,
...)` in place of the model; a module that is not an edgebert model comes back as it is.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from edgebert.model import Layer, LayerNorm, SelfAttention, attend, config_of, encoder_of, split_heads


def for_export(model: nn.Module, *, ort_attention: bool = False, layer_norm_node: bool = False) -> nn.Module:
    """`model` as an exporter should trace it, in eval mode: the last layer for [CLS] alone where that is all
    the head reads, and, for ONNX, `ort_attention` and `layer_norm_node` (see the module docstring)."""
    if config_of(model) is None:
        return model.eval()
    graph = copy.deepcopy(model, {id(t): t for t in (*model.parameters(), *model.buffers())}).eval()
    for parent in list(graph.modules()):
        for name, child in list(parent.named_children()):
            if ort_attention and type(child) is SelfAttention and child.rotary is None and child.window is None:
                setattr(parent, name, OrtAttention(child))
            elif layer_norm_node and isinstance(child, LayerNorm) and child.stats_width is not None:
                setattr(parent, name, LayerNormNode(child))
    stack = encoder_of(graph).encoder
    if getattr(graph, "reads_cls_alone", False) and stack.relative is None and len(stack.layer):
        stack.layer[-1] = ClsOnly(stack.layer[-1])
    return graph


class ClsOnly(nn.Module):
    """A layer computing its output [B, 1, H] for the first ([CLS]) position alone: the query and the residual
    of that row only, the keys and values of every row. Eval only (no dropout): a graph for inference."""

    def __init__(self, layer: Layer):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        layer = self.layer
        attn, out = layer.attention.output, layer.output
        if layer.pre_ln:
            h = attn.LayerNorm(x) if attn.LayerNorm is not None else x
            x = x[:, :1] + attn.dense(self.context(h, mask))
            return x + out.dense(layer.intermediate(out.LayerNorm(x)))
        x = attn.LayerNorm(attn.dense(self.context(x, mask)) + x[:, :1])
        return out.LayerNorm(out.dense(layer.intermediate(x)) + x)

    def context(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The attention's context [B, 1, D] for the first position's query."""
        a = self.layer.attention.self
        if isinstance(a, OrtAttention):
            return a(x, mask, queries=x[:, :1])
        q, k, v = (a.split(t) for t in (a.query(x[:, :1]), a.key(x), a.value(x)))
        if a.rotary is not None:
            q, k = a.rotary(q), a.rotary(k)  # q is position 0's
        if a.window is not None:
            mask = a.window(mask)[:, :, :1]
        return attend(q, k, v, mask, a.head_size)


class OrtAttention(nn.Module):
    """Plain attention as ONNX Runtime's com.microsoft MultiHeadAttention: one node for the heads' split,
    scores, mask, softmax and context, where the steps are a dozen. ORT runs it faster than both the steps and
    its own Attention fusion (measured on x86, the pruned student and the teacher alike); other runtimes lack
    it, so exports for them (static QDQ, NPUs, TFLite) keep the steps."""

    def __init__(self, attention: SelfAttention):
        super().__init__()
        self.attention = attention

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None) -> torch.Tensor:
        """`queries`: the rows whose context is computed (default: every row of x, whose keys and values all are)."""
        a = self.attention
        projections = (a.query, a.key, a.value)
        bias = torch.cat([m.bias for m in projections]) if a.query.bias is not None \
            else x.new_zeros(3 * a.heads * a.head_size)
        q = F.linear(x if queries is None else queries, a.query.weight)
        return MultiHeadAttention.apply(q, F.linear(x, a.key.weight), F.linear(x, a.value.weight), bias, mask, a.heads)


class MultiHeadAttention(torch.autograd.Function):
    """The projections q [B, S, D], k, v [B, T, D] (biases apart: ORT adds them) and the additive key mask
    [B, 1, 1, T] → the context [B, S, D]. Runs the steps in PyTorch; exports as one MultiHeadAttention node."""

    @staticmethod
    def forward(ctx, q, k, v, bias, mask, heads: int):
        size = q.shape[-1] // heads
        q, k, v = (split_heads(t + b, heads, size) for t, b in zip((q, k, v), bias.chunk(3)))
        return attend(q, k, v, mask, size)

    @staticmethod
    def symbolic(g, q, k, v, bias, mask, heads: int):
        keys = g.op("Squeeze", mask, g.op("Constant", value_t=torch.tensor([1, 2])))  # [B, T]: 0 where attended
        attended = g.op("Cast", g.op("Equal", keys, g.op("Constant", value_t=torch.tensor(0.0))), to_i=6)  # INT32
        context = g.op("com.microsoft::MultiHeadAttention", q, k, v, bias, attended, num_heads_i=heads)
        context.setType(q.type())  # the query's shape and type: what the exporter's shape inference reads
        return context


class LayerNormNode(nn.Module):
    """A LayerNorm averaging over `stats_width` > its width (width pruning) as one LayerNormalization node over
    its units padded with the zeros they stand for: the same statistics, and ONNX Runtime runs that one kernel
    faster than the dozen elementwise nodes of the model's steps (which LiteRT, without such a kernel, runs
    faster than the padded width)."""

    def __init__(self, norm: LayerNorm):
        super().__init__()
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.norm
        pad = n.stats_width - n.normalized_shape[0]  # (weights by torch.cat: the exporter folds it)
        weight = torch.cat([n.weight, n.weight.new_ones(pad)])
        bias = None if n.bias is None else torch.cat([n.bias, n.bias.new_zeros(pad)])
        return F.layer_norm(F.pad(x, (0, pad)), (n.stats_width,), weight, bias, n.eps)[..., :-pad]
