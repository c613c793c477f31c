"""The shared training loop and fine-tuning: tasks, resume, best-model selection, errors."""

import pytest
import torch
from builders import roundtrip, tiny_data, tiny_model

from edgebert.errors import EdgebertError
from edgebert.data import TaskData
from edgebert.passes import FinetuneConfig, TrainConfig, finetune
from edgebert.passes.train import param_groups


def config(**kw):
    return FinetuneConfig(train=TrainConfig(**{"steps": 12, "batch_size": 8, "lr": 3e-3, "progress": False, **kw}))


@pytest.mark.parametrize("task,labels,kind,metric", [
    ("classification", 2, "sequence-classification", "accuracy"),
    ("pair-classification", 2, "sequence-classification", "accuracy"),
    ("regression", 1, "sequence-classification", "spearman"),
    ("token-classification", 3, "token-classification", "entity_f1"),
])
def test_finetune_every_task_kind(task, labels, kind, metric, tmp_path):
    model = tiny_model(kind, labels)
    data = tiny_data(64, task=task)
    result = finetune(model, config(eval_every=6), TaskData(data, data[:16]))
    model, record = result.model, result.record
    assert metric in record.metrics
    assert record.params == sum(p.numel() for p in model.parameters())
    assert record.flops_128 > 0 and record.steps == 12
    assert [h[0] for h in record.details["history"]] == [6, 12]
    roundtrip(model, tmp_path)


def test_the_best_is_chosen_on_validation_and_reported_on_eval():
    torch.manual_seed(0)
    data = tiny_data(256)
    flipped = [{**item, "labels": 1 - item["labels"]} for item in data[:64]]  # scores as 1 - eval accuracy
    record = finetune(tiny_model(), config(steps=100, batch_size=16, eval_every=25),
                      TaskData(data, data[:64], validation=flipped)).record
    chosen = [h[2]["accuracy"] for h in record.details["history"]]  # the validation figures
    assert record.details["validation"]["accuracy"] == max(chosen)
    assert record.metrics["accuracy"] == pytest.approx(1 - max(chosen))  # eval, of the chosen checkpoint
    assert record.metrics["accuracy"] < 1 - min(chosen)  # choosing on eval would have kept a better one


def test_finetune_learns_and_keeps_the_best():
    torch.manual_seed(0)
    data = tiny_data(256)
    record = finetune(tiny_model(), config(steps=100, batch_size=16, eval_every=50), TaskData(data, data[:64])).record
    accuracies = [h[2]["accuracy"] for h in record.details["history"]]
    assert record.metrics["accuracy"] == max(accuracies) > 0.9


def test_the_moving_average_of_the_weights_is_what_is_returned():
    data = tiny_data(64)
    seen = []  # the weights each training step's forward ran with: those after steps 0, 1, ... n - 1

    def record(module, inputs):
        seen.append({n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad})

    model = tiny_model()
    handle = model.register_forward_pre_hook(record)
    averaged = finetune(model, config(ema=0.8, steps=40), TaskData(data)).model  # the decay reaches 0.8 at 31
    handle.remove()
    last = finetune(tiny_model(), config(steps=40), TaskData(data)).model.state_dict()  # the same run, not averaged
    expected = {n: w.clone() for n, w in seen[1].items()}  # the average starts from the first step's weights
    for updates, weights in enumerate(seen[2:] + [{n: last[n] for n in expected}], start=1):
        decay = min(0.8, (1 + updates) / (10 + updates))  # warming up: the first weights fade fast
        for n, w in weights.items():
            expected[n].mul_(decay).add_(w, alpha=1 - decay)
    got = averaged.state_dict()
    for n, w in expected.items():
        assert torch.allclose(got[n], w, atol=1e-6), n
    assert not all(torch.allclose(got[n], last[n], atol=1e-4) for n in expected)  # not the last step's


def test_a_new_option_enters_keys_only_when_set():
    """Config.added: runs cached before `ema` (or `patience`) existed keep their keys; a run that sets it gets its
    own."""
    # fp32, as every run cached before `ema` trained (auto is bf16 on a CPU with bf16 hardware: test_device_placement)
    plain, averaged = FinetuneConfig(train=TrainConfig(precision="fp32")), \
        FinetuneConfig(train=TrainConfig(ema=0.99, precision="fp32"))
    assert "ema" not in plain.key()["train"] and averaged.key()["train"]["ema"] == 0.99
    assert "ema_warmup" not in plain.key()["train"] and averaged.key()["train"]["ema_warmup"]
    patient = FinetuneConfig(train=TrainConfig(eval_every=10, patience=3, precision="fp32"))
    assert "patience" not in plain.key()["train"] and patient.key()["train"]["patience"] == 3
    # device and precision: test_device_placement
    assert plain.key()["train"] == {k: v for k, v in plain.to_dict()["train"].items()
                                    if k not in ("ema", "patience", "device", "precision")}
    with pytest.raises(EdgebertError, match="TrainConfig.ema is a decay"):
        TrainConfig(ema=1.0)


def test_patience_stops_when_validation_stops_improving_and_a_resume_stays_stopped(tmp_path):
    torch.manual_seed(0)
    data = tiny_data(256)
    flipped = [{**item, "labels": 1 - item["labels"]} for item in data[:64]]  # falls as the model learns
    task = TaskData(data, data[:64], validation=flipped)
    run = config(steps=300, batch_size=16, eval_every=10, patience=2)
    record = finetune(tiny_model(), run, task, work_dir=tmp_path).record
    scores = [h[2]["accuracy"] for h in record.details["history"]]
    assert record.steps == 10 * len(scores) < 300
    assert scores.index(max(scores)) == len(scores) - 3  # the best, then two evaluations below it: stopped there
    assert record.details["validation"]["accuracy"] == max(scores)  # the best is what it returns
    again = finetune(tiny_model(), run, task, work_dir=tmp_path).record  # --resume: nothing more to train
    assert again.steps == record.steps and again.details["history"] == record.details["history"]
    assert again.details["validation"] == record.details["validation"]
    with pytest.raises(EdgebertError, match="patience counts evaluations: set eval_every"):
        TrainConfig(patience=2)


@pytest.mark.parametrize("ema", [0.0, 0.9])
def test_resume_after_interruption_matches_uninterrupted(ema, tmp_path):
    data = tiny_data(96)
    common = {"steps": 10, "save_every": 4, "freeze_word_embeddings": True, "ema": ema}
    whole = finetune(tiny_model(), config(**common), TaskData(data), work_dir=tmp_path / "whole").model

    class Stop(Exception):
        pass

    interrupted = tiny_model()
    calls = {"n": 0}

    def bomb(module, inputs, output):
        calls["n"] += 1
        if calls["n"] == 7:  # dies during step 7, after the state of step 4 was saved
            raise Stop

    handle = interrupted.register_forward_hook(bomb)
    with pytest.raises(Stop):
        finetune(interrupted, config(**common), TaskData(data), work_dir=tmp_path / "resumed")
    handle.remove()
    assert (tmp_path / "resumed" / "state.pt").exists()
    resumed = finetune(tiny_model(), config(**common), TaskData(data), work_dir=tmp_path / "resumed").model
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name
    assert torch.equal(resumed.encoder.embeddings.word_embeddings.weight,
                       tiny_model().encoder.embeddings.word_embeddings.weight)  # frozen


def test_work_dir_with_other_options_is_refused(tmp_path):
    data = tiny_data(32)
    finetune(tiny_model(), config(steps=2), TaskData(data), work_dir=tmp_path)
    with pytest.raises(EdgebertError, match="other options"):
        finetune(tiny_model(), config(steps=3), TaskData(data), work_dir=tmp_path)


def test_no_weight_decay_on_bias_and_layernorm():
    model = tiny_model()
    decay, no_decay = param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].endswith("weight") and "LayerNorm" not in names[id(p)] for p in decay["params"])
    assert any("LayerNorm.weight" in names[id(p)] for p in no_decay["params"])


def test_bad_input_is_one_clear_error():
    with pytest.raises(EdgebertError, match="fewer than one batch"):
        finetune(tiny_model(), config(), TaskData(tiny_data(4)))
    with pytest.raises(EdgebertError, match="steps must be at least 1"):
        TrainConfig(steps=0)
    with pytest.raises(EdgebertError, match="takes no teacher"):
        finetune(tiny_model(), config(), TaskData(tiny_data(16)), teacher=tiny_model())
