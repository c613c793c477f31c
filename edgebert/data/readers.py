"""The benchmark files of the registered tasks (GLUE-style TSV, CoNLL-2003), and the bad-row
policy every reader shares: stop at the first bad row with file:line, or skip, count and warn."""

from __future__ import annotations

import io
import math
import re
import warnings
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import EdgebertError
from .tasks import Example, Split, Task, data_root, get_task


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
                f"{message}; fix the row, or skip bad rows: on_bad_row = \"skip\" in the recipe, "
                "--on-bad-row skip on the command line, on_bad_row='skip' in Python"
            )
        self.skipped.append(message)

    def finish(self) -> list[str]:
        if self.skipped:
            warnings.warn(
                f"skipped {len(self.skipped)} bad rows in {self.source} "
                f"(first: {self.skipped[0]}); fix them, or stop at the first with on_bad_row = "
                "\"error\" (--on-bad-row error)",
                stacklevel=3,
            )
        return self.skipped


_CONTROL = re.compile("[\x01-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # C0, DEL and C1, less tab and line ends
_KINDS = {dict: "an object", list: "an array", bool: "true or false", int: "a number", float: "a number",
          str: "a string", type(None): "null"}


def _kind(value: Any) -> str:
    """What a parsed JSON value is, for a message: "an object", "an array", "a number"."""
    return _KINDS.get(type(value), f"a {type(value).__name__}")


def _text(value: Any, what: str) -> str:
    """A text field, stripped. Only a string: a JSON object, array or number is refused, not stringified.
    A NUL is refused (it marks a UTF-16 or binary file read as UTF-8); other control characters are
    removed, as BERT's tokenizer removes them (STS-B's train.tsv holds a stray \\x12)."""
    if value is not None and not isinstance(value, str):
        raise _BadRow(f"{what} must be a string, got {_kind(value)}")
    value = value or ""
    if "\x00" in value:
        raise _BadRow(f"{what} holds a NUL character at character {value.index(chr(0)) + 1} (is the file "
                      "UTF-16 or binary? save it as UTF-8 text)")
    text = _CONTROL.sub("", value).strip()
    if not text:
        raise _BadRow(f"empty {what}")
    return text


def _label(value: Any, task: Task, by_index: bool = False) -> int | float:
    """Parse a raw label: a class name (or index, for GLUE files) or a regression score."""
    if isinstance(value, (dict, list)):
        raise _BadRow(f"label must be a string or a number, got {_kind(value)}")
    raw = "" if value is None else str(value).strip()
    if not raw:
        raise _BadRow("missing label")
    if task.kind in ("regression", "embedding"):  # a score (an embedding task's pair similarity)
        try:
            score = float(raw)
        except ValueError:
            raise _BadRow(f"label {raw!r} is not a number") from None
        if not math.isfinite(score):  # nan/inf: a missing or broken score, which turns the metric into nan
            raise _BadRow(f"label {raw!r} is not a finite number")
        return score
    if by_index and raw.isdigit() and int(raw) < len(task.labels):
        return int(raw)
    if not by_index and raw in task.labels:
        return task.labels.index(raw)
    expected = f"0..{len(task.labels) - 1}" if by_index else str(list(task.labels))
    raise _BadRow(f"unknown label {raw!r}; expected {expected}")


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
_LAYOUTS["stsb-embedding"] = _LAYOUTS["stsb"]


def read_text(path: Path, *, encoding: str = "utf-8-sig") -> str:
    """A text file's contents (a BOM dropped: MRPC files start with one), or one EdgebertError naming
    the line of the first byte that is not UTF-8."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise EdgebertError(f"{path}: cannot read ({e.strerror}); check the path and its permissions") from None
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as e:
        head = raw[:e.start]  # line ends as _lines counts them
        line = head.count(b"\n") + head.count(b"\r") - head.count(b"\r\n") + 1
        raise EdgebertError(f"{path}:{line}: byte 0x{raw[e.start]:02x} is not UTF-8; re-save the file as UTF-8 "
                            "(e.g. iconv -f latin1 -t utf-8)") from None


def _lines(text: str) -> list[str]:
    """Lines as a text-mode file splits them (\\n, \\r\\n or \\r), without their ends. Not str.splitlines,
    which also splits on U+2028, U+0085, \\f and others a text may hold, so line numbers would drift."""
    return [line.rstrip("\r\n") for line in io.StringIO(text, newline="")]


def _read_glue(path: Path, task: Task, rows: _Rows) -> tuple[list[Example], None]:
    """A GLUE TSV's examples (its documents are unknown)."""
    lines = _lines(read_text(path))
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
    return examples, None


# ---------------------------------------------------------------------------------------------
# CoNLL-2003 (IOB2)


def _read_conll(path: Path, task: Task, rows: _Rows) -> tuple[list[Example], list[int]]:
    """Sentences of `token POS chunk NER` lines, and each one's document (counted by -DOCSTART- lines;
    None for a file without them); a bad line drops its whole sentence."""
    examples, documents, words, tags, broken, document = [], [], [], [], False, -1
    lines = _lines(read_text(path, encoding="utf-8"))
    for number, line in enumerate([*lines, "\n"], start=1):
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            if words and not broken:
                examples.append(Example(words, None, tags))
                documents.append(document)
            words, tags, broken = [], [], False
            document += bool(fields)
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
    return examples, documents if document >= 0 else None


_READERS = {"sst2": _read_glue, "mrpc": _read_glue, "stsb": _read_glue, "stsb-embedding": _read_glue,
            "conll2003": _read_conll}


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
    examples, documents = _READERS[task.name](path, task, rows)
    return Split(task, split, nonempty(examples, path, rows), rows.finish(), documents)


def nonempty(examples: list[Example], source, rows: _Rows) -> list[Example]:
    """`examples`, or an EdgebertError for a split with none (a header-only file, every row skipped)."""
    if not examples:
        why = f" (all {len(rows.skipped)} rows were bad, first: {rows.skipped[0]})" if rows.skipped else ""
        raise EdgebertError(f"{source} holds no examples{why}; point at a file with at least one labeled row")
    return examples
