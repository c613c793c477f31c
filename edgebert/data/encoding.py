"""A split through the tokenizer, and right-padding: shared by training batches and the eval arrays."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..tokenizer import encode
from .tasks import IGNORE, Split


def encode_split(split: Split, tokenizer, max_length: int) -> tuple[list, list, list, int]:
    """(input_ids, token_type_ids, labels, truncated); token labels sit on first word pieces.

    An embedding task's pairs become two single-sentence rows each (rows 2i and 2i+1), both labeled
    with the pair's score: a model embeds one sentence at a time, and the metric pairs rows back up."""
    examples, task = split.examples, split.task
    source = f"{task.name}/{split.name}"
    if task.kind == "embedding":
        texts = [text for e in examples for text in (e.text, e.text_pair)]
        encoded = encode(tokenizer, texts, max_length=max_length, source=source)
        labels = [float(e.label) for e in examples for _ in (0, 1)]
        return encoded.input_ids, encoded.token_type_ids, labels, encoded.truncated
    if task.kind != "token-classification":
        paired = task.kind == "pair-classification" or any(e.text_pair is not None for e in examples)
        pairs = [e.text_pair for e in examples] if paired else None  # regression: one sentence or two
        encoded = encode(
            tokenizer, [e.text for e in examples], pairs, max_length=max_length, source=source
        )
        return (
            encoded.input_ids,
            encoded.token_type_ids,
            [e.label for e in examples],
            encoded.truncated,
        )
    encoded = encode(
        tokenizer,
        [e.text for e in examples],
        max_length=max_length,
        is_split_into_words=True,
        source=source,
    )
    labels = []
    for example, word_ids in zip(examples, encoded.word_ids, strict=True):
        aligned, previous = [], None
        for word in word_ids:
            aligned.append(IGNORE if word is None or word == previous else example.label[word])
            previous = word
        labels.append(aligned)
    return encoded.input_ids, encoded.token_type_ids, labels, encoded.truncated


def pad(sequences: Sequence[Sequence], length: int, value: int | float, dtype) -> np.ndarray:
    """Right-pad sequences into a [N, length] array."""
    out = np.full((len(sequences), length), value, dtype=dtype)
    for i, seq in enumerate(sequences):
        out[i, : len(seq)] = seq
    return out
