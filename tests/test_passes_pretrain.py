"""MLM (+ NSP) pretraining: reproducible masks, resume, NSP pairs, save/export."""

import pytest
import torch
from builders import roundtrip, sentences, tiny_model

from edgebert.data import TaskData
from edgebert.errors import EdgebertError
from edgebert.passes import PretrainConfig, TrainConfig, mlm_accuracy, pretrain, pretraining_data
from edgebert.passes.pretrain import mlm_collate


def config(**kw):
    return PretrainConfig(train=TrainConfig(**{"steps": 6, "batch_size": 8, "lr": 3e-3, "progress": False, **kw}))


def test_mlm_pretraining_improves_masked_accuracy(tiny_tokenizer, tmp_path):
    data = pretraining_data(tiny_tokenizer, sentences(96), max_length=24)
    model = tiny_model("masked-lm", vocab_size=len(tiny_tokenizer))
    before = mlm_accuracy(model, data[:32], tiny_tokenizer)["mlm_loss"]
    record = pretrain(model, config(steps=30, eval_every=15), TaskData(data, data[:32], tiny_tokenizer)).record
    assert record.metrics["mlm_loss"] < before and 0 <= record.metrics["mlm_accuracy"] <= 1
    roundtrip(model, tmp_path)


def test_masks_depend_only_on_seed_and_step(tiny_tokenizer):
    data = pretraining_data(tiny_tokenizer, sentences(8), max_length=24)
    a, b = mlm_collate(tiny_tokenizer, 0.15, 1), mlm_collate(tiny_tokenizer, 0.15, 1)
    a(data, range(8), 0)
    assert torch.equal(a(data, range(8), 3)["labels"], b(data, range(8), 3)["labels"])
    assert not torch.equal(a(data, range(8), 3)["labels"], a(data, range(8), 4)["labels"])


def test_nsp_head_trains_on_sentence_pairs_and_resumes(tiny_tokenizer, tmp_path):
    documents = [sentences(6, seed=s) for s in range(8)]
    data = pretraining_data(tiny_tokenizer, documents, max_length=32, nsp=True)
    assert {item["nsp_label"] for item in data} == {0, 1} and max(data[0]["token_type_ids"]) == 1
    build = lambda: tiny_model("masked-lm", vocab_size=len(tiny_tokenizer), nsp=True)

    whole = pretrain(build(), config(save_every=2), TaskData(data, tokenizer=tiny_tokenizer)).model
    interrupted, calls = build(), []

    def die_in_step_4(*_):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt

    interrupted.register_forward_hook(die_in_step_4)
    with pytest.raises(KeyboardInterrupt):
        pretrain(interrupted, config(save_every=2), TaskData(data, tokenizer=tiny_tokenizer), work_dir=tmp_path)
    resumed = pretrain(build(), config(save_every=2), TaskData(data, tokenizer=tiny_tokenizer), work_dir=tmp_path).model
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6)
    roundtrip(whole, tmp_path)


def test_pretrain_refuses_what_it_cannot_train(tiny_tokenizer):
    with pytest.raises(EdgebertError, match="needs a MaskedLM"):
        pretrain(tiny_model(), config(), TaskData([], tokenizer=tiny_tokenizer))
    data = pretraining_data(tiny_tokenizer, sentences(16), max_length=24)
    with pytest.raises(EdgebertError, match="sentence pairs"):
        pretrain(tiny_model("masked-lm", vocab_size=len(tiny_tokenizer), nsp=True), config(),
                 TaskData(data, tokenizer=tiny_tokenizer))
    with pytest.raises(EdgebertError, match="tokenizer="):
        pretrain(tiny_model("masked-lm", vocab_size=len(tiny_tokenizer)), config(), TaskData(data))
