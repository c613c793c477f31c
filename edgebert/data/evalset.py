"""The eval set as fixed-shape arrays: what device checks, export verification and bench feed a model."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..device_tests.evalset import task_entry
from .encoding import encode_split, pad
from .readers import load_task
from .tasks import IGNORE, Split, Task, get_task


def pretokenize_eval(
    task: str | Task | Split,
    tokenizer,
    max_length: int,
    *,
    split: str | None = None,
    data_dir: str | Path | None = None,
    out_dir: str | Path | None = None,
) -> dict[str, np.ndarray]:
    """The eval set as fixed-shape arrays for device checks; written to out_dir/eval.npz if given.

    input_ids / attention_mask / token_type_ids: int32 [N, max_length], right-padded with the pad
    id; lengths: int32 [N]; labels: int64 [N], float32 [N] for regression, int64 [N, T] with -100
    for token tasks; for an embedding task rows 2i and 2i+1 are pair i's sentences, each labeled with
    its float32 score. task: the task's name, kind, metric and label names (device_tests.evalset.task_entry),
    so the harness scores the set without the manifest.
    """
    if isinstance(task, Split):
        data = task
    else:
        task = get_task(task)
        data = load_task(task, split or task.eval_split, data_dir=data_dir)
    kind = data.task.kind
    input_ids, token_type_ids, labels, _ = encode_split(data, tokenizer, max_length)
    lengths = np.array([len(ids) for ids in input_ids], dtype=np.int32)
    if kind == "token-classification":
        label_array = pad(labels, max_length, IGNORE, np.int64)
    else:
        label_array = np.array(labels, dtype=np.float32 if kind in ("regression", "embedding") else np.int64)
    arrays = {
        "input_ids": pad(input_ids, max_length, tokenizer.pad_token_id, np.int32),
        "attention_mask": (np.arange(max_length)[None, :] < lengths[:, None]).astype(np.int32),
        "token_type_ids": pad(token_type_ids, max_length, tokenizer.pad_token_type_id, np.int32),
        "lengths": lengths,
        "labels": label_array,
        "task": task_entry(data.task.name, kind, data.task.metric, data.task.labels),
    }
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        np.savez(Path(out_dir) / "eval.npz", **arrays)
    return arrays
