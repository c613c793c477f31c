"""DistilBERT: BERT's layer with its own names and config keys, no segment embeddings."""

from __future__ import annotations

from ..errors import EdgebertError
from ..model import EncoderConfig
from . import TO_HF_ACTIVATIONS, Family, activation, linear, register

LAYER_PARTS = {"attention.q_lin": "attention.self.query", "attention.k_lin": "attention.self.key",
               "attention.v_lin": "attention.self.value", "attention.out_lin": "attention.output.dense",
               "sa_layer_norm": "attention.output.LayerNorm", "ffn.lin1": "intermediate.dense",
               "ffn.lin2": "output.dense", "output_layer_norm": "output.LayerNorm"}


def from_hf(config: dict) -> EncoderConfig:
    g = config.get
    return EncoderConfig(family="distilbert", vocab_size=g("vocab_size"), hidden_size=g("dim"),
                         num_layers=g("n_layers"), num_heads=g("n_heads"), intermediate_size=g("hidden_dim"),
                         activation=activation(config, "activation"), type_vocab_size=0,
                         max_positions=g("max_position_embeddings", 512), pad_token_id=g("pad_token_id", 0),
                         dropout=g("dropout", 0.1), attention_dropout=g("attention_dropout", 0.1))


def to_hf(c: EncoderConfig) -> dict:
    if c.pre_ln or c.attention_groups is not None or c.ffn_groups is not None or c.embedding_size \
            or c.type_vocab_size or c.layer_norm_eps != 1e-12:
        raise EdgebertError("transformers' DistilBERT is post-LN and unshared, with no segment embeddings, no "
                            "factorized embedding and LayerNorm eps 1e-12: use edgebert's own format")
    return {"vocab_size": c.vocab_size, "max_position_embeddings": c.max_positions, "pad_token_id": c.pad_token_id,
            "dim": c.hidden_size, "n_layers": c.num_layers, "n_heads": c.num_heads, "hidden_dim": c.intermediate_size,
            "activation": TO_HF_ACTIVATIONS[c.activation], "dropout": c.dropout,
            "attention_dropout": c.attention_dropout}


def weights(c: EncoderConfig) -> dict[str, str]:
    m = {f"embeddings.{t}_embeddings.weight": f"embeddings.{t}_embeddings.weight" for t in ("word", "position")}
    m.update(linear("embeddings.LayerNorm", "embeddings.LayerNorm"))
    for i in range(c.num_layers):
        for theirs, ours in LAYER_PARTS.items():
            m.update(linear(f"transformer.layer.{i}.{theirs}", f"encoder.layer.{i}.{ours}"))
    return m


FAMILY = register(Family(
    name="distilbert", model_types=("distilbert",), stem="DistilBert", prefix="distilbert.", from_hf=from_hf,
    to_hf=to_hf, weights=weights, pooler="pre_classifier", pooler_activation="relu",
    mlm=("vocab_transform", "vocab_layer_norm", "vocab_projector.bias"), inputs=("input_ids", "attention_mask"),
))
