"""ELECTRA (the discriminator): the BERT layout, with a factorized embedding when embedding_size < hidden."""

from __future__ import annotations

import dataclasses

from ..model import EncoderConfig
from . import Family, linear, register
from . import bert


def from_hf(config: dict) -> EncoderConfig:
    e = config.get("embedding_size")
    return bert.from_hf(config, family="electra", embedding_size=None if e == config.get("hidden_size") else e)


def to_hf(c: EncoderConfig) -> dict:
    return {**bert.to_hf(dataclasses.replace(c, embedding_size=None)), "embedding_size": c.embedding_dim}


def weights(c: EncoderConfig) -> dict[str, str]:
    m = bert.weights(c)
    return {**m, **linear("embeddings_project", "embeddings.projection")} if c.embedding_size else m


# ElectraForMaskedLM is the generator and ElectraForPreTraining the discriminator's head: both load
# as the bare encoder (mlm=None).
FAMILY = register(Family(
    name="electra", model_types=("electra",), stem="Electra", prefix="electra.", from_hf=from_hf, to_hf=to_hf,
    weights=weights, classifier="classifier.out_proj", pooler="classifier.dense", pooler_activation="gelu",
))
