"""ALBERT-style sharing and factorized embeddings: tied objects, counts, SVD error, recovery."""

import copy

import pytest
import torch
from builders import batch_of, roundtrip, tiny_data, tiny_model

from edgebert.data import TaskData
from edgebert.errors import EdgebertError
from edgebert.passes import (
    DistillConfig,
    ShareConfig,
    TrainConfig,
    evaluate,
    factorize_embeddings,
    remove_heads,
    share,
    share_layers,
    token_frequencies,
)
from edgebert.stats import params


def layer_params(layer, part):
    modules = [layer.attention] if part == "attention" else [layer.intermediate, layer.output]
    return sum(p.numel() for m in modules for p in m.parameters())


@pytest.mark.parametrize("parts", ["all", "attention", "ffn"])
def test_shared_layers_are_one_object_and_the_count_drops(parts):
    model = tiny_model()
    original = copy.deepcopy(model)
    layers = original.encoder.encoder.layer
    share_layers(model, group_size=2, parts=parts, init="mean")
    shared = model.encoder.encoder.layer
    kinds = ["attention", "ffn"] if parts == "all" else [parts]
    saved = sum(layer_params(layers[1], k) + layer_params(layers[3], k) for k in kinds)
    assert params(model)["total"] == params(original)["total"] - saved
    if "attention" in kinds:
        assert shared[0].attention is shared[1].attention and shared[1].attention is not shared[2].attention
        assert shared[2].attention.self.query.weight is shared[3].attention.self.query.weight
        mean = (layers[2].attention.self.query.weight + layers[3].attention.self.query.weight) / 2
        assert torch.allclose(shared[2].attention.self.query.weight, mean)
    else:
        assert shared[0].attention is not shared[1].attention
    if "ffn" in kinds:
        assert shared[0].intermediate.dense.weight is shared[1].intermediate.dense.weight
        assert shared[0].output.LayerNorm is shared[1].output.LayerNorm
    assert model.config.num_layers == 4


def test_member_init_and_whole_stack_sharing(tmp_path):
    model = tiny_model()
    third = model.encoder.encoder.layer[2].intermediate.dense.weight.clone()
    share_layers(model, group_size=0, init=2)
    assert len({id(layer.intermediate) for layer in model.encoder.encoder.layer}) == 1
    assert torch.equal(model.encoder.encoder.layer[0].intermediate.dense.weight, third)
    assert model.config.attention_groups == [0, 0, 0, 0]
    roundtrip(model, tmp_path)


def test_sharing_layers_of_different_widths_is_refused():
    model = remove_heads(tiny_model(), {0: [1]})
    with pytest.raises(EdgebertError, match="per_layer=True"):
        share_layers(model, group_size=2)
    with pytest.raises(EdgebertError, match="already shares"):
        share_layers(share_layers(tiny_model()), group_size=2)


def test_factorization_is_exact_for_low_rank_tables():
    model = tiny_model()
    emb = model.encoder.embeddings
    basis = torch.randn(3, 32)  # every table lives in one 3-dimensional row space
    with torch.no_grad():
        for table in (emb.word_embeddings, emb.position_embeddings, emb.token_type_embeddings):
            table.weight.copy_(torch.randn(table.weight.shape[0], 3) @ basis)
        emb.LayerNorm.weight.uniform_(0.5, 1.5)
        emb.LayerNorm.bias.uniform_(-0.1, 0.1)
    errors = factorize_embeddings(model, 8)
    assert errors["table_error"] < 1e-6 and errors["output_error"] < 1e-5
    assert emb.word_embeddings.weight.shape == (25, 8) and emb.projection.weight.shape == (32, 8)
    assert emb.LayerNorm.normalized_shape == (8,) and model.config.embedding_size == 8


def test_factorization_reports_the_error_it_makes(tmp_path):
    model = tiny_model()
    reference = copy.deepcopy(model.encoder.embeddings).eval()
    errors = factorize_embeddings(model, 16)
    assert 0 < errors["table_error"] < 1 and 0 < errors["output_error"] < 1
    ids, _, types = batch_of(tiny_data(64, seed=5))  # other inputs than the ones it measured on
    model.eval()
    with torch.no_grad():
        old, new = reference(ids, types), model.encoder.embeddings(ids, types)
    measured = float((new - old).norm() / old.norm())
    assert measured == pytest.approx(errors["output_error"], rel=0.5)
    assert measured == pytest.approx(errors["table_error"], rel=0.5)  # the estimate from discarded eigenvalues
    with pytest.raises(EdgebertError, match="already factorized"):
        factorize_embeddings(model, 8)
    with pytest.raises(EdgebertError, match="tied decoder"):
        factorize_embeddings(tiny_model("masked-lm"), 8)
    roundtrip(model, tmp_path)


def test_frequency_weighting_favours_the_tokens_the_data_uses():
    data = [{"input_ids": [2, 5, 6, 3], "token_type_ids": [0, 0, 0, 0]}] * 50
    frequencies = token_frequencies(tiny_model(), data)
    assert frequencies[0][5] == 51 and frequencies[1][:4].tolist() == [51] * 4 and frequencies[2].tolist() == [201, 1]
    uniform, weighted = tiny_model(), tiny_model()
    ids, _, types = batch_of(data[:1])
    with torch.no_grad():
        reference = uniform.encoder.embeddings.eval()(ids, types)
        factorize_embeddings(uniform, 10)
        factorize_embeddings(weighted, 10, frequencies=frequencies)
        errors = [float((m.encoder.embeddings.eval()(ids, types) - reference).norm() / reference.norm())
                  for m in (uniform, weighted)]
    assert errors[1] < 0.05 < errors[0], errors


def test_share_pass_records_size_not_flops_and_recovers(tmp_path):
    data = tiny_data(64)
    teacher = tiny_model()
    cfg = ShareConfig(group_size=2, init="best", embedding_size=16,
                      recovery=DistillConfig(train=TrainConfig(steps=4, batch_size=16, progress=False),
                                             hidden_weight=1.0, cache_dir=str(tmp_path / "cache")))
    result = share(copy.deepcopy(teacher), cfg, TaskData(data, data[:16]), teacher=teacher, work_dir=tmp_path / "w")
    model, record = result.model, result.record
    before = record.details["before"]
    assert record.params < before["params"] and record.bytes < before["bytes"]
    assert record.details["saved_params"] == before["params"] - record.params
    assert "not FLOPs" in record.details["note"] and set(record.details["init_scores"]) == {"mean", "0", "1"}
    assert record.flops_128 >= before["flops_128"]  # the E×H projection adds compute; sharing saves none
    assert "output_error" in record.details["factorization"] and "accuracy" in record.metrics
    assert model.encoder.encoder.layer[0].attention is model.encoder.encoder.layer[1].attention
    roundtrip(model, tmp_path)


def test_share_chooses_the_init_on_validation_and_reports_eval():
    data = tiny_data(64)
    flipped = [{**item, "labels": 1 - item["labels"]} for item in data[:16]]  # scores as 1 - eval accuracy
    model = tiny_model()
    record = share(model, ShareConfig(group_size=2, init="best", recovery=None),
                   TaskData(data, data[:16], validation=flipped)).record
    chosen = record.details["init_scores"][str(record.details["init"])]
    assert chosen == max(record.details["init_scores"].values())  # the best on validation
    assert record.metrics == record.details["before_recovery"] == evaluate(model, data[:16])  # eval is reported


# DeBERTa-v3's layout: relative disentangled attention, no position table (the family's own tests hold parity).
DEBERTA = dict(position="none", relative_terms=["c2p", "p2c"], relative_buckets=8, max_relative_positions=32,
               relative_norm=True, type_vocab_size=0)


def test_sharing_and_factorizing_a_model_without_a_position_table(tmp_path):
    model = tiny_model(**DEBERTA).eval()
    record = share(model, ShareConfig(group_size=2, embedding_size=16, recovery=None), None).record
    layers = model.encoder.encoder.layer
    assert layers[0].attention is layers[1].attention and model.config.embedding_size == 16
    assert model.encoder.embeddings.position_embeddings is None
    assert record.details["factorization"]["output_error"] < 1
    roundtrip(model, tmp_path)
