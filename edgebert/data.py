"""Task data: loaders for the benchmark files, encoding, batching, pretraining samplers, metrics.

The data root (`--data DIR`, else `EDGEBERT_DATA`, else `../shared/data` next to the repository)
is read in place and never copied: several of these corpora may not be redistributed.
"""

from __future__ import annotations

import csv
import json
import os
import random
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .device_tests.metrics import accuracy, entity_f1, f1, pearson, spearman
from .errors import EdgebertError
from .tokenizer import _first_line, encode

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
KINDS = ("classification", "pair-classification", "regression", "token-classification")
IGNORE = -100  # label of positions the loss and metrics skip
CONLL_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")


@dataclass(frozen=True)
class Task:
    """What a model learns: input kind, label names, files per split, and the primary metric
    (a key of `compute_metrics`' result, used to pick checkpoints)."""

    name: str
    kind: str
    labels: tuple[str, ...] = ()  # empty for regression
    metric: str = "accuracy"
    files: dict[str, str] = field(default_factory=dict)  # split -> path under the data root
    eval_split: str = "dev"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise EdgebertError(f"task {self.name}: unknown kind {self.kind!r}; use one of {KINDS}")


TASKS = {
    "sst2": Task(
        "sst2",
        "classification",
        ("negative", "positive"),
        "accuracy",
        {"train": "sst2/train.tsv", "dev": "sst2/dev.tsv"},
    ),
    "mrpc": Task(
        "mrpc",
        "pair-classification",
        ("not_equivalent", "equivalent"),
        "f1",
        {"train": "mrpc/train.tsv", "dev": "mrpc/dev.tsv", "test": "mrpc/msr_paraphrase_test.txt"},
    ),
    "stsb": Task(
        "stsb",
        "regression",
        (),
        "pearson",
        {"train": "stsb/train.tsv", "dev": "stsb/dev.tsv", "test": "stsb/sts-test.tsv"},
    ),
    "conll2003": Task(
        "conll2003",
        "token-classification",
        CONLL_TAGS,
        "entity_f1",
        {"train": "conll2003/train.txt", "dev": "conll2003/dev.txt", "test": "conll2003/test.txt"},
    ),
}


class Example(NamedTuple):
    """One input: text (a list of words for token tasks), optional pair, label index/score/tags."""

    text: str | list[str]
    text_pair: str | None = None
    label: int | float | list[int] | None = None


@dataclass
class Split:
    """Examples of one split, with the bad rows that were skipped ("file:line: problem")."""

    task: Task
    name: str
    examples: list[Example]
    skipped: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.examples)


def data_root(path: str | Path | None = None) -> Path:
    """The data folder: the argument, else EDGEBERT_DATA, else ../shared/data beside the repo."""
    root = Path(path or os.environ.get("EDGEBERT_DATA") or DEFAULT_DATA)
    if not root.is_dir():
        raise EdgebertError(f"data folder {root} not found; pass --data DIR or set EDGEBERT_DATA")
    return root


def get_task(task: str | Task) -> Task:
    if isinstance(task, Task):
        return task
    if task not in TASKS:
        raise EdgebertError(
            f"unknown task {task!r}; use one of {', '.join(TASKS)} or a CSV/JSONL file"
        )
    return TASKS[task]


# ---------------------------------------------------------------------------------------------
# Bad rows


class _BadRow(Exception):
    """Raised by a row parser; the reader adds file:line and applies on_bad_row."""


class _Rows:
    """Collects bad rows: raises at the first one ("error") or counts and warns ("skip")."""

    def __init__(self, source: str, on_bad_row: str):
        if on_bad_row not in ("skip", "error"):
            raise EdgebertError(f"on_bad_row must be 'skip' or 'error', got {on_bad_row!r}")
        self.source, self.on_bad_row, self.skipped = source, on_bad_row, []

    def bad(self, where: str, problem: str) -> None:
        message = f"{where}: {problem}"
        if self.on_bad_row == "error":
            raise EdgebertError(
                f"{message}; fix the row or pass on_bad_row='skip' to skip bad rows"
            )
        self.skipped.append(message)

    def finish(self) -> list[str]:
        if self.skipped:
            warnings.warn(
                f"skipped {len(self.skipped)} bad rows in {self.source} "
                f"(first: {self.skipped[0]}); fix them or pass on_bad_row='error' to stop at "
                "the first",
                stacklevel=3,
            )
        return self.skipped


def _text(value: Any, what: str) -> str:
    text = "" if value is None else str(value).strip()
    if not text:
        raise _BadRow(f"empty {what}")
    return text


def _label(value: Any, task: Task, by_index: bool = False) -> int | float:
    """Parse a raw label: a class name (or index, for GLUE files) or a regression score."""
    raw = "" if value is None else str(value).strip()
    if not raw:
        raise _BadRow("missing label")
    if task.kind == "regression":
        try:
            return float(raw)
        except ValueError:
            raise _BadRow(f"label {raw!r} is not a number") from None
    if by_index and raw.isdigit() and int(raw) < len(task.labels):
        return int(raw)
    if not by_index and raw in task.labels:
        return task.labels.index(raw)
    expected = f"0..{len(task.labels) - 1}" if by_index else str(list(task.labels))
    raise _BadRow(f"unknown label {raw!r}; expected {expected}")


# ---------------------------------------------------------------------------------------------
# GLUE-style TSV (read by splitting on tabs: MRPC and STS-B text holds unbalanced quotes)


class _Layout(NamedTuple):
    header: tuple[str, ...] | None
    columns: tuple[int, ...]  # allowed field counts
    text: int
    pair: int | None
    label: int


_STSB_HEADER = (
    "index",
    "genre",
    "filename",
    "year",
    "old_index",
    "source1",
    "source2",
    "sentence1",
    "sentence2",
    "score",
)
_LAYOUTS = {
    "sst2": [_Layout(("sentence", "label"), (2,), 0, None, 1)],
    "mrpc": [_Layout(("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"), (5,), 3, 4, 0)],
    # GLUE's train/dev, then the original sts-test.tsv: no header, 7 fields (9 with sources).
    "stsb": [_Layout(_STSB_HEADER, (10,), 7, 8, 9), _Layout(None, (7, 9), 5, 6, 4)],
}


def _read_glue(path: Path, task: Task, rows: _Rows) -> list[Example]:
    with open(path, encoding="utf-8-sig", newline="") as f:  # MRPC files start with a BOM
        lines = [line.rstrip("\r\n") for line in f]
    first = tuple(lines[0].split("\t")) if lines else ()
    for layout in _LAYOUTS[task.name]:
        if layout.header is None or first == layout.header:
            break
    else:
        raise EdgebertError(
            f"{path}:1: header {list(first)} is not the {task.name} layout "
            f"{list(_LAYOUTS[task.name][0].header)}; point at the GLUE {task.name} file"
        )
    examples = []
    start = 1 if layout.header else 0
    for number, line in enumerate(lines[start:], start=start + 1):
        fields = line.split("\t")
        try:
            if len(fields) not in layout.columns:
                raise _BadRow(
                    f"{len(fields)} tab-separated fields, "
                    f"expected {' or '.join(map(str, layout.columns))}"
                )
            text = _text(fields[layout.text], "text")
            pair = None if layout.pair is None else _text(fields[layout.pair], "text pair")
            examples.append(Example(text, pair, _label(fields[layout.label], task, by_index=True)))
        except _BadRow as e:
            rows.bad(f"{path}:{number}", str(e))
    return examples


# ---------------------------------------------------------------------------------------------
# CoNLL-2003 (IOB2)


def _read_conll(path: Path, task: Task, rows: _Rows) -> list[Example]:
    """Sentences of `token POS chunk NER` lines; a bad line drops its whole sentence."""
    examples, words, tags, broken = [], [], [], False
    with open(path, encoding="utf-8") as f:
        lines = list(f)
    for number, line in enumerate([*lines, "\n"], start=1):
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            if words and not broken:
                examples.append(Example(words, None, tags))
            words, tags, broken = [], [], False
            continue
        if len(fields) != 4:
            rows.bad(
                f"{path}:{number}",
                f"{len(fields)} space-separated fields, expected 4 (token POS chunk NER)",
            )
            broken = True
        elif fields[3] not in task.labels:
            rows.bad(
                f"{path}:{number}",
                f"unknown tag {fields[3]!r}; expected one of {list(task.labels)}",
            )
            broken = True
        else:
            words.append(fields[0])
            tags.append(task.labels.index(fields[3]))
    return examples


_READERS = {"sst2": _read_glue, "mrpc": _read_glue, "stsb": _read_glue, "conll2003": _read_conll}


def load_task(
    task: str | Task,
    split: str = "train",
    *,
    data_dir: str | Path | None = None,
    on_bad_row: str = "error",
) -> Split:
    """Load one split of a registered task from the data root."""
    task = get_task(task)
    if split not in task.files:
        raise EdgebertError(
            f"{task.name} has no labeled {split!r} split; use one of {', '.join(task.files)}"
        )
    path = data_root(data_dir) / task.files[split]
    if not path.is_file():
        raise EdgebertError(
            f"{path} not found; check --data DIR (it should hold {task.files[split]})"
        )
    rows = _Rows(str(path), on_bad_row)
    examples = _READERS[task.name](path, task, rows)
    return Split(task, split, examples, rows.finish())


# ---------------------------------------------------------------------------------------------
# Generic CSV / TSV / JSONL and Hugging Face `datasets`


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


# ---------------------------------------------------------------------------------------------
# Features, padding, batching


class EncodedDataset(Dataset):
    """A split encoded once with the tokenizer; padding happens per batch in `PadCollator`."""

    def __init__(self, split: Split, tokenizer, max_length: int):
        self.task = split.task
        self.input_ids, self.token_type_ids, self.labels, self.truncated = encode_split(
            split, tokenizer, max_length
        )
        self.lengths = [len(ids) for ids in self.input_ids]

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict:
        return {
            "input_ids": self.input_ids[i],
            "token_type_ids": self.token_type_ids[i],
            "labels": self.labels[i],
        }


@dataclass(frozen=True)
class TaskData:
    """What a pass trains and evaluates on: encoded train and eval splits, and the tokenizer that
    encoded them (distillation's MLM objective and augmentation need it)."""

    train: EncodedDataset
    eval: EncodedDataset | None = None
    tokenizer: Any = None


def encode_split(split: Split, tokenizer, max_length: int) -> tuple[list, list, list, int]:
    """(input_ids, token_type_ids, labels, truncated); token labels sit on first word pieces."""
    examples, task = split.examples, split.task
    source = f"{task.name}/{split.name}"
    if task.kind != "token-classification":
        pairs = [e.text_pair for e in examples] if task.kind != "classification" else None
        encoded = encode(
            tokenizer, [e.text for e in examples], pairs, max_length=max_length, source=source
        )
        return (
            encoded.input_ids,
            encoded.token_type_ids,
            [e.label for e in examples],
            encoded.truncated,
        )
    encoded = encode(
        tokenizer,
        [e.text for e in examples],
        max_length=max_length,
        is_split_into_words=True,
        source=source,
    )
    labels = []
    for example, word_ids in zip(examples, encoded.word_ids, strict=True):
        aligned, previous = [], None
        for word in word_ids:
            aligned.append(IGNORE if word is None or word == previous else example.label[word])
            previous = word
        labels.append(aligned)
    return encoded.input_ids, encoded.token_type_ids, labels, encoded.truncated


def pad(sequences: Sequence[Sequence], length: int, value: int | float, dtype) -> np.ndarray:
    """Right-pad sequences into a [N, length] array."""
    out = np.full((len(sequences), length), value, dtype=dtype)
    for i, seq in enumerate(sequences):
        out[i, : len(seq)] = seq
    return out


class PadCollator:
    """Pads a list of items to the longest in the batch: int64 ids, mask, types and labels."""

    def __init__(self, pad_id: int, pad_token_type_id: int = 0):
        self.pad_id, self.pad_token_type_id = pad_id, pad_token_type_id

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        ids = [item["input_ids"] for item in items]
        length = max(map(len, ids))
        batch = {
            "input_ids": torch.from_numpy(pad(ids, length, self.pad_id, np.int64)),
            "attention_mask": torch.from_numpy(
                pad([[1] * len(s) for s in ids], length, 0, np.int64)
            ),
            "token_type_ids": torch.from_numpy(
                pad(
                    [item["token_type_ids"] for item in items],
                    length,
                    self.pad_token_type_id,
                    np.int64,
                )
            ),
        }
        if "labels" in items[0]:
            labels = [item["labels"] for item in items]
            if isinstance(labels[0], list):
                batch["labels"] = torch.from_numpy(pad(labels, length, IGNORE, np.int64))
            else:
                batch["labels"] = torch.tensor(
                    labels, dtype=torch.float32 if isinstance(labels[0], float) else torch.int64
                )
        return batch


class BucketBatchSampler(Sampler[list[int]]):
    """Length-bucketed batches: less padding, still random, reproducible from (seed, epoch).

    Each epoch: shuffle, cut into chunks of `chunk_batches` batches, sort each chunk by length,
    split it into batches, shuffle the batch order within the chunk.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        *,
        seed: int = 0,
        chunk_batches: int = 100,
        drop_last: bool = False,
    ):
        if batch_size < 1:
            raise EdgebertError(f"batch_size must be at least 1, got {batch_size}")
        self.lengths, self.batch_size, self.seed = np.asarray(lengths), batch_size, seed
        self.chunk, self.drop_last, self.epoch = batch_size * chunk_batches, drop_last, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        self.epoch += 1
        order = rng.permutation(len(self.lengths))
        for start in range(0, len(order), self.chunk):
            chunk = order[start : start + self.chunk]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches = [
                chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size)
            ]
            if self.drop_last and len(batches[-1]) < self.batch_size:
                batches.pop()
            for b in rng.permutation(len(batches)):
                yield batches[b].tolist()

    def __len__(self) -> int:
        full, rest = divmod(len(self.lengths), self.batch_size)
        if self.drop_last:  # every chunk but the last holds whole batches
            return full
        return full + (rest > 0)


def make_loader(
    dataset: EncodedDataset,
    batch_size: int,
    *,
    pad_id: int,
    train: bool,
    seed: int = 0,
    collate=None,
) -> DataLoader:
    """Training: bucketed, shuffled batches. Evaluation: file order, so outputs match rows."""
    collate = collate or PadCollator(pad_id)
    if train:
        return DataLoader(
            dataset,
            batch_sampler=BucketBatchSampler(dataset.lengths, batch_size, seed=seed),
            collate_fn=collate,
        )
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate)


# ---------------------------------------------------------------------------------------------
# Pretraining: masked LM and next-sentence pairs


class MLMCollator:
    """Pads a batch and masks it as BERT does: 15% of real tokens, of those 80/10/10.

    80% become [MASK], 10% a random non-special token, 10% stay; labels are -100 elsewhere.
    Special and pad tokens are never chosen. Seeded with its own torch.Generator.
    """

    def __init__(self, tokenizer, *, probability: float = 0.15, seed: int = 0):
        if tokenizer.mask_token_id is None:
            raise EdgebertError("tokenizer has no mask token; MLM needs one (e.g. [MASK])")
        special = set(tokenizer.all_special_ids) | {tokenizer.pad_token_id}
        self.pad = PadCollator(tokenizer.pad_token_id, tokenizer.pad_token_type_id)
        self.probability, self.mask_id = probability, tokenizer.mask_token_id
        self.special_ids = torch.tensor(sorted(special))
        self.random_ids = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
        self.generator = torch.Generator().manual_seed(seed)

    def mask(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(masked input_ids, labels) for an int64 [B, T] batch."""
        g = self.generator
        candidates = ~torch.isin(input_ids, self.special_ids)
        chosen = candidates & (torch.rand(input_ids.shape, generator=g) < self.probability)
        labels = torch.where(chosen, input_ids, IGNORE)
        roll = torch.rand(input_ids.shape, generator=g)
        masked = input_ids.clone()
        masked[chosen & (roll < 0.8)] = self.mask_id
        randomized = chosen & (roll >= 0.8) & (roll < 0.9)
        picks = torch.randint(len(self.random_ids), (int(randomized.sum()),), generator=g)
        masked[randomized] = self.random_ids[picks]
        return masked, labels

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        batch = self.pad([{k: v for k, v in item.items() if k != "labels"} for item in items])
        batch["input_ids"], batch["labels"] = self.mask(batch["input_ids"])
        return batch


def nsp_pairs(documents: Sequence[Sequence[str]], *, seed: int = 0) -> list[tuple[str, str, int]]:
    """(sentence A, sentence B, label) for every adjacent pair: 50% IsNext (0), 50% NotNext (1).

    A NotNext partner is a random sentence from another document, as in BERT.
    """
    documents = [list(d) for d in documents if len(d)]
    if len(documents) < 2:
        raise EdgebertError(
            "NSP needs at least two non-empty documents to draw NotNext partners from"
        )
    rng = random.Random(seed)
    pairs = []
    for d, document in enumerate(documents):
        for i in range(len(document) - 1):
            if rng.random() < 0.5:
                pairs.append((document[i], document[i + 1], 0))
            else:
                other = rng.randrange(len(documents) - 1)
                other += other >= d
                pairs.append((document[i], rng.choice(documents[other]), 1))
    return pairs


# ---------------------------------------------------------------------------------------------
# Device eval set


def pretokenize_eval(
    task: str | Task | Split,
    tokenizer,
    max_length: int,
    *,
    split: str | None = None,
    data_dir: str | Path | None = None,
    out_dir: str | Path | None = None,
) -> dict[str, np.ndarray]:
    """The eval set as fixed-shape arrays for device checks; written to out_dir/eval.npz if given.

    input_ids / attention_mask / token_type_ids: int32 [N, max_length], right-padded with the pad
    id; lengths: int32 [N]; labels: int64 [N], float32 [N] for regression, int64 [N, T] with -100
    for token tasks.
    """
    if isinstance(task, Split):
        data = task
    else:
        task = get_task(task)
        data = load_task(task, split or task.eval_split, data_dir=data_dir)
    kind = data.task.kind
    input_ids, token_type_ids, labels, _ = encode_split(data, tokenizer, max_length)
    lengths = np.array([len(ids) for ids in input_ids], dtype=np.int32)
    if kind == "token-classification":
        label_array = pad(labels, max_length, IGNORE, np.int64)
    else:
        label_array = np.array(labels, dtype=np.float32 if kind == "regression" else np.int64)
    arrays = {
        "input_ids": pad(input_ids, max_length, tokenizer.pad_token_id, np.int32),
        "attention_mask": (np.arange(max_length)[None, :] < lengths[:, None]).astype(np.int32),
        "token_type_ids": pad(token_type_ids, max_length, tokenizer.pad_token_type_id, np.int32),
        "lengths": lengths,
        "labels": label_array,
    }
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        np.savez(Path(out_dir) / "eval.npz", **arrays)
    return arrays


def compute_metrics(task: str | Task, predictions, labels) -> dict[str, float]:
    """All metrics of a task kind: predicted class ids / scores / [N, T] tag ids vs labels."""
    task = get_task(task)
    if task.kind == "regression":
        return {"pearson": pearson(predictions, labels), "spearman": spearman(predictions, labels)}
    if task.kind == "token-classification":
        true, guess = [], []
        for predicted, gold in zip(np.asarray(predictions), np.asarray(labels), strict=True):
            keep = gold != IGNORE
            true.append([task.labels[t] for t in gold[keep]])
            guess.append([task.labels[t] for t in predicted[keep]])
        return entity_f1(true, guess)
    metrics = {"accuracy": accuracy(predictions, labels)}
    if len(task.labels) == 2:
        metrics["f1"] = f1(predictions, labels)
    return metrics
