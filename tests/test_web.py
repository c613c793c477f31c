"""The browser route: examples/web in headless Chromium (ONNX Runtime Web, WASM) against Python's
`tokenizers` and onnxruntime on the same bundle, and `edgebert bench --target web`.

Skipped, with the reason, where Chromium or the app's npm packages are missing (`npm ci` is tried first).
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgebert.bench import bench, table
from edgebert.device_tests import backends, files, runtimes, verify
from edgebert.device_tests.evalset import task_of
from edgebert.targets import BenchError
from edgebert.targets import web

ROOT = Path(__file__).resolve().parent.parent
REAL_BUNDLE = ROOT / "runs" / "default" / "bundle"
BUNDLE_FILES = ("model.onnx", "tokenizer.json", "tokenizer_config.json", "labels.txt", "eval.npz", "manifest.json",
                "golden.json")
TEXTS = [  # accents, punctuation, pieces, unknown characters, CJK, truncation, nothing at all
    "The cat sat on the mat.", "Café? Déjà vu, naïve AMÉLIE!", "playing... (the) [cat] {mat} $5+3=8 ~ | ^ `",
    "東京 the 😀 cat", "it's the cat's mat -- isn't it?", "zero\u200bwidth\u00a0space\ttab", "x" * 120,
    "the cat sat on the mat and the cat sat on the mat and the cat sat on the mat", "", "   "]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
WORDS = ["the", "cat", "sat", "on", "mat", "play", "##ing", "cafe", "deja", "vu", "naive", "amelie", "it", "s",
         "isn", "t", "x", "##x"]
PUNCTUATION = list(".,!?'()[]{}$+=~|^`-")


@pytest.fixture(scope="session")
def web_app():
    """examples/web with its npm packages, installed by `npm ci` when npm is here; else a skip naming why."""
    try:
        web.chromium()
    except BenchError as e:
        pytest.skip(str(e))
    if not (web.APP / "node_modules").is_dir():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip(f"{web.APP} has no node_modules and npm is not installed: run `npm ci` there")
        try:
            subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=web.APP, capture_output=True, text=True,
                           timeout=300, check=True)
        except subprocess.TimeoutExpired:
            pytest.skip(f"`npm ci` in {web.APP} took over 300 s (no registry?): run it there by hand")
        except subprocess.CalledProcessError as e:
            pytest.skip(f"`npm ci` in {web.APP} failed: {(e.stderr or e.stdout).strip().splitlines()[-1:]}")
    try:
        return web.app()
    except BenchError as e:
        pytest.skip(str(e))


def _tokenizer_json(path: Path, max_length: int) -> None:
    """An uncased BERT WordPiece tokenizer.json, as a bundle carries one (truncation and padding at max_length),
    over ids below the tiny model's vocabulary."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *LETTERS, *(f"##{c}" for c in LETTERS), *WORDS,
             *PUNCTUATION]
    tokenizer = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding(length=max_length)
    tokenizer.save(str(path))


def _open(path: Path):
    return lambda threads: backends.load(str(path), runtimes.choose(str(path)).name, threads)


def _finish(folder: Path) -> None:
    """golden.json for every model file, from its runtime here, when the bundle has none; a manifest listing
    every file."""
    record = json.loads((folder / "manifest.json").read_text())
    if not (folder / "golden.json").exists():
        columns = dict(np.load(folder / "eval.npz"))
        models = {p.name: _open(p) for p in sorted(folder.iterdir()) if p.suffix in (".onnx", ".tflite")}
        (folder / "golden.json").write_text(json.dumps(verify.golden(models, columns, task_of(columns))))
        record["golden"] = {"file": "golden.json"}
    record["files"] = {p.name: {"sha256": files.sha256(p), "bytes": p.stat().st_size}
                       for p in sorted(folder.iterdir()) if p.name != "manifest.json"}
    (folder / "manifest.json").write_text(json.dumps(record))


@pytest.fixture(scope="session")
def tiny_web(tiny, tmp_path_factory) -> Path:
    """The tiny ONNX classifier as a bundle the page loads: a WordPiece tokenizer.json cut at 16 tokens,
    labels, golden outputs and a manifest."""
    folder = tmp_path_factory.mktemp("tiny-web")
    for name in ("model.onnx", "eval.npz"):
        shutil.copy(tiny["bundle"] / name, folder / name)
    _tokenizer_json(folder / "tokenizer.json", 16)
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                              "do_lower_case": True, "model_max_length": 16}))
    (folder / "labels.txt").write_text("negative\npositive\n")
    (folder / "manifest.json").write_text(json.dumps({"inputs": {"max_length": 16}}))
    _finish(folder)
    return folder


def _python(folder: Path, texts: list[str]) -> list[dict]:
    """What Python makes of each text: tokenizer.json through `tokenizers` (without its padding), then
    model.onnx through onnxruntime, batch 1 at the text's own length."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    out = []
    for text in texts:
        e = tokenizer.encode(text)
        feeds = {"input_ids": e.ids, "attention_mask": e.attention_mask, "token_type_ids": e.type_ids}
        logits = session.run(None, {k: np.array([v], np.int64) for k, v in feeds.items()})[0][0]
        out.append({**feeds, "logits": logits})
    return out


def _agree(folder: Path, texts: list[str]) -> dict:
    """The page's ids and labels on `texts` against Python's: how many match, and the largest logit gap."""
    page = web.drive({"bundle": "/bundle/", "model": "model.onnx", "texts": texts},
                     {name: folder / name for name in BUNDLE_FILES if (folder / name).exists()}, timeout=300)
    want = _python(folder, texts)
    got = page["texts"]
    return {"page": page, "n": len(texts),
            "ids": sum(g["input_ids"] == w["input_ids"] and g["token_type_ids"] == w["token_type_ids"]
                       and g["attention_mask"] == w["attention_mask"] for g, w in zip(got, want)),
            "labels": sum(int(np.argmax(g["outputs"])) == int(np.argmax(w["logits"])) for g, w in zip(got, want)),
            "max_diff": max(float(np.abs(np.array(g["outputs"]) - w["logits"]).max()) for g, w in zip(got, want))}


def test_the_page_tokenizes_and_classifies_as_python_does(web_app, tiny_web):
    found = _agree(tiny_web, TEXTS)
    assert found["ids"] == found["n"], "the page's token ids differ from tokenizer.json's in Python"
    assert found["labels"] == found["n"] and found["max_diff"] < 1e-4
    page = found["page"]
    assert page["texts"][1]["tokens"][:5] == ["[CLS]", "cafe", "?", "deja", "vu"]  # accents stripped, lower case
    assert page["texts"][7]["truncated"] and len(page["texts"][7]["input_ids"]) == 16
    assert page["texts"][7]["input_ids"][-1] == 3  # cut at max_length, keeping the final [SEP]
    check = page["check"]
    assert check["passed"] is True and check["sha256_matches"] and check["labels_differ"] == 0
    assert check["max_abs_diff"] <= check["tolerance"]


def test_the_page_runs_edgebert_int8_one_row_at_a_time(web_app, tiny_web, tmp_path):
    """A dynamic-INT8 file as edgebert writes it (a Scan over the batch rows, ORT's integer contrib ops inside)
    loads in onnxruntime-web and gives Python's labels and first-run check."""
    from edgebert.quantize import DynamicInt8Config, quantize

    folder = tmp_path / "bundle"
    shutil.copytree(tiny_web, folder)
    (folder / "golden.json").unlink()
    int8 = quantize(tiny_web / "model.onnx", DynamicInt8Config(target="x86"), out=tmp_path / "int8.onnx")
    assert int8.meta["by_row"] is True
    shutil.copy(int8.path, folder / "model.onnx")
    _finish(folder)
    found = _agree(folder, TEXTS)
    assert found["ids"] == found["labels"] == found["n"] and found["page"]["check"]["passed"] is True


def test_the_demo_checks_the_bundle_and_classifies_on_load(web_app, tiny_web, tmp_path):
    """index.html as a person opens it (Chromium's --dump-dom, once the page is idle): the check's verdict
    and the sample text's label."""
    served = {name: tiny_web / name for name in BUNDLE_FILES}
    with web.serve({}, served) as (url, _):
        dom = subprocess.run([web.chromium(), "--headless", "--disable-gpu", "--no-sandbox",
                              f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", "--virtual-time-budget=60000",
                              f"{url}/index.html?bundle=/bundle/"], capture_output=True, text=True, timeout=120).stdout
    assert 'class="pass">first-run check: PASS model.onnx (onnxruntime-web ' in dom
    assert re.search(r'<div id="result"><h2>(negative|positive)</h2>', dom), dom[-800:]


def test_the_first_run_check_fails_on_other_outputs(web_app, tiny_web, tmp_path):
    """golden.json's outputs moved past the tolerance (its manifest entry updated too): the outputs fail alone."""
    folder = tmp_path / "bundle"
    shutil.copytree(tiny_web, folder)
    golden = json.loads((folder / "golden.json").read_text())
    entry = golden["files"]["model.onnx"]
    entry["outputs"] = [[x + 2 * entry["tolerance"] for x in row] for row in entry["outputs"]]
    (folder / "golden.json").write_text(json.dumps(golden))
    _finish(folder)
    page = web.drive({"bundle": "/bundle/", "model": "model.onnx"},
                     {name: folder / name for name in ("model.onnx", "manifest.json", "golden.json")}, timeout=300)
    check = page["check"]
    assert check["passed"] is False and check["sha256_matches"] and not check["outputs_match"]
    assert check["max_abs_diff"] > check["tolerance"]


def test_bench_web_times_the_onnx_file_in_the_browser(web_app, tiny_web, tiny, tmp_path):
    """The result has the local target's shape, so the two sit in one table; the bundle's .tflite is left out."""
    folder = tmp_path / "bundle"
    shutil.copytree(tiny_web, folder)
    shutil.copy(tiny["bundle"] / "model.tflite", folder / "model.tflite")
    (folder / "golden.json").unlink()
    _finish(folder)
    runs = bench(folder, target=["local", "web"], warmup=2, runs=10)["runs"]
    local = {r["model"]["file"]: r for r in runs if r["target"] == "local"}
    [browser] = [r for r in runs if r["target"] == "web"]
    assert set(local) == {"model.onnx", "model.tflite"} and browser["model"]["file"] == "model.onnx"
    assert browser["device"]["cpu_model"].startswith("Chromium ")
    assert browser["device"]["cpu_model"].endswith("(WASM, SIMD, 1 thread)")
    assert browser["runtime"]["backend"] == "onnxruntime-web" and not browser["emulated"]
    assert browser["settings"]["runs"] == 10 and browser["latency_ms"]["p50"] > 0
    assert browser["predictions"] == local["model.onnx"]["predictions"]
    assert browser["accuracy"] == pytest.approx(tiny["accuracy"])
    assert browser["verify"]["passed"] is True and browser["model"]["manifest_verified"]
    assert set(browser) >= set(local["model.onnx"]) - {"delegate_fit", "signatures_used"}
    assert "| model.onnx · onnxruntime-web · web | wasm32 Chromium " in table(runs)


def test_bench_web_refuses_what_the_browser_does_not_run(web_app, tiny):
    for kwargs, message in (({"fmt": "tflite"}, "web runs .onnx files .* got only model.tflite"),
                            ({"threads": 2}, "web: --threads 2: ORT Web runs 1 thread"),
                            ({"pad_to": 32}, "web: --pad-to 32: the page runs each example at its own length")):
        with pytest.raises(BenchError, match=message):
            bench(tiny["bundle"], target="web", **kwargs)


def test_the_real_bundle_in_the_browser_matches_python(web_app, data_dir, tmp_path):
    """200 SST-2 dev sentences through the real bundle: every token id and every label as in Python."""
    if not (REAL_BUNDLE / "model.onnx").is_file():
        pytest.skip(f"no real bundle at {REAL_BUNDLE}: compile it (edgebert compile --out runs/default)")
    folder = tmp_path / "bundle"
    folder.mkdir()
    for name in BUNDLE_FILES:
        if (REAL_BUNDLE / name).exists():
            shutil.copy(REAL_BUNDLE / name, folder / name)
    _finish(folder)  # a bundle written before golden.json gets one from onnxruntime here
    with open(data_dir / "sst2" / "dev.tsv", newline="", encoding="utf-8") as f:
        texts = [row["sentence"] for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)][:200]
    found = _agree(folder, texts)
    print(f"\nweb: {found['ids']}/200 token ids, {found['labels']}/200 labels as Python's; "
          f"max |logit diff| {found['max_diff']:.3g}; {verify.line(found['page']['check'])}")
    assert found["ids"] == 200 and found["labels"] == 200
    assert found["page"]["check"]["passed"] is True
