"""Augmented distillation data, as TinyBERT augments it but with embedding neighbours only.

Each copy of a training text has some of its one-piece words swapped for one of their nearest
whole words by cosine in the teacher's word-embedding table (TinyBERT takes BERT's masked-LM
guesses for one-piece words and GloVe neighbours for the rest; most small checkpoints ship no MLM
head). The teacher labels every copy through the teacher cache, so a copy whose meaning flipped
("good" → "bad") is labelled as the teacher reads it; gold labels do not carry over.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import Config
from ..data import EncodedDataset
from ..errors import EdgebertError
from ..model import embeddings
from .vocab import word_starts


@dataclass(frozen=True, kw_only=True)
class AugmentConfig(Config):
    """How many swapped copies of each training text the student also learns from."""

    copies: int = 1  # augmented copies per training text (the originals stay too)
    probability: float = 0.3  # chance that each one-piece word is swapped
    neighbours: int = 10  # a word's candidates: its nearest whole words in the teacher's embedding table
    seed: int = 0

    def __post_init__(self):
        if self.copies < 1:
            raise EdgebertError(f"AugmentConfig.copies must be at least 1, got {self.copies}")
        if not 0 < self.probability <= 1:
            raise EdgebertError(f"AugmentConfig.probability is a fraction in (0, 1], got {self.probability}")
        if self.neighbours < 1:
            raise EdgebertError(f"AugmentConfig.neighbours must be at least 1, got {self.neighbours}")


class AugmentedDataset:
    """The original texts followed by their copies, unlabeled: what the teacher cache labels."""

    def __init__(self, original: EncodedDataset, input_ids: list[list[int]], token_type_ids: list[list[int]],
                 summary: dict):
        self.task, self.summary = original.task, summary
        self.input_ids, self.token_type_ids = input_ids, token_type_ids
        self.lengths = [len(ids) for ids in input_ids]

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.input_ids[i], "token_type_ids": self.token_type_ids[i]}


@torch.no_grad()
def neighbours(table: torch.Tensor, ids: np.ndarray, candidates: np.ndarray, k: int) -> dict[int, np.ndarray]:
    """Each of `ids`' `k` nearest `candidates` by cosine of their rows in `table`, itself left out."""
    cand = torch.as_tensor(candidates)
    keys = F.normalize(table[cand].float(), dim=-1)
    found = {}
    for start in range(0, len(ids), 1024):
        chunk = torch.as_tensor(ids[start : start + 1024])
        sims = F.normalize(table[chunk].float(), dim=-1) @ keys.T
        sims[chunk[:, None] == cand[None, :]] = -2.0
        top = sims.topk(min(k, len(candidates) - 1), dim=-1).indices
        found.update({int(i): cand[row].numpy() for i, row in zip(chunk, top)})
    return found


def augment(dataset: EncodedDataset, teacher: nn.Module, tokenizer, config: AugmentConfig) -> AugmentedDataset:
    """`dataset`'s texts plus `config.copies` swapped copies of each (see the module docstring)."""
    start, whole = word_starts(tokenizer)
    candidates = np.flatnonzero(whole)
    if len(candidates) < 2:
        raise EdgebertError("augment: the tokenizer has fewer than two whole-word tokens to swap between: "
                            "drop distill.augment for this model")
    swappable = []  # per text: positions of one-piece words
    for ids in dataset.input_ids:
        a = np.asarray(ids)
        following = np.append(start[a[1:]], True)
        swappable.append(np.flatnonzero(whole[a] & following))
    used = np.unique(np.concatenate([np.asarray(dataset.input_ids[i])[p] for i, p in enumerate(swappable)]
                                    + [np.zeros(0, dtype=np.int64)])).astype(np.int64)
    near = neighbours(embeddings(teacher).word.weight, used, candidates, config.neighbours)
    input_ids, token_type_ids = list(dataset.input_ids), list(dataset.token_type_ids)
    swapped = 0
    for copy in range(config.copies):
        rng = np.random.default_rng([config.seed, copy])
        for ids, types, positions in zip(dataset.input_ids, dataset.token_type_ids, swappable):
            new = list(ids)
            for p in positions[rng.random(len(positions)) < config.probability]:
                new[p] = int(rng.choice(near[int(ids[p])]))
                swapped += 1
            input_ids.append(new)
            token_type_ids.append(types)
    words = sum(map(len, swappable)) * config.copies
    summary = {**config.to_dict(), "texts": len(input_ids), "swappable_words": words, "swapped_words": swapped}
    return AugmentedDataset(dataset, input_ids, token_type_ids, summary)
