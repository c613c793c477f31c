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


def test_entity_f1_equals_seqeval_on_random_tag_sequences():
    """seqeval's default (conlleval) chunking, on random IOB2 tags: I- after O, I- of another type,
    B- inside an entity, entities at the sentence ends, sentences without any."""
    import random
    import warnings

    seqeval = pytest.importorskip("seqeval.metrics")
    rng = random.Random(0)
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
    edge = [(["I-PER", "I-PER"], ["B-PER", "I-PER"]), (["B-PER", "I-LOC"], ["B-PER", "B-LOC"]),
            (["B-PER", "B-PER"], ["B-PER", "I-PER"]), (["O", "O"], ["O", "O"]), (["O", "I-MISC"], ["O", "B-MISC"])]
    for trial in range(500):
        if trial < len(edge):
            true, predicted = [edge[trial][0]], [edge[trial][1]]
        else:
            true = [[rng.choice(tags) for _ in range(rng.randint(1, 8))] for _ in range(rng.randint(1, 5))]
            predicted = [[rng.choice(tags) for _ in sentence] for sentence in true]
        ours = entity_f1(true, predicted)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # seqeval warns where it scores 0 for want of entities, as we do
            expected = {"precision": seqeval.precision_score(true, predicted),
                        "recall": seqeval.recall_score(true, predicted), "entity_f1": seqeval.f1_score(true, predicted)}
        assert ours == pytest.approx(expected, abs=1e-12), (true, predicted)


def test_task_metrics_per_kind():
    from edgebert.device_tests.metrics import IGNORE, cosine_pairs, macro_f1, task_metrics

    assert task_metrics("classification", [1, 0, 0], [1, 0, 1], ("neg", "pos")) == {"accuracy": pytest.approx(2 / 3)}
    assert task_metrics("pair-classification", [1, 1, 0, 0], [1, 0, 0, 1], ("no", "yes")) == \
        {"accuracy": 0.5, "f1": 0.5}
    three = task_metrics("classification", [0, 1, 2, 2], [0, 1, 1, 2], ("a", "b", "c"))
    # per class F1: a 1, b 2/3, c 2/3 (sklearn's f1_score(average="macro"))
    assert three == {"accuracy": 0.75, "macro_f1": pytest.approx((1 + 2 / 3 + 2 / 3) / 3)}
    assert macro_f1([0, 0], [0, 0], 3) == pytest.approx(1 / 3)  # absent classes count 0
    names = ("O", "B-PER", "I-PER")
    gold = np.array([[IGNORE, 1, 2, IGNORE, 0]])
    guess = np.array([[0, 1, 2, 1, 1]])  # the IGNORE slot's B-PER is not scored; the last one is a false entity
    assert task_metrics("token-classification", guess, gold, names) == \
        {"precision": 0.5, "recall": 1.0, "entity_f1": pytest.approx(2 / 3)}
    vectors = np.array([[1.0, 0.0], [2.0, 0.0], [1.0, 0.0], [0.0, 3.0], [1.0, 1.0], [-1.0, -1.0]])
    np.testing.assert_allclose(cosine_pairs(vectors), [1.0, 0.0, -1.0], atol=1e-12)
    assert task_metrics("embedding", vectors, np.repeat([5.0, 2.0, 0.0], 2))["cosine_spearman"] == pytest.approx(1.0)
