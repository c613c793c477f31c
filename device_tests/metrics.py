"""The task metrics, as fractions (points only when printed), in numpy alone: the one copy that
stage records, export verification, the device harness and bench all use."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

IGNORE = -100  # label of positions the loss and metrics skip (word pieces after a word's first)
# Every metric a task can report: the result keys of `task_metrics`.
NAMES = ("accuracy", "f1", "macro_f1", "pearson", "spearman", "entity_f1", "precision", "recall",
         "cosine_spearman", "cosine_pearson")


def accuracy(predictions, labels) -> float:
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    return float((predictions == labels).mean())


def f1(predictions, labels, positive: int = 1) -> float:
    """F1 of the positive class (MRPC reports class 1)."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    tp = np.sum((predictions == positive) & (labels == positive))
    denominator = np.sum(predictions == positive) + np.sum(labels == positive)
    return float(2 * tp / denominator) if denominator else 0.0


def macro_f1(predictions, labels, classes: int) -> float:
    """Unweighted mean of every class's F1 (a class absent from both counts as 0, as scikit-learn's)."""
    return float(np.mean([f1(predictions, labels, c) for c in range(classes)]))


def pearson(x, y) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denominator) if denominator else 0.0


def cosine_pairs(vectors) -> np.ndarray:
    """Cosine similarity of rows 2i and 2i+1 of `vectors` [2N, D], for each pair i."""
    vectors = np.asarray(vectors, dtype=np.float64)
    a, b = vectors[0::2], vectors[1::2]
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(1) / np.where(norms > 0, norms, 1.0)


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


def task_metrics(kind: str, predictions, labels, label_names: Sequence[str] = ()) -> dict[str, float]:
    """Every metric of a task kind, as fractions: the one definition stage records, export
    verification and the device harness share.

    predictions: class ids [N] (classification), scores [N] (regression) or tag ids [N, T]
    (token-classification, scored only where labels != IGNORE, tags named by `label_names`) or
    sentence vectors [2P, H] (embedding: the Spearman/Pearson of pair cosines against the scores).
    Classification gives accuracy, plus F1 of class 1 for two-class pair tasks and macro-F1 over
    more than two classes; regression Pearson and Spearman; token tasks entity-level F1."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if kind == "embedding":  # sentence vectors [2P, H]; labels: each pair's score on both its rows
        cosines, gold = cosine_pairs(predictions), labels[0::2]
        return {"cosine_spearman": spearman(cosines, gold), "cosine_pearson": pearson(cosines, gold)}
    if kind == "regression":
        return {"pearson": pearson(predictions, labels), "spearman": spearman(predictions, labels)}
    if kind == "token-classification":
        true, guess = [], []
        for predicted, gold in zip(predictions, labels, strict=True):
            keep = gold != IGNORE
            true.append([label_names[t] for t in gold[keep]])
            guess.append([label_names[t] for t in predicted[keep]])
        return entity_f1(true, guess)
    scores = {"accuracy": accuracy(predictions, labels)}
    classes = len(label_names) or int(max(predictions.max(initial=0), labels.max(initial=0))) + 1
    if classes > 2:
        scores["macro_f1"] = macro_f1(predictions, labels, classes)
    elif kind == "pair-classification":
        scores["f1"] = f1(predictions, labels)
    return scores


def points(fraction) -> float | None:
    """A metric in points (accuracy 0.9014 → 90.14), for what is printed or charted: everything else
    (records, verification, the harness's results) keeps fractions."""
    return None if fraction is None else float(fraction) * 100
