"""The one training loop every pass uses: AdamW, warmup/decay, bucketed batches, resumable, DDP-ready.

A pass describes *what* to minimise as an `Objective` (a module whose `forward(batch)` returns the
loss and whose `.model` is what the pass returns); this loop does the rest. Its state (weights,
optimizer, scheduler, step, RNG) is written to `work_dir` every `save_every` steps, so re-running
the same call after a kill continues where it stopped and ends with the same weights.

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
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from tqdm.auto import tqdm

from .. import checkpoint
from ..data import IGNORE, BucketBatchSampler, PadCollator, Task, compute_metrics
from ..device_tests.metrics import points
from ..config import Config
from ..errors import EdgebertError
from ..model import TaskModel, embeddings, encoder_of
from ..stats import flops, nbytes, params


@dataclass(frozen=True, kw_only=True)
class TrainConfig(Config):
    """Optimisation and bookkeeping shared by every pass. `steps` counts global batches."""

    added = ("ema",)

    steps: int = 1000
    batch_size: int = 32
    lr: float = 5e-5
    weight_decay: float = 0.01  # not applied to biases and LayerNorm weights
    warmup: float = 0.06  # a fraction of `steps` when < 1, else a step count
    clip: float = 1.0  # global gradient-norm clip; 0 = off
    eval_every: int = 0  # evaluate (and keep the best) every N steps; 0 = only at the end
    save_every: int = 200  # write resumable state every N steps
    seed: int = 42
    freeze_word_embeddings: bool = False  # the V×E table is most of a small model and barely moves
    chunk_batches: int = 100  # length bucketing: batches are sorted by length within chunks this big
    progress: bool = True
    ema: float = 0.0  # > 0: evaluate, keep and return the weights' moving average (this decay a step), not the last

    def __post_init__(self):
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise EdgebertError(f"TrainConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise EdgebertError(f"TrainConfig.lr must be positive, got {self.lr}")
        if not 0 <= self.ema < 1:
            raise EdgebertError(f"TrainConfig.ema is a decay in [0, 1) (0 = off; 0.999 is usual), got {self.ema}")


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
# Data plumbing


def lengths_of(dataset: Sequence) -> list[int]:
    lengths = getattr(dataset, "lengths", None)
    return list(lengths) if lengths is not None else [len(dataset[i]["input_ids"]) for i in range(len(dataset))]


def collate(model: nn.Module, items: list[dict], indices: Sequence[int]) -> dict[str, torch.Tensor]:
    """Dynamic padding (data.PadCollator) plus the example indices, which the teacher cache looks up."""
    batch = PadCollator(encoder_of(model).config.pad_token_id)(items)
    batch["index"] = torch.as_tensor(list(indices), dtype=torch.int64)
    return batch


def task_of(model: nn.Module, dataset: Sequence) -> Task:
    """The dataset's task (EncodedDataset has one), else one inferred from the model's head."""
    task = getattr(dataset, "task", None)
    if task is not None:
        return task
    head = model.head
    if head.kind == "embedding":
        return Task("custom", "embedding", (), "cosine_spearman")
    if head.kind == "token-classification":
        return Task("custom", "token-classification", tuple(head.labels or map(str, range(head.num_labels))),
                    "entity_f1")
    if head.num_labels == 1:
        return Task("custom", "regression", (), "pearson")
    return Task("custom", "classification", tuple(head.labels or map(str, range(head.num_labels))), "accuracy")


@torch.no_grad()
def predict(model: nn.Module, dataset: Sequence, *, batch_size: int = 64) -> list[torch.Tensor]:
    """Model outputs for every item in dataset order, batched by length for speed."""
    was_training = model.training
    model.eval()
    order = np.argsort(lengths_of(dataset), kind="stable")
    outputs: list[torch.Tensor | None] = [None] * len(dataset)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size].tolist()
        batch = collate(model, [dataset[i] for i in idx], idx)
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
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
    steps: int
    wall_s: float


def rank_world() -> tuple[int, int]:
    """(rank, world size); joins the process group (gloo) when launched by torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


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
    progress bar.
    """
    rank, world = rank_world()
    if config.batch_size % world:
        raise EdgebertError(f"batch_size {config.batch_size} is not divisible by the {world} processes: "
                            "use a multiple of the world size")
    model = objective.model
    if len(dataset) < config.batch_size:
        raise EdgebertError(f"{len(dataset)} training examples are fewer than one batch of {config.batch_size}: "
                            "lower batch_size or add data")
    if config.freeze_word_embeddings:
        embeddings(model).word.weight.requires_grad_(False)
    if collate_fn is None:
        def collate_fn(items, indices, step):
            return collate(model, items, indices)
    if evaluator is not None and metric is None:
        raise EdgebertError("train(evaluator=...) needs the metric name to select the best model by")
    seed_all(config.seed)

    optimizer = torch.optim.AdamW(param_groups(objective, config.weight_decay), lr=config.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(config))
    # an exponential moving average of the weights (Polyak averaging) wanders less than the last step's
    average = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(config.ema)) if config.ema else None
    scored = average.module if average is not None else model  # what is evaluated, kept and returned
    sampler = BucketBatchSampler(lengths_of(dataset), config.batch_size, seed=config.seed,
                                 chunk_batches=config.chunk_batches, drop_last=True)
    per_epoch = len(sampler)

    run_key = fingerprint(key, config.key(), len(dataset), world)
    work = Path(work_dir) if work_dir is not None else None
    state_file = work / "state.pt" if work else None
    start, history, best, best_metrics, spent = 0, [], -math.inf, {}, 0.0
    if state_file is not None and state_file.exists():
        try:
            state = torch.load(state_file, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:  # truncated or foreign file
            raise EdgebertError(f"{state_file} cannot be read ({type(e).__name__}): delete it to start over") from None
        if state["key"] != run_key:
            raise EdgebertError(f"{work} holds a run with other options or data: delete it or pass another work_dir")
        objective.load_state_dict(state["objective"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if average is not None:
            average.load_state_dict(state["average"])
        _set_rng_state(state["rng"])
        start, history, best, best_metrics = state["step"], state["history"], state["best"], state["best_metrics"]
        spent = state["wall_s"]

    def save_state(step: int) -> None:
        if state_file is None or rank != 0:
            return
        work.mkdir(parents=True, exist_ok=True)
        _atomic_torch_save({"key": run_key, "objective": objective.state_dict(), "optimizer": optimizer.state_dict(),
                            "scheduler": scheduler.state_dict(), "rng": _rng_state(), "step": step,
                            **({"average": average.state_dict()} if average is not None else {}),
                            "history": history, "best": best, "best_metrics": best_metrics,
                            "wall_s": spent + time.time() - t0}, state_file)

    best_state = None  # the best weights, in memory when there is no work dir

    def evaluate_now() -> dict:
        nonlocal best, best_metrics, best_state
        metrics = evaluator(scored)
        if metrics[metric] > best:
            best, best_metrics = metrics[metric], metrics
            if work is None:
                best_state = {k: v.clone() for k, v in scored.state_dict().items()}
            elif rank == 0:
                checkpoint.save(scored, work / "best")
        return metrics

    runner = objective
    if world > 1:
        runner = nn.parallel.DistributedDataParallel(objective)
    t0 = time.time()
    objective.train()
    # disable=None: a bar only on a terminal, so logs and CI output hold no \r frames
    bar = tqdm(total=config.steps, initial=start, disable=None if config.progress and rank == 0 else True, desc=name,
               dynamic_ncols=True)
    epoch_batches, epoch_of_batches, running, count = None, -1, 0.0, 0
    for step in range(start, config.steps):
        epoch, position = divmod(step, per_epoch)
        if epoch != epoch_of_batches:
            sampler.set_epoch(epoch)
            epoch_batches, epoch_of_batches = list(sampler), epoch
        indices = epoch_batches[position][rank::world]
        batch = collate_fn([dataset[i] for i in indices], indices, step)
        loss = runner(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.clip:
            torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], config.clip)
        optimizer.step()
        scheduler.step()
        if average is not None:
            average.update_parameters(model)
        value = loss.detach()
        if world > 1:
            dist.all_reduce(value)
            value /= world
        running, count = running + float(value), count + 1
        bar.update(1)
        bar.set_postfix(loss=f"{float(value):.4f}")
        done = step + 1
        if done == config.steps or (config.eval_every and done % config.eval_every == 0):
            metrics = evaluate_now() if evaluator is not None else None
            history.append([done, running / max(count, 1), metrics])
            running, count = 0.0, 0
            if metrics is not None and config.progress and rank == 0:
                bar.write(f"step {done}: loss {history[-1][1]:.4f} {metric} {points(metrics[metric]):.2f}",
                          file=sys.stderr)
        if done % config.save_every == 0 or done == config.steps:
            save_state(done)
    bar.close()
    wall = spent + time.time() - t0
    objective.eval()
    if world > 1:
        dist.barrier()  # rank 0 has written `best` before anyone reads it
    if best_state is not None:
        model.load_state_dict(best_state)
    elif evaluator is not None and work is not None and (work / "best").exists():
        model.load_state_dict(checkpoint.load(work / "best").state_dict())
    elif average is not None:
        model.load_state_dict(scored.state_dict())
    return TrainResult(model, best_metrics, history, config.steps, wall)
