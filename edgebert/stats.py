"""Size and cost of a model: parameters, bytes and FLOPs per sequence.

FLOPs count multiply-adds of the matrix products twice (the usual convention) and ignore
LayerNorm, softmax and activations, which are a few percent of a BERT forward pass. Shared
layers (ALBERT) save bytes, never FLOPs: every layer still runs.
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


def flops(config: EncoderConfig, seq_len: int, num_labels: int = 0) -> int:
    """FLOPs of one sequence of `seq_len` tokens through the encoder (+ a [CLS] classifier)."""
    t, h, d = seq_len, config.hidden_size, config.head_size
    macs = t * config.embedding_dim * h if config.embedding_dim != h else 0
    for i in range(config.num_layers):
        inner = config.heads(i) * d
        macs += 3 * t * h * inner  # query, key, value
        macs += 2 * t * t * inner  # scores and context
        macs += t * inner * h  # attention output
        macs += (3 if config.gated_ffn else 2) * t * h * config.ffn(i)  # FFN in (and gate) and out
    if num_labels:
        macs += h * h + h * num_labels  # pooler + classifier on [CLS]
    return 2 * macs


def summary(model: nn.Module, lengths=(32, 128, 512)) -> dict:
    """The facts `edgebert inspect` prints and every pass records."""
    c = model.config
    labels = model.head.num_labels if isinstance(model, TaskModel) and model.head.kind != "masked-lm" else 0
    p = params(model)
    return {
        "family": c.family,
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
        "flops": {str(n): flops(c, n, labels) for n in lengths if n <= c.max_length},
    }
