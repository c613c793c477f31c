"""Training and evaluation batches: an encoded split, padding per batch, length-bucketed sampling."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..errors import EdgebertError
from .encoding import encode_split, pad
from .tasks import IGNORE, Split


class EncodedDataset(Dataset):
    """A split encoded once with the tokenizer; padding happens per batch in `PadCollator`."""

    def __init__(self, split: Split, tokenizer, max_length: int):
        self.task = split.task
        self.split, self.max_length = split, max_length  # to re-encode it under another tokenizer (vocab)
        self.input_ids, self.token_type_ids, self.labels, self.truncated = encode_split(
            split, tokenizer, max_length
        )
        self.lengths = [len(ids) for ids in self.input_ids]

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict:
        return {
            "input_ids": self.input_ids[i],
            "token_type_ids": self.token_type_ids[i],
            "labels": self.labels[i],
        }


@dataclass(frozen=True)
class TaskData:
    """What a pass trains and evaluates on: encoded train and eval splits, the tokenizer that
    encoded them (distillation's MLM objective and augmentation need it), and optionally a
    validation split carved from the training data, which "keep the best" then chooses by so that
    the eval split's figures are not chosen on the eval split itself."""

    train: EncodedDataset
    eval: EncodedDataset | None = None
    tokenizer: Any = None
    validation: EncodedDataset | None = None

    @property
    def choose_on(self) -> EncodedDataset | None:
        """The split checkpoints are chosen by: the validation split, else the eval split."""
        return self.validation if self.validation is not None else self.eval


class PadCollator:
    """Pads a list of items to the longest in the batch (rounded up to a multiple of `multiple`, as Transformers'
    pad_to_multiple_of does, at most `limit`): int64 ids, mask, types and labels."""

    def __init__(self, pad_id: int, pad_token_type_id: int = 0, multiple: int = 1, limit: int | None = None):
        self.pad_id, self.pad_token_type_id = pad_id, pad_token_type_id
        self.multiple, self.limit = multiple, limit

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        ids = [item["input_ids"] for item in items]
        longest = max(map(len, ids))
        rounded = -(-longest // self.multiple) * self.multiple
        length = max(longest, min(rounded, self.limit)) if self.limit is not None else rounded
        batch = {
            "input_ids": torch.from_numpy(pad(ids, length, self.pad_id, np.int64)),
            "attention_mask": torch.from_numpy(
                pad([[1] * len(s) for s in ids], length, 0, np.int64)
            ),
            "token_type_ids": torch.from_numpy(
                pad(
                    [item["token_type_ids"] for item in items],
                    length,
                    self.pad_token_type_id,
                    np.int64,
                )
            ),
        }
        if "labels" in items[0]:
            labels = [item["labels"] for item in items]
            if isinstance(labels[0], list):
                batch["labels"] = torch.from_numpy(pad(labels, length, IGNORE, np.int64))
            else:
                batch["labels"] = torch.tensor(
                    labels, dtype=torch.float32 if isinstance(labels[0], float) else torch.int64
                )
        return batch


class BucketBatchSampler(Sampler[list[int]]):
    """Length-bucketed batches: less padding, still random, reproducible from (seed, epoch).

    Each epoch: shuffle, cut into chunks of `chunk_batches` batches, sort each chunk by length,
    split it into batches, shuffle the batch order within the chunk.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        *,
        seed: int = 0,
        chunk_batches: int = 100,
        drop_last: bool = False,
    ):
        if batch_size < 1:
            raise EdgebertError(f"batch_size must be at least 1, got {batch_size}")
        self.lengths, self.batch_size, self.seed = np.asarray(lengths), batch_size, seed
        self.chunk, self.drop_last, self.epoch = batch_size * chunk_batches, drop_last, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        self.epoch += 1
        order = rng.permutation(len(self.lengths))
        for start in range(0, len(order), self.chunk):
            chunk = order[start : start + self.chunk]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches = [
                chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size)
            ]
            if self.drop_last and len(batches[-1]) < self.batch_size:
                batches.pop()
            for b in rng.permutation(len(batches)):
                yield batches[b].tolist()

    def __len__(self) -> int:
        full, rest = divmod(len(self.lengths), self.batch_size)
        if self.drop_last:  # every chunk but the last holds whole batches
            return full
        return full + (rest > 0)


def make_loader(
    dataset: EncodedDataset,
    batch_size: int,
    *,
    pad_id: int,
    train: bool,
    seed: int = 0,
    collate=None,
) -> DataLoader:
    """Training: bucketed, shuffled batches. Evaluation: file order, so outputs match rows."""
    collate = collate or PadCollator(pad_id)
    if train:
        return DataLoader(
            dataset,
            batch_sampler=BucketBatchSampler(dataset.lengths, batch_size, seed=seed),
            collate_fn=collate,
        )
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate)
