"""Users' own data: CSV / TSV / JSONL files with named columns, and Hugging Face `datasets`; and a
recipe's `[data]` table (`DataConfig`), which names them for `edgebert compile`."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from ..config import Config, repeated
from ..device_tests.files import sha256
from ..errors import EdgebertError
from ..tokenizer import _first_line
from .holdout import carve
from .readers import _BadRow, _kind, _label, _lines, _Rows, _text, nonempty, read_text
from .tasks import Example, Split, Task, metric_of

SUFFIXES = (".csv", ".tsv", ".jsonl")


def _records(path: Path) -> Iterator[tuple[int, dict | str]]:
    """(line, record) pairs; in place of a record, what is wrong with the line (a bad row). Lines are
    numbered as `_lines` numbers them, so a U+2028 inside a JSON string does not shift the count."""
    text = read_text(path)
    if path.suffix == ".jsonl":
        for number, line in enumerate(_lines(text), start=1):
            if line.strip():
                yield number, _json_record(path, number, line)
        return
    tsv = path.suffix == ".tsv"
    # Every field fits in its file: lift csv's 128 KiB cap, so a long text is read (and truncated to the
    # model's length later, with a count in the log) rather than failing as a raw _csv.Error.
    csv.field_size_limit(max(csv.field_size_limit(), min(len(text), 2**31 - 1)))
    reader = csv.DictReader(
        io.StringIO(text, newline=""), delimiter="\t" if tsv else ",",
        quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL,
    )
    try:
        _unique(path, reader.fieldnames or [], reader.line_num)
        for record in reader:
            wrong = None in record or None in record.values()
            yield reader.line_num, "wrong number of columns" if wrong else record
    except csv.Error as e:
        raise EdgebertError(f"{path}:{reader.line_num}: {e}; fix the line") from None


def _unique(path: Path, names: Sequence[str], line: int) -> None:
    """Refuse a header that names a column twice: a reader would silently keep only the last one."""
    seen: dict[str, int] = {}
    for column, name in enumerate(names, start=1):
        if name.strip() and name in seen:  # blank names: the trailing empty columns spreadsheets write
            raise EdgebertError(f"{path}:{line}: column {name!r} appears twice in the header (columns "
                                f"{seen[name]} and {column}); rename or remove one")
        seen.setdefault(name, column)


def _json_record(path: Path, number: int, line: str) -> dict | str:
    """One JSONL line's object, or what is wrong with it: a key twice, or not an object at all."""
    def fields(pairs):
        keys = [k for k, _ in pairs]
        twice = repeated(keys)
        if twice is not None:
            raise _BadRow(f"field {twice!r} appears twice; keep one")
        return dict(pairs)

    try:
        record = json.loads(line, object_pairs_hook=fields)
    except json.JSONDecodeError as e:
        raise EdgebertError(f"{path}:{number}: not valid JSON ({e.msg}); fix the line") from e
    except _BadRow as e:
        return str(e)
    if not isinstance(record, dict):
        return f"the line holds {_kind(record)}, not a JSON object with named fields"
    return record


def _to_examples(
    records: Iterable[tuple[str, dict | str]],
    task: Task,
    text_column: str,
    text_pair_column: str | None,
    label_column: str,
    rows: _Rows,
) -> list[Example]:
    examples = []
    for where, record in records:
        try:
            if isinstance(record, str):
                raise _BadRow(record)
            missing = [c for c in (text_column, text_pair_column) if c and c not in record]
            if missing:
                raise _BadRow(f"no {missing[0]!r} column (has {list(record)})")
            text = _text(record[text_column], "text")
            pair = _text(record[text_pair_column], "text pair") if text_pair_column else None
            examples.append(Example(text, pair, _label(record.get(label_column), task)))
        except _BadRow as e:
            rows.bad(where, str(e))
    return examples


def _is_score(value) -> bool:
    """A label that reads as a score: a JSON float, or text like "3.8" or "1e-2" (not "3")."""
    if isinstance(value, float):
        return True
    text = str(value).strip()
    try:
        float(text)
    except ValueError:
        return False
    return not text.lstrip("+-").isdigit()


def _found(value) -> bool:
    """Whether a raw label names a class or a score: not missing ("", "None"), not nan or inf, not a JSON
    object or array; such rows are reported as bad rows, and must not add a class or turn a file into scores."""
    if value is None or isinstance(value, (dict, list)) or str(value).strip() in ("", "None"):
        return False
    try:
        return math.isfinite(float(str(value).strip()))
    except ValueError:
        return True


def _infer(values: list, kind: str | None, paired: bool, labels: Sequence[str] | None) -> tuple[str, tuple]:
    """(kind, labels) from the raw label values: all scores → regression; else class names, sorted
    (numerically when they are all integers), so the same file always gives the same label order."""
    found = [v for v in values if _found(v)]
    if kind is None:
        scores = bool(found) and all(_is_score(v) or str(v).strip().lstrip("+-").isdigit() for v in found)
        kind = "regression" if scores and any(_is_score(v) for v in found) else (
            "pair-classification" if paired else "classification")
    if kind == "regression":
        return kind, ()
    if labels is None:
        names = {str(v).strip() for v in found}
        numeric = all(s.lstrip("-").isdigit() for s in names)
        labels = sorted(names, key=int if numeric else str)
    return kind, tuple(labels)


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
    """A CSV, TSV or JSONL file with named columns; labels default to the sorted values found, and the
    kind to regression when every label is a score ("3.8"), else (pair-)classification. A text must be a
    string: a NUL in it makes a bad row, other control characters are removed (`readers._text`)."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise EdgebertError(f"{path}: unsupported file type; use .csv, .tsv or .jsonl")
    if not path.is_file():
        raise EdgebertError(f"{path} not found; check the path")
    if kind == "token-classification":
        raise EdgebertError(f"{path}: token tasks need CoNLL-style files, not {path.suffix}")
    records = [(f"{path}:{number}", record) for number, record in _records(path)]
    found = [r.get(label_column) for _, r in records if isinstance(r, dict)]
    kind, labels = _infer(found, kind, bool(text_pair_column), labels)
    task = Task(path.stem, kind, labels, metric_of(kind, labels))
    rows = _Rows(str(path), on_bad_row)
    examples = _to_examples(records, task, text_column, text_pair_column, label_column, rows)
    return Split(task, path.stem, nonempty(examples, path, rows), rows.finish())


def load_hf(
    name: str,
    split: str,
    *,
    config: str | None = None,
    text_column: str = "sentence",
    label_column: str = "label",
    text_pair_column: str | None = None,
    labels: Sequence[str] | None = None,
    kind: str | None = None,
    on_bad_row: str = "error",
) -> Split:
    """A split of a Hugging Face dataset, for users who are online and have `datasets`: labels are a
    ClassLabel's names, else inferred from the values as `load_table` does."""
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
    records = []
    for i, record in enumerate(data):
        label = record.get(label_column)
        if names and isinstance(label, int):  # ClassLabel: -1 marks a hidden (test) label
            record = {**record, label_column: names[label] if 0 <= label < len(names) else None}
        records.append((f"{name}[{split}]:{i}", record))
    if names and kind is None:
        kind = "pair-classification" if text_pair_column else "classification"
    kind, labels = _infer([r.get(label_column) for _, r in records], kind, bool(text_pair_column),
                          labels if labels is not None else names or None)
    task = Task(f"{name}/{config}" if config else name, kind, labels, metric_of(kind, labels))
    rows = _Rows(f"{name}[{split}]", on_bad_row)
    examples = _to_examples(records, task, text_column, text_pair_column, label_column, rows)
    return Split(task, split, nonempty(examples, f"{name}[{split}]", rows), rows.finish())


# ---------------------------------------------------------------------------------------------
# A recipe's [data] table


@dataclass(frozen=True, kw_only=True)
class DataConfig(Config):
    """A recipe's `[data]` table: the user's own files (or an online `datasets` name), which columns hold
    the text, the pair and the label, and where the dev split comes from. Relative paths start from the
    folder `edgebert compile` runs in."""

    table = "data"

    train: str | None = None  # a .csv, .tsv or .jsonl file; with `dataset`, a split name (default "train")
    dev: str | None = None  # the same for the dev split; absent: `dev_fraction` of train, carved with the seed
    dataset: str | None = None  # a Hugging Face `datasets` name (needs `datasets` and the network)
    dataset_config: str | None = None  # its configuration, e.g. "sst2" for "glue"
    name: str | None = None  # the task's name in the bundle (default: the file's, or its folder's for train.*)
    text: str = "text"  # column of the (first) text
    pair: str | None = None  # column of the second text, for pair tasks
    label: str = "label"  # column of the label: a class name, an int, or a score for regression
    # absent: from the labels (token tasks read CoNLL files: task = "conll2003")
    kind: Literal["classification", "pair-classification", "regression"] | None = None
    dev_fraction: float = 0.1  # share of train carved out as dev when `dev` is absent

    def __post_init__(self):
        if not self.train and not self.dataset:
            raise EdgebertError('data.train: missing; name your training file (train = "data/train.csv") '
                                'or an online dataset (dataset = "glue")')
        if not self.dataset:
            for key in ("train", "dev"):
                value = getattr(self, key)
                if value and Path(value).suffix not in SUFFIXES:
                    raise EdgebertError(f"data.{key}: {value} is not a .csv, .tsv or .jsonl file; convert it, "
                                        "or name an online dataset with data.dataset")
        if not 0 < self.dev_fraction < 1:
            raise EdgebertError(f"data.dev_fraction: expected a fraction between 0 and 1, got {self.dev_fraction}")


def is_data_file(task: str) -> bool:
    """Whether a recipe's or the CLI's `task` names a user's file rather than a registered task."""
    return Path(task).suffix in SUFFIXES


def _columns(path: Path) -> list[str]:
    """The header of a CSV/TSV file, or the keys of a JSONL file's first record."""
    for _, record in _records(path):
        if isinstance(record, dict):
            return list(record)
    text = read_text(path)
    first = _lines(text)[0] if text.strip() else ""
    return first.split("\t" if path.suffix == ".tsv" else ",") if path.suffix != ".jsonl" else []


def _file(config: DataConfig, key: str) -> Path:
    path = Path(getattr(config, key))
    if not path.is_file():
        raise EdgebertError(f"data.{key}: {path} not found (no {path.resolve()}); check the path (in a recipe "
                            "file, relative to that file)")
    columns = _columns(path)  # none: an empty file, which load_table reports as holding no examples
    for field in ("text", "pair", "label"):
        column = getattr(config, field)
        if columns and column is not None and column not in columns:
            raise EdgebertError(f'data.{field}: column "{column}" not in {path.name} (columns: {", ".join(columns)}); '
                                f"set data.{field} to one of them")
    return path


def _carve(train: Split, fraction: float, seed: int) -> tuple[Split, Split]:
    """A seeded dev split out of `train`: the same seed and file give the same split."""
    n = len(train)
    size = max(1, round(n * fraction))
    if n - size < 1:
        raise EdgebertError(f"data.dev_fraction: train holds {n} examples, too few to carve a dev split from; "
                            "add rows or give a dev file (data.dev)")
    return carve(train, size, seed, name="dev")


def load_data(config: DataConfig, *, seed: int, on_bad_row: str = "error") -> tuple[Split, Split, dict]:
    """The train and dev splits a `[data]` table names, sharing one task (its labels from train), and
    what the manifest records of them: each file's sha256 and row counts, and how dev was made."""
    columns = {"text_column": config.text, "text_pair_column": config.pair, "label_column": config.label}
    if config.dataset:
        def load(split, **known):
            return load_hf(config.dataset, split, config=config.dataset_config, **columns, **known,
                           on_bad_row=on_bad_row)

        def source(split, loaded):
            return {"split": split, "rows": len(loaded), "skipped": len(loaded.skipped)}

        train_name, dev_name = config.train or "train", config.dev
        record = {"dataset": config.dataset, "config": config.dataset_config}
    else:
        def load(key, **known):
            return load_table(_file(config, key), **columns, **known, on_bad_row=on_bad_row)

        def source(key, loaded):
            path = getattr(config, key)
            return {"file": path, "sha256": sha256(path), "rows": len(loaded), "skipped": len(loaded.skipped)}

        train_name, dev_name = "train", "dev" if config.dev else None
        record = {}
    train = load(train_name, kind=config.kind)
    kind, labels = train.task.kind, train.task.labels
    if kind != "regression" and len(labels) < 2:
        raise EdgebertError(f"data.label: the training data has {len(labels)} label value(s) {list(labels)}; a "
                            "classifier needs at least two (scores? set data.kind = \"regression\")")
    record["train"] = source(train_name, train)
    if dev_name:
        dev = load(dev_name, kind=kind, labels=None if kind == "regression" else labels)
        record["dev"] = source(dev_name, dev)
    else:
        train, dev = _carve(train, config.dev_fraction, seed)
        record["dev"] = {"carved_from": "train", "fraction": config.dev_fraction, "seed": seed, "rows": len(dev)}
        record["train"]["rows"] = len(train)
    path = Path(config.train or "")
    default = train.task.name if config.dataset else path.parent.resolve().name if path.stem == "train" else path.stem
    task = Task(config.name or default, kind, labels, metric_of(kind, labels))
    record["columns"] = {"text": config.text, "pair": config.pair, "label": config.label}
    return replace(train, task=task, name="train"), replace(dev, task=task, name="dev"), record
