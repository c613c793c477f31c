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


def test_encoder_of_is_the_one_way_to_the_encoder():
    from edgebert import encoder_of

    encoder = Encoder(EncoderConfig(**TINY))
    classifier = build(EncoderConfig(**TINY), HeadConfig())
    assert encoder_of(encoder) is encoder and encoder_of(classifier) is classifier.encoder
    with pytest.raises(EdgebertError, match="Linear is not an edgebert model"):
        encoder_of(torch.nn.Linear(2, 2))


def test_the_layer_view_reads_and_replaces_parts_by_role():
    from edgebert.model import blocks, embeddings

    model = build(EncoderConfig(**{**TINY, "num_layers": 3}, attention_groups=[0, 0, 1]), HeadConfig())
    layers = blocks(model)
    assert [b.index for b in layers] == [0, 1, 2] and layers[0].heads == 4
    assert (layers[0].query.out_features, layers[0].attention_out.in_features) == (16, 16)
    assert (layers[1].ffn_in.out_features, layers[1].ffn_out.in_features) == (32, 32)
    assert layers[0].query is layers[1].query and layers[1].query is not layers[2].query  # shared attention
    assert layers[0].attention_norm.normalized_shape == layers[0].ffn_norm.normalized_shape == (16,)
    wider = torch.nn.Linear(16, 40)
    layers[2].ffn_in = wider  # assigning a role replaces the module inside the model
    assert model.encoder.encoder.layer[2].intermediate.dense is wider
    layers[2].set_units(layers[0].units("ffn"))
    assert blocks(model)[2].ffn_in is layers[0].ffn_in
    emb = embeddings(model)
    assert emb.word.num_embeddings == 60 and emb.position.num_embeddings == 24 and emb.token_type is not None
    assert emb.norm is model.encoder.embeddings.LayerNorm and emb.projection is None


def test_rotary_scores_depend_only_on_relative_position():
    from edgebert.model import Rotary

    torch.manual_seed(0)
    rotary = Rotary(8, 10000.0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    line = lambda v: v.expand(1, 1, 10, 8)  # the same vector at positions 0..9
    scores = rotary(line(q)) @ rotary(line(k)).transpose(-1, -2)  # [.., query pos, key pos]
    assert torch.allclose(scores[0, 0, 2, 5], scores[0, 0, 6, 9], atol=1e-5)  # offset 3 both times
    assert not torch.allclose(scores[0, 0, 2, 5], scores[0, 0, 2, 6], atol=1e-3)


def test_sliding_window_masks_far_keys_and_padding():
    from edgebert.model import SlidingWindow, attention_bias

    bias = SlidingWindow(4)(attention_bias(torch.tensor([[1, 1, 1, 1, 1, 0]]), torch.float32))[0, 0]
    allowed = bias == 0
    assert allowed[2].tolist() == [True, True, True, True, True, False]  # ±2 around 2, padding masked
    assert allowed[0].tolist() == [True, True, True, False, False, False]


def test_modernbert_layout_layers_and_gated_ffn_surgery():
    from edgebert.model import blocks
    from edgebert.passes.surgery import remove_neurons

    torch.manual_seed(0)
    config = EncoderConfig(**{**TINY, "num_layers": 3}, type_vocab_size=0, pre_ln=True, position="rotary",
                           attention_window=4, global_every=2, gated_ffn=True, bias=False, first_attention_norm=False)
    model = Encoder(config).eval()
    layers = blocks(model)
    assert [b.module.attention.self.window is not None for b in layers] == [False, True, False]
    assert layers[0].attention_norm is None and layers[1].attention_norm is not None
    assert layers[0].ffn_gate.out_features == 32 and layers[0].query.bias is None
    assert model.embeddings.position_embeddings is None
    with torch.no_grad():
        layers[1].ffn_out.weight[:, 7] = 0  # neuron 7 of layer 1 contributes nothing
        ids = torch.randint(1, 60, (2, 9))
        before = model(ids)
        remove_neurons(model, {1: [7]})
        assert blocks(model)[1].ffn_gate.out_features == 31 and model.config.layer_ffn == [32, 31, 32]
        assert torch.allclose(model(ids), before, atol=1e-6)


def test_removing_layers_keeps_the_global_attention_pattern():
    from edgebert.passes.surgery import remove_layers

    config = EncoderConfig(**{**TINY, "num_layers": 4}, pre_ln=True, position="rotary", attention_window=4,
                           global_every=2, first_attention_norm=False)
    with pytest.raises(EdgebertError, match="global-attention layers"):
        remove_layers(Encoder(config), [1])  # layer 2 (global) would become layer 1 (local)
    kept = remove_layers(Encoder(config), [2, 3])
    assert kept.config.num_layers == 2 and kept.encoder.layer[1].attention.self.window is not None


@pytest.mark.parametrize("layout", [
    {},  # BERT
    {"pre_ln": True, "position": "rotary", "attention_window": 4, "global_every": 2, "gated_ffn": True,
     "first_attention_norm": False},  # ModernBERT: the last layer's query rows sliced from a windowed mask
    {"num_layers": 3, "layer_heads": [4, 2, 1], "hidden_size": 12, "norm_width": 16, "head_size": 4},  # pruned
])
def test_the_last_layer_for_cls_alone_is_the_cls_row_of_the_whole(layout):
    """What exported [CLS] heads compute (`export.graph.ClsOnly`): the [CLS] row of the full last layer, at
    [B, 1, H], with padding in the batch; the model itself keeps every row."""
    from edgebert.export.graph import ClsOnly, for_export

    torch.manual_seed(0)
    model = build(EncoderConfig(**{**TINY, **layout}), HeadConfig()).eval()
    graph = for_export(model)
    ids = torch.randint(1, 60, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    with torch.no_grad():
        first = graph.encoder(ids, mask)
        whole = model.encoder(ids, mask)
        assert torch.allclose(graph(ids, mask), model(ids, mask), atol=1e-6)
    assert first.shape == (2, 1, whole.shape[-1])
    assert torch.allclose(first, whole[:, :1], atol=1e-6)
    assert isinstance(graph.encoder.encoder.layer[-1], ClsOnly) and not any(isinstance(m, ClsOnly) for m in model.modules())
    assert graph.classifier.weight is model.classifier.weight  # a copy holding the same weights


def test_relative_attention_keeps_every_row_when_asked_for_cls_alone():
    from edgebert.export.graph import for_export

    model = build(EncoderConfig(**TINY, relative_terms=["c2p", "p2c"], max_relative_positions=8), HeadConfig()).eval()
    ids = torch.randint(1, 60, (1, 7))
    with torch.no_grad():
        assert torch.equal(for_export(model).encoder(ids), model.encoder(ids))


@pytest.mark.parametrize("head", [HeadConfig(pooling="mean"), HeadConfig(kind="token-classification"),
                                  HeadConfig(kind="embedding", pooling="mean")])
def test_heads_that_read_every_row_keep_every_row_in_the_exported_graph(head):
    from edgebert.export.graph import for_export

    model = build(EncoderConfig(**TINY), head).eval()
    assert not model.reads_cls_alone
    ids = torch.randint(1, 60, (1, 7))
    with torch.no_grad():
        assert torch.equal(for_export(model).encoder(ids), model.encoder(ids))
