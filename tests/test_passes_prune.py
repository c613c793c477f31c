"""Structured pruning: exact removal, zero-output equivalence, importance, budgets, resume."""

import pytest
import torch
from conftest import batch_of, roundtrip, tiny_data, tiny_model

from edgebert.data import TaskData
from edgebert.errors import EdgebertError
from edgebert.passes import (
    DistillConfig,
    PruneConfig,
    TrainConfig,
    importance,
    magnitude_prune,
    prune,
    remove_heads,
    remove_layers,
    remove_neurons,
    share_layers,
)
from edgebert.stats import flops

D = 8  # head size of the tiny model


def _run(result):
    return result.model, result.record


def outputs(model, items):
    model.eval()
    with torch.no_grad():
        return model(*batch_of(items))


def test_remove_heads_keeps_exactly_the_other_heads():
    model = tiny_model()
    before = model.encoder.encoder.layer[1].attention
    q, out = before.self.query.weight.clone(), before.output.dense.weight.clone()
    remove_heads(model, {1: [0, 2]})
    after = model.encoder.encoder.layer[1].attention
    kept = torch.cat([torch.arange(1 * D, 2 * D), torch.arange(3 * D, 4 * D)])
    assert torch.equal(after.self.query.weight, q[kept]) and torch.equal(after.output.dense.weight, out[:, kept])
    assert model.config.layer_heads == [4, 2, 4, 4] and after.self.heads == 2


def test_removing_a_silent_head_or_neuron_changes_nothing(tmp_path):
    model, items = tiny_model(), tiny_data(6)
    layer = model.encoder.encoder.layer[2]
    with torch.no_grad():
        layer.attention.output.dense.weight[:, 3 * D:] = 0  # head 3 of layer 2 contributes nothing
        layer.output.dense.weight[:, [5, 40]] = 0  # nor do FFN neurons 5 and 40
    reference = outputs(model, items)
    scores = importance(model, tiny_data(32), batches=2, batch_size=16)
    assert scores.heads[2][3] == 0 and scores.neurons[2][5] == 0 and scores.heads[2][:3].min() > 0
    remove_heads(model, {2: [3]})
    remove_neurons(model, {2: [5, 40]})
    assert model.config.layer_heads[2] == 3 and model.config.layer_ffn[2] == 62
    assert torch.allclose(outputs(model, items), reference, atol=1e-6)
    roundtrip(model, tmp_path)


def test_remove_layers_and_limits():
    model = tiny_model()
    remove_heads(model, {3: [0]})
    remove_layers(model, [0, 3])
    assert model.config.num_layers == 2 and model.config.layer_heads == [4, 4]
    with pytest.raises(EdgebertError, match="keep at least one"):
        remove_heads(model, {0: [0, 1, 2, 3]})
    with pytest.raises(EdgebertError, match="keep at least one"):
        remove_layers(model, [0, 1])
    with pytest.raises(EdgebertError, match="before `share`"):
        remove_heads(share_layers(tiny_model(), group_size=2), {0: [0]})


def test_prune_in_rounds_with_recovery_resumes_and_exports(tmp_path):
    data = tiny_data(64)
    cfg = PruneConfig(heads=0.5, ffn=0.5, layers=1, per_layer=True, rounds=2, sample_batches=2, batch_size=16,
                      recovery=DistillConfig(train=TrainConfig(steps=4, batch_size=16, progress=False, eval_every=2)))
    model, record = _run(prune(tiny_model(), cfg, TaskData(data, data[:16]), work_dir=tmp_path / "w"))
    assert record.details["after"] == {"layers": 3, "heads": [2, 2, 2], "ffn": [32, 32, 32]}
    assert [r["heads"] for r in record.details["rounds"]] == [[3, 3, 3, 3], [2, 2, 2]]
    assert record.params < record.details["before"]["params"] and record.steps == 8
    again, rerun = _run(prune(tiny_model(), cfg, TaskData(data, data[:16]), work_dir=tmp_path / "w"))  # reloads
    assert rerun.details["after"] == record.details["after"]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    roundtrip(model, tmp_path)


def test_budgets_and_global_ranking():
    data = TaskData(tiny_data(32))
    target = int(0.6 * flops(tiny_model().config, 64, 2))  # the tiny model's longest input is 64
    model, record = _run(prune(tiny_model(), PruneConfig(flops=target, recovery=None, sample_batches=2), data))
    assert record.flops_128 <= target and min(model.config.layer_heads) >= 1
    model, record = _run(prune(tiny_model(), PruneConfig(params=30_000, recovery=None, sample_batches=2), data))
    assert record.params <= 30_000
    with pytest.raises(EdgebertError, match="cannot be met"):
        prune(tiny_model(), PruneConfig(params=1_000, recovery=None), data)
    with pytest.raises(EdgebertError, match="fraction"):
        PruneConfig(heads=1.0)


def test_unstructured_pruning_is_size_only():
    model = tiny_model()
    sparsity = magnitude_prune(model, 0.5)
    assert 0.49 < sparsity < 0.52
    record = prune(tiny_model(), PruneConfig(unstructured=0.3, recovery=None), TaskData(tiny_data(32))).record
    assert record.details["unstructured_sparsity"] >= 0.3
    assert record.flops_128 == flops(tiny_model().config, 64, 2) and "FLOPs" in record.details["note"]
