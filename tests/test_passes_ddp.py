"""Scale-out: the same training loop under torchrun (2 CPU processes, gloo) matches one process,
for fine-tuning and for distillation from a cached teacher.

Run as a script, this file is the torchrun worker."""

import json
import subprocess
import sys
from pathlib import Path

import torch
from builders import tiny_data, tiny_model

from edgebert.data import TaskData
from edgebert.passes import DistillConfig, FinetuneConfig, TrainConfig, distill, finetune


def losses(cache: str) -> dict[str, list[float]]:
    """Per-step losses of short runs; the global batch is 16 whatever the process count."""
    torch.set_num_threads(1)
    train = TrainConfig(steps=5, batch_size=16, lr=3e-3, eval_every=1, progress=False)
    data = TaskData(tiny_data(96))
    tuned = finetune(tiny_model(), FinetuneConfig(train=train), data).record
    distilled = distill(tiny_model(), DistillConfig(train=train, layers=2, hidden_weight=1.0, cache_dir=cache),
                        data).record
    return {name: [loss for _, loss, _ in record.details["history"]]
            for name, record in (("finetune", tuned), ("distill", distilled))}


def test_two_processes_follow_the_single_process_loss_curve(tmp_path):
    out = tmp_path / "ddp.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__,
               str(out), str(tmp_path / "cache")]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, cwd=Path(__file__).parent)
    assert run.returncode == 0, run.stderr[-3000:]
    distributed = json.loads(out.read_text())
    single = losses(str(tmp_path / "cache"))  # reuses the cache the two processes wrote
    for name in ("finetune", "distill"):
        assert len(distributed[name]) == len(single[name]) == 5
        for a, b in zip(distributed[name], single[name]):
            assert abs(a - b) < 1e-4 * max(1.0, abs(b)), (name, distributed[name], single[name])
        assert len(set(single[name])) > 1  # the weights moved


if __name__ == "__main__":
    import torch.distributed as dist

    curves = losses(sys.argv[2])
    if dist.get_rank() == 0:
        Path(sys.argv[1]).write_text(json.dumps(curves))
    dist.destroy_process_group()
