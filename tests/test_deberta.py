"""DeBERTa-v2/v3: parity with transformers' own DebertaV2 models over the config switches, save_hf
round trips, ONNX and TFLite exports (float and dynamic INT8) verified in their runtimes, FLOPs of the
relative terms, refusals, and the SentencePiece tokenizer."""

import io
import json
import random

import numpy as np
import onnx
import pytest
import torch
import transformers as T

from edgebert.checkpoint import load, save_hf
from edgebert.errors import EdgebertError
from edgebert.export import Budget, OnnxExportConfig, TFLiteExportConfig, export
from edgebert.families import deberta
from edgebert.model import blocks, build, encoder_of, HeadConfig
from edgebert.quantize import DynamicInt8Config, quantize
from edgebert.stats import flops

VOCAB = 99
V3 = dict(relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8, max_relative_positions=32,
          share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0)
SWITCHES = {
    "v3": {},
    "own-position-projections": dict(share_att_key=False),
    "no-buckets": dict(position_buckets=-1),
    "absolute-too-no-norm": dict(position_biased_input=True, norm_rel_ebd="none", type_vocab_size=2),
    "c2p-only-own": dict(pos_att_type="c2p", share_att_key=False),
    "p2c-only": dict(pos_att_type=["p2c"]),
    "no-relative": dict(relative_attention=False, pos_att_type=None, position_biased_input=True),
}


def hf_config(**changes) -> T.DebertaV2Config:
    """2 layers, 32 wide, no dropout; 40-token inputs exceed max_relative_positions=32, so distances clamp."""
    base = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                pooler_hidden_act="gelu", **V3)
    return T.DebertaV2Config(**{**base, **changes})


def batch(t=40):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (3, t), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0
    mask[2, 7:] = 0
    return ids * mask, mask, (torch.arange(t) >= t // 2).long().expand(3, t) * mask


def hf_model(cls, tmp_path, **changes):
    torch.manual_seed(0)
    model = cls(hf_config(**changes)).eval()
    if cls is T.DebertaV2ForSequenceClassification:  # make the logits large enough to compare
        for m in (model.classifier, model.pooler.dense):
            torch.nn.init.normal_(m.weight, std=1.0)
    model.save_pretrained(tmp_path / "hf")
    return model


@pytest.mark.parametrize("switch", SWITCHES)
def test_hidden_states_match_transformers(switch, tmp_path):
    hf = hf_model(T.DebertaV2Model, tmp_path, **SWITCHES[switch])
    ours = load(tmp_path / "hf")
    ids, mask, types = batch()
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        got = ours(ids, mask, types)
    real = mask[..., None].bool()  # padded rows differ by design: transformers lets them attend uniformly
    assert (got - want).abs().masked_select(real).max() < deberta.FAMILY.tolerance
    assert (encoder_of(ours).encoder.relative is None) == (switch == "no-relative")


@pytest.mark.parametrize("switch", ["v3", "own-position-projections", "absolute-too-no-norm"])
def test_classifier_logits_match_and_save_hf_round_trips(switch, tmp_path):
    hf = hf_model(T.DebertaV2ForSequenceClassification, tmp_path, **SWITCHES[switch])
    ours = load(tmp_path / "hf")
    assert ours.head.pooler == "gelu"
    ids, mask, types = batch()
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        assert want.abs().max() > 0.1
        assert (ours(ids, mask, types) - want).abs().max() < 1e-4
        save_hf(ours, tmp_path / "back")
        back = T.AutoModelForSequenceClassification.from_pretrained(tmp_path / "back").eval()
        assert type(back) is T.DebertaV2ForSequenceClassification
        assert (back(input_ids=ids, attention_mask=mask, token_type_ids=types).logits - want).abs().max() < 1e-5


def test_the_view_holds_the_own_position_projections():
    c = deberta.from_hf(hf_config(share_att_key=False).to_dict())
    b = blocks(build(c))[0]
    assert b.pos_key.weight.shape == b.pos_query.weight.shape == b.key.weight.shape
    shared = blocks(build(deberta.from_hf(hf_config().to_dict())))[0]
    assert shared.pos_key is None and shared.pos_query is None


def test_removing_a_silenced_head_with_own_position_projections_changes_nothing():
    """Head surgery slices DeBERTa's own pos_key/pos_query rows with the head's query/key rows."""
    from edgebert.passes.surgery import remove_heads

    torch.manual_seed(0)
    model = build(deberta.from_hf(hf_config(share_att_key=False).to_dict())).eval()
    d = model.config.head_size
    with torch.no_grad():  # head 1 of layer 0 writes nothing: its columns of the output projection are zero
        blocks(model)[0].attention_out.weight[:, d:2 * d] = 0
    ids = torch.randint(5, 90, (2, 12))
    with torch.no_grad():
        before = model(ids)
        remove_heads(model, {0: [1]})
        after = model(ids)
    assert blocks(model)[0].pos_key.weight.shape[0] == blocks(model)[0].key.weight.shape[0] == 3 * d
    assert (before - after).abs().max() < 1e-5


def test_flops_count_the_relative_terms():
    c = deberta.from_hf(hf_config().to_dict())
    plain = deberta.from_hf(hf_config(**SWITCHES["no-relative"]).to_dict())
    rows, terms, t = 16, 2, 24  # 2 · position_buckets table rows, c2p and p2c
    per_layer = terms * t * rows * 32  # the scores against the table; its projection is a constant (stats doc)
    assert flops(c, t) - flops(plain, t) == 2 * c.num_layers * per_layer


@pytest.mark.parametrize("changes, named", [
    (dict(conv_kernel_size=3), "conv_kernel_size"),
    (dict(pos_att_type=["c2p", "p2p"]), "p2p"),
    (dict(relative_attention=False), "without relative_attention"),
    (dict(norm_rel_ebd="layer_norm|other"), "norm_rel_ebd"),
    (dict(pooler_hidden_size=16), "pooler_hidden_size"),
])
def test_unsupported_switches_are_refused_in_one_line(changes, named):
    with pytest.raises(EdgebertError, match=named) as e:
        deberta.from_hf(hf_config(**changes).to_dict())
    assert "\n" not in str(e.value)


def test_save_hf_refuses_a_classifier_transformers_cannot_express(tmp_path):
    model = build(deberta.from_hf(hf_config().to_dict()), HeadConfig(pooler=None))
    with pytest.raises(EdgebertError, match="ContextPooler"):
        save_hf(model, tmp_path / "out")


# ---------------------------------------------------------------------------------------------
# Export: the relative positions are computed from the sequence length inside the graph.


@pytest.fixture(scope="module")
def classifier():
    torch.manual_seed(0)
    c = deberta.from_hf(hf_config(share_att_key=False, max_position_embeddings=32).to_dict())
    model = build(c, HeadConfig(pooler="gelu")).eval()
    for m in (model.classifier, model.pooler.dense):
        torch.nn.init.normal_(m.weight, std=0.5)
    return model


@pytest.fixture(scope="module")
def arrays():
    rng = np.random.default_rng(0)
    n, t = 16, 16
    lengths = rng.integers(2, t + 1, n).astype(np.int32)
    mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
    return {"input_ids": (rng.integers(1, VOCAB, (n, t)) * mask).astype(np.int32), "attention_mask": mask,
            "lengths": lengths, "labels": rng.integers(0, 2, n)}


def test_onnx_export_has_dynamic_axes_and_verifies(classifier, arrays, tmp_path):
    import onnxruntime as ort

    r = export(classifier, OnnxExportConfig(), out=tmp_path / "m.onnx", eval_data=arrays,
               budget=Budget(max_abs_diff=1e-4, min_agreement=1.0))
    assert r.meta["inputs"] == ["input_ids", "attention_mask"] and r.meta["optimization"] == "fused"
    assert r.meta["fused_ops"].get("BiasGelu") and "Attention" not in r.meta["fused_ops"]
    assert [n.op_type for n in onnx.load(str(r.path)).graph.node].count("Sum") == 4  # the residual norms' adds
    session = ort.InferenceSession(str(r.path), providers=["CPUExecutionProvider"])
    ids, mask, _ = batch(t=29)  # a length the trace never saw
    with torch.no_grad():
        want = classifier(ids, mask).numpy()
    got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    assert np.abs(got - want).max() < 1e-4


def test_tflite_export_verifies(classifier, arrays, tmp_path):
    r = export(classifier, TFLiteExportConfig(seq_lens=(8, 16)), out=tmp_path / "m.tflite", eval_data=arrays,
               budget=Budget(max_abs_diff=1e-4, min_agreement=1.0))
    assert r.meta["signatures"] == {"seq_8": 8, "seq_16": 16}


@pytest.mark.parametrize("suffix", ["onnx", "tflite"])
def test_dynamic_int8_runs_and_verifies(classifier, arrays, tmp_path, suffix):
    export_as = TFLiteExportConfig(seq_lens=(16,)) if suffix == "tflite" else None
    r = quantize(classifier, DynamicInt8Config(), out=tmp_path / f"q.{suffix}", eval_data=arrays,
                 budget=Budget(max_abs_diff=0.5, min_agreement=0.9), export_as=export_as)
    assert r.verification["max_abs_diff"] > 0  # quantized, not a float copy


# ---------------------------------------------------------------------------------------------
# The SentencePiece (Unigram) tokenizer DeBERTa-v3 ships as spm.model


@pytest.fixture(scope="module")
def spm_folder(tmp_path_factory):
    spm = pytest.importorskip("sentencepiece")
    words = "the cat sat on a mat and dog ran far away from home with its red ball while birds sang".split()
    rng = random.Random(0)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([" ".join(rng.choice(words) for _ in range(8)) for _ in range(300)]),
        model_writer=model, vocab_size=60, model_type="unigram", hard_vocab_limit=False, minloglevel=2,
        pad_id=0, pad_piece="[PAD]", bos_id=1, bos_piece="[CLS]", eos_id=2, eos_piece="[SEP]", unk_id=3,
        unk_piece="[UNK]", user_defined_symbols=["[MASK]"])
    folder = tmp_path_factory.mktemp("spm")
    (folder / "spm.model").write_bytes(model.getvalue())
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "DebertaV2Tokenizer"}))
    (folder / "config.json").write_text(hf_config(max_position_embeddings=48).to_json_string())
    return folder


def test_sentencepiece_tokenizer_loads_and_encodes_pairs(spm_folder, recwarn):
    from edgebert.tokenizer import describe, load_tokenizer

    tokenizer = load_tokenizer(spm_folder)
    assert not [w for w in recwarn if "tokenizer is" in str(w.message)]  # Unigram is DeBERTa's kind
    d = describe(tokenizer, 32)
    assert d["type"] == "Unigram" and d["pair_template"] == "[CLS] A [SEP] B [SEP]"
    assert d["model_max_length"] == 48  # capped by config.json's positions
    ids = tokenizer("the cat sat", "a dog ran")["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids)[:2] == ["[CLS]", "▁the"] and ids.count(2) == 2


def test_a_sentencepiece_model_without_the_package_names_the_extra(spm_folder, monkeypatch):
    import importlib.util

    from edgebert import tokenizer

    def fail(*args, **kwargs):
        raise ValueError("Couldn't instantiate the backend tokenizer from one of:\n(1) a `tokenizers` file")

    monkeypatch.setattr(tokenizer.AutoTokenizer, "from_pretrained", fail)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sentencepiece" else real(name, *a))
    with pytest.raises(EdgebertError, match=r"edgebert\[sentencepiece\]"):
        tokenizer.load_tokenizer(spm_folder)
