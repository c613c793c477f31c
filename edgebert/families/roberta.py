"""RoBERTa (and XLM-R, CamemBERT): the BERT layout with positions numbered from padding_idx + 1."""

from __future__ import annotations

from ..model import EncoderConfig
from . import Family, register
from . import bert


def from_hf(config: dict) -> EncoderConfig:
    pad = config.get("pad_token_id", 1)
    return bert.from_hf(config, family="roberta", position_offset=pad + 1)


FAMILY = register(Family(
    name="roberta", model_types=("roberta", "xlm-roberta", "camembert"), stem="Roberta", prefix="roberta.",
    from_hf=from_hf, to_hf=bert.to_hf, weights=bert.weights, classifier="classifier.out_proj",
    pooler="classifier.dense", mlm=("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
    tokenizers=("BPE", "Unigram"),  # RoBERTa's byte-level BPE; XLM-R's and CamemBERT's SentencePiece
))
