"""Size and cost of a model: parameters, bytes and FLOPs per sequence.

FLOPs count multiply-adds of the matrix products twice (the usual convention) and ignore
LayerNorm, softmax, rotary and activations, which are a few percent of a BERT forward pass. They count
what the exported graph computes per sequence:
- DeBERTa's c2p and p2c terms cost every token's scores against all 2·span rows of the relative table
  (as much as attending to 2·span extra keys). The table's own projections are not counted: they depend
  on the weights only; ONNX Runtime folds them into constants when it loads the file (PyTorch eager
  recomputes them once per batch).
- Sliding-window layers (ModernBERT) are counted at full T×T: the padded implementation computes every
  score and masks the far ones. `flops(..., windowed=True)` (inspect's `flops_windowed`) counts only the
  pairs inside each window, the cost of a kernel that skips the rest; no exported graph does that yet.
Shared layers (ALBERT) save bytes, never FLOPs: every layer still runs.
"""

from __future__ import annotations

from torch import nn

from .model import EncoderConfig, TaskModel, encoder_of


def _unique_params(module: nn.Module) -> list:
    return list({id(p): p for p in module.parameters()}.values())


def params(model: nn.Module) -> dict[str, int]:
    """Parameter counts split into embeddings, encoder layers and heads (shared tensors once)."""
    encoder = encoder_of(model)
    total = sum(p.numel() for p in _unique_params(model))
    embeddings = sum(p.numel() for p in _unique_params(encoder.embeddings))
    layers = sum(p.numel() for p in _unique_params(encoder.encoder))
    return {"total": total, "embeddings": embeddings, "encoder": layers, "heads": total - embeddings - layers}


def nbytes(model: nn.Module) -> int:
    """Bytes of the unique parameter storage (what a float file of the model holds)."""
    return sum(p.numel() * p.element_size() for p in _unique_params(model))


def pairs(seq_len: int, window: int | None) -> int:
    """Query–key pairs a layer scores: all T×T, or with a window those within window // 2 positions."""
    t = seq_len
    r = t - 1 if window is None else min(window // 2, t - 1)
    return t + 2 * (r * t - r * (r + 1) // 2)  # the diagonal, and each distance d ≤ r on both sides: t − d


def flops(config: EncoderConfig, seq_len: int, num_labels: int = 0, *, windowed: bool = False) -> int:
    """FLOPs of one sequence of `seq_len` tokens through the encoder (+ a [CLS] classifier).
    `windowed`: sliding-window layers score only the pairs inside their window (see the module doc)."""
    t, h, d = seq_len, config.hidden_size, config.head_size
    macs = t * config.embedding_dim * h if config.embedding_dim != h else 0
    for i in range(config.num_layers):
        inner = config.heads(i) * d
        macs += 3 * t * h * inner  # query, key, value
        macs += 2 * pairs(t, config.window(i) if windowed else None) * inner  # scores and context
        macs += t * inner * h  # attention output
        # DeBERTa, per c2p/p2c term: every token's scores against all 2·span table rows (the gather that
        # picks each pair's row is free; the table's projection is a constant, see the module doc).
        macs += len(config.relative_terms or ()) * t * 2 * config.relative_span * inner
        macs += (3 if config.gated_ffn else 2) * t * h * config.ffn(i)  # FFN in (and gate) and out
    if num_labels:
        macs += h * h + h * num_labels  # pooler + classifier on [CLS]
    return 2 * macs


def attention(c: EncoderConfig) -> str:
    """The attention layout in words: what sets the families apart."""
    kind = "global"
    if c.relative_terms:
        rows = f"{c.relative_buckets} log buckets" if c.relative_buckets else "exact distances"
        kind = f"disentangled {'+'.join(c.relative_terms)} ({rows} up to {c.max_relative_positions}" \
               + (", shared key)" if c.relative_shared_key else ")")
    if c.attention_window is not None:
        kind += f" every {c.global_every} layers from layer 0, a {c.attention_window}-token window elsewhere"
    return f"{kind}; {'no absolute' if c.position == 'none' else c.position} positions"


def summary(model: nn.Module, lengths=(32, 128, 512)) -> dict:
    """The facts `edgebert inspect` prints and every pass records."""
    c = model.config
    labels = model.head.num_labels if isinstance(model, TaskModel) and model.head.kind != "masked-lm" else 0
    p = params(model)
    lengths = [n for n in lengths if n <= c.max_length]
    windowed = {"flops_windowed": {str(n): flops(c, n, labels, windowed=True) for n in lengths}} \
        if c.attention_window is not None else {}
    return {
        "family": c.family,
        "attention": attention(c),
        "layers": c.num_layers,
        "hidden": c.hidden_size,
        "heads": [c.heads(i) for i in range(c.num_layers)] if c.layer_heads else c.num_heads,
        "ffn": [c.ffn(i) for i in range(c.num_layers)] if c.layer_ffn else c.intermediate_size,
        "vocab": c.vocab_size,
        "params": p["total"],
        "params_embeddings": p["embeddings"],
        "params_encoder": p["encoder"],
        "params_heads": p["heads"],
        "bytes": nbytes(model),
        "flops": {str(n): flops(c, n, labels) for n in lengths},
        **windowed,
    }
