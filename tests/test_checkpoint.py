"""Checkpoint import/export: parity with transformers' own models, and safe, clear failures."""

import json
import pickle

import pytest
import torch
import transformers as T

from edgebert import EdgebertError, encoder_of, families, load, save, save_hf
from edgebert.checkpoint import default_checkpoint

SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=37, max_position_embeddings=64)

FAMILIES = {
    "bert": (lambda: T.BertConfig(**SMALL), T.BertModel, T.BertForSequenceClassification),
    # MiniLM is the BERT layout at a small width; its own shape here.
    "minilm": (lambda: T.BertConfig(**{**SMALL, "hidden_size": 48, "num_attention_heads": 12,
                                       "intermediate_size": 96}), T.BertModel, T.BertForSequenceClassification),
    "roberta": (lambda: T.RobertaConfig(**SMALL, type_vocab_size=1, pad_token_id=1),
                T.RobertaModel, T.RobertaForSequenceClassification),
    "albert": (lambda: T.AlbertConfig(**{**SMALL, "num_hidden_layers": 4}, embedding_size=16, num_hidden_groups=2,
                                      hidden_act="gelu_new"), T.AlbertModel, T.AlbertForSequenceClassification),
    "distilbert": (lambda: T.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                                              max_position_embeddings=64),
                   T.DistilBertModel, T.DistilBertForSequenceClassification),
    "electra": (lambda: T.ElectraConfig(**SMALL, embedding_size=16), T.ElectraModel,
                T.ElectraForSequenceClassification),
    # Rotary, sliding-window layers (1 and 3) and a GeGLU FFN; its classifier head is not mapped.
    "modernbert": (lambda: T.ModernBertConfig(**{**SMALL, "num_hidden_layers": 4}, pad_token_id=0, local_attention=4,
                                              global_attn_every_n_layers=2), T.ModernBertModel, None),
    # DeBERTa-v3's switches; tests/test_deberta.py covers the others.
    "deberta": (lambda: T.DebertaV2Config(**SMALL, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                          position_buckets=8, max_relative_positions=32, share_att_key=True,
                                          norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0),
                T.DebertaV2Model, T.DebertaV2ForSequenceClassification),
}


def _family(case):
    return families.get("bert" if case == "minilm" else case)


def test_every_family_has_a_parity_case():
    assert {_family(case).name for case in FAMILIES} == set(families.names())


def _inputs(family):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 99, (2, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    types = torch.zeros_like(ids)
    if family not in ("roberta", "distilbert"):
        types[:, 5:] = 1
    return ids, mask, types


def _hf_kwargs(family, ids, mask, types):
    given = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    return {name: given[name] for name in _family(family).inputs}


@pytest.mark.parametrize("family", FAMILIES)
def test_hidden_states_match_transformers(family, tmp_path):
    make_config, bare, _ = FAMILIES[family]
    torch.manual_seed(0)
    hf = bare(make_config()).eval()
    hf.save_pretrained(tmp_path)
    ours = encoder_of(load(tmp_path))
    ids, mask, types = _inputs(family)
    with torch.no_grad():
        ref = hf(**_hf_kwargs(family, ids, mask, types)).last_hidden_state
        out = ours(ids, mask, types)
    valid = mask.bool()  # RoBERTa numbers padding positions differently; they are masked anyway
    assert (ref[valid] - out[valid]).abs().max() < _family(family).tolerance


@pytest.mark.parametrize("family", [f for f, (_, _, classifier) in FAMILIES.items() if classifier])
def test_logits_match_and_save_hf_round_trips(family, tmp_path):
    make_config, _, classifier = FAMILIES[family]
    torch.manual_seed(0)
    hf = classifier(make_config()).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = load(tmp_path / "hf")
    ids, mask, types = _inputs(family)
    kw = _hf_kwargs(family, ids, mask, types)
    with torch.no_grad():
        ref = hf(**kw).logits
        assert (ours(ids, mask, types) - ref).abs().max() < _family(family).tolerance
        save_hf(ours, tmp_path / "back")
        back = classifier.from_pretrained(tmp_path / "back").eval()
        assert torch.equal(back(**kw).logits, ref)


def test_real_minilm_matches_transformers():
    path = default_checkpoint()
    tok = T.AutoTokenizer.from_pretrained(path)
    batch = tok(["a gripping , funny film", "the plot is thin"], ["second part", "x"], padding=True,
                return_tensors="pt")
    hf = T.AutoModel.from_pretrained(path).eval()
    ours = encoder_of(load(path))
    with torch.no_grad():
        ref = hf(**batch).last_hidden_state
        out = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    valid = batch["attention_mask"].bool()
    assert (ref[valid] - out[valid]).abs().max() < 1e-4


def test_edgebert_format_round_trips_shared_and_pruned_shapes(tmp_path):
    from edgebert import EncoderConfig, HeadConfig, build

    config = EncoderConfig(vocab_size=50, hidden_size=16, num_layers=4, num_heads=4, intermediate_size=24,
                           layer_heads=[2, 2, 3, 3], layer_ffn=[8, 8, 12, 12], attention_groups=[0, 0, 1, 1],
                           ffn_groups=[0, 0, 1, 1], embedding_size=8, max_positions=32)
    model = build(config, HeadConfig(num_labels=3, labels=["a", "b", "c"])).eval()
    save(model, tmp_path / "m")
    again = load(tmp_path / "m")
    ids = torch.randint(0, 50, (1, 7))
    assert torch.equal(model(ids), again(ids))
    layers = again.encoder.encoder.layer
    assert layers[0].attention is layers[1].attention and layers[1].attention is not layers[2].attention
    with pytest.raises(EdgebertError, match="sharing .* need the albert family"):
        save_hf(again, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    embedder = build(config, HeadConfig(kind="embedding", vector_width=12)).eval()
    save(embedder, tmp_path / "e")
    assert torch.equal(embedder(ids), load(tmp_path / "e")(ids)) and embedder(ids).shape == (1, 12)
    with pytest.raises(EdgebertError, match="projection .* not expressible"):
        save_hf(embedder, tmp_path / "hf")


def _bert_folder(tmp_path):
    torch.manual_seed(0)
    T.BertModel(T.BertConfig(**SMALL)).save_pretrained(tmp_path)
    return tmp_path


def test_unsupported_architecture_is_one_line(tmp_path):
    folder = _bert_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(EdgebertError, match=r"config.json: unsupported architecture 'gpt2'"):
        load(folder)


def test_truncated_weights_name_the_file(tmp_path):
    folder = _bert_folder(tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(EdgebertError, match=r"model.safetensors is corrupt or truncated"):
        load(folder)


def test_mismatched_and_missing_tensors(tmp_path):
    folder = _bert_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 40}))
    with pytest.raises(EdgebertError, match="wrong shape, e.g. encoder.layer.0.intermediate.dense.weight"):
        load(folder)
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(EdgebertError, match="missing, e.g. encoder.layer.2"):
        load(folder)


class _Exploit:
    def __reduce__(self):
        return (print, ("code from the checkpoint ran",))


def test_pickled_code_is_refused(tmp_path, capsys):
    folder = _bert_folder(tmp_path)
    (folder / "model.safetensors").unlink()
    with open(folder / "pytorch_model.bin", "wb") as f:
        pickle.dump({"x": _Exploit()}, f)
    with pytest.raises(EdgebertError, match="pytorch_model.bin cannot be read safely"):
        load(folder)
    assert "code from the checkpoint ran" not in capsys.readouterr().out


def test_missing_folder_and_offline_hub_id(tmp_path, monkeypatch):
    with pytest.raises(EdgebertError, match="no checkpoint at"):
        load(tmp_path / "nothing")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EdgebertError, match="cannot fetch 'someone/some-model' from the model hub"):
        load("someone/some-model")
