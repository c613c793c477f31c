"""BERT, and MiniLM, which is the BERT layout at a small width. Its config keys and layer names are
the base the other BERT-derived families (RoBERTa, ALBERT, ELECTRA) extend."""

from __future__ import annotations

from ..errors import EdgebertError
from ..model import EncoderConfig
from . import TO_HF_ACTIVATIONS, Family, activation, linear, register

# Our layer parts, in Hugging Face's BERT names (which model.py mirrors).
LAYER_PARTS = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
               "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm")


def from_hf(config: dict, **changes) -> EncoderConfig:
    """A BERT-layout config.json (`changes` are a derived family's own fields)."""
    g = config.get
    fields = dict(
        family="bert", vocab_size=g("vocab_size"), hidden_size=g("hidden_size"), num_layers=g("num_hidden_layers"),
        num_heads=g("num_attention_heads"), intermediate_size=g("intermediate_size"), activation=activation(config),
        type_vocab_size=g("type_vocab_size", 2), max_positions=g("max_position_embeddings", 512),
        pad_token_id=g("pad_token_id", 0) or 0, layer_norm_eps=g("layer_norm_eps", 1e-12),
        dropout=g("hidden_dropout_prob", 0.1), attention_dropout=g("attention_probs_dropout_prob", 0.1),
        layer_heads=layer_heads(config, lambda i: i),
    )
    return EncoderConfig(**{**fields, **changes})


def layer_heads(config: dict, key) -> list[int] | None:
    """Heads per layer after config.json's `pruned_heads` {key(layer): heads dropped}, or None."""
    pruned = {int(k): set(v) for k, v in (config.get("pruned_heads") or {}).items()}
    n = config.get("num_attention_heads")
    return [n - len(pruned.get(key(i), ())) for i in range(config["num_hidden_layers"])] if pruned else None


def pruned_heads(c: EncoderConfig, key) -> dict:
    """Per-layer head counts as transformers says them: `pruned_heads` {key(layer): the heads dropped}.
    Pruning keeps a layer's remaining heads first and in order, so the dropped ones are the last."""
    if not c.layer_heads or all(h == c.num_heads for h in c.layer_heads):
        return {}
    if c.head_size * c.num_heads != c.hidden_size:
        raise EdgebertError(f"head_size {c.head_size} × {c.num_heads} heads ≠ hidden_size {c.hidden_size}: "
                            "transformers derives the head size from them; use edgebert's own format")
    return {"pruned_heads": {str(key(i)): list(range(h, c.num_heads)) for i, h in enumerate(c.layer_heads)
                             if h < c.num_heads}}


def to_hf(c: EncoderConfig) -> dict:
    """The BERT-layout keys; refuses what BERT's config cannot say (a derived family passes `c` without
    the fields it expresses itself)."""
    if c.pre_ln:
        raise EdgebertError(f"pre-LN encoders are not expressible in transformers' {c.family} config: "
                            "use edgebert's own format")
    if c.attention_groups is not None or c.ffn_groups is not None or c.embedding_size:
        raise EdgebertError(f"cross-layer sharing or factorized embeddings need the albert family, not {c.family}: "
                            "use edgebert's own format")
    return {"vocab_size": c.vocab_size, "max_position_embeddings": c.max_positions, "pad_token_id": c.pad_token_id,
            "hidden_size": c.hidden_size, "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
            "intermediate_size": c.intermediate_size, "hidden_act": TO_HF_ACTIVATIONS[c.activation],
            "type_vocab_size": c.type_vocab_size, "layer_norm_eps": c.layer_norm_eps,
            "hidden_dropout_prob": c.dropout, "attention_probs_dropout_prob": c.attention_dropout,
            **pruned_heads(c, lambda i: i)}


def embedding_weights(c: EncoderConfig) -> dict[str, str]:
    m = {f"embeddings.{t}_embeddings.weight": f"embeddings.{t}_embeddings.weight"
         for t in ("word", "position", "token_type")[: 3 if c.type_vocab_size else 2]}
    return {**m, **linear("embeddings.LayerNorm", "embeddings.LayerNorm")}


def weights(c: EncoderConfig) -> dict[str, str]:
    m = embedding_weights(c)
    for i in range(c.num_layers):
        for part in LAYER_PARTS:
            m.update(linear(f"encoder.layer.{i}.{part}", f"encoder.layer.{i}.{part}"))
    return m


FAMILY = register(Family(
    name="bert", model_types=("bert",), stem="Bert", prefix="bert.", from_hf=from_hf, to_hf=to_hf,
    weights=weights, pooler="bert.pooler.dense",
    mlm=("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias"),
    nsp=("bert.pooler.dense", "cls.seq_relationship"),
))
