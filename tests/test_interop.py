"""Hugging Face and Optimum interop: the bundle loads in Optimum's ORTModel and transformers' pipeline,
save_hf writes pruned students exactly, the tokenizer files follow the bundle's contract, and the
manifest says truthfully which files padding changes."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers

from edgebert import EncoderConfig, HeadConfig, build, checkpoint, load, save_hf
from edgebert.export import OnnxExportConfig, export
from edgebert.pipeline.bundle import write_bundle
from edgebert.quantize import DynamicInt8Config, onnx_ptq, quantize

from builders import sentences

LABELS = ["negative", "positive"]
MAX_LENGTH = 24  # below the tokenizer's 32 positions: the tokenizer files must say the bundle's length


@pytest.fixture(scope="module")
def student(tiny_tokenizer, tmp_path_factory):
    """A pruned tiny classifier (per-layer heads and FFN widths), saved in edgebert's format."""
    torch.manual_seed(0)
    config = EncoderConfig(vocab_size=len(tiny_tokenizer), hidden_size=16, num_layers=2, num_heads=4,
                           intermediate_size=32, layer_heads=[3, 1], layer_ffn=[32, 12], max_positions=32,
                           dropout=0.0, attention_dropout=0.0)
    model = build(config, HeadConfig(num_labels=2, labels=LABELS)).eval()
    folder = tmp_path_factory.mktemp("student")
    tiny_tokenizer.save_pretrained(folder / "tokenizer")
    return model, checkpoint.save(model, folder / "model", tokenizer_from=folder / "tokenizer")


def _arrays(tokenizer, texts, length):
    enc = tokenizer(texts, padding="max_length", max_length=length, truncation=True)
    arrays = {k: np.array(enc[k]) for k in ("input_ids", "attention_mask", "token_type_ids")}
    arrays["lengths"] = arrays["attention_mask"].sum(1)
    arrays["labels"] = np.arange(len(texts)) % 2
    return arrays


@pytest.fixture(scope="module")
def bundle(student, tiny_tokenizer, tmp_path_factory):
    model, folder = student
    out = tmp_path_factory.mktemp("interop")
    onnx = export(model, OnnxExportConfig(optimize="none"), out=out / "model.onnx").path
    return write_bundle(out / "bundle", models={"model.onnx": onnx}, tokenizer_dir=folder, labels=LABELS,
                        eval_arrays=_arrays(tiny_tokenizer, sentences(8), 16), manifest={"task": "sst2"},
                        max_length=MAX_LENGTH, source_model=folder)


def _torch_logits(model, tokenizer, texts):
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]).numpy()


def test_optimum_and_pipeline_run_the_bundle(bundle, student, tiny_tokenizer):
    from optimum.onnxruntime import ORTModelForSequenceClassification

    config = json.loads((bundle / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"} and config["label2id"]["positive"] == 1
    assert json.loads((bundle / "manifest.json").read_text())["hf"]["config"] == "config.json"
    texts = sentences(5, seed=3)
    expected = _torch_logits(student[0], tiny_tokenizer, texts)
    ort_model = ORTModelForSequenceClassification.from_pretrained(bundle)  # reads model.onnx and config.json
    enc = tiny_tokenizer(texts, padding=True, return_tensors="pt")
    np.testing.assert_allclose(ort_model(**enc).logits.numpy(), expected, atol=1e-5)
    pipe = transformers.pipeline("text-classification", model=ort_model, tokenizer=str(bundle))
    got = pipe(texts)
    probs = torch.softmax(torch.from_numpy(expected), -1).numpy()
    assert [g["label"] for g in got] == [LABELS[i] for i in expected.argmax(1)]
    np.testing.assert_allclose([g["score"] for g in got], probs.max(1), atol=1e-5)


def test_pipeline_scores_do_not_depend_on_the_batch(student, tiny_tokenizer, tmp_path):
    """Optimum's pipeline pads each batch to its longest text: edgebert's INT8 bundle scores a text the same at batch
    1 and batch 8, where ORT's plain dynamic INT8 of the same float file does not."""
    from optimum.onnxruntime import ORTModelForSequenceClassification

    model, folder = student
    fp32 = export(model, OnnxExportConfig(), out=tmp_path / "fp32.onnx").path
    texts = sentences(24, seed=5)
    scores = {}
    for name in ("edgebert", "plain"):
        int8 = tmp_path / f"{name}.onnx"
        if name == "edgebert":
            quantize(fp32, DynamicInt8Config(target="x86"), out=int8)
        else:
            onnx_ptq.dynamic(fp32, int8, target="x86", per_channel=True, embeddings=True)
        bundle = write_bundle(tmp_path / name, models={"model.onnx": int8}, tokenizer_dir=folder, labels=LABELS,
                              eval_arrays=_arrays(tiny_tokenizer, sentences(8), 16), manifest={"task": "sst2"},
                              max_length=MAX_LENGTH, source_model=folder)
        pipe = transformers.pipeline("text-classification", tokenizer=str(bundle),
                                     model=ORTModelForSequenceClassification.from_pretrained(bundle))
        scores[name] = [[(o["label"], o["score"]) for o in pipe(texts, batch_size=b)] for b in (1, 8)]
    assert scores["edgebert"][0] == scores["edgebert"][1]
    assert scores["plain"][0] != scores["plain"][1]


def test_tokenizer_files_say_the_bundles_max_length(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["inputs"]["max_length"] == MAX_LENGTH
    assert json.loads((bundle / "tokenizer_config.json").read_text())["model_max_length"] == MAX_LENGTH
    fast = json.loads((bundle / "tokenizer.json").read_text())
    assert fast["truncation"]["max_length"] == MAX_LENGTH
    assert fast["padding"]["strategy"] == {"Fixed": MAX_LENGTH} and fast["padding"]["direction"] == "Right"
    from tokenizers import Tokenizer  # what an app using Hugging Face tokenizers reads

    ids = Tokenizer.from_file(str(bundle / "tokenizer.json")).encode(" ".join(["cat"] * 40)).ids
    assert len(ids) == MAX_LENGTH and ids[-1] == 3  # cut to the contract, ending in [SEP]


@pytest.mark.parametrize("family", ["bert", "albert"])
def test_save_hf_writes_a_pruned_student_exactly(family, tmp_path):
    torch.manual_seed(1)
    shared = {"attention_groups": [0, 0, 1, 1], "ffn_groups": [0, 0, 1, 1], "embedding_size": 8} \
        if family == "albert" else {}
    config = EncoderConfig(family=family, vocab_size=50, hidden_size=16, num_layers=4, num_heads=4,
                           intermediate_size=24, layer_heads=[2, 2, 3, 3] if shared else [1, 4, 3, 2],
                           layer_ffn=[8, 8, 12, 12] if shared else [8, 24, 12, 5], max_positions=32,
                           dropout=0.0, attention_dropout=0.0, **shared)
    model = build(config, HeadConfig(num_labels=3, labels=["a", "b", "c"])).eval()
    folder = save_hf(model, tmp_path / "hf")
    written = json.loads((folder / "config.json").read_text())
    widest = 12 if shared else 24
    assert written["intermediate_size"] == widest
    assert written["edgebert_ffn_padding"]["widths"] == config.layer_ffn
    assert written["pruned_heads"] == ({"0": [2, 3], "1": [3]} if shared else {"0": [1, 2, 3], "2": [3], "3": [2, 3]})
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(folder, attn_implementation="eager").eval()
    layer = (hf.albert.encoder.albert_layer_groups[0].albert_layers[0].attention if shared
             else hf.bert.encoder.layer[0].attention.self)
    assert layer.num_attention_heads == (2 if shared else 1)  # transformers pruned the heads on load
    ids = torch.randint(5, 50, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        ours = model(ids, mask)
        assert (hf(input_ids=ids, attention_mask=mask).logits - ours).abs().max() < 1e-5
        assert (load(folder)(ids, mask) - ours).abs().max() < 1e-5  # and edgebert reads pruned_heads back


def test_save_hf_refuses_heads_the_family_cannot_prune(tmp_path):
    config = EncoderConfig(family="distilbert", vocab_size=50, hidden_size=16, num_layers=2, num_heads=4,
                           intermediate_size=24, type_vocab_size=0, layer_heads=[2, 4], max_positions=32)
    with pytest.raises(Exception, match="per-layer head counts .* not expressible in transformers' distilbert"):
        save_hf(build(config, HeadConfig(num_labels=2)).eval(), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_manifest_says_which_files_padding_and_batching_change(tiny_classifier, tiny_arrays, tiny_tokenizer, tmp_path):
    """ORT's plain dynamic INT8 takes activation ranges over the padded batch; edgebert's runs each row alone at its
    length (with or without the export's padding trim): the manifest must say which, truthfully."""
    fp32 = export(tiny_classifier, OnnxExportConfig(trim_padding=False), out=tmp_path / "fp32.onnx").path
    int8 = quantize(fp32, DynamicInt8Config(target="x86"), out=tmp_path / "int8.onnx", eval_data=tiny_arrays).path
    trimmed = quantize(export(tiny_classifier, OnnxExportConfig(), out=tmp_path / "trimmed-fp32.onnx").path,
                       DynamicInt8Config(target="x86"), out=tmp_path / "trimmed.onnx").path
    plain = tmp_path / "plain.onnx"  # what Optimum's quantizer writes
    onnx_ptq.dynamic(fp32, plain, target="x86", per_channel=True, embeddings=True)
    tokenizer_dir = tmp_path / "tokenizer"
    tiny_tokenizer.save_pretrained(tokenizer_dir)
    out = write_bundle(tmp_path / "b", models={"model.onnx": fp32, "int8.onnx": int8, "trimmed.onnx": trimmed,
                                               "plain.onnx": plain},
                       tokenizer_dir=tokenizer_dir, labels=LABELS, eval_arrays=tiny_arrays, manifest={}, max_length=32)
    files = json.loads((out / "manifest.json").read_text())["inputs"]["files"]
    for name in ("model.onnx", "int8.onnx", "trimmed.onnx"):
        assert files[name]["padding_invariant"] is True and files[name]["batch_invariant"] is True, name
    for name in ("int8.onnx", "trimmed.onnx"):
        assert files[name]["max_abs_diff"] == 0 and files[name]["batch_max_abs_diff"] == 0
    assert files["plain.onnx"]["padding_invariant"] is False and files["plain.onnx"]["max_abs_diff"] > 0
    assert files["plain.onnx"]["batch_invariant"] is False and files["plain.onnx"]["batch_max_abs_diff"] > 0
    assert files["plain.onnx"]["padded_to"] == 32 and files["plain.onnx"]["examples"] == len(tiny_arrays["lengths"])
    assert files["plain.onnx"]["batch"] == 8

    def run(name, row, length):  # one example, padded to `length`, straight through onnxruntime
        session = ort.InferenceSession(str(out / name), providers=["CPUExecutionProvider"])
        n = tiny_arrays["lengths"][row]
        feed = {k: np.pad(tiny_arrays[k][row:row + 1, :n], ((0, 0), (0, length - n))).astype(np.int64)
                for k in ("input_ids", "attention_mask", "token_type_ids")}
        return session.run(None, feed)[0]

    rows = range(len(tiny_arrays["lengths"]))
    assert max(np.abs(run("plain.onnx", r, tiny_arrays["lengths"][r]) - run("plain.onnx", r, 32)).max()
               for r in rows) == pytest.approx(files["plain.onnx"]["max_abs_diff"])
    assert all(np.abs(run("model.onnx", r, tiny_arrays["lengths"][r]) - run("model.onnx", r, 32)).max() < 1e-6
               for r in rows[:8])
