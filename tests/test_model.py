"""The encoder itself: BERT facts, the shapes the passes produce, the CLI's inspect."""

import json
import subprocess
import sys

import pytest
import torch

from edgebert import EdgebertError, Encoder, EncoderConfig, HeadConfig, build
from edgebert.stats import flops, params

TINY = dict(vocab_size=60, hidden_size=16, num_layers=2, num_heads=4, intermediate_size=32, max_positions=24)


def test_attention_is_bidirectional():
    torch.manual_seed(0)
    model = Encoder(EncoderConfig(**TINY)).eval()
    ids = torch.randint(5, 60, (1, 8))
    changed = ids.clone()
    changed[0, -1] = 4
    with torch.no_grad():
        assert not torch.allclose(model(ids)[0, 0], model(changed)[0, 0])  # first token sees the last


def test_padding_is_masked_out():
    torch.manual_seed(0)
    model = Encoder(EncoderConfig(**TINY)).eval()
    ids = torch.randint(5, 60, (1, 6))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=ids.dtype)], 1)
    mask = torch.cat([torch.ones(1, 6), torch.zeros(1, 4)], 1).long()
    with torch.no_grad():
        assert torch.allclose(model(ids), model(padded, mask)[:, :6], atol=1e-6)


def test_segment_ids_matter_and_positions_are_learned():
    model = Encoder(EncoderConfig(**TINY)).eval()
    ids = torch.randint(5, 60, (1, 6))
    with torch.no_grad():
        a = model(ids, token_type_ids=torch.zeros_like(ids))
        b = model(ids, token_type_ids=torch.ones_like(ids))
    assert not torch.allclose(a, b)
    assert model.embeddings.position_embeddings.weight.requires_grad


def test_too_long_input_is_refused():
    model = Encoder(EncoderConfig(**TINY))
    with pytest.raises(EdgebertError, match="exceeds the model's 24 positions"):
        model(torch.zeros(1, 25, dtype=torch.long))


def test_pruned_shared_factorized_pre_ln_shapes():
    config = EncoderConfig(**{**TINY, "num_layers": 4}, layer_heads=[1, 2, 3, 4], layer_ffn=[4, 8, 12, 16],
                           embedding_size=8, pre_ln=True, activation="gelu_tanh")
    model = Encoder(config)
    assert model(torch.randint(0, 60, (2, 5))).shape == (2, 5, 16)
    assert model.encoder.layer[0].attention.self.query.out_features == 4
    assert model.encoder.layer[3].intermediate.dense.out_features == 16
    shared = Encoder(EncoderConfig(**{**TINY, "num_layers": 4}, attention_groups=[0, 0, 0, 0], ffn_groups=[0, 0, 1, 1]))
    plain = Encoder(EncoderConfig(**{**TINY, "num_layers": 4}))
    layer = shared.encoder.layer
    assert layer[0].attention.self.query.weight is layer[3].attention.self.query.weight
    assert layer[1].intermediate is not layer[2].intermediate
    per_attention = sum(p.numel() for p in plain.encoder.layer[0].attention.parameters())
    per_ffn = sum(p.numel() for m in (plain.encoder.layer[0].intermediate, plain.encoder.layer[0].output)
                  for p in m.parameters())
    assert params(plain)["total"] - params(shared)["total"] == 3 * per_attention + 2 * per_ffn


def test_sharing_groups_must_agree_on_width():
    with pytest.raises(EdgebertError, match="same width"):
        EncoderConfig(**TINY, layer_heads=[1, 2], attention_groups=[0, 0])


def test_flops_formula_on_bert_base_shape():
    # BERT-base at 128 tokens: the commonly quoted ~22 GFLOPs (2 x 11.2 G multiply-adds).
    base = EncoderConfig(hidden_size=768, num_heads=12, num_layers=12, intermediate_size=3072)
    assert 21.5e9 < flops(base, 128) < 23e9


@pytest.mark.parametrize("kind", ["sequence-classification", "token-classification", "embedding", "masked-lm"])
def test_heads_output_shapes(kind):
    head = HeadConfig(kind=kind, num_labels=3, pooling="mean", normalize=True, nsp=True)
    model = build(EncoderConfig(**TINY), head).eval()
    out = model(torch.randint(0, 60, (2, 5)))
    expected = {"sequence-classification": (2, 3), "token-classification": (2, 5, 3), "embedding": (2, 16)}
    if kind == "masked-lm":
        mlm, nsp = out
        assert mlm.shape == (2, 5, 60) and nsp.shape == (2, 2)
    else:
        assert out.shape == expected[kind]
    if kind == "embedding":
        assert torch.allclose(out.norm(dim=-1), torch.ones(2))


def test_mlm_decoder_is_tied_to_word_embeddings():
    model = build(EncoderConfig(**TINY), HeadConfig(kind="masked-lm"))
    ids = torch.randint(0, 60, (1, 4))
    model(ids).sum().backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad[ids[0, 0]].abs().sum() > 0
    names = [n for n, _ in model.named_parameters()]
    assert not any("decoder" in n for n in names)


def test_inspect_json_keys():
    out = subprocess.run([sys.executable, "-m", "edgebert.cli", "inspect", "--json"], capture_output=True,
                         text=True, check=True).stdout
    facts = json.loads(out)
    for key in ("family", "layers", "hidden", "heads", "ffn", "vocab", "params", "params_embeddings",
                "bytes", "flops"):
        assert key in facts
    assert facts["layers"] == 6 and facts["hidden"] == 384 and facts["vocab"] == 30522
    assert set(facts["flops"]) == {"32", "128", "512"}


def test_cli_bad_input_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "edgebert.cli", "inspect", str(tmp_path / "none")],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "no checkpoint at" in result.stderr
