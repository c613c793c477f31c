"""ALBERT: factorized embeddings and whole layers shared in contiguous groups."""

from __future__ import annotations

import dataclasses

from ..errors import EdgebertError
from ..model import EncoderConfig
from . import Family, linear, register
from . import bert

# ALBERT's layer names → ours.
LAYER_PARTS = {"attention.query": "attention.self.query", "attention.key": "attention.self.key",
               "attention.value": "attention.self.value", "attention.dense": "attention.output.dense",
               "attention.LayerNorm": "attention.output.LayerNorm", "ffn": "intermediate.dense",
               "ffn_output": "output.dense", "full_layer_layer_norm": "output.LayerNorm"}


def _groups(layers: int, n: int) -> list[int]:
    return [int(i / (layers / n)) for i in range(layers)]


def from_hf(config: dict) -> EncoderConfig:
    if config.get("inner_group_num", 1) != 1:
        raise EdgebertError("ALBERT with inner_group_num > 1 is not supported")
    groups = _groups(config.get("num_hidden_layers"), config.get("num_hidden_groups", 1))
    e = config.get("embedding_size")
    return bert.from_hf(config, family="albert", attention_groups=groups, ffn_groups=groups,
                        embedding_size=None if e == config.get("hidden_size") else e,
                        layer_heads=bert.layer_heads(config, groups.__getitem__))  # pruned_heads is by group


def to_hf(c: EncoderConfig) -> dict:
    groups = [c.group("attention_groups", i) for i in range(c.num_layers)]
    n = max(groups) + 1
    if groups != [c.group("ffn_groups", i) for i in range(c.num_layers)] or groups != _groups(c.num_layers, n):
        raise EdgebertError("transformers' ALBERT shares whole layers in contiguous equal groups; "
                            "this sharing pattern needs edgebert's own format")
    plain = bert.to_hf(dataclasses.replace(c, attention_groups=None, ffn_groups=None, embedding_size=None,
                                           layer_heads=None))
    return {**plain, "embedding_size": c.embedding_dim, "num_hidden_groups": n, "inner_group_num": 1,
            **bert.pruned_heads(c, groups.__getitem__)}  # transformers' ALBERT prunes by group


def weights(c: EncoderConfig) -> dict[str, str]:
    m = bert.embedding_weights(c)
    if c.embedding_size:
        m.update(linear("encoder.embedding_hidden_mapping_in", "embeddings.projection"))
    for i in range(c.num_layers):
        hf = f"encoder.albert_layer_groups.{c.group('attention_groups', i)}.albert_layers.0."
        for theirs, ours in LAYER_PARTS.items():
            m.update(linear(hf + theirs, f"encoder.layer.{i}.{ours}"))
    return m


FAMILY = register(Family(
    name="albert", model_types=("albert",), stem="Albert", prefix="albert.", from_hf=from_hf, to_hf=to_hf,
    weights=weights, pooler="albert.pooler", mlm=("predictions.dense", "predictions.LayerNorm", "predictions.bias"),
    tokenizers=("Unigram",),
))
