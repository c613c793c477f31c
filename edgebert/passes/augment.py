"""Augmented distillation data, as TinyBERT augments it but with embedding neighbours only.

Each copy of a training text has some of its one-piece words swapped for one of their nearest
whole words by cosine in the teacher's word-embedding table (TinyBERT takes BERT's masked-LM
guesses for one-piece words and GloVe neighbours for the rest; most small checkpoints ship no MLM
head). The teacher labels every copy through the teacher cache, so a copy whose meaning flipped
("good" → "bad") is labelled as the teacher reads it; gold labels do not carry over.

Pairs get two more kinds of text: each pair with its texts in the other order (`swap_order`: a
paraphrase or a similarity does not depend on which sentence comes first, and every odd-numbered
word-swapped copy is made from the swapped pair), and recombined pairs (`recombine`): one pair's
first text beside another pair's second text, the one sharing the most words with it among a
random sample, so the teacher labels near-misses rather than unrelated sentences.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import Config
from ..data import EncodedDataset, encode_split
from ..errors import EdgebertError
from ..model import embeddings
from .vocab import word_starts


@dataclass(frozen=True, kw_only=True)
class AugmentConfig(Config):
    """How many swapped copies of each training text the student also learns from."""

    copies: int = 1  # augmented copies per training text (the originals stay too)
    probability: float = 0.3  # chance that each one-piece word is swapped
    neighbours: int = 10  # a word's candidates: its nearest whole words in the teacher's embedding table
    swap_order: bool = False  # pairs: each pair also with its two texts the other way round
    recombine: int = 0  # pairs: this many recombined pairs per pair (a first text beside another's second)
    draws: int = 64  # recombine: the random other pairs whose second text is scored by shared words
    seed: int = 0
    added = ("swap_order", "recombine", "draws")

    def __post_init__(self):
        if self.copies < 0:
            raise EdgebertError(f"AugmentConfig.copies must be 0 or more, got {self.copies}")
        if self.copies + self.swap_order + self.recombine == 0:
            raise EdgebertError("AugmentConfig asks for no copies: set copies, swap_order or recombine, "
                                "or drop the augment table")
        if self.recombine < 0 or self.draws < 1:
            raise EdgebertError(f"AugmentConfig.recombine must be 0 or more and draws at least 1, got "
                                f"{self.recombine} and {self.draws}")
        if not 0 < self.probability <= 1:
            raise EdgebertError(f"AugmentConfig.probability is a fraction in (0, 1], got {self.probability}")
        if self.neighbours < 1:
            raise EdgebertError(f"AugmentConfig.neighbours must be at least 1, got {self.neighbours}")

    @property
    def pairs(self) -> bool:
        """Whether it asks for what only pairs have."""
        return self.swap_order or self.recombine > 0

    @property
    def texts_per_example(self) -> int:
        """The texts the teacher labels per training example: the original and everything made from it."""
        return 1 + self.copies + self.swap_order + self.recombine


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


SINGLE_TEXT_KINDS = ("classification", "token-classification", "embedding")  # each example one text


def check_pairs(config: AugmentConfig | None, single_texts: bool, table: str) -> None:
    """Refuse swap_order and recombine where each example is one text."""
    if config is not None and config.pairs and single_texts:
        raise EdgebertError(f"{table}.swap_order and {table}.recombine make new pairs, and this task's examples "
                            f"are single texts: set them only for a pair task")


def recombined(examples: list, tokenizer, config: AugmentConfig) -> list:
    """`config.recombine` new pairs per pair: its first text beside the second text, among `config.draws`
    random other pairs', that shares the most word pieces with it (ties: the first drawn)."""
    firsts, words = ([set(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
                     for texts in ([e.text for e in examples], [e.text_pair for e in examples]))
    rng = np.random.default_rng([config.seed, 1 << 16])
    n, made = len(examples), []
    for i, example in enumerate(examples):
        others = rng.integers(0, n - 1, size=(config.recombine, config.draws))
        others += others >= i  # never the pair itself
        for row in others:
            best = max(row, key=lambda j: len(firsts[i] & words[j]))
            made.append(example._replace(text_pair=examples[best].text_pair, label=None))
    return made


def augment(dataset: EncodedDataset, teacher: nn.Module, tokenizer, config: AugmentConfig) -> AugmentedDataset:
    """`dataset`'s texts plus what `config` makes from each (see the module docstring)."""
    examples = dataset.split.examples
    check_pairs(config, any(e.text_pair is None for e in examples), "augment")
    start, whole = word_starts(tokenizer)
    candidates = np.flatnonzero(whole)
    if config.copies and len(candidates) < 2:
        raise EdgebertError("augment: the tokenizer has fewer than two whole-word tokens to swap between: "
                            "drop distill.augment for this model")

    def encoded(made: list) -> tuple[list, list]:
        split = replace(dataset.split, examples=made, documents=None)
        return encode_split(split, tokenizer, dataset.max_length)[:2]

    input_ids, token_type_ids = list(dataset.input_ids), list(dataset.token_type_ids)
    sources = [(dataset.input_ids, dataset.token_type_ids)]  # what word-swapped copies are made from, in turn
    if config.swap_order:
        swapped = encoded([e._replace(text=e.text_pair, text_pair=e.text) for e in examples])
        input_ids += swapped[0]
        token_type_ids += swapped[1]
        sources.append(swapped)
    if config.recombine:
        made = encoded(recombined(examples, tokenizer, config))
        input_ids += made[0]
        token_type_ids += made[1]
    if config.copies:
        def one_piece_words(ids: list[int]) -> np.ndarray:
            """Positions of the words that are one piece (the next token starts a word)."""
            a = np.asarray(ids)
            return np.flatnonzero(whole[a] & np.append(start[a[1:]], True))

        sources = [(ids, types, [one_piece_words(i) for i in ids]) for ids, types in sources]
        used = np.unique(np.concatenate([np.asarray(i)[p] for ids, _, where in sources for i, p in zip(ids, where)]
                                        + [np.zeros(0, dtype=np.int64)])).astype(np.int64)
        near = neighbours(embeddings(teacher).word.weight, used, candidates, config.neighbours)
    swapped_words = swappable_words = 0
    for copy in range(config.copies):
        rng = np.random.default_rng([config.seed, copy])
        for ids, types, positions in zip(*sources[copy % len(sources)]):
            new = list(ids)
            for p in positions[rng.random(len(positions)) < config.probability]:
                new[p] = int(rng.choice(near[int(ids[p])]))
                swapped_words += 1
            swappable_words += len(positions)
            input_ids.append(new)
            token_type_ids.append(types)
    summary = {**config.to_dict(), "texts": len(input_ids), "swappable_words": swappable_words,
               "swapped_words": swapped_words}
    return AugmentedDataset(dataset, input_ids, token_type_ids, summary)
