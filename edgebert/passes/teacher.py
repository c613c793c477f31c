"""The teacher cache: a teacher's logits and hidden states computed once per (teacher, data, layers),
so every student epoch costs only the student."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..model import TaskModel, describe, encoder_of
from .capture import capture
from .train import collate


class TeacherCache:
    """Teacher logits and selected hidden states for every example, in memory-mapped files.

    Rows are ragged: one logit row per sequence (per token for token classification), one hidden
    row per token, stored float16, addressed through offsets. Written to a temporary folder and
    renamed, so a killed computation leaves nothing half-written."""

    def __init__(self, folder: Path):
        self.folder = folder
        meta = json.loads((folder / "meta.json").read_text())
        self.hidden_layers, self.token_logits = meta["hidden"], meta["token_logits"]
        self.offsets = np.load(folder / "offsets.npy")
        self.logit_offsets = np.load(folder / "logit_offsets.npy")
        self.logits = np.load(folder / "logits.npy", mmap_mode="r")
        self.hidden = {i: np.load(folder / f"hidden_{i}.npy", mmap_mode="r") for i in self.hidden_layers}

    @staticmethod
    def key(teacher: nn.Module, dataset: Sequence, hidden: list[int]) -> str:
        h = hashlib.sha256(json.dumps([describe(teacher), sorted(hidden)], sort_keys=True).encode())
        for name, tensor in sorted(teacher.state_dict().items()):
            h.update(name.encode())
            h.update(tensor.detach().contiguous().numpy().tobytes())
        for i in range(len(dataset)):
            item = dataset[i]
            h.update(np.asarray(item["input_ids"], dtype=np.int64).tobytes())
            types = item.get("token_type_ids")
            h.update(np.asarray(types if types is not None else [], dtype=np.int64).tobytes())
            h.update(b"|")
        return h.hexdigest()[:24]

    @classmethod
    @torch.no_grad()
    def build(cls, teacher: nn.Module, dataset: Sequence, hidden: list[int], root: Path, *,
              batch_size: int = 128, progress: bool = True) -> TeacherCache:
        """Load the cache for (teacher, data, hidden layers) from `root`, computing it if absent."""
        from tqdm.auto import tqdm

        folder = root / cls.key(teacher, dataset, hidden)
        if (folder / "meta.json").exists():
            return cls(folder)
        teacher.eval()
        lengths = np.array([len(dataset[i]["input_ids"]) for i in range(len(dataset))])
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        classifier = isinstance(teacher, TaskModel) and teacher.head.kind in ("sequence-classification",
                                                                             "token-classification")
        token_logits = classifier and teacher.head.kind == "token-classification"
        logit_offsets = offsets if token_logits else np.arange(len(dataset) + 1)
        width = teacher.head.num_labels if classifier else 0
        hidden_size = encoder_of(teacher).config.hidden_size
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{folder.name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        logits = np.lib.format.open_memmap(tmp / "logits.npy", "w+", np.float32, (int(logit_offsets[-1]), width))
        states = {i: np.lib.format.open_memmap(tmp / f"hidden_{i}.npy", "w+", np.float16,
                                               (int(offsets[-1]), hidden_size)) for i in hidden}
        order = np.argsort(lengths, kind="stable")
        for start in tqdm(range(0, len(order), batch_size), desc="teacher cache", disable=not progress):
            idx = order[start : start + batch_size].tolist()
            batch = collate(teacher, [dataset[i] for i in idx], idx)
            with capture(teacher, set(hidden), set()) as captured:
                out = teacher(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
            for j, i in enumerate(idx):
                n = lengths[i]
                if width:
                    logits[logit_offsets[i] : logit_offsets[i + 1]] = (out[j, :n] if token_logits else out[j]).numpy()
                for layer in hidden:
                    states[layer][offsets[i] : offsets[i + 1]] = captured["hidden"][layer][j, :n].numpy()
        logits.flush()
        for s in states.values():
            s.flush()
        np.save(tmp / "offsets.npy", offsets)
        np.save(tmp / "logit_offsets.npy", logit_offsets)
        (tmp / "meta.json").write_text(json.dumps({"hidden": hidden, "examples": len(dataset),
                                                     "token_logits": token_logits}))
        try:
            os.replace(tmp, folder)
        except OSError:  # another process finished the same cache first
            shutil.rmtree(tmp, ignore_errors=True)
        return cls(folder)

    def lookup(self, indices: Sequence[int], length: int) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """(logits [B, C] or [B, T, C], {layer: hidden [B, T, H]}) zero-padded to `length`."""
        rows = [self.logits[self.logit_offsets[i] : self.logit_offsets[i + 1]] for i in indices]
        if self.token_logits:
            logits = torch.zeros(len(indices), length, self.logits.shape[1])
            for j, r in enumerate(rows):
                logits[j, : len(r)] = torch.from_numpy(np.asarray(r))
        else:
            logits = torch.from_numpy(np.concatenate(rows).astype(np.float32))
        hidden = {}
        for layer, table in self.hidden.items():
            h = torch.zeros(len(indices), length, table.shape[1])
            for j, i in enumerate(indices):
                r = table[self.offsets[i] : self.offsets[i + 1]]
                h[j, : len(r)] = torch.from_numpy(r.astype(np.float32))
            hidden[layer] = h
        return logits, hidden
