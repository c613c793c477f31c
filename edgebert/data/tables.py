"""Users' own data: CSV / TSV / JSONL files with named columns, and Hugging Face `datasets`."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from ..errors import EdgebertError
from ..tokenizer import _first_line
from .readers import _BadRow, _label, _Rows, _text
from .tasks import Example, Split, Task


def _records(path: Path) -> Iterator[tuple[int, dict | None]]:
    """(line, record) pairs; record is None when the line has the wrong number of fields."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        if path.suffix == ".jsonl":
            for number, line in enumerate(f, start=1):
                if line.strip():
                    try:
                        yield number, json.loads(line)
                    except json.JSONDecodeError as e:
                        raise EdgebertError(
                            f"{path}:{number}: not valid JSON ({e.msg}); fix the line"
                        ) from e
            return
        tsv = path.suffix == ".tsv"
        reader = csv.DictReader(
            f, delimiter="\t" if tsv else ",", quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL
        )
        for record in reader:
            wrong = None in record or None in record.values()
            yield reader.line_num, None if wrong else record


def _to_examples(
    records: Iterable[tuple[str, dict | None]],
    task: Task,
    text_column: str,
    text_pair_column: str | None,
    label_column: str,
    rows: _Rows,
) -> list[Example]:
    examples = []
    for where, record in records:
        try:
            if record is None:
                raise _BadRow("wrong number of columns")
            missing = [c for c in (text_column, text_pair_column) if c and c not in record]
            if missing:
                raise _BadRow(f"no {missing[0]!r} column (has {list(record)})")
            text = _text(record[text_column], "text")
            pair = _text(record[text_pair_column], "text pair") if text_pair_column else None
            examples.append(Example(text, pair, _label(record.get(label_column), task)))
        except _BadRow as e:
            rows.bad(where, str(e))
    return examples


def load_table(
    path: str | Path,
    *,
    text_column: str = "text",
    label_column: str = "label",
    text_pair_column: str | None = None,
    labels: Sequence[str] | None = None,
    kind: str | None = None,
    on_bad_row: str = "error",
) -> Split:
    """A CSV, TSV or JSONL file with named columns; labels default to the sorted values found."""
    path = Path(path)
    if path.suffix not in (".csv", ".tsv", ".jsonl"):
        raise EdgebertError(f"{path}: unsupported file type; use .csv, .tsv or .jsonl")
    if not path.is_file():
        raise EdgebertError(f"{path} not found; check the path")
    kind = kind or ("pair-classification" if text_pair_column else "classification")
    if kind == "token-classification":
        raise EdgebertError(f"{path}: token tasks need CoNLL-style files, not {path.suffix}")
    records = [(f"{path}:{number}", record) for number, record in _records(path)]
    if labels is None and kind != "regression":
        found = {str(r.get(label_column, "")).strip() for _, r in records if r} - {"", "None"}
        numeric = all(s.lstrip("-").isdigit() for s in found)
        labels = sorted(found, key=int if numeric else str)
    task = Task(
        path.stem, kind, tuple(labels or ()), "pearson" if kind == "regression" else "accuracy"
    )
    rows = _Rows(str(path), on_bad_row)
    examples = _to_examples(records, task, text_column, text_pair_column, label_column, rows)
    return Split(task, path.stem, examples, rows.finish())


def load_hf(
    name: str,
    split: str,
    *,
    config: str | None = None,
    text_column: str = "sentence",
    label_column: str = "label",
    text_pair_column: str | None = None,
    kind: str | None = None,
    on_bad_row: str = "error",
) -> Split:
    """A split of a Hugging Face dataset, for users who are online and have `datasets`."""
    try:
        import datasets
    except ImportError:
        raise EdgebertError(
            f"loading {name!r} needs the `datasets` package: pip install datasets "
            "(or use local files with --data)"
        ) from None
    try:
        data = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # datasets raises many types for offline / unknown names
        raise EdgebertError(
            f"could not load dataset {name!r} split {split!r}: {_first_line(e)}; check the name "
            "and that you are online, or use local files with --data"
        ) from e
    feature = data.features.get(label_column)
    names = tuple(getattr(feature, "names", ()) or ())
    if kind is None and not names:
        kind = "regression"
    elif kind is None:
        kind = "pair-classification" if text_pair_column else "classification"
    metric = "pearson" if kind == "regression" else "accuracy"
    task = Task(f"{name}/{config}" if config else name, kind, names, metric)

    def records():
        for i, record in enumerate(data):
            label = record.get(label_column)
            if names and isinstance(label, int):  # ClassLabel: -1 marks a hidden (test) label
                record = {**record, label_column: names[label] if 0 <= label < len(names) else None}
            yield f"{name}[{split}]:{i}", record

    rows = _Rows(f"{name}[{split}]", on_bad_row)
    examples = _to_examples(records(), task, text_column, text_pair_column, label_column, rows)
    return Split(task, split, examples, rows.finish())
