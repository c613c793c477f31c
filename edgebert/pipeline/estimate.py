"""How long a compile will take on this machine, said before the first stage trains.

A short warm-up times, on the training device and data, a few training steps and an inference pass of
each model shape the stages will train (the start model, then each stage's `shape` of it: distill's
student, prune's cut), and of the teacher. A stage that learns from a teacher cache is timed as it runs: the
cache, with the hidden states it keeps, built over a sample and read every step by the recipe's own loss.
Each stage's registry entry counts its `work` in those units (resources.Work: examples trained, inferred,
labelled by the teacher, plus fixed seconds), so the estimate is their product, summed; text a stage before
had the same teacher label into the same layers is not counted again, since its cache serves. The compile prints
it, and the manifest keeps it beside the time taken.
"""

from __future__ import annotations

import copy
import random
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from ..model import MaskedLM
from ..passes import DistillConfig, Objective
from ..passes.distill import DistillObjective, cached_collate, cached_layers
from ..passes.student import resolve_layer_map
from ..passes.teacher import TeacherCache
from ..passes.train import Accelerator, TrainConfig, predict, train
from ..progress import clock
from .context import Context, task_model
from .resources import Work
from .stages import STAGES

STEPS = 8  # timed training steps per shape, one on each batch picked, after WARM untimed ones
WARM = 2
INFERRED = 1024  # examples timed in inference per shape, in batches of BATCH (the teacher cache's)
BATCH = 128
BUNDLE_S = 15.0  # loading the data, the bundle: the files' local bench, each stage's PyTorch latency, the report


class _Output(Objective):
    """Any head's forward and backward, whatever its task: the square of its output."""

    def forward(self, batch):
        out = self.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        return (out[0] if isinstance(out, tuple) else out).float().square().mean()


@dataclass
class Estimate:
    """Seconds per stage still to run, as estimated before the first of them trained."""

    stages: dict[str, float] = field(default_factory=dict)
    warmup_s: float = 0.0
    on: str = "cpu"  # where the training stages run: "cpu (2 threads)", "2 × cuda"

    @property
    def total_s(self) -> float:
        return self.warmup_s + sum(self.stages.values())

    def line(self) -> str:
        parts = ", ".join(f"{name} {clock(s)}" for name, s in self.stages.items())
        return f"estimate: about {clock(self.total_s)} on {self.on} ({parts}; from a {self.warmup_s:.0f} s warm-up)"


class Timer:
    """Seconds per example of each model shape on this machine, timed on the compile's training data in batches of
    like lengths, as training (length-bucketed) and the teacher cache (length-sorted) batch them. Each shape is
    timed once: estimates that share a timer differ only in the work they count."""

    def __init__(self, ctx: Context):
        train = ctx.data.train
        sample = [train[i] for i in random.Random(ctx.recipe.seed).sample(range(len(train)), min(len(train), 4096))]
        self.sorted = sorted(sample, key=lambda item: len(item["input_ids"]))
        self.cache: dict[tuple, float] = {}

    def batches(self, count: int, size: int) -> list[dict]:
        """`count` batches of `size` examples, each a run of like lengths, spread evenly over the length-sorted
        sample: their mean cost is the data's (a long tail of long texts costs in proportion)."""
        windows = max(len(self.sorted) // size, 1)
        picked = sorted({int((j + 0.5) * windows / count) for j in range(min(count, windows))})
        return [item for w in picked for item in self.sorted[w * size : (w + 1) * size]]

    @staticmethod
    def _steps(objective: Objective, examples: list[dict], config: TrainConfig, collate_fn=None) -> float:
        """Seconds per example of `objective`'s training steps, one on each batch of `examples`, after WARM
        untimed ones (the weights' moving average left out: over a few steps its setup would be most of the
        time). Every batch is timed: steps over a random few of them would leave out the long ones at random."""
        steps = max(1, len(examples) // config.batch_size)
        timed = replace(config, steps=steps, eval_every=0, patience=0, progress=False, ema=0.0)
        train(objective, examples, config=replace(timed, steps=WARM), collate_fn=collate_fn)  # allocations, pools
        return train(objective, examples, config=timed, collate_fn=collate_fn).wall_s / (steps * config.batch_size)

    def train(self, model: nn.Module, config: TrainConfig) -> float:
        key = ("train", _key(model), config.batch_size, config.device, config.precision)
        if key not in self.cache:
            examples = self.batches(STEPS, config.batch_size)
            self.cache[key] = self._steps(_Output(copy.deepcopy(model)), examples, config)
        return self.cache[key]

    def infer(self, model: nn.Module, device: str, precision: str = "fp32") -> float:
        """Seconds per example in inference: at fp32 as evaluation runs, or at the training precision as the
        teacher cache labels."""
        accelerator = Accelerator.current(TrainConfig(device=device, precision=precision))
        key = ("infer", _key(model), device, accelerator.precision)
        if key not in self.cache:
            model = accelerator.place(copy.deepcopy(model)).eval()
            examples = self.batches(INFERRED // BATCH, BATCH)
            with torch.inference_mode(), accelerator.autocast():
                predict(model, examples[:BATCH], batch_size=BATCH)
                t0 = time.perf_counter()
                predict(model, examples, batch_size=BATCH)
            self.cache[key] = (time.perf_counter() - t0) / len(examples)
        return self.cache[key]

    def distill(self, student: nn.Module, teacher: nn.Module, config: DistillConfig) -> tuple[float, float] | None:
        """(seconds per example trained, per example the teacher labels) as distillation from its cache runs: the
        cache, hidden states included, built over the sample and looked up each step by the recipe's loss. None
        for a teacher that runs beside the student instead (MLM, attention relations): `train` and `infer` time it.
        """
        if isinstance(student, MaskedLM) or config.attention_weight or config.value_weight:
            return None
        train_config = config.train
        accelerator = Accelerator.current(train_config)
        key = ("distill", _key(student), _key(teacher), train_config.batch_size, train_config.device,
               accelerator.precision, config.hidden_weight > 0)
        if key not in self.cache:
            layer_map = resolve_layer_map(student, teacher, config.layer_map)
            hidden = cached_layers(layer_map, config)
            examples = self.batches(STEPS, train_config.batch_size)
            labelled = self.batches(INFERRED // BATCH, BATCH)
            with tempfile.TemporaryDirectory(prefix="edgebert-estimate-") as tmp:
                def cache(data, name):
                    return TeacherCache.build(teacher, data, hidden, Path(tmp) / name, progress=False,
                                              accelerator=accelerator)
                cache(labelled[:BATCH], "warm")
                t0 = time.perf_counter()
                cache(labelled, "labelled")
                per_label = (time.perf_counter() - t0) / len(labelled)
                objective = DistillObjective(copy.deepcopy(student), teacher, config, layer_map)
                collate_fn = cached_collate(objective.model, cache(examples, "train"))
                self.cache[key] = (self._steps(objective, examples, train_config, collate_fn), per_label)
        return self.cache[key]


def _key(model: nn.Module) -> tuple:
    c = model.config
    return (c.num_layers, c.hidden_size, tuple(c.heads(i) for i in range(c.num_layers)),
            tuple(c.ffn(i) for i in range(c.num_layers)))


def _where(accelerator: Accelerator) -> str:
    device = accelerator.device.type
    threads = torch.get_num_threads()
    if device == "cpu":
        each = f"{threads} thread{'s' if threads > 1 else ''}"
        return f"cpu ({each})" if accelerator.world == 1 else f"{accelerator.world} × cpu ({each} each)"
    return f"{accelerator.world} × {device}"


def estimate(ctx: Context, model_dir, teacher_dir, stages: list[str], timer: Timer | None = None) -> Estimate:
    """The time `stages` (the recipe's, from the first not yet done) will take, starting from the checkpoint
    in `model_dir` with `teacher_dir` as the teacher so far (None before a stage sets one); `timer`, one an
    estimate before used, to compare recipes by their work alone."""
    t0 = time.time()
    timer, result = timer or Timer(ctx), Estimate()
    labelled_before = set()  # (teacher, text, layers) a stage before had labelled: its teacher cache serves
    model = task_model(model_dir, ctx.task)
    teacher = task_model(teacher_dir, ctx.task) if teacher_dir is not None else None
    for name in stages:
        stage, options = STAGES.get(name), ctx.recipe.stage(name)
        if stage.fine_tunes and ctx.recipe.teacher:
            continue
        if stage.sets_teacher:
            teacher = model
        made = stage.shape(model, options) if stage.shape is not None else model
        work = stage.work(options, ctx.data) if stage.work is not None else Work()
        tries = len(stage.tries(options)) if stage.tries is not None else 1
        seconds = work.seconds
        labeller = model if teacher is None or work.labels_own_input else teacher
        cached = timer.distill(made, labeller, work.distill) if work.distill is not None and work.train else None
        if work.train:
            seconds += work.train * (cached[0] if cached else timer.train(made, work.config))
            result.on = _where(Accelerator.current(work.config))
        device, precision = (work.config.device, work.config.precision) if work.config is not None else ("cpu", "fp32")
        if work.infer:
            seconds += work.infer * timer.infer(made, device)
        per_label = cached[1] if cached else timer.infer(labeller, device, precision)
        text = (id(labeller), work.teacher, work.distill.augment if work.distill else None,
                tuple(cached_layers(resolve_layer_map(made, labeller, work.distill.layer_map), work.distill))
                if work.distill else ())
        labelled = work.teacher * per_label if work.teacher and text not in labelled_before else 0
        labelled_before.add(text)
        result.stages[name] = round(labelled + tries * seconds, 2)
        model = made
    result.stages["bundle"] = BUNDLE_S
    result.warmup_s = round(time.time() - t0, 1)
    return result
