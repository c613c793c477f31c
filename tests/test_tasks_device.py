"""Each task on the device harness: NER bundles scored by entity F1 through `edgebert bench`, and
`run --text` reading raw lines through the bundle's tokenizer.json as labels, spans or vectors.

The models are lookup tables exported to ONNX (a token's logits are its row, plus its segment's row;
sentence outputs average them over the real tokens), so each test sets by hand which word gets which label.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from edgebert.bench import register
from edgebert.data import Example, Split, Task, pretokenize_eval
from edgebert.device_tests.metrics import IGNORE

TAGS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
NAMES = ("input_ids", "attention_mask", "token_type_ids")


class Lookup(torch.nn.Module):
    def __init__(self, words: np.ndarray, segments: np.ndarray, pooled: bool):
        super().__init__()
        self.words = torch.nn.Embedding.from_pretrained(torch.tensor(words, dtype=torch.float32))
        self.segments = torch.nn.Embedding.from_pretrained(torch.tensor(segments, dtype=torch.float32))
        self.pooled = pooled

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.words(input_ids) + self.segments(token_type_ids)
        if not self.pooled:
            return out
        m = attention_mask.unsqueeze(-1).to(out.dtype)
        return (out * m).sum(1) / m.sum(1).clamp(min=1.0)


def _onnx(module, path: Path, output: str = "logits") -> Path:
    sample = tuple(torch.ones(1, 8, dtype=torch.long) for _ in NAMES)
    torch.onnx.export(module, sample, str(path), input_names=list(NAMES), output_names=[output],
                      dynamic_axes={k: {0: "batch", 1: "seq"} for k in NAMES}, opset_version=17, dynamo=False)
    return path


def _table(tokenizer, classes: int, default: int, rows: dict[str, dict[int, float]]) -> np.ndarray:
    """A row per token: `default` class 1.0 everywhere, then each named token's own {class: logit}."""
    table = np.zeros((len(tokenizer), classes))
    table[:, default] = 1.0
    for token, logits in rows.items():
        table[tokenizer.convert_tokens_to_ids(token)] = 0.0
        for c, v in logits.items():
            table[tokenizer.convert_tokens_to_ids(token), c] = v
    return table


# NER: "cat" B-PER, "sat" I-PER, "mat" and "play" B-LOC, "##ing" I-PER: a word's tag is its first piece's,
# so "playing" must come out B-LOC, never I-PER.
NER_ROWS = {"cat": {1: 5.0}, "sat": {2: 5.0}, "mat": {3: 5.0}, "play": {3: 5.0}, "##ing": {2: 5.0}}
PREDICTED = {"cat": "B-PER", "sat": "I-PER", "mat": "B-LOC", "playing": "B-LOC"}
GOLD = [  # words with the gold tags; where they differ from PREDICTED the model is wrong
    (["the", "cat", "sat", "on", "the", "mat"], ["O", "B-PER", "I-PER", "O", "O", "B-LOC"]),
    (["playing", "on", "the", "mat", "."], ["B-LOC", "O", "O", "B-PER", "O"]),
    (["the", "cat", "on", "the", "cat"], ["O", "B-PER", "O", "O", "O"]),
    (["cat", "sat", "playing", ","], ["B-PER", "I-PER", "I-LOC", "O"]),
]


@pytest.fixture(scope="module")
def ner_bundle(tmp_path_factory, tiny_tokenizer):
    """A token-classification bundle (model.onnx, tokenizer.json, labels.txt, eval.npz with [N, T] tags)."""
    from edgebert.pipeline.bundle import write_bundle

    folder = tmp_path_factory.mktemp("ner")
    tiny_tokenizer.save_pretrained(folder / "tokenizer")
    model = _onnx(Lookup(_table(tiny_tokenizer, len(TAGS), 0, NER_ROWS), np.zeros((2, len(TAGS))), pooled=False),
                  folder / "model.onnx")
    task = Task("tiny-ner", "token-classification", TAGS, "entity_f1")
    split = Split(task, "dev", [Example(words, label=[TAGS.index(t) for t in tags]) for words, tags in GOLD])
    arrays = pretokenize_eval(split, tiny_tokenizer, 32)
    return write_bundle(folder / "bundle", models={"model.onnx": model}, tokenizer_dir=folder / "tokenizer",
                        labels=list(TAGS), eval_arrays=arrays, max_length=32,
                        manifest={"task": {"name": task.name, "kind": task.kind, "metric": task.metric}})


def _expected_entity_f1() -> float:
    """seqeval on the words: the model's word tags (PREDICTED, else O) against the gold ones."""
    from seqeval.metrics import f1_score

    gold = [tags for _, tags in GOLD]
    guess = [[PREDICTED.get(w, "O") for w in words] for words, _ in GOLD]
    return f1_score(gold, guess)


def test_eval_set_carries_token_labels_and_the_task(ner_bundle):
    data = np.load(ner_bundle / "eval.npz")
    assert data["labels"].shape == data["input_ids"].shape  # [N, T], IGNORE off first pieces
    lengths, labels = data["lengths"], data["labels"]
    assert (labels[:, 0] == IGNORE).all() and all((labels[i, n - 1:] == IGNORE).all() for i, n in enumerate(lengths))
    assert json.loads(str(data["task"][0])) == {"name": "tiny-ner", "kind": "token-classification",
                                                 "metric": "entity_f1", "labels": list(TAGS)}


def test_edgebert_bench_scores_a_ner_bundle_by_entity_f1(ner_bundle, tmp_path, capsys):
    out = tmp_path / "r.json"
    parser = argparse.ArgumentParser(prog="edgebert")
    register(parser.add_subparsers())
    args = parser.parse_args(["bench", str(ner_bundle), "--target", "local", "--warmup", "1", "--runs", "3",
                              "--json", str(out)])
    args.run(args)
    run = json.loads(out.read_text())["runs"][0]
    expected = _expected_entity_f1()
    assert 0 < expected < 1
    assert (run["task"], run["metric"]) == ("token-classification", "entity_f1")
    assert run["entity_f1"] == pytest.approx(expected) and "accuracy" not in run
    assert f"entity_f1 {expected:.4f}" in capsys.readouterr().out
    # the host's verification scores the same files the same way
    from edgebert.export import compare, load_arrays
    from edgebert.export.formats import of_file

    arrays = load_arrays(ner_bundle / "eval.npz")
    logits = of_file(ner_bundle / "model.onnx").run(ner_bundle / "model.onnx", arrays)
    check = compare(arrays, logits, logits)
    assert check["metric"] == "entity_f1" and check["value"] == pytest.approx(expected)


def _text(model, lines: list[str], tmp_path, *extra) -> tuple[int, list[dict], str]:
    file = tmp_path / "lines.txt"
    file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "edgebert.device_tests", "run", "--model", str(model), "--text",
                           str(file), *map(str, extra)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    return proc.returncode, [json.loads(x) for x in proc.stdout.splitlines() if x.strip()], proc.stderr


def test_text_gives_entity_spans_with_first_piece_alignment(ner_bundle, tmp_path):
    sentence = "The cat sat on the mat, playing."
    rc, lines, err = _text(ner_bundle / "model.onnx", [sentence], tmp_path)
    assert rc == 0, err
    (line,) = lines
    assert [(w["word"], w["label"]) for w in line["words"]] == [
        ("The", "O"), ("cat", "B-PER"), ("sat", "I-PER"), ("on", "O"), ("the", "O"), ("mat", "B-LOC"), (",", "O"),
        ("playing", "B-LOC"), (".", "O")]
    assert line["spans"] == [
        {"label": "PER", "text": "cat sat", "start": 4, "end": 11, "words": ["cat", "sat"]},
        {"label": "LOC", "text": "mat", "start": 19, "end": 22, "words": ["mat"]},
        {"label": "LOC", "text": "playing", "start": 24, "end": 31, "words": ["playing"]}]
    assert all(sentence[s["start"]:s["end"]] == s["text"] for s in line["spans"])


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tiny_tokenizer):
    """Every token says "negative" but "cat" says "positive"; the second segment says "positive" strongly."""
    from edgebert.tokenizer import save

    folder = tmp_path_factory.mktemp("classifier")
    words = _table(tiny_tokenizer, 2, 0, {"cat": {1: 5.0}})
    _onnx(Lookup(words, np.array([[0.0, 0.0], [0.0, 10.0]]), pooled=True), folder / "model.onnx")
    save(tiny_tokenizer, folder, max_length=32)
    (folder / "labels.txt").write_text("negative\npositive\n")
    return folder


def test_text_gives_labels_with_scores_and_reads_pairs(classifier, tmp_path):
    rc, lines, err = _text(classifier / "model.onnx", ["the mat", "the cat", "the mat\tthe mat"], tmp_path)
    assert rc == 0, err
    assert [line["labels"][0]["label"] for line in lines] == ["negative", "positive", "positive"]
    for line in lines:
        scores = [x["score"] for x in line["labels"]]
        assert sum(scores) == pytest.approx(1.0) and scores == sorted(scores, reverse=True)
    assert lines[2]["text"] == "the mat" and lines[2]["pair"] == "the mat"  # segment 1 reached the model
    # "the cat": [CLS] the cat [SEP] = rows (1,0), (1,0), (0,5), (1,0): mean (0.75, 1.25)
    assert lines[1]["labels"][0]["score"] == pytest.approx(1 / (1 + np.exp(-0.5)))
    long = " ".join(["the cat"] * 40)
    rc, lines, err = _text(classifier / "model.onnx", [long], tmp_path)
    assert rc == 0 and lines[0]["truncated"] is True, err  # cut at the bundle's max_length, and said so
    assert err.splitlines()[-1:] == ["device_tests: warning: 1 of 1 lines are longer than the model's 32 tokens and "
                                "were cut to them (line 1; `truncated` in the output): their answers read only the "
                                "start"]  # on screen, too
    rc, _, err = _text(classifier, ["the cat"], tmp_path)  # a folder for --model
    assert rc == 2 and err.strip() == (f"device_tests: error: --model {classifier} is a folder: pass the file in "
                                       f"it (e.g. {classifier}/model.onnx)")
    proc = subprocess.run([sys.executable, "-m", "edgebert.device_tests", "run", "--model", classifier / "model.onnx",
                           "--text", long], capture_output=True, text=True, timeout=120)  # text where a file belongs
    assert proc.returncode == 2 and proc.stderr.startswith("device_tests: error: cannot read --text the cat the cat")
    assert f"... ({len(long)} characters) (" in proc.stderr and len(proc.stderr) < 250


def test_text_gives_vectors_for_an_embeddings_output(tiny_tokenizer, classifier, tmp_path):
    words = np.random.default_rng(0).normal(size=(len(tiny_tokenizer), 6))
    model = _onnx(Lookup(words, np.zeros((2, 6)), pooled=True), tmp_path / "model.onnx", output="embeddings")
    rc, lines, err = _text(model, ["the cat sat"], tmp_path, "--tokenizer", classifier / "tokenizer.json")
    assert rc == 0, err
    ids = tiny_tokenizer("the cat sat")["input_ids"]
    np.testing.assert_allclose(lines[0]["embedding"], words[ids].mean(0), atol=1e-5)


def test_text_needs_tokenizers_but_the_eval_run_does_not(classifier, ner_bundle, tmp_path):
    """numpy + one runtime run the eval set; tokenizers is imported for --text alone."""
    (tmp_path / "lines.txt").write_text("the cat\n")
    blocked = "import sys; sys.modules['tokenizers'] = None; from edgebert.device_tests.cli import main; "
    run = [sys.executable, "-c"]
    eval_run = subprocess.run([*run, blocked + f"sys.exit(main(['run', '--model', {str(ner_bundle / 'model.onnx')!r}, "
                               f"'--inputs', {str(ner_bundle / 'eval.npz')!r}, '--runs', '2', '--warmup', '0', "
                               f"'--json', {str(tmp_path / 'r.json')!r}]))"], capture_output=True, text=True,
                              timeout=120)
    assert eval_run.returncode == 0, eval_run.stderr
    text_run = subprocess.run([*run, blocked + f"sys.exit(main(['run', '--model', "
                               f"{str(classifier / 'model.onnx')!r}, '--text', {str(tmp_path / 'lines.txt')!r}]))"],
                              capture_output=True, text=True, timeout=120)
    assert text_run.returncode == 2 and "--text needs the tokenizers library" in text_run.stderr


def test_text_refuses_bad_lines_in_one_line(classifier, tmp_path):
    rc, _, err = _text(classifier / "model.onnx", ["a\tb\tc"], tmp_path)
    assert rc == 2 and "lines.txt:1: expected one sentence or two tab-separated ones, got 3 fields" in err
    rc, _, err = _text(classifier / "model.onnx", ["the cat"], tmp_path, "--pad-to", 16)
    assert rc == 2 and "--pad-to times or scores the eval set and does not apply to --text" in err


@pytest.mark.parametrize("kind, metric, labels, width", [
    ("pair-classification", "f1", ["not_equivalent", "equivalent"], 2),
    ("classification", "accuracy", ["a", "b", "c"], 3),
    ("regression", "spearman", [], 1),
])
def test_verification_and_the_harness_score_the_task_metric(kind, metric, labels, width, tmp_path):
    """Export verification (and so the INT8 budget) and the device harness read the metric off the eval
    set's task entry: MRPC by F1, never accuracy; STS-B by Pearson."""
    from edgebert.device_tests.evalset import EvalSet, metric as harness_metric, task_entry
    from edgebert.device_tests.metrics import task_metrics
    from edgebert.export import compare

    rng = np.random.default_rng(0)
    n, t = 40, 8
    arrays = {k: np.ones((n, t), np.int32) for k in NAMES} | {"lengths": np.full(n, t, np.int32)}
    arrays["labels"] = rng.normal(size=n).astype(np.float32) if kind == "regression" else rng.integers(0, width, n)
    arrays["task"] = task_entry("t", kind, metric, labels)
    got, ref = rng.normal(size=(n, width)), rng.normal(size=(n, width))
    check = compare(arrays, got, ref)
    predictions = got[:, 0] if kind == "regression" else got.argmax(1)
    expected = task_metrics(kind, predictions, arrays["labels"], labels)
    assert check["metric"] == metric and check["value"] == pytest.approx(expected[metric])
    assert check["metrics"] == pytest.approx(expected)
    if kind == "classification":
        assert set(expected) == {"accuracy", "macro_f1"}
    np.savez(tmp_path / "eval.npz", **arrays)
    data = EvalSet(str(tmp_path / "eval.npz"))
    assert data.task["metric"] == metric
    assert harness_metric(got, data.labels, data.task)[0] == pytest.approx(expected)
