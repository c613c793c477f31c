"""ModernBERT: pre-LN with a final norm, rotary positions (separate global and local bases), global
attention on every `global_attn_every_n_layers`-th layer and a `local_attention` window elsewhere, a
GeGLU FFN, and no biases. Its fused Wqkv and Wi load as row blocks of our separate projections."""

from __future__ import annotations

from ..errors import EdgebertError
from ..model import EncoderConfig
from . import TO_HF_ACTIVATIONS, Family, Slice, activation, register


def from_hf(config: dict) -> EncoderConfig:
    g = config.get
    biases = {g("norm_bias", False), g("attention_bias", False), g("mlp_bias", False)}
    if len(biases) > 1:
        raise EdgebertError("ModernBERT with biases on some layers only (norm_bias, attention_bias, mlp_bias differ) "
                            "is not supported: edgebert has one bias switch")
    return EncoderConfig(
        family="modernbert", vocab_size=g("vocab_size"), hidden_size=g("hidden_size"),
        num_layers=g("num_hidden_layers"), num_heads=g("num_attention_heads"), intermediate_size=g("intermediate_size"),
        activation=activation(config, "hidden_activation"), type_vocab_size=0,
        max_positions=g("max_position_embeddings", 8192), pad_token_id=g("pad_token_id", 50283),
        layer_norm_eps=g("norm_eps", 1e-5), dropout=g("embedding_dropout", 0.0),
        attention_dropout=g("attention_dropout", 0.0), pre_ln=True, position="rotary",
        rope_theta=g("global_rope_theta", 160000.0), local_rope_theta=g("local_rope_theta"),
        attention_window=g("local_attention", 128), global_every=g("global_attn_every_n_layers", 3),
        gated_ffn=True, bias=biases.pop(), first_attention_norm=False,
    )


def to_hf(c: EncoderConfig) -> dict:
    if not (c.pre_ln and c.position == "rotary" and c.gated_ffn and not c.first_attention_norm) \
            or c.attention_groups is not None or c.ffn_groups is not None or c.embedding_size \
            or c.type_vocab_size or c.position_offset:
        raise EdgebertError("transformers' ModernBERT is pre-LN, rotary, gated and unshared, with no segment or "
                            "factorized embeddings: use edgebert's own format")
    return {"vocab_size": c.vocab_size, "max_position_embeddings": c.max_positions, "pad_token_id": c.pad_token_id,
            "hidden_size": c.hidden_size, "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
            "intermediate_size": c.intermediate_size, "hidden_activation": TO_HF_ACTIVATIONS[c.activation],
            "norm_eps": c.layer_norm_eps, "embedding_dropout": c.dropout, "mlp_dropout": c.dropout,
            "attention_dropout": c.attention_dropout, "global_rope_theta": c.rope_theta,
            "local_rope_theta": c.local_rope_theta, "local_attention": c.attention_window,
            "global_attn_every_n_layers": c.global_every, "norm_bias": c.bias, "attention_bias": c.bias,
            "mlp_bias": c.bias}


def weights(c: EncoderConfig) -> dict[str, str | Slice]:
    kinds = ("weight", "bias") if c.bias else ("weight",)
    m: dict[str, str | Slice] = {"embeddings.word_embeddings.weight": "embeddings.tok_embeddings.weight"}

    def add(hf: str, ours: str, count: int = 1, index: int = 0) -> None:
        for kind in kinds:
            m[f"{ours}.{kind}"] = Slice(f"{hf}.{kind}", index, count) if count > 1 else f"{hf}.{kind}"

    add("embeddings.norm", "embeddings.LayerNorm")
    for i in range(c.num_layers):
        hf, ours = f"layers.{i}.", f"encoder.layer.{i}."
        for j, part in enumerate(("query", "key", "value")):
            add(hf + "attn.Wqkv", ours + f"attention.self.{part}", 3, j)
        add(hf + "attn.Wo", ours + "attention.output.dense")
        if i > 0:  # layer 0's attention reads the embedding norm's output
            add(hf + "attn_norm", ours + "attention.output.LayerNorm")
        add(hf + "mlp_norm", ours + "output.LayerNorm")
        add(hf + "mlp.Wi", ours + "intermediate.dense", 2, 0)  # act(input) ⊙ gate, in that row order
        add(hf + "mlp.Wi", ours + "intermediate.gate", 2, 1)
        add(hf + "mlp.Wo", ours + "output.dense")
    add("final_norm", "encoder.final_layernorm")
    return m


def head_from_hf(config: dict, kind: str) -> dict:
    """ModernBERT's heads: [CLS] or mean pooling, then dense → activation → norm (the pooler, or the MLM
    transform before the tied decoder)."""
    g = config.get
    if kind == "token-classification":
        raise EdgebertError("ModernBERT's token classifier (a dense + norm head on every token) is not mapped: "
                            "load the bare encoder (ModernBertModel) and add a head with edgebert.with_head")
    if kind == "masked-lm" and (activation(config, "classifier_activation") != activation(config, "hidden_activation")
                                or not g("decoder_bias", True) or not g("tie_word_embeddings", True)):
        raise EdgebertError("ModernBertForMaskedLM is mapped with a tied, biased decoder and the encoder's activation "
                            "in its head: this config differs (classifier_activation, decoder_bias or "
                            "tie_word_embeddings)")
    fields = {"pooler_bias": g("classifier_bias", False)}
    if kind == "sequence-classification":
        fields.update(pooler=activation(config, "classifier_activation"), pooler_norm=True,
                      pooling=g("classifier_pooling", "cls"))
    return fields


def head_to_hf(head, c: EncoderConfig) -> dict:
    if head.kind == "sequence-classification":
        if not (head.pooler and head.pooler_norm):
            raise EdgebertError("transformers' ModernBERT classifier always has its dense + norm head: use "
                                "HeadConfig(pooler='gelu', pooler_norm=True) or edgebert's own format")
        return {"classifier_pooling": head.pooling, "classifier_activation": TO_HF_ACTIVATIONS[head.pooler],
                "classifier_bias": head.pooler_bias}
    if head.kind == "masked-lm":
        return {"classifier_activation": TO_HF_ACTIVATIONS[c.activation], "classifier_bias": head.pooler_bias,
                "decoder_bias": True, "tie_word_embeddings": True}
    raise EdgebertError(f"the {head.kind} head is not mapped for ModernBERT: save with edgebert's own format")


FAMILY = register(Family(
    name="modernbert", model_types=("modernbert",), stem="ModernBert", prefix="model.", from_hf=from_hf,
    to_hf=to_hf, weights=weights, pooler="head.dense", pooler_activation="gelu", pooler_norm="head.norm",
    head_from_hf=head_from_hf, head_to_hf=head_to_hf, mlm=("head.dense", "head.norm", "decoder.bias"),
    tokenizers=("BPE",), inputs=("input_ids", "attention_mask"), tolerance=1e-5,
))
