"""DeBERTa-v2 and -v3 (transformers' DebertaV2*): the BERT layout (post-LN) with disentangled attention
(content-to-position and position-to-content terms over a shared relative position table, log-bucketed
distances, optionally its own position projections and a LayerNorm on the table), absolute positions
only when `position_biased_input`, the ContextPooler head (a [CLS] dense + `pooler_hidden_act`) and a
SentencePiece (Unigram) tokenizer.

ONNX Runtime's optimizer has no DeBERTa type; its "bert" fusions still pay off, and every export checks
the fused graph against the unfused one. Measured on 2-layer, 32-wide tiny classifiers (opset 17,
onnxruntime 1.32): with relative attention they fuse BiasGelu 2 (the FFNs) and Gelu 1 (the pooler), and
leave every LayerNormalization apart (each residual norm's Add written as Sum: `export.onnx.residual_sums`);
no Attention (the c2p/p2c MatMul + GatherElements terms are outside its pattern,
so attention stays 4 MatMul, 2 GatherElements, Softmax per layer) and no EmbedLayerNormalization.
Without relative attention the graph is BERT's and fuses fully (Attention 2, EmbedLayerNormalization 1).
"""

from __future__ import annotations

from ..errors import EdgebertError
from ..model import EncoderConfig
from . import TO_HF_ACTIVATIONS, Family, activation, linear, register
from . import bert

TERMS = ("c2p", "p2c")
PROJECTIONS = {"query": "query_proj", "key": "key_proj", "value": "value_proj", "pos_key": "pos_key_proj",
               "pos_query": "pos_query_proj"}  # our attention.self parts → transformers' names


def _list(value, default: str = "") -> list[str]:
    """transformers accepts "c2p|p2c" strings and lists alike."""
    value = default if value is None else value
    return [x.strip() for x in value.lower().split("|") if x.strip()] if isinstance(value, str) else list(value)


def from_hf(config: dict) -> EncoderConfig:
    g = config.get
    hidden = g("hidden_size")
    terms = _list(g("pos_att_type"))
    norms = _list(g("norm_rel_ebd"), "none")
    missing = [
        f"conv_kernel_size={g('conv_kernel_size')} (the convolution layer)" if (g("conv_kernel_size") or 0) > 0 else "",
        f"pos_att_type {sorted(set(terms) - set(TERMS))}" if set(terms) - set(TERMS) else "",
        f"norm_rel_ebd {g('norm_rel_ebd')!r}" if set(norms) - {"none", "layer_norm"} else "",
        "pos_att_type without relative_attention" if terms and not g("relative_attention", False) else "",
        f"embedding_size {g('embedding_size')} ≠ hidden_size" if g("embedding_size", hidden) != hidden else "",
        f"pooler_hidden_size {g('pooler_hidden_size')} ≠ hidden_size" if g("pooler_hidden_size", hidden) != hidden else "",
    ]
    missing = [m for m in missing if m]
    if missing:
        raise EdgebertError(f"DeBERTa with {', '.join(missing)} is not supported: edgebert runs c2p/p2c disentangled "
                            "attention without convolution, with optional layer_norm on the relative embeddings")
    relative = bool(terms) and g("relative_attention", False)
    max_relative = g("max_relative_positions", -1)
    return bert.from_hf(
        config, family="deberta", type_vocab_size=g("type_vocab_size", 0), layer_norm_eps=g("layer_norm_eps", 1e-7),
        head_size=g("attention_head_size"), position="absolute" if g("position_biased_input", True) else "none",
        relative_terms=terms if relative else None, relative_buckets=max(g("position_buckets", -1), 0),
        max_relative_positions=max_relative if max_relative >= 1 else g("max_position_embeddings", 512),
        relative_shared_key=g("share_att_key", False), relative_norm="layer_norm" in norms,
    )


def to_hf(c: EncoderConfig) -> dict:
    if c.position == "rotary" or c.position_offset or c.gated_ffn or c.attention_window or not c.bias:
        raise EdgebertError("transformers' DeBERTa has learned or relative positions from 0, a plain FFN, global "
                            "attention and biases: use edgebert's own format")
    head_size = {} if c.head_size * c.num_heads == c.hidden_size else {"attention_head_size": c.head_size}
    return {**bert.to_hf(c), **head_size, "position_biased_input": c.position == "absolute",
            "relative_attention": c.relative_terms is not None, "pos_att_type": list(c.relative_terms or []),
            "position_buckets": c.relative_buckets or -1, "max_relative_positions": c.max_relative_positions,
            "share_att_key": c.relative_shared_key, "norm_rel_ebd": "layer_norm" if c.relative_norm else "none",
            "pooler_hidden_size": c.hidden_size}


def weights(c: EncoderConfig) -> dict[str, str]:
    tables = ("word", "position", "token_type")
    m = {f"embeddings.{t}_embeddings.weight": f"embeddings.{t}_embeddings.weight" for t in tables
         if t == "word" or (t == "position" and c.position == "absolute") or (t == "token_type" and c.type_vocab_size)}
    m.update(linear("embeddings.LayerNorm", "embeddings.LayerNorm"))
    terms = c.relative_terms or []
    own = [] if c.relative_shared_key else [p for t, p in (("c2p", "pos_key"), ("p2c", "pos_query")) if t in terms]
    for i in range(c.num_layers):
        layer = f"encoder.layer.{i}."
        for ours in ("query", "key", "value", *own):
            m.update(linear(f"{layer}attention.self.{PROJECTIONS[ours]}", f"{layer}attention.self.{ours}"))
        for part in bert.LAYER_PARTS[3:]:  # attention output, FFN and their norms: BERT's names
            m.update(linear(layer + part, layer + part))
    if terms:
        m["encoder.relative.table.weight"] = "encoder.rel_embeddings.weight"
        if c.relative_norm:
            m.update(linear("encoder.LayerNorm", "encoder.relative.LayerNorm"))
    return m


def head_from_hf(config: dict, kind: str) -> dict:
    return {"pooler": activation(config, "pooler_hidden_act")} if kind == "sequence-classification" else {}


def head_to_hf(head, c: EncoderConfig) -> dict:
    """The ContextPooler's activation; a classifier without it, or pooling other than [CLS], is refused."""
    if head.kind != "sequence-classification":
        return {}
    if not head.pooler or not head.pooler_bias or head.pooling != "cls":
        raise EdgebertError("transformers' DeBERTa classifier is a [CLS] dense with bias and an activation "
                            "(ContextPooler): use HeadConfig(pooler='gelu', pooling='cls') or edgebert's own format")
    return {"pooler_hidden_act": TO_HF_ACTIVATIONS[head.pooler], "pooler_dropout": 0}


FAMILY = register(Family(
    name="deberta", model_types=("deberta-v2",), stem="DebertaV2", prefix="deberta.", from_hf=from_hf, to_hf=to_hf,
    weights=weights, pooler="pooler.dense", pooler_activation="gelu", head_from_hf=head_from_hf, head_to_hf=head_to_hf,
    tokenizers=("Unigram",),
    tolerance=1e-5,
))
