"""edgebert.stats and `edgebert inspect` on the families with their own attention: FLOPs counted by hand
for a tiny DeBERTa (relative terms) and a tiny ModernBERT (sliding windows, padded and windowed), inspect's
facts on a checkpoint folder transformers wrote, and its one-line refusal of configs edgebert cannot run."""

import json

import pytest
import torch
import transformers as T

from edgebert.cli import main
from edgebert.families import deberta, modernbert
from edgebert.stats import flops, pairs

# 8 wide, 2 heads of 4, FFN 12, a 2-label classifier: small enough to count by hand.
DEBERTA = dict(vocab_size=50, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=12,
               max_position_embeddings=32, relative_attention=True, pos_att_type=["c2p", "p2c"], position_buckets=4,
               max_relative_positions=16, share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
               type_vocab_size=0, pooler_hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
MODERNBERT = dict(vocab_size=50, hidden_size=8, num_hidden_layers=3, num_attention_heads=2, intermediate_size=12,
                  max_position_embeddings=32, pad_token_id=0, local_attention=4, global_attn_every_n_layers=3)


def test_deberta_flops_by_hand():
    c = deberta.from_hf(T.DebertaV2Config(**DEBERTA).to_dict())
    t = 5
    per_layer = (3 * t * 8 * 8  # query, key, value
                 + 2 * t * t * 8  # scores and context
                 + t * 8 * 8  # attention output
                 + 2 * t * (2 * 4) * 8  # c2p and p2c: each token against the 2·4 bucket rows
                 + 2 * t * 8 * 12)  # FFN in and out
    head = 8 * 8 + 8 * 2  # ContextPooler dense + classifier on [CLS]
    assert flops(c, t, 2) == 2 * (2 * per_layer + head) == 13280
    assert flops(c, t, 2, windowed=True) == flops(c, t, 2)  # no window: the same figure


def test_modernbert_flops_by_hand_padded_and_windowed():
    c = modernbert.from_hf(T.ModernBertConfig(**MODERNBERT).to_dict())
    assert [c.window(i) for i in range(3)] == [None, 4, 4]  # layer 0 global, then two local layers
    t = 6
    dense = 3 * t * 8 * 8 + t * 8 * 8 + 3 * t * 8 * 12  # q, k, v; output; GeGLU in, gate and out
    head = 8 * 8 + 8 * 2  # dense (+ norm) + classifier
    # Within ±2 positions of 6 tokens: 3 + 4 + 5 + 5 + 4 + 3 pairs.
    assert pairs(t, 4) == 24 and pairs(t, None) == 36 and pairs(t, 128) == 36
    padded = 3 * dense + 3 * (2 * 36 * 8) + head  # the graph scores all T×T pairs and masks the far ones
    windowed = 3 * dense + (2 * 36 * 8) + 2 * (2 * 24 * 8) + head
    assert flops(c, t, 2) == 2 * padded == 23200
    assert flops(c, t, 2, windowed=True) == 2 * windowed == 22432
    assert flops(c, 3, 2, windowed=True) == flops(c, 3, 2)  # 3 tokens all fit in the window


def _inspect(capfd, *argv) -> tuple[int, str, str]:
    code = main(["inspect", *argv])
    out = capfd.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("family", ["deberta", "modernbert"])
def test_inspect_reports_the_family_from_a_transformers_folder(family, tmp_path, capfd):
    torch.manual_seed(0)
    if family == "deberta":
        hf = T.DebertaV2ForSequenceClassification(T.DebertaV2Config(**DEBERTA))
    else:
        hf = T.ModernBertForSequenceClassification(T.ModernBertConfig(**MODERNBERT))
    hf.save_pretrained(tmp_path)
    code, out, _ = _inspect(capfd, str(tmp_path), "--json")
    facts = json.loads(out)
    assert code == 0 and facts["family"] == family and facts["layers"] == hf.config.num_hidden_layers
    assert facts["params"] == sum(p.numel() for p in hf.parameters())  # every tensor of the checkpoint, once
    config = (deberta if family == "deberta" else modernbert).from_hf(hf.config.to_dict())
    assert set(facts["flops"]) == {"32"}  # max_position_embeddings=32 rules out 128 and 512
    assert facts["flops"]["32"] == flops(config, 32, 2)
    if family == "deberta":
        assert facts["attention"] == "disentangled c2p+p2c (4 log buckets up to 16, shared key); no absolute positions"
        assert "flops_windowed" not in facts
    else:
        assert facts["attention"] == ("global every 3 layers from layer 0, a 4-token window elsewhere; "
                                      "rotary positions")
        assert facts["flops_windowed"]["32"] == flops(config, 32, 2, windowed=True) < facts["flops"]["32"]
        code, out, _ = _inspect(capfd, str(tmp_path))
        assert code == 0 and "flops_windowed" in out and "GFLOPs" in out.split("flops_windowed")[1]


@pytest.mark.parametrize("config, changes, named", [
    (T.DebertaV2Config, dict(DEBERTA, conv_kernel_size=3), "conv_kernel_size"),
    (T.DebertaV2Config, dict(DEBERTA, pos_att_type=["c2p", "p2p"]), "pos_att_type ['p2p']"),
    (T.DebertaV2Config, dict(DEBERTA, embedding_size=4), "embedding_size"),
    (T.ModernBertConfig, dict(MODERNBERT, attention_bias=True), "biases on some layers only"),
    (T.ModernBertConfig, dict(MODERNBERT, hidden_activation="silu"), "unsupported activation 'silu'"),
])
def test_inspect_refuses_what_a_family_cannot_run_in_one_line(config, changes, named, tmp_path, capfd):
    config(**changes).save_pretrained(tmp_path)  # config.json is what decides; no weights needed
    code, _, err = _inspect(capfd, str(tmp_path))
    assert code == 2 and named in err and err.strip().count("\n") == 0
