"""Task data: real-file counts, bad rows, token labels, batching, MLM/NSP, eval set, task metrics."""

import json
import re
import sys
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from edgebert.data import (
    CONLL_TAGS,
    IGNORE,
    TASKS,
    BucketBatchSampler,
    EncodedDataset,
    Example,
    MLMCollator,
    PadCollator,
    Split,
    Task,
    compute_metrics,
    data_root,
    encode_split,
    load_hf,
    load_table,
    load_task,
    make_loader,
    metric_of,
    nsp_pairs,
    pretokenize_eval,
)
from edgebert.data.tasks import get_task, register
from edgebert.errors import EdgebertError

# Counts from each folder's SOURCE.md.
CLASS_COUNTS = {
    ("sst2", "train"): (29_780, 37_569),
    ("sst2", "dev"): (428, 444),
    ("mrpc", "train"): (1_194, 2_474),
    ("mrpc", "dev"): (129, 279),
    ("mrpc", "test"): (578, 1_147),
}
STSB = {"train": (5_749, 2.70), "dev": (1_500, 2.36), "test": (1_379, 2.61)}
CONLL = {  # sentences, then PER / LOC / ORG / MISC mentions
    "train": (14_041, 6_600, 7_140, 6_321, 3_438),
    "dev": (3_250, 1_842, 1_837, 1_341, 922),
    "test": (3_453, 1_617, 1_668, 1_661, 702),
}


@pytest.mark.parametrize(("task", "split"), list(CLASS_COUNTS))
def test_classification_counts_match_source(data_dir, task, split):
    data = load_task(task, split, data_dir=data_dir)
    counts = Counter(example.label for example in data.examples)
    assert (counts[0], counts[1]) == CLASS_COUNTS[task, split]
    assert not data.skipped


@pytest.mark.parametrize("split", list(STSB))
def test_stsb_counts_and_mean_score_match_source(data_dir, split):
    data = load_task("stsb", split, data_dir=data_dir)
    scores = np.array([example.label for example in data.examples])
    assert (len(data), round(float(scores.mean()), 2)) == STSB[split]
    assert scores.min() >= 0 and scores.max() <= 5
    assert all(example.text and example.text_pair for example in data.examples)


@pytest.mark.parametrize("split", list(CONLL))
def test_conll_sentence_and_entity_counts_match_source(data_dir, split):
    data = load_task("conll2003", split, data_dir=data_dir)
    tags = TASKS.get("conll2003").labels
    mentions = Counter(
        tags[t][2:] for e in data.examples for t in e.label if tags[t].startswith("B-")
    )
    assert (
        len(data),
        mentions["PER"],
        mentions["LOC"],
        mentions["ORG"],
        mentions["MISC"],
    ) == CONLL[split]


def test_mrpc_keeps_quotes_and_drops_the_bom(data_dir):
    first = load_task("mrpc", "train", data_dir=data_dir).examples[0]
    assert first.label == 1
    assert first.text.startswith('Amrozi accused his brother , whom he called " the witness "')


def test_data_root_prefers_argument_then_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEBERT_DATA", str(tmp_path))
    assert data_root() == tmp_path
    with pytest.raises(EdgebertError, match="pass --data DIR or set EDGEBERT_DATA"):
        data_root(tmp_path / "missing")


def test_tasks_are_registered_once_and_found_by_name():
    assert get_task("mrpc").metric == "f1" and list(TASKS)[:2] == ["sst2", "mrpc"]
    with pytest.raises(EdgebertError, match="^task 'sst2' is registered twice"):
        register(Task("sst2", "classification", ("a", "b")))
    with pytest.raises(EdgebertError, match="^unknown task 'imdb'; use one of sst2, mrpc, .* your own data"):
        get_task("imdb")


def test_unlabeled_split_is_refused(data_dir):
    with pytest.raises(EdgebertError, match="no labeled 'test' split"):
        load_task("sst2", "test", data_dir=data_dir)


# --- bad rows ------------------------------------------------------------------------------


def _write_sst2(root):
    path = root / "sst2" / "train.tsv"
    path.parent.mkdir()
    rows = [
        "sentence\tlabel",
        "a fine film \t1",
        "no label here\t",
        "a bad label\t7",
        "  \t0",
        "too\tmany\t1",
    ]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_bad_row_stops_with_file_and_line(tmp_path):
    path = _write_sst2(tmp_path)
    with pytest.raises(EdgebertError, match=f"{path}:3: missing label"):
        load_task("sst2", data_dir=tmp_path)


def test_bad_rows_are_skipped_counted_and_warned(tmp_path):
    path = _write_sst2(tmp_path)
    with pytest.warns(UserWarning, match="skipped 4 bad rows"):
        data = load_task("sst2", data_dir=tmp_path, on_bad_row="skip")
    assert data.examples == [Example("a fine film", None, 1)]
    assert [message.split(": ")[0] for message in data.skipped] == [
        f"{path}:{n}" for n in (3, 4, 5, 6)
    ]
    assert [
        "missing label" in data.skipped[0],
        "unknown label '7'" in data.skipped[1],
        "empty text" in data.skipped[2],
        "3 tab-separated fields" in data.skipped[3],
    ] == [True] * 4


def test_conll_bad_line_drops_its_sentence(tmp_path):
    path = tmp_path / "conll2003" / "train.txt"
    path.parent.mkdir()
    path.write_text(
        "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\n\n"
        "Peter NNP B-NP B-PER\nX NNP\n\nY NN I-NP B-FOO\n"
    )
    with pytest.raises(EdgebertError, match=f"{path}:6: 2 space-separated fields"):
        load_task("conll2003", data_dir=tmp_path)
    with pytest.warns(UserWarning, match="skipped 2 bad rows"):
        data = load_task("conll2003", data_dir=tmp_path, on_bad_row="skip")
    assert data.examples == [Example(["EU"], None, [TASKS.get("conll2003").labels.index("B-ORG")])]
    assert "unknown tag 'B-FOO'" in data.skipped[1]


def test_csv_and_jsonl_tables(tmp_path):
    csv_path = tmp_path / "reviews.csv"
    csv_path.write_text('text,label\n"good, really",pos\nbad,neg\n,pos\nmeh,\nextra,pos,1\n')
    with pytest.raises(EdgebertError, match=f"{csv_path}:4: empty text"):
        load_table(csv_path)
    with pytest.warns(UserWarning, match="skipped 3 bad rows"):
        data = load_table(csv_path, on_bad_row="skip")
    assert data.task.labels == ("neg", "pos")
    assert data.examples == [Example("good, really", None, 1), Example("bad", None, 0)]

    jsonl = tmp_path / "pairs.jsonl"
    lines = [{"a": "x", "b": "y", "label": "yes"}, {"a": "x", "b": "y", "label": "maybe"}]
    jsonl.write_text("\n".join(map(json.dumps, lines)) + "\n")
    with pytest.raises(EdgebertError, match=f"{jsonl}:2: unknown label 'maybe'"):
        load_table(jsonl, text_column="a", text_pair_column="b", labels=["no", "yes"])


# --- input semantics: each class of bad input is one line naming file, line and fix, or read as documented


@pytest.mark.parametrize("name, header", [("t.csv", "text,label,text"), ("t.tsv", "text\tlabel\ttext")])
def test_a_column_named_twice_is_refused(tmp_path, name, header):
    path = tmp_path / name
    sep = "\t" if name.endswith(".tsv") else ","
    path.write_text(f"{header}\n{sep.join('axb')}\n{sep.join('cyd')}\n")
    with pytest.raises(EdgebertError, match=f"^{path}:1: column 'text' appears twice in the header "
                                            r"\(columns 1 and 3\); rename or remove one$"):
        load_table(path, on_bad_row="skip")  # the whole file is wrong, not a row


def test_blank_trailing_columns_are_not_duplicates(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_text("text,label,,\na,x,,\nb,y,,\n")
    assert load_table(path).examples == [Example("a", None, 0), Example("b", None, 1)]


def test_a_jsonl_key_given_twice_is_a_bad_row(tmp_path):
    path = tmp_path / "twice.jsonl"
    path.write_text('{"text": "a", "label": "x"}\n{"text": "b", "text": "c", "label": "y"}\n')
    with pytest.raises(EdgebertError, match=f"{path}:2: field 'text' appears twice; keep one; fix the row"):
        load_table(path, labels=["x", "y"])


def test_nan_and_inf_scores_are_bad_rows(tmp_path):
    path = tmp_path / "scores.csv"
    path.write_text("text,label\na,1.5\nb,nan\nc,inf\nd,-Infinity\ne,2.5\n")
    with pytest.raises(EdgebertError, match=f"{path}:3: label 'nan' is not a finite number; fix the row"):
        load_table(path)
    with pytest.warns(UserWarning, match="skipped 3 bad rows"):
        data = load_table(path, on_bad_row="skip")
    assert data.task.kind == "regression" and [e.label for e in data.examples] == [1.5, 2.5]
    assert [m.split(": ")[0] for m in data.skipped] == [f"{path}:{n}" for n in (3, 4, 5)]
    jsonl = tmp_path / "scores.jsonl"  # JSON's own NaN literal, as pandas' to_json can write
    jsonl.write_text('{"text": "a", "label": 0.5}\n{"text": "b", "label": NaN}\n')
    with pytest.raises(EdgebertError, match=f"{jsonl}:2: label 'nan' is not a finite number"):
        load_table(jsonl)


def test_a_nan_label_does_not_turn_classes_into_scores(tmp_path):
    path = tmp_path / "classes.csv"
    path.write_text("text,label\na,0\nb,1\nc,nan\n")
    with pytest.warns(UserWarning, match="skipped 1 bad rows"):
        data = load_table(path, on_bad_row="skip")
    assert (data.task.kind, data.task.labels) == ("classification", ("0", "1"))
    assert data.skipped == [f"{path}:4: unknown label 'nan'; expected ['0', '1']"]


def test_a_json_object_or_array_as_text_or_label_is_a_bad_row(tmp_path):
    path = tmp_path / "nested.jsonl"
    lines = [{"text": {"a": 1}, "label": "x"}, {"text": "ok", "pair": ["a"], "label": "y"},
             {"text": 42, "label": "x"}, {"text": "ok", "label": {"y": 1}}, {"text": "fine", "label": "y"}]
    lines = [{"pair": "p", **line} for line in lines]
    path.write_text("\n".join(map(json.dumps, lines)) + "\n")
    with pytest.raises(EdgebertError, match=f"^{path}:1: text must be a string, got an object; fix the row"):
        load_table(path)
    with pytest.warns(UserWarning, match="skipped 4 bad rows"):
        data = load_table(path, text_pair_column="pair", on_bad_row="skip")
    assert data.skipped[1:] == [f"{path}:2: text pair must be a string, got an array",
                                f"{path}:3: text must be a string, got a number",
                                f"{path}:4: label must be a string or a number, got an object"]
    assert data.task.labels == ("x", "y")  # the object label adds no class


@pytest.mark.parametrize("line, kind", [('["a", "x"]', "an array"), ("3", "a number"), ('"a"', "a string"),
                                        ("null", "null"), ("true", "true or false")])
def test_a_jsonl_line_that_is_not_an_object_is_a_bad_row(tmp_path, line, kind):
    path = tmp_path / "lines.jsonl"
    path.write_text(f'{{"text": "a", "label": "x"}}\n{line}\n{{"text": "b", "label": "y"}}\n')
    with pytest.raises(EdgebertError, match=re.escape(f"{path}:2: the line holds {kind}, not a JSON object with "
                                                      "named fields; fix the row")):
        load_table(path)
    with pytest.warns(UserWarning, match="skipped 1 bad rows"):
        assert len(load_table(path, on_bad_row="skip")) == 2


@pytest.mark.parametrize("name, sep", [("long.csv", ","), ("long.tsv", "\t")])
def test_a_field_over_the_csv_module_limit_is_read(tmp_path, name, sep):
    """csv's default cap is 128 KiB a field; longer texts are read (the encoder truncates and counts them)."""
    path = tmp_path / name
    path.write_text(f"text{sep}label\n{'a' * (1 << 20)}{sep}x\nb{sep}y\n")
    data = load_table(path)
    assert len(data.examples[0].text) == 1 << 20 and data.examples[1] == Example("b", None, 1)


# Characters str.splitlines breaks on but an editor does not: inside a text, none may shift a line number.
SEPARATORS = ["\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1c", "\x1e"]


@pytest.mark.parametrize("sep", SEPARATORS, ids=[f"U+{ord(c):04X}" for c in SEPARATORS])
def test_line_numbers_count_only_line_ends(tmp_path, sep):
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text(json.dumps({"text": f"a{sep}b", "label": "x"}, ensure_ascii=False) + "\n"
                     + '{"text": "", "label": "x"}\n', encoding="utf-8")
    csv_path = tmp_path / "t.csv"
    csv_path.write_text(f'text,label\n"a{sep}b",x\n,x\n', encoding="utf-8")
    sst2 = tmp_path / "sst2" / "train.tsv"
    sst2.parent.mkdir()
    sst2.write_text(f"sentence\tlabel\na{sep}b\t1\n\t0\n", encoding="utf-8")
    for path, line, load in ((jsonl, 2, load_table), (csv_path, 3, load_table),
                             (sst2, 3, lambda p: load_task("sst2", data_dir=tmp_path))):
        with pytest.raises(EdgebertError, match=f"^{re.escape(str(path))}:{line}: empty text"):
            load(path)


def test_undecodable_byte_line_counts_crlf_once(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"text,label\r\na,x\r\n\xe9,y\r\n")
    with pytest.raises(EdgebertError, match=f"{path}:3: byte 0xe9 is not UTF-8"):
        load_table(path)


def test_control_characters_are_removed_and_a_nul_refused(tmp_path):
    """Documented in readers._text: a NUL marks a UTF-16 or binary file; other control characters are
    dropped, as BERT's tokenizer drops them (tab and line ends are kept as text)."""
    path = tmp_path / "ctl.jsonl"
    lines = [{"text": "Treasury\x12s plan\x7f\x85", "label": "x"}, {"text": "a\tb\nc", "label": "y"},
             {"text": "\x01\x02", "label": "x"}, {"text": "ab\x00c", "label": "y"}]
    path.write_text("\n".join(map(json.dumps, lines)) + "\n")
    with pytest.raises(EdgebertError, match=f"{path}:3: empty text; fix the row"):
        load_table(path)
    with pytest.warns(UserWarning, match="skipped 2 bad rows"):
        data = load_table(path, on_bad_row="skip")
    assert data.examples == [Example("Treasurys plan", None, 0), Example("a\tb\nc", None, 1)]
    assert data.skipped[1] == (f"{path}:4: text holds a NUL character at character 3 (is the file UTF-16 or "
                               "binary? save it as UTF-8 text)")
    sst2 = tmp_path / "sst2" / "train.tsv"  # the registered readers share the rule
    sst2.parent.mkdir()
    sst2.write_text("sentence\tlabel\nfine\x12 film\t1\nx\x00y\t0\n")
    with pytest.raises(EdgebertError, match=f"{sst2}:3: text holds a NUL character at character 2"):
        load_task("sst2", data_dir=tmp_path)


class _FakeDataset(list):
    """Just what load_hf reads from a `datasets.Dataset`: features and row dicts."""

    features = {"label": SimpleNamespace(names=["negative", "positive"])}


def test_datasets_rows_map_class_labels_and_hidden_labels_are_bad(monkeypatch):
    rows = _FakeDataset([{"sentence": "fine", "label": 1}, {"sentence": "hidden", "label": -1}])
    monkeypatch.setitem(sys.modules, "datasets", SimpleNamespace(load_dataset=lambda *a, **k: rows))
    with pytest.warns(UserWarning, match="skipped 1 bad rows"):
        data = load_hf("glue", "test", config="sst2", on_bad_row="skip")
    assert (data.task.name, data.task.labels) == ("glue/sst2", ("negative", "positive"))
    assert data.examples == [Example("fine", None, 1)]
    assert data.skipped == ["glue[test]:1: missing label"]


def test_datasets_offline_is_a_clear_error(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'glue' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setitem(sys.modules, "datasets", SimpleNamespace(load_dataset=offline))
    with pytest.raises(EdgebertError, match="could not load dataset 'glue'.*online"):
        load_hf("glue", "validation", config="sst2")


def test_datasets_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(EdgebertError, match="pip install datasets"):
        load_hf("glue", "validation", config="sst2")


# --- encoding and batching -----------------------------------------------------------------


def _split(kind, examples, labels=("neg", "pos")):
    return Split(Task("toy", kind, labels), "dev", examples)


def test_conll_labels_sit_on_the_first_word_piece(tiny_tokenizer):
    split = _split(
        "token-classification",
        [Example(["The", "cat", "playing"], None, [0, 3, 4])],
        TASKS.get("conll2003").labels,
    )
    input_ids, _, labels, _ = encode_split(split, tiny_tokenizer, 16)
    assert tiny_tokenizer.convert_ids_to_tokens(input_ids[0]) == [
        "[CLS]",
        "the",
        "cat",
        "play",
        "##ing",
        "[SEP]",
    ]
    assert labels[0] == [IGNORE, 0, 3, 4, IGNORE, IGNORE]


def test_dataset_truncation_is_counted_and_warned(tiny_tokenizer):
    split = _split(
        "classification", [Example("the cat " * 20, None, 1), Example("the mat", None, 0)]
    )
    with pytest.warns(UserWarning, match="toy/dev: truncated 1 of 2"):
        dataset = EncodedDataset(split, tiny_tokenizer, 8)
    assert dataset.truncated == 1 and dataset.lengths == [8, 4]


def test_collate_pads_dynamically_to_int64(tiny_tokenizer):
    split = _split(
        "pair-classification",
        [Example("the cat", "sat", 1), Example("on the mat .", "the cat sat", 0)],
    )
    batch = PadCollator(tiny_tokenizer.pad_token_id)([*EncodedDataset(split, tiny_tokenizer, 16)])
    assert batch["input_ids"].shape == (2, 10)
    assert all(
        batch[k].dtype == torch.int64
        for k in ("input_ids", "attention_mask", "token_type_ids", "labels")
    )
    assert batch["attention_mask"][0].tolist() == [1] * 6 + [0] * 4
    assert batch["input_ids"][0, 6:].tolist() == [tiny_tokenizer.pad_token_id] * 4
    assert batch["token_type_ids"][1].tolist() == [0] * 6 + [1] * 4
    items = [*EncodedDataset(split, tiny_tokenizer, 16)]
    rounded = PadCollator(tiny_tokenizer.pad_token_id, multiple=8)(items)  # 10 tokens: 16
    assert rounded["input_ids"].shape == (2, 16) and rounded["attention_mask"][1].tolist() == [1] * 10 + [0] * 6
    assert torch.equal(rounded["input_ids"][:, :10], batch["input_ids"])
    assert PadCollator(tiny_tokenizer.pad_token_id, multiple=8, limit=12)(items)["input_ids"].shape == (2, 12)


def test_bucketed_batches_are_reproducible_and_cover_every_example():
    lengths = np.random.default_rng(0).integers(3, 60, size=1000)
    first = list(BucketBatchSampler(lengths, 8, seed=1, chunk_batches=10))
    again = BucketBatchSampler(lengths, 8, seed=1, chunk_batches=10)
    assert list(again) == first
    assert list(again) != first  # the next epoch reshuffles
    assert sorted(i for batch in first for i in batch) == list(range(1000))
    spread = np.mean([np.ptp(lengths[batch]) for batch in first])
    assert spread < 10  # sorted within chunks: batches hold similar lengths (random would be ~45)


def test_train_loader_yields_padded_batches(tiny_tokenizer):
    split = _split(
        "classification", [Example("the cat " * (i % 5 + 1), None, i % 2) for i in range(50)]
    )
    dataset = EncodedDataset(split, tiny_tokenizer, 32)
    batches = list(make_loader(dataset, 8, pad_id=tiny_tokenizer.pad_token_id, train=True, seed=3))
    assert sum(len(b["labels"]) for b in batches) == 50
    assert all(b["attention_mask"].sum(1).max() == b["input_ids"].shape[1] for b in batches)


# --- pretraining ---------------------------------------------------------------------------


def test_masking_statistics(tiny_tokenizer):
    tok = tiny_tokenizer
    rows, width = 100, 1002
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, len(tok), (rows, width), generator=generator)
    input_ids[:, 0], input_ids[:, 500], input_ids[:, -1] = (
        tok.cls_token_id,
        tok.sep_token_id,
        tok.sep_token_id,
    )
    input_ids[::4, -50:] = tok.pad_token_id  # pad tails
    special = torch.isin(input_ids, torch.tensor(tok.all_special_ids))

    masked, labels = MLMCollator(tok, seed=0).mask(input_ids)
    chosen = labels != IGNORE
    assert special.logical_not().sum() > 95_000
    assert abs(chosen.sum() / (~special).sum() - 0.15) < 0.01
    assert not chosen[special].any() and torch.equal(masked[special], input_ids[special])
    assert torch.equal(labels[chosen], input_ids[chosen])
    to_mask = (masked[chosen] == tok.mask_token_id).float().mean()
    unchanged = (masked[chosen] == input_ids[chosen]).float().mean()
    assert abs(to_mask - 0.8) < 0.015 and abs(unchanged - 0.1) < 0.015
    assert abs(1 - to_mask - unchanged - 0.1) < 0.015  # random replacements
    assert not torch.isin(
        masked[chosen & (masked != tok.mask_token_id)], torch.tensor(tok.all_special_ids)
    ).any()
    again, _ = MLMCollator(tok, seed=0).mask(input_ids)
    assert torch.equal(again, masked)


def test_nsp_pairs_are_half_next_and_negatives_come_from_other_documents():
    documents = [[f"d{d}s{s}" for s in range(10)] for d in range(1000)]
    pairs = nsp_pairs(documents, seed=0)
    assert len(pairs) == 9000
    labels = np.array([label for _, _, label in pairs])
    assert abs(labels.mean() - 0.5) < 0.03
    for a, b, label in pairs:
        doc_a, sent_a = a[1:].split("s")
        doc_b, sent_b = b[1:].split("s")
        if label == 0:
            assert (doc_b, int(sent_b)) == (doc_a, int(sent_a) + 1)
        else:
            assert doc_b != doc_a


# --- device eval set -----------------------------------------------------------------------


def test_pretokenize_eval_contract(tiny_tokenizer, tmp_path):
    split = _split(
        "pair-classification", [Example("the cat", "sat", 1), Example("on the mat", "the", 0)]
    )
    arrays = pretokenize_eval(split, tiny_tokenizer, 12, out_dir=tmp_path)
    assert arrays["input_ids"].shape == (2, 12) and arrays["input_ids"].dtype == np.int32
    assert arrays["lengths"].tolist() == [6, 7] and arrays["lengths"].dtype == np.int32
    assert arrays["attention_mask"].sum(1).tolist() == [6, 7]
    assert arrays["input_ids"][0, 6:].tolist() == [tiny_tokenizer.pad_token_id] * 6
    assert arrays["labels"].dtype == np.int64
    saved = np.load(tmp_path / "eval.npz")
    assert set(saved.files) == {
        "input_ids",
        "attention_mask",
        "token_type_ids",
        "lengths",
        "labels",
        "task",  # what the harness scores it by, without the manifest
    }
    assert json.loads(str(saved["task"][0]))["kind"] == "pair-classification"


def test_pretokenize_eval_regression_and_token_labels(tiny_tokenizer):
    scores = pretokenize_eval(
        _split("regression", [Example("the cat", "a cat", 4.5)], ()), tiny_tokenizer, 8
    )
    assert scores["labels"].dtype == np.float32 and scores["labels"].tolist() == [4.5]
    tags = _split(
        "token-classification", [Example(["playing"], None, [1])], TASKS.get("conll2003").labels
    )
    arrays = pretokenize_eval(tags, tiny_tokenizer, 8)
    assert arrays["labels"].tolist() == [
        [IGNORE, 1, IGNORE, IGNORE, IGNORE, IGNORE, IGNORE, IGNORE]
    ]


# --- metrics -------------------------------------------------------------------------------


def test_compute_metrics_picks_the_task_metrics():
    assert compute_metrics("mrpc", [1, 1, 0, 0], [1, 0, 0, 1]) == {"accuracy": 0.5, "f1": 0.5}
    assert compute_metrics("sst2", [1, 0, 0], [1, 0, 1]) == {"accuracy": pytest.approx(2 / 3)}
    scores = compute_metrics("stsb", [1.0, 2.0, 3.0], [1.0, 3.0, 2.0])
    assert scores == {"pearson": pytest.approx(0.5), "spearman": pytest.approx(0.5)}
    tags = TASKS.get("conll2003").labels
    gold = np.array([[IGNORE, tags.index("B-PER"), tags.index("I-PER"), IGNORE]])
    guess = np.array([[0, tags.index("B-PER"), tags.index("I-PER"), tags.index("B-LOC")]])  # IGNORE slots skipped
    assert compute_metrics("conll2003", guess, gold)["entity_f1"] == 1.0


@pytest.mark.parametrize("kind, labels, metric", [
    ("classification", ("neg", "pos"), "accuracy"),
    ("pair-classification", ("no", "yes"), "f1"),
    ("pair-classification", ("a", "b", "c"), "accuracy"),  # F1 names one positive class: three have none
    ("regression", (), "spearman"),
    ("token-classification", CONLL_TAGS, "entity_f1"),
    ("embedding", (), "cosine_spearman"),
])
def test_a_kind_has_one_metric(kind, labels, metric):
    assert metric_of(kind, labels) == metric


def test_the_built_in_tasks_use_their_kinds_metric():
    built_in = [get_task(name) for name in ("sst2", "mrpc", "stsb", "conll2003", "stsb-embedding")]
    assert all(t.metric == metric_of(t.kind, t.labels) for t in built_in)
