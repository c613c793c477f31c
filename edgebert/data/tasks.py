"""The registered tasks and what a loaded split holds.

The data root (`--data DIR`, else `EDGEBERT_DATA`, else `../shared/data` next to the repository)
is read in place and never copied: several of these corpora may not be redistributed. The one exception
is packaged: the quick default's SST-2 sample (`embedded/`, with its SOURCE.md), so a first run needs
nothing beside the repository.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from ..device_tests.metrics import IGNORE  # noqa: F401  (label of positions the loss and metrics skip)
from ..errors import EdgebertError
from ..registry import Registry

DEFAULT_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
EMBEDDED_DATA = Path(__file__).resolve().parent / "embedded"
EMBEDDED_ROWS = {"sst2": 3000}  # task -> the training rows EMBEDDED_DATA holds of it (embedded/SOURCE.md)
KINDS = ("classification", "pair-classification", "regression", "token-classification", "embedding")
METRICS = {"regression": "spearman", "token-classification": "entity_f1", "embedding": "cosine_spearman"}
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


def metric_of(kind: str, labels: tuple[str, ...] | list[str] = ()) -> str:
    """The metric that picks a task's checkpoints by its kind: Spearman for scores (the rank correlation STS
    benchmarks are ranked by), entity F1 for tags, cosine Spearman for embeddings, F1 for a yes/no pair task,
    else accuracy."""
    if kind in METRICS:
        return METRICS[kind]
    return "f1" if kind == "pair-classification" and len(labels) == 2 else "accuracy"


TASKS: Registry[Task] = Registry("task")


def register(task: Task) -> Task:
    return TASKS.register(task.name, task)


register(Task("sst2", "classification", ("negative", "positive"), "accuracy",
              {"train": "sst2/train.tsv", "dev": "sst2/dev.tsv"}))
register(Task("mrpc", "pair-classification", ("not_equivalent", "equivalent"), "f1",
              {"train": "mrpc/train.tsv", "dev": "mrpc/dev.tsv", "test": "mrpc/msr_paraphrase_test.txt"}))
register(Task("stsb", "regression", (), "spearman",
              {"train": "stsb/train.tsv", "dev": "stsb/dev.tsv", "test": "stsb/sts-test.tsv"}))
register(Task("conll2003", "token-classification", CONLL_TAGS, "entity_f1",
              {"train": "conll2003/train.txt", "dev": "conll2003/dev.txt", "test": "conll2003/test.txt"}))
# Sentence embeddings, trained on STS-B's sentences as unlabeled text (distillation needs no labels)
# and scored by the Spearman correlation of cosine similarity with the dev pairs' gold scores.
register(Task("stsb-embedding", "embedding", (), "cosine_spearman",
              {"train": "stsb/train.tsv", "dev": "stsb/dev.tsv", "test": "stsb/sts-test.tsv"}))


class Example(NamedTuple):
    """One input: text (a list of words for token tasks), optional pair, label index/score/tags."""

    text: str | list[str]
    text_pair: str | None = None
    label: int | float | list[int] | None = None


@dataclass
class Split:
    """Examples of one split, with the bad rows that were skipped ("file:line: problem"), and where the
    file knows them (CoNLL's -DOCSTART-), each example's document, so held-out splits take whole ones."""

    task: Task
    name: str
    examples: list[Example]
    skipped: list[str] = field(default_factory=list)
    documents: list[int] | None = None

    def __len__(self) -> int:
        return len(self.examples)

    def subset(self, indices: list[int], name: str | None = None) -> "Split":
        """The examples at `indices`, in that order, with their documents."""
        return replace(self, name=name or self.name, examples=[self.examples[i] for i in indices],
                       documents=None if self.documents is None else [self.documents[i] for i in indices])


def data_root(path: str | Path | None = None, *, task: str | None = None, rows: int = 0) -> Path:
    """The data folder: the argument, else EDGEBERT_DATA, else ../shared/data beside the repo, else, for a
    reader of at most the `rows` training rows of `task` that the package holds (0: the whole split, which
    it never holds), the packaged sample EMBEDDED_DATA."""
    given = path or os.environ.get("EDGEBERT_DATA")
    root = Path(given or DEFAULT_DATA)
    if root.is_dir():
        return root
    if not given and task is not None and 0 < rows <= EMBEDDED_ROWS.get(task, 0):
        return EMBEDDED_DATA
    packaged = "" if given else (" (without one, only `edgebert compile --quick` runs: on the SST-2 sample "
                                 "packaged with edgebert)")
    raise EdgebertError(f"data folder {root} not found; pass --data DIR or set EDGEBERT_DATA{packaged}")


def get_task(task: str | Task) -> Task:
    if isinstance(task, Task):
        return task
    if task not in TASKS:  # the registry's list, and the other way in: the user's own files
        raise EdgebertError(
            f"unknown task {task!r}; use one of {', '.join(TASKS)}, or your own data: a .csv/.tsv/.jsonl "
            "file (task = \"data/train.csv\", a [data] table in a recipe, load_table in Python)"
        )
    return TASKS.get(task)
