"""The task metrics, as fractions (points only when printed), in numpy alone: the one copy that
stage records, export verification, the device harness and bench all use."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np



def accuracy(predictions, labels) -> float:
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    return float((predictions == labels).mean())


def f1(predictions, labels, positive: int = 1) -> float:
    """F1 of the positive class (MRPC reports class 1)."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    tp = np.sum((predictions == positive) & (labels == positive))
    denominator = np.sum(predictions == positive) + np.sum(labels == positive)
    return float(2 * tp / denominator) if denominator else 0.0


def pearson(x, y) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denominator) if denominator else 0.0


def _ranks(x) -> np.ndarray:
    """Ranks with ties given their average rank, as Spearman's rho requires."""
    x = np.asarray(x)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(len(x))
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def spearman(x, y) -> float:
    return pearson(_ranks(x), _ranks(y))


def entities(tags: Sequence[str]) -> set[tuple[int, int, str]]:
    """(start, end, type) chunks as conlleval reads them: I- after O or another type starts one."""
    chunks, start, kind = set(), None, None
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, tag_type = tag.partition("-")
        starts = prefix == "B" or (prefix == "I" and (start is None or tag_type != kind))
        if start is not None and (prefix == "O" or starts):
            chunks.add((start, i, kind))
            start, kind = None, None
        if starts:
            start, kind = i, tag_type
    return chunks


def entity_f1(
    true_tags: Sequence[Sequence[str]], predicted_tags: Sequence[Sequence[str]]
) -> dict[str, float]:
    """Entity-level micro precision / recall / F1 over sentences (conlleval, seqeval default)."""
    correct = found = expected = 0
    for true, predicted in zip(true_tags, predicted_tags, strict=True):
        gold, guess = entities(true), entities(predicted)
        correct += len(gold & guess)
        found += len(guess)
        expected += len(gold)
    precision = correct / found if found else 0.0
    recall = correct / expected if expected else 0.0
    score = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "entity_f1": score}
