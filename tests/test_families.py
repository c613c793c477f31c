"""The family registry: every family maps configs both ways, an unknown one is refused in one line,
and a family defined right here loads and saves through edgebert.checkpoint with no other edits."""

import dataclasses
import json

import pytest
import torch
import transformers as T
from safetensors.torch import save_file

from edgebert import EdgebertError, EncoderConfig, HeadConfig, build, encoder_of, families, load, save_hf
from edgebert.export import InputSpec
from edgebert.families import Family, linear

SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=64)
HF_CONFIGS = {  # one transformers config per registered family
    "bert": lambda: T.BertConfig(**SMALL),
    "roberta": lambda: T.RobertaConfig(**SMALL, type_vocab_size=1, pad_token_id=1),
    "albert": lambda: T.AlbertConfig(**SMALL, embedding_size=16, num_hidden_groups=2, hidden_act="gelu_new"),
    "distilbert": lambda: T.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37),
    "electra": lambda: T.ElectraConfig(**SMALL, embedding_size=16),
    "modernbert": lambda: T.ModernBertConfig(**SMALL, pad_token_id=0, local_attention=4, global_attn_every_n_layers=2),
    "deberta": lambda: T.DebertaV2Config(**SMALL, relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8,
                                         max_relative_positions=32, share_att_key=True, norm_rel_ebd="layer_norm",
                                         position_biased_input=False, type_vocab_size=0),
}


def test_every_family_has_a_config_here():
    assert set(HF_CONFIGS) == set(families.names())


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_config_round_trips(name):
    family = families.get(name)
    hf = HF_CONFIGS[name]().to_dict()
    assert families.for_hf(hf) is family
    ours = family.from_hf(hf)
    assert ours.family == name
    back = family.to_hf(ours)
    assert {k: hf[k] for k in back} == back  # every key we write says what transformers' config said
    assert family.from_hf({**hf, **back}) == ours


def test_an_unknown_model_type_is_refused_in_one_line():
    with pytest.raises(EdgebertError) as e:
        families.for_hf({"model_type": "made-up"}, "x/config.json")
    message = str(e.value)
    assert message.startswith("x/config.json: unsupported architecture 'made-up'") and "\n" not in message
    assert all(t in message for name in families.names() for t in families.get(name).model_types)
    with pytest.raises(EdgebertError, match="unknown model family 'made-up'"):
        families.get("made-up")


def test_a_clashing_registration_is_refused(monkeypatch):
    monkeypatch.setattr(families.FAMILIES, "_entries", {name: families.get(name) for name in families.names()})
    with pytest.raises(EdgebertError, match="clashes"):
        families.register(dataclasses.replace(families.get("bert"), name="bert2"))  # model_type "bert" taken


# A made-up architecture: BERT's layer under other names and config keys, no segment embeddings.
def _toy_from_hf(c: dict) -> EncoderConfig:
    return EncoderConfig(family="toy", vocab_size=c["vocab"], hidden_size=c["width"], num_layers=c["depth"],
                         num_heads=c["heads"], intermediate_size=c["ffn"], type_vocab_size=0,
                         max_positions=c["positions"])


def _toy_to_hf(c: EncoderConfig) -> dict:
    return {"vocab": c.vocab_size, "width": c.hidden_size, "depth": c.num_layers, "heads": c.num_heads,
            "ffn": c.intermediate_size, "positions": c.max_positions}


def _toy_weights(c: EncoderConfig) -> dict[str, str]:
    m = {"embeddings.word_embeddings.weight": "tok.weight", "embeddings.position_embeddings.weight": "pos.weight",
         **linear("emb_norm", "embeddings.LayerNorm")}
    parts = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
             "o": "attention.output.dense", "n1": "attention.output.LayerNorm", "up": "intermediate.dense",
             "down": "output.dense", "n2": "output.LayerNorm"}
    for i in range(c.num_layers):
        for theirs, ours in parts.items():
            m.update(linear(f"blocks.{i}.{theirs}", f"encoder.layer.{i}.{ours}"))
    return m


TOY = Family(name="toy", model_types=("toy-encoder",), stem="Toy", prefix="body.", from_hf=_toy_from_hf,
             to_hf=_toy_to_hf, weights=_toy_weights, classifier="head.out", inputs=("input_ids", "attention_mask"))


def test_a_family_defined_here_loads_and_saves_through_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(families.FAMILIES, "_entries", {name: families.get(name) for name in families.names()})
    families.register(TOY)
    torch.manual_seed(0)
    reference = build(_toy_from_hf({"vocab": 50, "width": 16, "depth": 2, "heads": 2, "ffn": 24, "positions": 20}),
                      HeadConfig(num_labels=3, pooler=None)).eval()
    # The checkpoint as the toy library would write it: its names, its config keys.
    ours = reference.state_dict()
    state = {"body." + hf: ours["encoder." + k] for k, hf in _toy_weights(reference.config).items()}
    state.update({"head.out.weight": ours["classifier.weight"], "head.out.bias": ours["classifier.bias"]})
    folder = tmp_path / "toy"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    config = {"model_type": "toy-encoder", "architectures": ["ToyForSequenceClassification"],
              "id2label": {"0": "a", "1": "b", "2": "c"}, **_toy_to_hf(reference.config)}
    (folder / "config.json").write_text(json.dumps(config))

    model = load(folder)
    ids = torch.randint(1, 50, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    with torch.no_grad():
        assert torch.equal(model(ids, mask), reference(ids, mask))
    assert model.head.labels == ["a", "b", "c"] and InputSpec.of(model).names == TOY.inputs

    save_hf(model, tmp_path / "back")
    assert json.loads((tmp_path / "back" / "config.json").read_text())["architectures"] == ["ToyForSequenceClassification"]
    with torch.no_grad():
        assert torch.equal(load(tmp_path / "back")(ids, mask), reference(ids, mask))


def test_modernbert_saves_back_to_transformers_and_exports_to_onnx(tmp_path):
    import numpy as np

    from edgebert.export import Budget, OnnxExportConfig, export

    torch.manual_seed(0)
    hf = T.ModernBertModel(HF_CONFIGS["modernbert"]()).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = encoder_of(load(tmp_path / "hf"))
    save_hf(ours, tmp_path / "back")  # fused Wqkv and Wi rebuilt from our separate projections
    back = T.ModernBertModel.from_pretrained(tmp_path / "back").eval()
    ids = torch.randint(3, 99, (2, 11))
    with torch.no_grad():
        assert torch.equal(back(input_ids=ids).last_hidden_state, hf(input_ids=ids).last_hidden_state)

    classifier = build(ours.config, HeadConfig(num_labels=2)).eval()
    classifier.encoder.load_state_dict(ours.state_dict())
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 13, 8).astype(np.int32)
    mask = (np.arange(12)[None] < lengths[:, None]).astype(np.int32)
    arrays = {"input_ids": (rng.integers(1, 99, (8, 12)) * mask).astype(np.int32), "attention_mask": mask,
              "lengths": lengths, "labels": rng.integers(0, 2, 8)}
    r = export(classifier, OnnxExportConfig(), out=tmp_path / "m.onnx", eval_data=arrays,
               budget=Budget(max_abs_diff=1e-4))
    assert r.meta["inputs"] == ["input_ids", "attention_mask"] and r.verification["agreement"] == 1.0
