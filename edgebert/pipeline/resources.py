"""Resources: what a stage costs (`Work`, which the compile's estimate multiplies out), and guards that refuse,
in one line and before any work, a stage that would exhaust the machine's memory or a write that cannot fit
on the disk (an OOM kill takes the whole machine with it, and a full disk is found only hours in).

The memory estimate is deliberately rough (float32 training with AdamW, eager attention): weights,
gradients and the two Adam moments are 16 bytes a parameter; every layer keeps about three
[heads, T, T] attention tensors (scores, probabilities, dropout mask) and some 12 [T, hidden] plus 3
[T, ffn] activations per example for the backward pass. It is meant to catch settings that are off by
a large factor (a batch of 512 at 512 tokens on BERT-large), not to predict the peak to the megabyte.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import EdgebertError

FLOAT = 4


@dataclass(frozen=True)
class Training:
    """A training stage at its largest batch, as its registry entry (`trains`) says: what check_memory estimates."""

    batch: int
    option: str  # the stage's option that sets `batch`, e.g. "train.batch_size"
    layers: int | None = None  # it trains the start model's first `layers` layers (a student); None: all
    teacher: bool = False  # a teacher runs beside it, in inference


@dataclass(frozen=True)
class Work:
    """What a stage costs, as its registry entry (`work`) counts it in the units the compile's warm-up times
    (pipeline.estimate): examples through each kind of step, and seconds that scale with none of them."""

    train: int = 0  # examples through a training step (forward, backward, update) of the model the stage makes
    infer: int = 0  # examples through that model in inference (validation during training, the final eval)
    teacher: int = 0  # examples the teacher labels (its cache: computed once, shared by the stage's tries)
    labels_own_input: bool = False  # its teacher is the model it starts from, not the teacher of the stages before
    seconds: float = 0.0  # conversion, export and verification, as measured on 2 CPU cores
    config: object = None  # the TrainConfig its training steps run under (batch, device, precision)
    distill: object = None  # the DistillConfig its steps learn by, timed with the teacher cache they read


def examples(config) -> int:
    """Examples a training run of TrainConfig `config` steps through."""
    return config.steps * config.batch_size


def evaluated(config, data) -> int:
    """Examples a training run of `config` evaluates: the validation split (else eval) at every `eval_every` and
    at the end, then the eval split once."""
    chosen = data.choose_on
    times = (config.steps // config.eval_every if config.eval_every else 0) + 1
    return times * (len(chosen) if chosen is not None else 0) + eval_size(data)


def labelled(augment, data) -> int:
    """Texts the teacher labels: the training split, and with AugmentConfig `augment` what it makes from each."""
    return len(data.train) * (augment.texts_per_example if augment is not None else 1)


def eval_size(data) -> int:
    """The eval split's examples, which a stage scores its model on at the end (0 without one)."""
    return len(data.eval) if data.eval is not None else 0


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


def check_memory(stage: str, peak: Training, encoder, max_length: int, available: int | None = None) -> None:
    """Refuse a training stage whose estimate at its `peak` exceeds the memory available now (default: read
    now), naming what to lower."""
    available = available_memory() if available is None else available
    if available is None:
        return
    need = training_memory(encoder, peak.batch, max_length, peak.layers)
    if peak.teacher:
        need += FLOAT * parameters(encoder)  # the teacher, in inference
    if need > available:
        raise EdgebertError(
            f"{stage} needs about {need / 1e9:.1f} GB of memory (batch {peak.batch} × max_length {max_length} "
            f"on {peak.layers or encoder.num_layers} layers of width {encoder.hidden_size}), more than the "
            f"{available / 1e9:.1f} GB available: lower {stage}.{peak.option} or max_length in the recipe")


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
