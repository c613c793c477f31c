"""Devices and precision: the Accelerator resolves them, refuses what this machine lacks in one line, places
modules and batches, trains bf16 on the CPU, and keeps the keys of fp32 runs as they were."""

from pathlib import Path

import pytest
import torch
from builders import tiny_data, tiny_model

from edgebert.data import TaskData
from edgebert.errors import EdgebertError
from edgebert.passes import DistillConfig, FinetuneConfig, PruneConfig, TrainConfig, finetune, prune
from edgebert.passes.train import CPU, Accelerator, place
from edgebert.pipeline import recipe as recipes
from edgebert.pipeline.stages import STAGES

GPU = torch.cuda.is_available() or torch.backends.mps.is_available()


@pytest.mark.skipif(GPU, reason="auto takes the GPU here")
def test_auto_is_the_cpu_in_bf16_where_it_has_bf16_hardware_else_fp32_on_a_machine_without_a_gpu():
    flags = Path("/proc/cpuinfo").read_text().split()
    native = "bf16" if "amx_bf16" in flags or "avx512_bf16" in flags else "fp32"
    assert Accelerator.resolve() == (CPU, native)
    accelerator = Accelerator.current(TrainConfig())
    assert (accelerator.device, accelerator.precision) == (CPU, native)
    assert Accelerator.resolve("cpu", "fp32") == (CPU, "fp32")  # asked for, on any CPU


@pytest.mark.skipif(GPU, reason="this machine has a GPU")
@pytest.mark.parametrize("device,precision,message", [
    ("cuda", "auto", "device 'cuda': PyTorch sees no CUDA GPU"),
    ("cuda:3", "fp32", "device 'cuda:3': PyTorch sees no CUDA GPU"),
    ("mps", "auto", "device 'mps': PyTorch sees no Apple GPU"),
    ("cpu", "fp16", "precision 'fp16' trains with a gradient scaler, on a CUDA GPU only"),
])
def test_what_this_machine_lacks_is_refused_in_one_line(device, precision, message):
    config = FinetuneConfig(train=TrainConfig(steps=2, batch_size=8, device=device, precision=precision))
    with pytest.raises(EdgebertError, match=message) as refused:
        finetune(tiny_model(), config, TaskData(tiny_data(16)))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("device", ["gpu", "cuda:", "CPU", "cuda:one"])
def test_a_device_that_is_no_device_is_one_clear_error(device):
    with pytest.raises(EdgebertError, match=f"unknown device '{device}': use auto, cpu, cuda, cuda:N"):
        TrainConfig(device=device)
    with pytest.raises(EdgebertError, match="TrainConfig.precision: unknown precision 'fp8'"):
        TrainConfig(precision="fp8")


def test_the_accelerator_places_batches_and_modules():
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "teacher_hidden": {1: torch.zeros(2, 3, 4)},
             "pair": (torch.zeros(1), 7)}
    assert Accelerator().place(batch)["input_ids"] is batch["input_ids"]  # on the CPU already: no copy
    moved = place(batch, torch.device("meta"))  # a real move, without a GPU
    assert moved["input_ids"].device.type == moved["teacher_hidden"][1].device.type == "meta"
    assert isinstance(moved["pair"], tuple) and moved["pair"][0].device.type == "meta" and moved["pair"][1] == 7
    assert batch["input_ids"].device == CPU  # the original is untouched
    model = tiny_model()
    assert place(model, torch.device("meta")) is model and next(model.parameters()).device.type == "meta"


def test_bf16_training_on_the_cpu_learns_and_its_record_says_so():
    torch.manual_seed(0)
    data = tiny_data(256)
    config = FinetuneConfig(train=TrainConfig(steps=100, batch_size=16, lr=3e-3, eval_every=50, progress=False,
                                              precision="bf16"))
    result = finetune(tiny_model(), config, TaskData(data, data[:64]))
    assert result.record.details["device"] == "cpu" and result.record.details["precision"] == "bf16"
    assert result.record.metrics["accuracy"] > 0.9
    assert all(p.dtype == torch.float32 and p.device == CPU for p in result.model.parameters())  # as export wants


def test_keys_hold_the_precision_when_it_is_not_fp32_and_never_the_device():
    def key(**options):
        return FinetuneConfig(train=TrainConfig(lr=5e-5, eval_every=300, **options)).key()["train"]

    plain = key(precision="fp32")
    assert "device" not in plain and "precision" not in plain  # as before these options existed
    assert key(device="cuda:1", precision="fp32") == plain  # a CUDA fp32 run resumes a CPU fp32 run's stages
    assert key(precision="bf16") == {**plain, "precision": "bf16"}
    if not GPU:  # auto is this CPU's: bf16 with AVX512-BF16 or AMX, else fp32
        assert FinetuneConfig().key()["train"] == key(precision=Accelerator.resolve()[1])


def test_the_recipe_trains_where_the_flags_say_and_keeps_its_keys_when_they_change_nothing():
    recipe = recipes.load(recipes.RECIPES / "sst2-minilm.toml")
    keys = {name: STAGES.get(name).cache_key(recipe) for name in recipe.stages}
    native = Accelerator.resolve("cpu")[1]  # what auto is on this CPU
    assert {name: STAGES.get(name).cache_key(recipes.with_device(recipe, "cpu", native)) for name in recipe.stages} \
        == keys
    other = "fp32" if native == "bf16" else "bf16"
    moved = recipes.with_device(recipe, "cpu", other)
    assert moved.stage("prune").recovery.train.precision == other  # however deep the training options are
    changed = {name for name in recipe.stages if STAGES.get(name).cache_key(moved) != keys[name]}
    assert changed == {name for name in recipe.stages if STAGES.get(name).trains}


def test_a_pass_that_trains_through_distillation_records_the_precision_of_its_recovery(tmp_path):
    data = tiny_data(64)
    recovery = DistillConfig(hidden_weight=1.0, train=TrainConfig(steps=4, batch_size=16, progress=False,
                                                                  precision="bf16"))
    record = prune(tiny_model(), PruneConfig(heads=0.5, sample_batches=2, recovery=recovery), TaskData(data, data[:16]),
                   work_dir=tmp_path).record  # the teacher's cached float32 states against a bf16 student
    assert (record.details["device"], record.details["precision"]) == ("cpu", "bf16")
    assert record.details["rounds"][0]["precision"] == "bf16"
