"""Augmented distillation data: only one-piece words are swapped, each for one of its embedding
neighbours, and distill learns from the teacher-labelled copies."""

import pytest
import torch
from builders import subword_tokenizer, sentences, tiny_model

from edgebert import EdgebertError
from edgebert.data import EncodedDataset, Example, Split, Task, TaskData
from edgebert.model import embeddings
from edgebert.passes import AugmentConfig, DistillConfig, TrainConfig, augment, distill
from edgebert.passes.vocab import word_starts
from edgebert.tokenizer import load_tokenizer

TASK = Task("toy", "classification", ("no", "yes"))
TEXTS = ["the cat sat on the mat .", "the cat playing , the mat sat", "cat on mat"] * 6


def _dataset(tok, texts=TEXTS):
    return EncodedDataset(Split(TASK, "train", [Example(t, label=i % 2) for i, t in enumerate(texts)]), tok, 32)


def _teacher(tok, nearest: dict[str, str]):
    """A tiny model whose word table puts each word of `nearest` next to its partner and far from the rest."""
    model = tiny_model(vocab_size=len(tok))
    table = embeddings(model).word.weight
    with torch.no_grad():
        table.normal_(generator=torch.Generator().manual_seed(0))
        for a, b in nearest.items():
            table[tok.convert_tokens_to_ids(b)] = table[tok.convert_tokens_to_ids(a)] + 0.01
    return model


def test_every_one_piece_word_goes_to_its_nearest_neighbour(tiny_tokenizer):
    tok = tiny_tokenizer
    data = _dataset(tok)
    teacher = _teacher(tok, {"cat": "mat", "sat": "the", "on": "play"})
    out = augment(data, teacher, tok, AugmentConfig(copies=1, probability=1.0, neighbours=1))
    assert len(out) == 2 * len(data) and out.input_ids[: len(data)] == data.input_ids
    swapped = tok.convert_ids_to_tokens(out.input_ids[len(data)])
    # each to its nearest whole word (the <-> sat, cat <-> mat, on <-> play); "." and specials stay
    assert swapped == ["[CLS]", "sat", "mat", "the", "play", "sat", "cat", ".", "[SEP]"]
    second = tok.convert_ids_to_tokens(out.input_ids[len(data) + 1])
    assert second[3:5] == ["play", "##ing"]  # "playing" is two pieces, so it is never swapped
    assert all(len(a) == len(b) for a, b in zip(out.input_ids[len(data):], data.input_ids))
    assert out.token_type_ids[len(data):] == data.token_type_ids
    assert "labels" not in out[len(data)]  # the teacher labels the copies
    assert out.summary["swapped_words"] == out.summary["swappable_words"] > 0


def test_the_swap_rate_follows_probability_and_the_seed(tiny_tokenizer):
    data, teacher = _dataset(tiny_tokenizer, TEXTS * 10), _teacher(tiny_tokenizer, {})
    runs = [augment(data, teacher, tiny_tokenizer, AugmentConfig(probability=0.3, seed=s)) for s in (0, 0, 1)]
    assert runs[0].input_ids == runs[1].input_ids != runs[2].input_ids
    rate = runs[0].summary["swapped_words"] / runs[0].summary["swappable_words"]
    assert 0.2 < rate < 0.4


@pytest.mark.parametrize("kind", ["BPE", "Unigram"])
def test_word_starts_follow_the_tokenizer_convention(tmp_path, kind):
    subword_tokenizer(tmp_path, sentences(200), kind=kind)
    tok = load_tokenizer(tmp_path)
    start, whole = word_starts(tok)
    marker = "Ġ" if kind == "BPE" else "▁"
    for i, piece in enumerate(tok.convert_ids_to_tokens(list(range(len(tok))))):
        if i not in tok.all_special_ids:
            assert start[i] == piece.startswith(marker)
            assert whole[i] == (piece.startswith(marker) and len(piece) > 2 and piece[1:].isalpha())


def test_distill_learns_from_the_copies_through_the_cache(tiny_tokenizer, tmp_path):
    tok = tiny_tokenizer
    data = TaskData(_dataset(tok), tokenizer=tok)
    teacher = _teacher(tok, {"cat": "mat"})
    train = TrainConfig(steps=4, batch_size=8, lr=1e-3, progress=False)
    result = distill(teacher, DistillConfig(layers=1, train=train, augment=AugmentConfig(copies=2)), data,
                     work_dir=tmp_path)
    assert result.record.details["augmented"]["texts"] == 3 * len(TEXTS)
    cache = result.record.details["teacher_cache"]
    assert (tmp_path / "teacher-cache").is_dir() and cache.startswith(str(tmp_path / "teacher-cache"))
    import numpy as np
    assert len(np.load(f"{cache}/logit_offsets.npy")) == 3 * len(TEXTS) + 1  # a teacher row per copy


def test_copies_with_gold_labels_are_refused():
    with pytest.raises(EdgebertError, match="label_weight must be 0"):
        DistillConfig(augment=AugmentConfig(), label_weight=1.0)
