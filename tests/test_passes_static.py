"""The static student: the teacher's token vectors, n-gram features over them, a maximum, a classifier."""

import types
from pathlib import Path

import pytest
import torch
from builders import PASS_SPECIALS, batch_of, roundtrip, tiny_data, tiny_model

from edgebert.checkpoint import hf_config_of
from edgebert.data import TaskData
from edgebert.errors import EdgebertError
from edgebert.passes import DistillConfig, TrainConfig
from edgebert.passes.static import StaticConfig, principal, static, static_shape, static_student, token_vectors

TOKENS = types.SimpleNamespace(cls_token_id=2, sep_token_id=3)  # PASS_SPECIALS' [CLS] and [SEP]


def options(**kw) -> StaticConfig:
    train = TrainConfig(steps=30, batch_size=16, lr=1e-2, eval_every=10, progress=False)
    return StaticConfig(**{"dim": 8, "ngram_features": 16, "distill": DistillConfig(train=train), **kw})


def test_the_table_is_the_teachers_token_vectors_reduced_and_weighted():
    teacher, data = tiny_model(), tiny_data(64)
    student = static_student(teacher, TaskData(data, tokenizer=TOKENS), options(sif=0.0))
    assert student.config.num_layers == 0 and student.config.hidden_size == 8
    vectors = token_vectors(teacher, 2, 3)
    with torch.no_grad():
        alone = teacher.encoder(torch.tensor([[2, 7, 3]]), torch.ones(1, 3, dtype=torch.long))[0, 1]
    assert torch.allclose(vectors[7], alone, atol=1e-5)  # each token read alone between [CLS] and [SEP]
    assert torch.allclose(student.encoder.embeddings.word_embeddings.weight, principal(vectors, 8))
    weighted = static_student(teacher, TaskData(data, tokenizer=TOKENS), options(sif=1e-3))
    scale = weighted.encoder.embeddings.word_embeddings.weight.norm(dim=1) / principal(vectors, 8).norm(dim=1)
    counts = torch.bincount(torch.cat([torch.tensor(d["input_ids"]) for d in data]), minlength=len(scale))
    rarest = counts[len(PASS_SPECIALS):].argmin() + len(PASS_SPECIALS)
    assert scale[2] < scale[rarest]  # [CLS], in every text, weighs least


def test_the_student_reads_word_order_and_not_its_padding():
    student = static_shape(tiny_model(), options()).eval()
    ids = torch.tensor([[2, 20, 5, 9, 3]])
    with torch.no_grad():
        out = student(ids, torch.ones_like(ids))
        swapped = ids[:, [0, 2, 1, 3, 4]]
        assert not torch.allclose(out, student(swapped, torch.ones_like(ids)))  # "not good" is not "good not"
        padded = torch.cat([ids, torch.zeros(1, 7, dtype=torch.long)], 1)
        mask = (padded != 0).long()
        assert torch.allclose(out, student(padded, mask), atol=1e-6)


def test_distillation_trains_it_and_it_saves_as_an_edgebert_model(tmp_path):
    teacher = tiny_model()
    data = TaskData(tiny_data(128), validation=tiny_data(32, seed=1), tokenizer=TOKENS)
    result = static(teacher, options(), data, work_dir=tmp_path)
    record = result.record
    assert record.name == "static" and record.details["static"]["ngram_window"] == 3
    history = [h[2]["accuracy"] for h in record.details["history"]]
    assert len(history) == 3 and record.params < sum(p.numel() for p in teacher.parameters())
    again = roundtrip(result.model, tmp_path)
    inputs = batch_of(tiny_data(4, seed=2))
    with torch.no_grad():
        assert torch.allclose(result.model.eval()(*inputs), again(*inputs))
    with pytest.raises(EdgebertError, match="static student .* is not a transformers model"):
        hf_config_of(result.model)


@pytest.mark.parametrize("model, kw, message", [
    (lambda: tiny_model("token-classification", num_labels=3), {}, "has no token-classification head"),
    (lambda: tiny_model(), {"dim": 64}, "static.dim 64 is wider than the teacher's 32"),
])
def test_what_a_static_student_cannot_be_is_refused(model, kw, message):
    with pytest.raises(EdgebertError, match=message):
        static_shape(model(), options(**kw))


@pytest.mark.parametrize("kw, message", [
    ({"ngram_window": 2}, "ngram_window must be odd"),
    ({"distill": DistillConfig(layers=2)}, "leave layers"),
])
def test_bad_options_are_one_line(kw, message):
    with pytest.raises(EdgebertError, match=message):
        StaticConfig(**kw)


def test_a_recipe_asking_a_static_student_for_tokens_is_refused_before_any_work(tiny_checkpoint):
    from edgebert.pipeline import recipe as recipes
    from edgebert.pipeline.context import context

    recipe = recipes.parse(f'task = "conll2003"\nmodel = "{tiny_checkpoint}"\nstages = ["static", "export"]')
    with pytest.raises(EdgebertError, match='has no token-classification head: drop "static" for the conll2003 task'):
        context(recipe, Path("never-made"), "no-data-folder-either")
