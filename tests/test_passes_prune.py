"""Structured pruning: exact removal, zero-output equivalence, importance, budgets, resume."""

import pytest
import torch
from builders import batch_of, roundtrip, tiny_data, tiny_model

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


MODERN = dict(type_vocab_size=0, pre_ln=True, position="rotary", attention_window=4, global_every=2, gated_ffn=True,
              bias=False, first_attention_norm=False)


@pytest.mark.parametrize("kind,changes", [("sequence-classification", {}), ("masked-lm", {}),
                                          ("sequence-classification", MODERN),
                                          ("token-classification", {"embedding_size": 16, "num_labels": 3}),
                                          ("embedding", {})])
def test_removing_zeroed_hidden_units_changes_nothing(kind, changes, tmp_path):
    from edgebert.model import LayerNorm, hidden_parts
    from edgebert.passes.surgery import remove_hidden

    model, items, units = tiny_model(kind, **changes).eval(), tiny_data(6), [3, 7, 20]
    with torch.no_grad():  # hidden units 3, 7 and 20 carry zeros everywhere
        for module, dims in hidden_parts(model):
            for dim in dims:
                module.weight.index_fill_(dim if module.weight.dim() == 2 else 0, torch.tensor(units), 0.0)
                if dim == 0 and getattr(module, "bias", None) is not None:
                    module.bias[units] = 0
    reference = outputs(model, items)
    reference = reference[0] if isinstance(reference, tuple) else reference
    kept = [j for j in range(32) if j not in units]
    if kind != "masked-lm":  # prune scores classifiers only
        task = "token-classification" if kind == "token-classification" else "classification"
        scores = importance(model, tiny_data(32, task=task), batches=1, batch_size=16).hidden
        assert scores[units].max() == 0 and scores[kept].min() > 0
    with torch.no_grad():
        hidden = model.encoder(*batch_of(items))[..., kept]
    remove_hidden(model, units)
    assert model.config.hidden_size == 29 and model.config.norm_width == 32
    after = outputs(model, items)
    assert torch.allclose(after[0] if isinstance(after, tuple) else after, reference, atol=1e-5)
    if kind == "embedding":  # its vectors stay 32 wide, through a projection the saved head declares
        assert model.head.vector_width == 32 and model.projection.in_features == 29
        from edgebert.passes.teacher import TeacherCache

        cache = TeacherCache.build(model, items, [], tmp_path / "cache", progress=False)  # as a teacher, too
        assert torch.allclose(torch.from_numpy(cache.logits[:].astype("float32")), reference, atol=1e-2)
    roundtrip(model, tmp_path)  # the narrowed shape saves, reloads with the same statistics, and exports
    # The LayerNorms still average over 32 units; renormalising over the 29 left would change every output.
    norms = [m for m in model.modules() if isinstance(m, LayerNorm) and m.stats_width]
    assert norms and all(m.stats_width == 32 for m in norms)
    for m in norms:
        m.stats_width = None
    with torch.no_grad():
        assert not torch.allclose(model.encoder(*batch_of(items)), hidden, atol=1e-2)


def test_width_pruning_refusals():
    from edgebert.passes.surgery import remove_hidden

    with pytest.raises(EdgebertError, match="removing all 32 hidden units of the model"):
        remove_hidden(tiny_model(), list(range(32)))
    with pytest.raises(EdgebertError, match="PruneConfig.width is a fraction"):
        PruneConfig(width=1.0)


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
    cfg = PruneConfig(heads=0.5, ffn=0.5, layers=1, width=0.25, per_layer=True, rounds=2, sample_batches=2,
                      batch_size=16,
                      recovery=DistillConfig(train=TrainConfig(steps=4, batch_size=16, progress=False, eval_every=2)))
    model, record = _run(prune(tiny_model(), cfg, TaskData(data, data[:16]), work_dir=tmp_path / "w"))
    assert record.details["after"] == {"layers": 3, "hidden": 24, "heads": [2, 2, 2], "ffn": [32, 32, 32]}
    assert [r["heads"] for r in record.details["rounds"]] == [[3, 3, 3, 3], [2, 2, 2]]
    assert [r["hidden"] for r in record.details["rounds"]] == [28, 24] and model.config.norm_width == 32
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
    with pytest.raises(EdgebertError, match="tries = 2 is the compile's"):  # one stage per seed, cached apart
        prune(tiny_model(), PruneConfig(heads=0.5, tries=2), data)


def test_unstructured_pruning_is_size_only():
    model = tiny_model()
    sparsity = magnitude_prune(model, 0.5)
    assert 0.49 < sparsity < 0.52
    record = prune(tiny_model(), PruneConfig(unstructured=0.3, recovery=None), TaskData(tiny_data(32))).record
    assert record.details["unstructured_sparsity"] >= 0.3
    assert record.flops_128 == flops(tiny_model().config, 64, 2) and "FLOPs" in record.details["note"]


def test_recovery_from_a_given_teacher_on_the_int4_word_grid(tmp_path):
    from edgebert.model import embeddings
    from edgebert.passes.int4 import int4_grid

    data = TaskData(tiny_data(64), tiny_data(16, seed=1))
    train = TrainConfig(steps=12, lr=3e-3, batch_size=16, progress=False, eval_every=12, freeze_word_embeddings=True)
    cfg = PruneConfig(heads=0.5, recover_from="teacher", int4_words=32, sample_batches=2, batch_size=16,
                      recovery=DistillConfig(train=train, temperature=1.0))
    with pytest.raises(EdgebertError, match="pass teacher="):
        prune(tiny_model(), cfg, data)
    table = embeddings(tiny_model()).word.weight.detach().clone()
    teacher = tiny_model()
    with torch.no_grad():  # a teacher sure of label 0 everywhere
        teacher.classifier.bias.copy_(torch.tensor([8.0, -8.0]))

    def leaning(model):  # how far the model leans to label 0 on the eval sentences
        logits = outputs(model, data.eval)
        return float((logits[:, 0] - logits[:, 1]).mean())

    from_teacher = prune(tiny_model(), cfg, data, teacher=teacher, work_dir=tmp_path / "t").model
    from_unpruned = prune(tiny_model(), cfg.replace(recover_from="unpruned"), data, work_dir=tmp_path / "u").model
    assert leaning(from_teacher) > leaning(from_unpruned) + 0.5
    word = embeddings(from_teacher).word.weight.detach()
    assert torch.equal(word, int4_grid(table, 32)) and not torch.equal(word, table)  # on the grid, and stayed there
    assert max(len(torch.unique(block)) for block in word.reshape(-1, 32)) <= 15
    with pytest.raises(EdgebertError, match="freeze_word_embeddings = true"):
        PruneConfig(int4_words=32)
    with pytest.raises(EdgebertError, match="int4_words 48: use one of"):
        cfg.replace(int4_words=48)
    with pytest.raises(EdgebertError, match="recover_from 'student'"):
        cfg.replace(recover_from="student")


def test_the_recovery_shows_its_progress_as_prune(capsys, tmp_path):
    """A person watching a compile sees the stage they are in, not the pass it calls."""
    data = tiny_data(64)
    cfg = PruneConfig(heads=0.5, sample_batches=2, batch_size=16,
                      recovery=DistillConfig(train=TrainConfig(steps=4, batch_size=16, eval_every=2)))
    prune(tiny_model(), cfg, TaskData(data, data[:16]), work_dir=tmp_path / "w")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("edgebert: ")]
    assert lines and all(line.startswith(("edgebert: prune: ", "edgebert: teacher cache: ")) for line in lines)
    assert any(line.startswith("edgebert: prune: 4/4 (100%)") for line in lines)


def test_layerwise_recovery_matches_each_surviving_layer_to_the_one_it_was(tmp_path):
    """Recovery from the unpruned model compares hidden states layer to layer: a kept layer's target is its
    own former output (kept by importance), not an evenly spread teacher layer."""
    from edgebert.passes.surgery import layer_choice

    data = TaskData(tiny_data(64), tiny_data(16, seed=1))
    train = TrainConfig(steps=2, batch_size=16, progress=False, eval_every=2)
    cfg = PruneConfig(layers=2, sample_batches=2, batch_size=16,
                      recovery=DistillConfig(train=train, hidden_weight=1.0))
    scores = importance(tiny_model(), data.train, batches=2, batch_size=16, seed=cfg.seed + 1)
    kept = layer_choice(tiny_model().config, 2, lambda j, i: float(scores.layers[i]))
    assert kept != [1, 3]  # what an even spread over 4 layers would map 2 layers to: the test tells them apart
    record = prune(tiny_model(), cfg, data, work_dir=tmp_path / "w").record
    assert record.details["rounds"][0]["layer_map"] == {1: kept[0] + 1, 2: kept[1] + 1}
    given = cfg.recovery.replace(layer_map={1: 2, 2: 4})  # a map the recipe gives is kept
    record = prune(tiny_model(), cfg.replace(recovery=given), data, work_dir=tmp_path / "g").record
    assert record.details["rounds"][0]["layer_map"] == {1: 2, 2: 4}
