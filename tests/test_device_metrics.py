"""The shared metrics (device_tests.metrics): fractions, checked against scipy and conlleval."""

import numpy as np
import pytest

from edgebert.device_tests.metrics import accuracy, entity_f1, f1, pearson, spearman


def test_classification_and_correlation_metrics():
    assert accuracy([1, 1, 0, 0], [1, 0, 0, 1]) == 0.5 and f1([1, 1, 0, 0], [1, 0, 0, 1]) == 0.5
    assert f1([0, 0], [0, 0]) == 0.0
    x = np.array([1.0, 2.0, 2.0, 3.0, 10.0])
    y = np.array([2.0, 1.0, 3.0, 3.0, 4.0])
    assert pearson(x, y) == pytest.approx(0.7335037571219196)  # scipy.stats.pearsonr
    assert spearman(x, y) == pytest.approx(29 / 38)  # scipy.stats.spearmanr, ties averaged


def test_entity_f1_is_conlleval_style():
    true = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "I-ORG"]]
    predicted = [
        ["B-PER", "I-PER", "O", "B-ORG"],
        ["I-ORG", "I-ORG", "I-ORG"],
    ]  # I- after O starts an entity
    scores = entity_f1(true, predicted)
    assert scores == {"precision": 2 / 3, "recall": 2 / 3, "entity_f1": pytest.approx(2 / 3)}
    assert (
        entity_f1([["B-PER", "I-LOC"]], [["B-PER", "B-LOC"]])["entity_f1"] == 1.0
    )  # type change splits
