"""Distillation: student initialisation, losses, the teacher cache, task-agnostic (MLM) mode."""

import copy

import pytest
import torch
from builders import batch_of, roundtrip, sentences, tiny_config, tiny_data, tiny_model

from edgebert.data import TaskData
from edgebert.errors import EdgebertError
from edgebert.model import HeadConfig, build
from edgebert.passes import DistillConfig, TeacherCache, TrainConfig, distill, mlm_accuracy, pretraining_data
from edgebert.passes.distill import DistillObjective, cached_collate
from edgebert.passes.student import default_layers, init_student, resolve_layer_map
from edgebert.passes.train import Accelerator, collate


def config(**kw):
    train = TrainConfig(**{"steps": 6, "batch_size": 8, "lr": 1e-3, "progress": False, **kw.pop("train", {})})
    return DistillConfig(train=train, **kw)


def test_student_takes_every_kth_layer_and_the_largest_heads():
    teacher = tiny_model(num_layers=4)
    assert default_layers(2, teacher.config) == [2, 4]
    assert default_layers(4, tiny_config(num_layers=6)) == [2, 3, 5, 6]
    student = init_student(teacher, layers=2)
    assert student.config.num_layers == 2 and teacher.config.num_layers == 4
    for s, t in zip(student.encoder.encoder.layer, [teacher.encoder.encoder.layer[i] for i in (1, 3)]):
        assert torch.equal(s.attention.self.query.weight, t.attention.self.query.weight)
    narrow = init_student(teacher, keep_layers=[1, 4], heads=2, ffn=16)
    assert narrow.config.layer_heads == [2, 2] and narrow.config.layer_ffn == [16, 16]
    assert narrow.encoder.encoder.layer[0].attention.self.query.weight.shape == (2 * 8, 32)


def test_cache_is_computed_once_and_reused(tmp_path):
    teacher, data = tiny_model(), tiny_data(48)
    students = [init_student(teacher, layers=2) for _ in range(2)]
    calls = {"n": 0}
    teacher.register_forward_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
    cfg = config(hidden_weight=1.0, cache_dir=str(tmp_path / "cache"))
    first = distill(students[0], cfg, TaskData(data), teacher=teacher).record
    computed = calls["n"]
    assert computed > 0
    second = distill(students[1], cfg, TaskData(data), teacher=teacher).record
    assert calls["n"] == computed  # the second student never ran the teacher
    assert first.details["teacher_cache"] == second.details["teacher_cache"]
    assert len(list((tmp_path / "cache").iterdir())) == 1


def test_a_bf16_cache_is_its_own_and_labels_as_the_fp32_one_does(tmp_path):
    teacher, data = tiny_model(), tiny_data(24)
    fp32 = TeacherCache.build(teacher, data, [1, 2], tmp_path, progress=False)
    bf16 = TeacherCache.build(teacher, data, [1, 2], tmp_path, progress=False,
                              accelerator=Accelerator(precision="bf16"))
    assert bf16.folder != fp32.folder  # a run at the other precision never reads these labels
    logits, hidden = bf16.lookup(range(24), 32)
    want_logits, want_hidden = fp32.lookup(range(24), 32)
    assert logits.dtype == torch.float32 and torch.equal(logits.argmax(-1), want_logits.argmax(-1))
    assert torch.allclose(logits, want_logits, atol=0.05) and torch.allclose(hidden[2], want_hidden[2], atol=0.1)
    assert not torch.allclose(logits, want_logits, atol=0, rtol=0)  # it did run in bf16


def test_cached_and_online_teacher_give_the_same_loss(tmp_path):
    teacher, data = tiny_model(), tiny_data(24)
    student = init_student(teacher, layers=2)
    cfg = config(hidden_weight=1.0)
    layer_map = resolve_layer_map(student, teacher, None)
    cache = TeacherCache.build(teacher, data, sorted(layer_map.values()), tmp_path, progress=False)
    objective = DistillObjective(student, teacher, cfg, layer_map)
    cached = objective(cached_collate(student, cache)(data[:8], range(8), 0))
    online = objective(collate(student, data[:8], range(8)))
    assert torch.allclose(cached, online, rtol=1e-2)  # hidden states are cached in float16


@pytest.mark.filterwarnings("error")  # torch warns of a read-only array: the cache's rows are memory maps
def test_a_token_teachers_cache_gives_its_per_token_logits_zero_padded(tmp_path):
    teacher, data = tiny_model("token-classification", 3), tiny_data(12, task="token-classification")
    cache = TeacherCache.build(teacher, data, [1], tmp_path, progress=False)
    logits, hidden = cache.lookup(range(12), 20)
    with torch.no_grad():
        online = teacher.eval()(*batch_of(data))
    for i, item in enumerate(data):
        n = len(item["input_ids"])
        assert torch.allclose(logits[i, :n], online[i, :n], atol=1e-5)
        assert not logits[i, n:].any() and not hidden[1][i, n:].any()


@pytest.mark.parametrize("weights", [{"attention_weight": 1.0}, {"value_weight": 1.0, "relation_heads": 2},
                                     {"hidden_weight": 1.0}])
def test_intermediate_losses_vanish_for_an_identical_student(weights):
    teacher, data = tiny_model(), tiny_data(8)
    batch = collate(teacher, data, range(8))
    kw = dict(logit_weight=0.0, layer_map={i: i for i in range(5)}, **weights)
    same = DistillObjective(copy.deepcopy(teacher), teacher, config(**kw), kw["layer_map"])(batch)
    assert float(same.detach()) < 1e-7
    narrow = init_student(teacher, heads=2, ffn=32)  # unequal head counts: head-averaged attention
    assert float(DistillObjective(narrow, teacher, config(**kw), kw["layer_map"])(batch).detach()) > 1e-6


def test_narrower_hidden_student_gets_a_projection(tmp_path):
    teacher, data = tiny_model(), tiny_data(32)
    student = build(tiny_model().config.__class__(**{**teacher.config.to_dict(), "hidden_size": 16, "head_size": None,
                                                     "num_heads": 2, "num_layers": 2}), HeadConfig(num_labels=2))
    cfg = config(hidden_weight=1.0, value_weight=1.0, relation_heads=2, cache_dir=str(tmp_path))
    objective = DistillObjective(student, teacher, cfg, resolve_layer_map(student, teacher, None))
    assert set(objective.projections) == {"1", "2"}
    record = distill(student, cfg, TaskData(data, data[:16]), teacher=teacher).record
    assert "accuracy" in record.metrics
    roundtrip(student, tmp_path)


def test_distilled_student_learns_the_teacher(tmp_path):
    teacher, data = tiny_model(), tiny_data(64)
    student = tiny_model(num_layers=2, seed=1)  # random, so it starts far from the teacher
    ids, mask, types = batch_of(data[:16])

    @torch.no_grad()
    def gap():
        return float((student(ids, mask, types) - teacher(ids, mask, types)).abs().mean())

    before = gap()
    # fp32: under bf16 autocast (auto's on a CPU with bf16 hardware) these tiny models' gap grows in 30 steps, not
    # shrinks: this test is about the loss, not the precision
    trained = distill(student, config(train={"steps": 30, "lr": 3e-3, "precision": "fp32"}), TaskData(data),
                      teacher=teacher, work_dir=tmp_path).model
    assert trained is student and gap() < before
    roundtrip(student, tmp_path)


def test_task_agnostic_mlm_distillation(tiny_tokenizer, tmp_path):
    texts = sentences(40)
    data = pretraining_data(tiny_tokenizer, texts, max_length=24)
    teacher = tiny_model("masked-lm", vocab_size=len(tiny_tokenizer))
    result = distill(teacher, config(layers=2, label_weight=1.0, hidden_weight=1.0, attention_weight=1.0),
                     TaskData(data, data[:16], tiny_tokenizer))  # the student is made from the teacher
    student, record = result.model, result.record
    assert student.config.num_layers == 2 and teacher.config.num_layers == 4
    assert record.metrics == pytest.approx(mlm_accuracy(student, data[:16], tiny_tokenizer))  # of the returned model
    assert record.details["teacher_cache"] is None
    roundtrip(student, tmp_path)
    with pytest.raises(EdgebertError, match="tokenizer="):
        distill(student, config(), TaskData(data), teacher=teacher)


def test_mismatched_pairs_are_refused():
    data = TaskData(tiny_data(16))
    with pytest.raises(EdgebertError, match="same head"):
        distill(tiny_model(), config(), data, teacher=tiny_model("token-classification", 3))
    with pytest.raises(EdgebertError, match="out of range"):
        distill(tiny_model(), config(hidden_weight=1, layer_map={9: 1}), data, teacher=tiny_model())
    with pytest.raises(EdgebertError, match="needs a teacher"):
        distill(tiny_model(), config(), data)
    with pytest.raises(EdgebertError, match="drop teacher="):
        distill(tiny_model(), config(layers=2), data, teacher=tiny_model())
    with pytest.raises(EdgebertError, match="temperature must be positive"):
        config(temperature=0)
