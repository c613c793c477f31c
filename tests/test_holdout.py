"""Held-out splits do not leak: carved texts are neither inside kept texts nor hold one; pairs share no
sentence across the cut; token tasks move whole documents. Checked by brute force, on tiny splits and on
the real SST-2, MRPC and CoNLL-2003 training files when the data folder is here."""

import random

import pytest

from edgebert import data
from edgebert.data import Example, Split, carve, get_task
from edgebert.errors import EdgebertError


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _runs(text: str) -> set[str]:
    w = _norm(text).split()
    return {" ".join(w[i:j]) for i in range(len(w)) for j in range(i + 1, len(w) + 1)}


def _leaks(rest: Split, carved: Split) -> list[str]:
    """Carved texts that sit inside a kept text or hold one, as runs of whole words."""
    kept = {_norm(e.text) for e in rest.examples}
    joined = " " + " \n ".join(kept) + " "
    return [e.text for e in carved.examples
            if f" {_norm(e.text)} " in joined or _runs(e.text) & kept]


def _single(texts: list[str]) -> Split:
    return Split(get_task("sst2"), "train", [Example(t, None, i % 2) for i, t in enumerate(texts)])


def test_a_phrase_of_a_held_out_sentence_is_never_trained_on():
    texts = ["a great film", "great film", "a great film , really", "film", "great",
             "a dull plot", "dull plot", "dull", "plot", "the acting is fine", "acting", "a film"]
    for seed in range(20):
        rest, held = carve(_single(texts), 3, seed, name="validation")
        assert held.name == "validation" and len(held) >= 3
        assert not _leaks(rest, held), seed
        assert {e.text for e in rest.examples} | {e.text for e in held.examples} <= set(texts)
        assert not {e.text for e in rest.examples} & {e.text for e in held.examples}


def test_the_same_text_moves_together_case_and_spacing_aside():
    texts = ["Good  movie", "good movie", "bad movie", "awful", "fine", "dull", "odd", "new", "old", "hot"]
    rest, held = carve(_single(texts), 1, 3, name="validation")
    keys = lambda s: [_norm(e.text) for e in s.examples]
    assert not set(keys(rest)) & set(keys(held))
    assert ("good movie" in keys(held)) == (keys(held).count("good movie") == 2)


def test_pairs_that_share_a_sentence_stay_on_one_side():
    task = get_task("mrpc")
    pairs = [("a", "b"), ("b", "c"), ("d", "e"), ("f", "g"), ("g", "a"), ("h", "i"), ("j", "k"), ("l", "m")]
    split = Split(task, "train", [Example(f"s {a}", f"s {b}", 0) for a, b in pairs])
    for seed in range(10):
        rest, held = carve(split, 2, seed, name="validation")
        sentences = lambda s: {t for e in s.examples for t in (e.text, e.text_pair)}
        assert len(rest) + len(held) == len(split) and len(held) >= 2
        assert not sentences(rest) & sentences(held), seed


def test_token_tasks_hold_out_whole_documents():
    task = get_task("conll2003")
    examples = [Example(["w", str(i)], None, [0, 0]) for i in range(30)]
    split = Split(task, "train", examples, documents=[i // 5 for i in range(30)])
    rest, held = carve(split, 7, 1, name="validation")
    assert len(held) == 10 and len(rest) == 20  # two documents of five: whole ones, never a part
    assert not set(rest.documents) & set(held.documents)
    assert [e.text for e in held.examples] == [examples[i].text for i in range(30) if split.documents[i] in
                                               set(held.documents)]


def test_a_split_that_is_one_linked_whole_cannot_be_carved():
    task = get_task("mrpc")
    split = Split(task, "train", [Example("s a", "s b", 0), Example("s b", "s c", 1), Example("s c", "s a", 0)])
    with pytest.raises(EdgebertError, match="leaves none to train on"):
        carve(split, 1, 0, name="dev")


def test_conll_documents_are_read(tmp_path):
    (tmp_path / "conll2003").mkdir()
    doc = "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\nPeter NNP B-NP B-PER\n\n"
    (tmp_path / "conll2003" / "train.txt").write_text(doc * 3)
    split = data.load_task("conll2003", "train", data_dir=tmp_path)
    assert len(split) == 6 and split.documents == [0, 0, 1, 1, 2, 2]
    assert split.subset([5, 0], name="x").documents == [2, 0]
    (tmp_path / "conll2003" / "train.txt").write_text(doc.replace("-DOCSTART- -X- -X- O\n", "") * 3)
    assert data.load_task("conll2003", "train", data_dir=tmp_path).documents is None  # sentences, then


def _real(task: str) -> Split:
    try:
        return data.load_task(task, "train")
    except EdgebertError:
        pytest.skip("the data folder is not here (EDGEBERT_DATA, ../shared/data)")


def test_sst2_validation_is_not_training_phrases():
    train = _real("sst2")
    rest, held = carve(train, 1000, 44, name="validation")
    assert not _leaks(rest, held)
    assert 1000 <= len(held) < 1100 and len(train) - len(rest) - len(held) < 1000
    order = list(range(len(train)))
    random.Random(44).shuffle(order)  # what a plain random sample would have held out: mostly training phrases
    plain = set(order[:1000])
    leaked = _leaks(train.subset([i for i in range(len(train)) if i not in plain]), train.subset(sorted(plain)))
    assert len(leaked) > 800


@pytest.mark.parametrize("task", ["mrpc", "conll2003"])
def test_real_pairs_and_documents_do_not_cross(task):
    train = _real(task)
    rest, held = carve(train, 1000, 44, name="validation")
    assert len(rest) + len(held) == len(train) and len(held) >= 1000
    if task == "mrpc":
        sentences = lambda s: {_norm(t) for e in s.examples for t in (e.text, e.text_pair)}
        assert not sentences(rest) & sentences(held)
    else:
        assert not set(rest.documents) & set(held.documents)
