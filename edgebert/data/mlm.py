"""Pretraining samples: BERT's masked-LM batches and next-sentence pairs."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from ..errors import EdgebertError
from .batching import PadCollator
from .tasks import IGNORE


class MLMCollator:
    """Pads a batch and masks it as BERT does: 15% of real tokens, of those 80/10/10.

    80% become [MASK], 10% a random non-special token, 10% stay; labels are -100 elsewhere.
    Special and pad tokens are never chosen. Seeded with its own torch.Generator.
    """

    def __init__(self, tokenizer, *, probability: float = 0.15, seed: int = 0):
        if tokenizer.mask_token_id is None:
            raise EdgebertError("tokenizer has no mask token; MLM needs one (e.g. [MASK])")
        special = set(tokenizer.all_special_ids) | {tokenizer.pad_token_id}
        self.pad = PadCollator(tokenizer.pad_token_id, tokenizer.pad_token_type_id)
        self.probability, self.mask_id = probability, tokenizer.mask_token_id
        self.special_ids = torch.tensor(sorted(special))
        self.random_ids = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
        self.generator = torch.Generator().manual_seed(seed)

    def mask(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(masked input_ids, labels) for an int64 [B, T] batch."""
        g = self.generator
        candidates = ~torch.isin(input_ids, self.special_ids)
        chosen = candidates & (torch.rand(input_ids.shape, generator=g) < self.probability)
        labels = torch.where(chosen, input_ids, IGNORE)
        roll = torch.rand(input_ids.shape, generator=g)
        masked = input_ids.clone()
        masked[chosen & (roll < 0.8)] = self.mask_id
        randomized = chosen & (roll >= 0.8) & (roll < 0.9)
        picks = torch.randint(len(self.random_ids), (int(randomized.sum()),), generator=g)
        masked[randomized] = self.random_ids[picks]
        return masked, labels

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        batch = self.pad([{k: v for k, v in item.items() if k != "labels"} for item in items])
        batch["input_ids"], batch["labels"] = self.mask(batch["input_ids"])
        return batch


def nsp_pairs(documents: Sequence[Sequence[str]], *, seed: int = 0) -> list[tuple[str, str, int]]:
    """(sentence A, sentence B, label) for every adjacent pair: 50% IsNext (0), 50% NotNext (1).

    A NotNext partner is a random sentence from another document, as in BERT.
    """
    documents = [list(d) for d in documents if len(d)]
    if len(documents) < 2:
        raise EdgebertError(
            "NSP needs at least two non-empty documents to draw NotNext partners from"
        )
    rng = random.Random(seed)
    pairs = []
    for d, document in enumerate(documents):
        for i in range(len(document) - 1):
            if rng.random() < 0.5:
                pairs.append((document[i], document[i + 1], 0))
            else:
                other = rng.randrange(len(documents) - 1)
                other += other >= d
                pairs.append((document[i], rng.choice(documents[other]), 1))
    return pairs
