"""The teacher cache: a teacher's logits and hidden states computed once per (teacher, data, layers),
so every student epoch costs only the student. They are computed on the training device at its training
precision (bf16 autocast on a CPU with bf16 hardware, as the student trains there: labelling the copies of the
text is most of a recovery's setup), and stored on disk; a lookup gives CPU tensors that travel to the device with
their batch."""

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

from ..errors import EdgebertError, disk_full
from ..model import TaskModel, describe, encoder_of
from ..progress import Progress
from .capture import capture
from .train import CPU, Accelerator, collate, place


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
    def key(teacher: nn.Module, dataset: Sequence, hidden: list[int], precision: str = "fp32") -> str:
        described = [describe(teacher), sorted(hidden)] + ([precision] if precision != "fp32" else [])
        h = hashlib.sha256(json.dumps(described, sort_keys=True).encode())
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
              batch_size: int = 128, progress: bool = True, accelerator: Accelerator = Accelerator()) -> TeacherCache:
        """Load the cache for (teacher, data, hidden layers, precision) from `root`, computing it on the
        accelerator's device and precision if absent (the teacher is back on the CPU after)."""
        folder = root / cls.key(teacher, dataset, hidden, accelerator.precision)
        if (folder / "meta.json").exists():
            return cls(folder)
        teacher.eval()
        lengths = np.array([len(dataset[i]["input_ids"]) for i in range(len(dataset))])
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        classifier = isinstance(teacher, TaskModel) and teacher.head.kind in ("sequence-classification",
                                                                             "token-classification", "embedding")
        token_logits = classifier and teacher.head.kind == "token-classification"
        logit_offsets = offsets if token_logits else np.arange(len(dataset) + 1)
        hidden_size = encoder_of(teacher).config.hidden_size
        # An embedder's "logits" are its sentence vectors, one row per sentence.
        width = (teacher.vector_width if teacher.head.kind == "embedding" else teacher.head.num_labels) if classifier \
            else 0
        root.mkdir(parents=True, exist_ok=True)
        _remove_stale(root)
        tmp = root / f".{folder.name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            _fill(accelerator.place(teacher), accelerator, dataset, hidden, tmp, lengths, offsets, logit_offsets,
                  width, token_logits, hidden_size, batch_size, progress)
            os.replace(tmp, folder)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if (folder / "meta.json").exists():  # another process finished the same cache first
                return cls(folder)
            if disk_full(e, root):
                raise EdgebertError(f"disk full writing the teacher cache under {root}: free space, then run "
                                    "again (a compile: with --resume)") from None
            raise
        except BaseException:  # Ctrl-C, a failing batch: nothing half-written stays behind
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            place(teacher, CPU)
        return cls(folder)

    def lookup(self, indices: Sequence[int], length: int) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """(logits [B, C] or [B, T, C], {layer: hidden [B, T, H]}) zero-padded to `length`."""
        rows = [self.logits[self.logit_offsets[i] : self.logit_offsets[i + 1]] for i in indices]
        if self.token_logits:
            logits = padded(rows, length)
        else:
            logits = torch.from_numpy(np.concatenate(rows).astype(np.float32))
        hidden = {layer: padded([table[self.offsets[i] : self.offsets[i + 1]] for i in indices], length)
                  for layer, table in self.hidden.items()}
        return logits, hidden


def _memmap(path: Path, dtype, shape: tuple[int, int]) -> np.memmap:
    """A .npy file mapped for writing, its blocks allocated up front: a full disk then fails here as
    ENOSPC instead of killing the process with SIGBUS at the first page that has no block."""
    array = np.lib.format.open_memmap(path, "w+", dtype, shape)
    with open(path, "r+b") as f:
        os.posix_fallocate(f.fileno(), 0, os.path.getsize(path))
    return array


@torch.no_grad()
def _fill(teacher, accelerator: Accelerator, dataset, hidden, tmp: Path, lengths, offsets, logit_offsets, width,
          token_logits, hidden_size, batch_size, progress) -> None:
    logits = _memmap(tmp / "logits.npy", np.float32, (int(logit_offsets[-1]), width))
    states = {i: _memmap(tmp / f"hidden_{i}.npy", np.float16, (int(offsets[-1]), hidden_size)) for i in hidden}
    order = np.argsort(lengths, kind="stable")
    shown = Progress(len(order), "teacher cache", enabled=progress)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size].tolist()
        batch = accelerator.place(collate(teacher, [dataset[i] for i in idx], idx))
        with accelerator.autocast(), capture(teacher, set(hidden), set()) as captured:
            out = teacher(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        out, hidden_states = place((out.float(), {k: v.float() for k, v in captured["hidden"].items()}), CPU)
        for j, i in enumerate(idx):
            n = lengths[i]
            if width:
                logits[logit_offsets[i] : logit_offsets[i + 1]] = (out[j, :n] if token_logits else out[j]).numpy()
            for layer in hidden:
                states[layer][offsets[i] : offsets[i + 1]] = hidden_states[layer][j, :n].numpy()
        shown.update(len(idx))
    shown.close()
    logits.flush()
    for s in states.values():
        s.flush()
    np.save(tmp / "offsets.npy", offsets)
    np.save(tmp / "logit_offsets.npy", logit_offsets)
    (tmp / "meta.json").write_text(json.dumps({"hidden": hidden, "examples": len(dataset),
                                                 "token_logits": token_logits}))


def _remove_stale(root: Path) -> None:
    """Temporary folders of computations whose process is gone (killed, or the machine stopped)."""
    for tmp in root.glob(".*.*.tmp"):
        pid = tmp.name.rsplit(".", 2)[-2]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def padded(rows: list[np.ndarray], length: int) -> torch.Tensor:
    """Per-token rows [T_i, D] (read-only memory maps) as one zero-padded float32 tensor [B, length, D]."""
    out = np.zeros((len(rows), length, rows[0].shape[1]), np.float32)
    for j, r in enumerate(rows):
        out[j, : len(r)] = r
    return torch.from_numpy(out)
