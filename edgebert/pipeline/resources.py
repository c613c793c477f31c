"""Resource guards: refuse, in one line and before any work, a stage that would exhaust the machine's
memory or a write that cannot fit on the disk (an OOM kill takes the whole machine with it, and a full
disk is found only hours in).

The memory estimate is deliberately rough (float32 training with AdamW, eager attention): weights,
gradients and the two Adam moments are 16 bytes a parameter; every layer keeps about three
[heads, T, T] attention tensors (scores, probabilities, dropout mask) and some 12 [T, hidden] plus 3
[T, ffn] activations per example for the backward pass. It is meant to catch settings that are off by
a large factor (a batch of 512 at 512 tokens on BERT-large), not to predict the peak to the megabyte.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import EdgebertError

TRAINING = ("finetune", "distill", "prune")
FLOAT = 4


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (what can be allocated without swapping); None elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def parameters(encoder) -> int:
    """Parameters of an encoder config: the embedding tables and every layer's projections."""
    e, h = encoder.embedding_dim, encoder.hidden_size
    tables = (encoder.vocab_size + encoder.max_positions + encoder.type_vocab_size) * e + (e * h if e != h else 0)
    layers = sum(4 * h * encoder.heads(i) * encoder.head_size + 2 * h * encoder.ffn(i)
                 for i in range(encoder.num_layers))
    return tables + layers


def training_memory(encoder, batch: int, length: int, layers: int | None = None) -> int:
    """Bytes one training step of `encoder` (or its first `layers` layers) needs at batch × length tokens."""
    n = encoder.num_layers if layers is None else min(layers, encoder.num_layers)
    activations = sum(3 * encoder.heads(i) * length * length + length * (12 * encoder.hidden_size + 3 * encoder.ffn(i))
                      for i in range(n))
    return FLOAT * (4 * parameters(encoder) + batch * activations)


def check_memory(recipe, encoder, available: int | None = None) -> None:
    """Refuse a training stage whose estimate exceeds the memory available now, naming what to lower."""
    available = available_memory() if available is None else available
    if available is None:
        return
    for name in (s for s in recipe.stages if s in TRAINING):
        options = recipe.stage(name)
        if name == "prune":  # scoring, then distillation recovery: the larger batch is the peak
            sizes = {"prune.batch_size": options.batch_size}
            if options.recovery is not None:
                sizes["prune.recovery.train.batch_size"] = options.recovery.train.batch_size
            layers = None
        else:
            sizes = {f"{name}.train.batch_size": options.train.batch_size}
            layers = (options.layers or (len(options.keep_layers) if options.keep_layers else None)
                      if name == "distill" else None)
        where, batch = max(sizes.items(), key=lambda item: item[1])
        need = training_memory(encoder, batch, recipe.max_length, layers)
        if name in ("distill", "prune"):
            need += FLOAT * parameters(encoder)  # the teacher, in inference
        if need > available:
            raise EdgebertError(
                f"{name} needs about {need / 1e9:.1f} GB of memory (batch {batch} × max_length {recipe.max_length} "
                f"on {layers or encoder.num_layers} layers of width {encoder.hidden_size}), more than the "
                f"{available / 1e9:.1f} GB available: lower {where} or max_length in the recipe")


def check_disk(folder: Path, need: int, what: str, fix: str) -> None:
    """Refuse to write `need` bytes of `what` under `folder` (or its nearest existing parent) when they
    cannot fit, so a full disk is a message before the write rather than an error part-way through it."""
    where = Path(folder)
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if free < need:
        raise EdgebertError(f"disk full: {where} has {free / 1e6:.0f} MB free and {what} needs about "
                            f"{need / 1e6:.0f} MB; {fix}")
