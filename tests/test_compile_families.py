"""`edgebert compile` (distill → prune → quantize → export) on a tiny random-init ModernBERT and DeBERTa-v3 with
their own tokenizers (BPE, SentencePiece-style Unigram) on an SST-2-shaped folder: the stages run and every
file verifies; no accuracy is asserted. MediaPipe's classifier is skipped with its one-line reason."""

import json

import pytest
import torch
import transformers as T
from builders import SST2_WORDS, subword_tokenizer

from edgebert.pipeline import compile as compiler
from edgebert.pipeline import recipe as recipes

SMALL = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=64, num_labels=2, id2label={0: "negative", 1: "positive"},
             label2id={"negative": 0, "positive": 1})
FAMILIES = {  # HF class, config (given the tokenizer's vocabulary size and pad id), tokenizer kind, MediaPipe reason
    "modernbert": (T.ModernBertForSequenceClassification,
                   lambda vocab, pad: T.ModernBertConfig(**SMALL, vocab_size=vocab, pad_token_id=pad, local_attention=4,
                                                         global_attn_every_n_layers=2, classifier_pooling="mean"),
                   "BPE", "no BPE tokenizer"),
    "deberta": (T.DebertaV2ForSequenceClassification,
                lambda vocab, pad: T.DebertaV2Config(**SMALL, vocab_size=vocab, pad_token_id=pad, relative_attention=True,
                                                     pos_att_type=["p2c", "c2p"], position_buckets=8,
                                                     max_relative_positions=32, share_att_key=True,
                                                     norm_rel_ebd="layer_norm", position_biased_input=False,
                                                     type_vocab_size=0, pooler_hidden_act="gelu"),
                "Unigram", "not SentencePiece yet"),
}


RECIPE = """
task = "sst2"
model = "{model}"
max_length = 16
stages = ["distill", "prune", "quantize", "export"]
[distill]
layers = 2
hidden_weight = 1.0
[distill.train]
steps = 4
batch_size = 8
[prune]
heads = 0.5
ffn = 0.5
width = 0.25
sample_batches = 2
batch_size = 8
[prune.recovery.train]
steps = 4
batch_size = 8
[quantize]
accuracy_budget = 100.0
[export]
formats = ["onnx", "tflite"]
seq_lens = [16]
bench = false
"""


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_compile_runs_every_stage_and_verifies(family, tiny_sst2, tmp_path):
    cls, config, kind, reason = FAMILIES[family]
    folder = tmp_path / "model"
    vocab = subword_tokenizer(folder, [" ".join(SST2_WORDS)] * 20, kind=kind, vocab_size=120)
    torch.manual_seed(0)
    cls(config(vocab, 3)).save_pretrained(folder)  # [PAD] is id 3 in conftest's subword tokenizers
    bundle = compiler.compile(recipes.parse(RECIPE.format(model=folder)), tmp_path / "out", data_dir=str(tiny_sst2))
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert [s["name"] for s in manifest["stages"]] == ["distill", "prune"]
    assert manifest["stages"][1]["params"]["total"] < manifest["stages"][0]["params"]["total"]
    (pruned,) = (tmp_path / "out" / "stages").glob("02-prune-*/model/config.json")
    shape = json.loads(pruned.read_text())["edgebert"]["encoder"]
    assert (shape["family"], shape["num_layers"], shape["hidden_size"], shape["norm_width"]) == (family, 2, 24, 32)
    for name in ("model.onnx", "model.tflite"):
        check = manifest["verification"][name]["verify"]  # the INT8 file against PyTorch on the dev split
        assert check["examples"] == 32 and check["max_abs_diff"] < 0.5
    assert manifest["inputs"]["tokenizer"]["type"] == kind and "tokenizer.json" in manifest["inputs"]["tokenizer_files"]
    assert reason in manifest["mediapipe"]["skipped"] and "\n" not in manifest["mediapipe"]["skipped"]
    assert not (bundle / "classifier.tflite").exists() and reason in (bundle / "report.html").read_text()
