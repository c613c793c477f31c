"""The one training loop every pass uses: AdamW, warmup/decay, bucketed batches, resumable, DDP-ready.

A pass describes *what* to minimise as an `Objective` (a module whose `forward(batch)` returns the
loss and whose `.model` is what the pass returns); this loop does the rest. Its state (weights,
optimizer, scheduler, step, RNG) is written to `work_dir` every `save_every` steps, so re-running
the same call after a kill continues where it stopped and ends with the same weights.

Where it runs is the `Accelerator`'s business (device, precision, rank), not the passes': it places the
objective and each batch on the device (`TrainConfig.device`), runs the forward pass under autocast
(`TrainConfig.precision`), and hands the model back on the CPU, where export and quantization work.
Under `torchrun` (WORLD_SIZE > 1) the objective is wrapped in DistributedDataParallel and every
global batch of `batch_size` examples is split across the ranks, so the loss curve matches a
single process with the same global batch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import random
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.optim.swa_utils import AveragedModel

from .. import checkpoint
from ..data import IGNORE, BucketBatchSampler, PadCollator, Task, compute_metrics, metric_of
from ..device_tests.metrics import points
from ..config import Config
from ..errors import EdgebertError
from ..model import TaskModel, embeddings, encoder_of
from ..progress import Progress
from ..stats import flops, nbytes, params


@dataclass(frozen=True, kw_only=True)
class TrainConfig(Config):
    """Optimisation and bookkeeping shared by every pass. `steps` counts global batches."""

    added = ("ema", "patience")

    steps: int = 1000
    batch_size: int = 32
    lr: float = 5e-5
    weight_decay: float = 0.01  # not applied to biases and LayerNorm weights
    warmup: float = 0.06  # a fraction of `steps` when < 1, else a step count
    clip: float = 1.0  # global gradient-norm clip; 0 = off
    eval_every: int = 0  # evaluate (and keep the best) every N steps; 0 = only at the end
    patience: int = 0  # with eval_every: stop once this many evaluations in a row found no new best (0 = never)
    save_every: int = 200  # write resumable state every N steps
    seed: int = 42
    freeze_word_embeddings: bool = False  # the V×E table is most of a small model and barely moves
    chunk_batches: int = 100  # length bucketing: batches are sorted by length within chunks this big
    progress: bool = True
    ema: float = 0.0  # > 0: evaluate, keep and return the weights' moving average (this decay a step), not the last
    device: str = "auto"  # auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:N or mps
    # the forward pass's: bf16 or fp16 autocast (fp16 with a gradient scaler, CUDA only), or fp32; auto: bf16 on a
    # CUDA GPU that has it, else fp16 on CUDA; bf16 on a CPU with AVX512-BF16 or AMX, else fp32 on CPU and MPS
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"

    def __post_init__(self):
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise EdgebertError(f"TrainConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise EdgebertError(f"TrainConfig.lr must be positive, got {self.lr}")
        if self.patience < 0 or (self.patience and not self.eval_every):
            raise EdgebertError(f"TrainConfig.patience counts evaluations: set eval_every too, and 0 or more "
                                f"(0 = never stop early), got patience {self.patience}, eval_every {self.eval_every}")
        if not 0 <= self.ema < 1:
            raise EdgebertError(f"TrainConfig.ema is a decay in [0, 1) (0 = off; 0.999 is usual), got {self.ema}")
        check_device(self.device)

    def key(self) -> dict:
        """What the trained weights depend on: the precision as resolved on this machine, left out at fp32 as in
        the runs cached before it (an fp32 and a bf16 run differ), and never the device (a CUDA run resumes a
        CPU run's stages)."""
        key = super().key()
        del key["device"], key["precision"]
        if self.ema:  # runs cached before the average warmed up (warmed_ema) kept barely trained weights in it
            key["ema_warmup"] = True
        precision = Accelerator.resolve(self.device)[1] if self.precision == "auto" else self.precision
        return key if precision == "fp32" else {**key, "precision": precision}


def warmed_ema(decay: float):
    """AveragedModel's update with its decay warming up, min(decay, (1 + n) / (10 + n)) after n updates, as
    TensorFlow's ExponentialMovingAverage does given num_updates: at a fixed 0.999 the barely trained first
    weights keep 0.999 ** steps of the average, half of it after 700 steps (a short fine-tune's whole run)."""

    def update(averaged: list[torch.Tensor], current: list[torch.Tensor], num_averaged: torch.Tensor) -> None:
        n = int(num_averaged)
        weight = 1 - min(decay, (1 + n) / (10 + n))
        for a, c in zip(averaged, current):
            a.lerp_(c, weight)

    return update


class Objective(nn.Module):
    """What a pass minimises: `forward(batch) -> scalar loss`; `model` is the network being trained.

    Extra trainable modules (e.g. distillation projections) live on the objective and are trained
    with the model but not returned."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model


@dataclass
class Record:
    """What a pass reports: size and cost of its output, the task metric, and how long it took."""

    name: str
    params: int
    bytes: int
    flops_128: int  # FLOPs per sequence of 128 tokens (stats.flops)
    metrics: dict = field(default_factory=dict)
    wall_s: float = 0.0
    steps: int = 0
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def ran_on(self) -> dict:
        """The device and precision a training pass's details say it used (a pass that trains others: theirs)."""
        return {k: self.details[k] for k in ("device", "precision") if k in self.details}


@dataclass
class Result:
    """What every pass returns: the model it made (often the input, changed in place) and its Record."""

    model: nn.Module
    record: Record


def measure(name: str, model: nn.Module, *, metrics: dict | None = None, wall_s: float = 0.0, steps: int = 0,
            details: dict | None = None) -> Record:
    """A Record of `model` as it is now."""
    labels = model.head.num_labels if isinstance(model, TaskModel) and model.head.kind not in ("masked-lm",
                                                                                              "embedding") else 0
    c = model.config
    return Record(name, params(model)["total"], nbytes(model), flops(c, min(128, c.max_length), labels),
                  dict(metrics or {}), round(wall_s, 2), steps, dict(details or {}))


# ---------------------------------------------------------------------------------------------
# Devices

CPU = torch.device("cpu")
DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def check_device(device: str) -> None:
    if not DEVICE.fullmatch(device):
        raise EdgebertError(f"unknown device {device!r}: use auto, cpu, cuda, cuda:N (the GPU's index) or mps")


def place(value, device: torch.device):
    """`value` (a module, moved in place; a tensor; dicts, lists and tuples of them) on `device`: the one way
    a pass moves anything. Tensors bound for a CUDA GPU go through pinned memory, so the copy is asynchronous."""
    if isinstance(value, nn.Module):
        return value.to(device)
    if isinstance(value, torch.Tensor):
        if value.device == device:
            return value
        if device.type == "cuda" and value.device.type == "cpu":
            return value.pin_memory().to(device, non_blocking=True)
        return value.to(device)
    if isinstance(value, dict):
        return {k: place(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(place(v, device) for v in value)
    return value


def device_of(model: nn.Module) -> torch.device:
    """Where `model`'s weights are: evaluation runs its batches there."""
    return next(model.parameters()).device


# ---------------------------------------------------------------------------------------------
# Data plumbing


def lengths_of(dataset: Sequence) -> list[int]:
    lengths = getattr(dataset, "lengths", None)
    return list(lengths) if lengths is not None else [len(dataset[i]["input_ids"]) for i in range(len(dataset))]


def collate(model: nn.Module, items: list[dict], indices: Sequence[int]) -> dict[str, torch.Tensor]:
    """Dynamic padding (data.PadCollator) plus the example indices, which the teacher cache looks up. Lengths are
    rounded up to a multiple of 8: each new shape costs PyTorch's CPU kernels fresh buffers and primitives, which
    with a shape per length took half a bf16 recovery's CPU time in system calls; 8 shapes cover 64 tokens."""
    c = encoder_of(model).config
    batch = PadCollator(c.pad_token_id, multiple=8, limit=c.max_length)(items)
    batch["index"] = torch.as_tensor(list(indices), dtype=torch.int64)
    return batch


def task_of(model: nn.Module, dataset: Sequence) -> Task:
    """The dataset's task (EncodedDataset has one), else one inferred from the model's head."""
    task = getattr(dataset, "task", None)
    if task is not None:
        return task
    head = model.head
    kind = head.kind if head.kind in ("embedding", "token-classification") else \
        "regression" if head.num_labels == 1 else "classification"
    labels = () if kind in ("embedding", "regression") else tuple(head.labels or map(str, range(head.num_labels)))
    return Task("custom", kind, labels, metric_of(kind, labels))


@torch.no_grad()
def predict(model: nn.Module, dataset: Sequence, *, batch_size: int = 64) -> list[torch.Tensor]:
    """Model outputs (on the CPU) for every item in dataset order, batched by length for speed, computed in
    float32 where the model is."""
    was_training = model.training
    model.eval()
    device = device_of(model)
    order = np.argsort(lengths_of(dataset), kind="stable")
    outputs: list[torch.Tensor | None] = [None] * len(dataset)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size].tolist()
        batch = place(collate(model, [dataset[i] for i in idx], idx), device)
        out = place(model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]), CPU)
        lengths = batch["attention_mask"].sum(1).tolist()
        for j, i in enumerate(idx):
            outputs[i] = out[j, : lengths[j]] if out.dim() == 3 else out[j]
    model.train(was_training)
    return outputs


def task_evaluator(model: nn.Module, dataset: Sequence | None) -> tuple[Callable | None, str | None]:
    """(evaluator, primary metric) for a labeled eval set, or (None, None) without one."""
    if dataset is None:
        return None, None
    if not isinstance(model, TaskModel) or model.head.kind not in ("sequence-classification", "token-classification",
                                                                   "embedding"):
        raise EdgebertError(f"eval data is scored with a task metric, which a {type(model).__name__} has none of: "
                            "pass eval data only for classifiers, token classifiers and embedders")
    return (lambda m: evaluate(m, dataset)), task_of(model, dataset).metric


def reported(model: nn.Module, data, chosen: dict) -> tuple[dict, dict]:
    """(metrics, details) a pass reports for the model "keep the best" chose by `chosen`, its metrics on
    `data.choose_on`. When that was a validation split, the eval split is scored now and the
    validation figures go in the details; otherwise the chosen metrics are the eval split's."""
    if data.validation is None or data.eval is None or not chosen:
        return chosen, {}
    return evaluate(model, data.eval), {"validation": chosen}


def evaluate(model: TaskModel, dataset: Sequence, *, batch_size: int = 64) -> dict[str, float]:
    """The task's metrics (data.compute_metrics) of `model` on a labeled dataset."""
    task = task_of(model, dataset)
    outputs = predict(model, dataset, batch_size=batch_size)
    labels = [dataset[i]["labels"] for i in range(len(dataset))]
    if task.kind == "embedding":  # sentence vectors; rows 2i and 2i+1 are a scored pair
        predictions = torch.stack(outputs).numpy()
    elif task.kind == "regression":
        predictions = [float(o.reshape(-1)[0]) for o in outputs]
    elif task.kind == "token-classification":
        width = max(len(l) for l in labels)
        predictions = np.full((len(labels), width), IGNORE)
        gold = np.full((len(labels), width), IGNORE)
        for i, (o, l) in enumerate(zip(outputs, labels)):
            predictions[i, : len(l)], gold[i, : len(l)] = o.argmax(-1).numpy(), l
        labels = gold
    else:
        predictions = [int(o.argmax(-1)) for o in outputs]
    return compute_metrics(task, predictions, labels)


# ---------------------------------------------------------------------------------------------
# The loop


@dataclass
class TrainResult:
    model: nn.Module  # the best model when evaluating, else the final one
    metrics: dict  # of the returned model
    history: list  # [step, mean loss since the last entry, metrics or None]
    steps: int  # the steps it ran: fewer than asked where `patience` stopped it
    wall_s: float
    ran_on: dict  # the device and precision it trained in (and on CUDA its peak memory)


AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def cpu_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AVX512-BF16 or AMX tiles): there bf16 autocast
    trains faster than fp32 (1.5x a MiniLM step on an AVX512-BF16 EPYC); on other CPUs bf16 is emulated and slower."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


@dataclass(frozen=True)
class Accelerator:
    """Where and how the loop runs: this process's rank among `world` (torchrun), its device and the
    precision of the forward pass. The loop and the passes ask this object and never spell any of them out."""

    rank: int = 0
    world: int = 1
    device: torch.device = CPU
    precision: str = "fp32"  # resolved: fp32, bf16 or fp16

    @classmethod
    def current(cls, config: TrainConfig) -> "Accelerator":
        """This process's, on `config`'s device and precision. Launched by torchrun, it joins the process group
        (`process`), and `cuda` means this process's own GPU, cuda:LOCAL_RANK."""
        device, precision = cls.resolve(config.device, config.precision)
        if device.type == "cuda" and device.index is None and cls.launched():
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        return replace(cls.process(), device=device, precision=precision)

    @staticmethod
    def launched() -> bool:
        """Whether torchrun started this process as one of several."""
        return int(os.environ.get("WORLD_SIZE", "1")) > 1

    @classmethod
    def process(cls) -> "Accelerator":
        """This process's rank and world, on the CPU: what a compile's driver asks, which trains nothing itself.
        Launched by torchrun, the process joins the process group once: gloo carries CPU tensors and, on a
        machine with CUDA, NCCL carries GPU ones, so one group serves every stage whatever its device."""
        if cls.launched() and not dist.is_initialized():
            dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
        return cls(dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else cls()

    @staticmethod
    def resolve(device: str = "auto", precision: str = "auto") -> tuple[torch.device, str]:
        """(device, fp32 | bf16 | fp16) that `device` and `precision` name on this machine; one EdgebertError
        for what it lacks."""
        check_device(device)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
        where = torch.device(device)
        if where.type == "cuda" and not torch.cuda.is_available():
            raise EdgebertError(f"device {device!r}: PyTorch sees no CUDA GPU on this machine (a CPU-only torch, or "
                                "no driver): train on cpu, or auto")
        if where.type == "cuda" and (where.index or 0) >= torch.cuda.device_count():
            raise EdgebertError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s), "
                                f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
        if where.type == "mps" and not torch.backends.mps.is_available():
            raise EdgebertError(f"device {device!r}: PyTorch sees no Apple GPU (MPS) on this machine: train on cpu, "
                                "or auto")
        cuda_bf16 = where.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
        if precision == "auto":
            precision = "bf16" if cuda_bf16 or (where.type == "cpu" and cpu_bf16()) else \
                "fp16" if where.type == "cuda" else "fp32"
        if precision == "fp16" and where.type != "cuda":
            raise EdgebertError(f"precision 'fp16' trains with a gradient scaler, on a CUDA GPU only: on {where.type} "
                                "use bf16 or fp32")
        if precision == "bf16" and where.type == "cuda" and not cuda_bf16:
            raise EdgebertError(f"precision 'bf16': the GPU {device!r} has no bfloat16 arithmetic: use fp16 or auto")
        return where, precision

    @property
    def main(self) -> bool:
        """Rank 0: the process that writes files and shows progress."""
        return self.rank == 0

    def place(self, value):
        """`value` (a module, tensors) on this device: see `place`."""
        return place(value, self.device)

    def shard(self, indices: list[int]) -> list[int]:
        """This rank's share of a global batch."""
        return indices[self.rank::self.world]

    def wrap(self, objective: nn.Module) -> nn.Module:
        """What the loop calls: the objective, under DistributedDataParallel across ranks."""
        ids = [self.device] if self.device.type == "cuda" else None  # one GPU per process
        return nn.parallel.DistributedDataParallel(objective, device_ids=ids) if self.world > 1 else objective

    def scaler(self) -> torch.amp.GradScaler:
        """fp16's gradient scaler (its small range underflows small gradients); a pass-through otherwise."""
        return torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")

    def autocast(self):
        """The forward pass at this precision: autocast to bf16 or fp16, or as it is at fp32."""
        return torch.autocast(self.device.type, dtype=AUTOCAST.get(self.precision), enabled=self.precision != "fp32")

    def loss(self, runner: nn.Module, batch: dict) -> torch.Tensor:
        """One batch's loss: the batch moved to the device, the forward pass under autocast, the loss in float32."""
        with self.autocast():
            return runner(self.place(batch)).float()

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of `value` over the ranks."""
        if self.world > 1:
            dist.all_reduce(value)
            value /= self.world
        return value

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def leave(self) -> None:
        """Leaves the process group once every rank has finished: gloo's worker threads, left to the
        interpreter's exit, can abort a process whose work is done ("terminate called without an active
        exception"). Never after an error, where a rank still waiting in a collective would hang it."""
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    def first(self, work: Callable[[], object]):
        """`work()` done by rank 0 alone while the others wait; every rank gets its result (pickled across),
        and an EdgebertError it raises is raised on every rank, so a refusal stops them all with its line."""
        if self.world == 1:
            return work()
        outcome = [None, None]  # result, error message
        if self.main:
            try:
                outcome[0] = work()
            except EdgebertError as e:
                outcome[1] = str(e)
        dist.broadcast_object_list(outcome, src=0)
        if outcome[1] is not None:
            raise EdgebertError(outcome[1])
        return outcome[0]

    @contextmanager
    def output(self, folder: Path, scratch: Path | None = None):
        """Where this rank writes what `folder` is to hold: rank 0 into `folder`, atomically (atomic_dir, its
        temporary folder in `scratch`), the others into a temporary folder deleted after: ranks that trained
        together made the same files, and rank 0's copy is the one kept (the others wait for it at a barrier
        before reading it)."""
        from edgebert.device_tests.files import atomic_dir

        if self.main:
            with atomic_dir(folder, scratch=scratch) as tmp:
                yield tmp
        else:
            with tempfile.TemporaryDirectory(prefix=f"edgebert-rank{self.rank}-") as tmp:
                yield Path(tmp)


def param_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: no weight decay on biases and LayerNorm weights; frozen tensors left out."""
    norm_weights = {id(m.weight) for m in module.modules() if isinstance(m, nn.LayerNorm)}
    decay, no_decay = [], []
    for name, p in module.named_parameters():  # shared tensors are yielded once
        if p.requires_grad:
            (no_decay if name.endswith("bias") or id(p) in norm_weights else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _schedule(config: TrainConfig) -> Callable[[int], float]:
    warmup = int(config.warmup * config.steps) if config.warmup < 1 else int(config.warmup)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (config.steps - step) / max(1, config.steps - warmup))

    return factor


def fingerprint(*parts, length: int = 16) -> str:
    """A short hash of JSON-able options, so a work dir is never resumed with different ones."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:length]


def _rng_state() -> dict:
    """RNG states as tensors and plain types, so the state file loads with weights_only=True."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss,
                                                      cached], "python": random.getstate()}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def _atomic_torch_save(obj, path: Path) -> None:
    from edgebert.device_tests.files import atomic_path

    with atomic_path(path) as tmp:  # a full disk or Ctrl-C leaves no half-written state behind
        torch.save(obj, tmp)


class _Run:
    """One call's training state: the optimizer and its schedule, the weights' moving average, the loss
    history and the best model so far; saved to `work` so a killed run resumes where it stopped."""

    def __init__(self, objective: Objective, config: TrainConfig, accelerator: Accelerator, work: Path | None,
                 key: str):
        self.objective, self.config, self.accelerator, self.work, self.key = objective, config, accelerator, work, key
        self.scaler = accelerator.scaler()
        # fused: one kernel for every tensor's update (a sixth of a small model's step on a CPU, else)
        self.optimizer = torch.optim.AdamW(param_groups(objective, config.weight_decay), lr=config.lr,
                                           fused=accelerator.device.type in ("cpu", "cuda"))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _schedule(config))
        # an exponential moving average of the weights (Polyak averaging) wanders less than the last step's
        self.average = (AveragedModel(objective.model, multi_avg_fn=warmed_ema(config.ema)) if config.ema else None)
        self.scored = self.average.module if self.average is not None else objective.model  # evaluated, kept, returned
        self.step, self.history, self.best, self.best_metrics, self.spent = 0, [], -math.inf, {}, 0.0
        self.best_state = None  # the best weights, in memory when there is no work dir
        self.started = time.time()

    @property
    def state_file(self) -> Path | None:
        return self.work / "state.pt" if self.work is not None else None

    def resume(self) -> None:
        """Continue from the state file, if the work dir has one of a run with the same key."""
        if self.state_file is None or not self.state_file.exists():
            return
        try:
            state = torch.load(self.state_file, map_location=CPU, weights_only=True)  # RNG states live there
        except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:  # truncated or foreign file
            raise EdgebertError(f"{self.state_file} cannot be read ({type(e).__name__}): delete it to start over") \
                from None
        if state["key"] != self.key:
            raise EdgebertError(f"{self.work} holds a run with other options or data: delete it or pass another "
                                "work_dir")
        self.objective.load_state_dict(state["objective"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.average is not None:
            self.average.load_state_dict(state["average"])
        if self.scaler.is_enabled():
            self.scaler.load_state_dict(state["scaler"])
        _set_rng_state(state["rng"])
        self.step, self.history, self.best = state["step"], state["history"], state["best"]
        self.best_metrics, self.spent = state["best_metrics"], state["wall_s"]

    def save(self, step: int) -> None:
        if self.state_file is None or not self.accelerator.main:
            return
        self.work.mkdir(parents=True, exist_ok=True)
        average = {"average": self.average.state_dict()} if self.average is not None else {}
        scaler = {"scaler": self.scaler.state_dict()} if self.scaler.is_enabled() else {}
        _atomic_torch_save({"key": self.key, "objective": self.objective.state_dict(),
                            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                            "rng": _rng_state(), "step": step, **average, **scaler, "history": self.history,
                            "best": self.best, "best_metrics": self.best_metrics, "wall_s": self.wall_s()},
                           self.state_file)

    def wall_s(self) -> float:
        return self.spent + time.time() - self.started

    def update(self, runner: nn.Module, batch: dict) -> float:
        """One optimizer step on `batch`; the loss, averaged over the ranks."""
        loss = self.accelerator.loss(runner, batch)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.config.clip:
            self.scaler.unscale_(self.optimizer)  # the clip is on the true gradients
            torch.nn.utils.clip_grad_norm_([p for g in self.optimizer.param_groups for p in g["params"]],
                                           self.config.clip)
        self.scaler.step(self.optimizer)  # skipped when fp16 gradients overflowed
        self.scaler.update()
        self.scheduler.step()
        if self.average is not None:
            self.average.update_parameters(self.objective.model)
        return float(self.accelerator.mean(loss.detach()))

    def evaluate(self, evaluator: Callable[[nn.Module], dict], metric: str) -> dict:
        """The scored model's metrics, keeping it when it is the best so far."""
        metrics = evaluator(self.scored)
        if metrics[metric] > self.best:
            self.best, self.best_metrics = metrics[metric], metrics
            if self.work is None:
                self.best_state = {k: v.clone() for k, v in self.scored.state_dict().items()}
            elif self.accelerator.main:
                checkpoint.save(self.scored, self.work / "best")
        return metrics

    def out_of_patience(self, metric: str | None) -> bool:
        """Whether the last `config.patience` evaluations all fell short of the best before them: training
        on would only pay for checkpoints "keep the best" does not keep."""
        scores = [m[metric] for _, _, m in self.history if m is not None] if metric else []
        return bool(self.config.patience and scores) and \
            len(scores) - 1 - scores.index(max(scores)) >= self.config.patience

    def final(self, evaluated: bool) -> nn.Module:
        """The model, holding the weights to return: the best kept, else the average, else the last."""
        model = self.objective.model
        if self.best_state is not None:
            model.load_state_dict(self.best_state)
        elif evaluated and self.work is not None and (self.work / "best").exists():
            model.load_state_dict(checkpoint.load(self.work / "best").state_dict())
        elif self.average is not None:
            model.load_state_dict(self.scored.state_dict())
        return model


def _batches(sampler: BucketBatchSampler, start: int, steps: int, accelerator: Accelerator):
    """(step, this rank's example indices) for the steps from `start`; the sampler reshuffles each epoch."""
    per_epoch, batches, epoch_of_batches = len(sampler), None, -1
    for step in range(start, steps):
        epoch, position = divmod(step, per_epoch)
        if epoch != epoch_of_batches:
            sampler.set_epoch(epoch)
            batches, epoch_of_batches = list(sampler), epoch
        yield step, accelerator.shard(batches[position])


def _check(config: TrainConfig, dataset: Sequence, accelerator: Accelerator, evaluator, metric) -> None:
    if config.batch_size % accelerator.world:
        raise EdgebertError(f"batch_size {config.batch_size} is not divisible by the {accelerator.world} processes: "
                            "use a multiple of the world size")
    if len(dataset) < config.batch_size:
        raise EdgebertError(f"{len(dataset)} training examples are fewer than one batch of {config.batch_size}: "
                            "lower batch_size or add data")
    if evaluator is not None and metric is None:
        raise EdgebertError("train(evaluator=...) needs the metric name to select the best model by")


def train(
    objective: Objective,
    dataset: Sequence,
    *,
    config: TrainConfig,
    collate_fn: Callable[[list[dict], Sequence[int], int], dict] | None = None,
    evaluator: Callable[[nn.Module], dict] | None = None,
    metric: str | None = None,
    work_dir: str | Path | None = None,
    key: str = "",
    name: str = "train",
) -> TrainResult:
    """Minimise `objective` over `dataset` for `config.steps` global batches.

    collate_fn(items, indices, step) builds a batch (default: dynamic padding); `step` lets a
    randomised collator (MLM masking) reseed, so a resumed run draws the same masks. With an
    `evaluator` (model -> metrics), the model is evaluated every `eval_every` steps and the best
    by `metric` (higher is better) is returned; with `config.ema` it is the moving average of the
    weights that is evaluated, kept and returned. `key` identifies the run's options: a work
    dir holding a run with another key is refused rather than silently mixed. `name` labels the
    progress bar. The objective trains on `config.device` and is handed back on the CPU.
    """
    accelerator = Accelerator.current(config)
    _check(config, dataset, accelerator, evaluator, metric)
    accelerator.place(objective)  # before the optimizer and the moving average are made of its weights
    model = objective.model
    if config.freeze_word_embeddings:
        embeddings(model).word.weight.requires_grad_(False)
    if collate_fn is None:
        def collate_fn(items, indices, step):
            return collate(model, items, indices)
    seed_all(config.seed)
    run = _Run(objective, config, accelerator, Path(work_dir) if work_dir is not None else None,
               fingerprint(key, config.key(), len(dataset), accelerator.world))
    sampler = BucketBatchSampler(lengths_of(dataset), config.batch_size, seed=config.seed,
                                 chunk_batches=config.chunk_batches, drop_last=True)
    run.resume()

    runner = accelerator.wrap(objective)
    if accelerator.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(accelerator.device)
    run.started = time.time()
    objective.train()
    progress = Progress(config.steps, name, initial=run.step, enabled=config.progress and accelerator.main)
    running, count, done = 0.0, 0, run.step
    last = run.step if run.out_of_patience(metric) else config.steps  # a resumed run that had stopped stays stopped
    for step, indices in _batches(sampler, run.step, last, accelerator):
        value = run.update(runner, collate_fn([dataset[i] for i in indices], indices, step))
        running, count = running + value, count + 1
        progress.show(loss=f"{value:.4f}")
        progress.update()
        done, stop = step + 1, False
        if done == config.steps or (config.eval_every and done % config.eval_every == 0):
            metrics = run.evaluate(evaluator, metric) if evaluator is not None else None
            run.history.append([done, running / max(count, 1), metrics])
            running, count = 0.0, 0
            if metrics is not None:
                progress.show(**{metric: f"{points(metrics[metric]):.2f}"})
                progress.write(f"step {done}: loss {run.history[-1][1]:.4f} {metric} {points(metrics[metric]):.2f}")
            stop = run.out_of_patience(metric)
        if done % config.save_every == 0 or done == config.steps or stop:
            run.save(done)
        if stop:
            progress.write(f"step {done}: stopped early: {config.patience} evaluations without a new best "
                           f"(its {metric} {points(run.best):.2f})")
            break
    progress.close()
    wall = run.wall_s()
    objective.eval()
    accelerator.barrier()  # rank 0 has written `best` before anyone reads it
    model = run.final(evaluator is not None)
    place(objective, CPU)  # the model and the objective's own modules (distillation projections)
    ran_on = {"device": str(accelerator.device), "precision": accelerator.precision}
    if accelerator.device.type == "cuda":  # what a smaller GPU would need
        ran_on["peak_gpu_bytes"] = torch.cuda.max_memory_allocated(accelerator.device)
    return TrainResult(model, run.best_metrics, run.history, done, wall, ran_on)
