"""Augmented distillation data: only one-piece words are swapped, each for one of its embedding
neighbours, pairs also come the other way round and recombined, and distill learns from the
teacher-labelled copies."""

import pytest
import torch
from builders import subword_tokenizer, sentences, tiny_model

from edgebert import EdgebertError
from edgebert.data import EncodedDataset, Example, Split, Task, TaskData, encode_split
from edgebert.model import embeddings
from edgebert.passes import AugmentConfig, DistillConfig, TrainConfig, augment, distill
from edgebert.passes.vocab import word_starts
from edgebert.pipeline import compile as compiler
from edgebert.pipeline import recipe as recipes
from edgebert.tokenizer import load_tokenizer

TASK = Task("toy", "classification", ("no", "yes"))
TEXTS = ["the cat sat on the mat .", "the cat playing , the mat sat", "cat on mat"] * 6
PAIR_TASK = Task("toypair", "pair-classification", ("no", "yes"))
PAIRS = [("the cat sat", "on the mat ."), ("cat on mat", "the cat playing"), ("mat . mat", "sat , sat")]


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


def _pairs(tok, pairs=PAIRS):
    return EncodedDataset(Split(PAIR_TASK, "train", [Example(a, b, i % 2) for i, (a, b) in enumerate(pairs)]), tok, 32)


def _encoded(tok, pairs):
    split = Split(PAIR_TASK, "train", [Example(a, b) for a, b in pairs])
    return encode_split(split, tok, 32)[:2]


def test_pairs_come_the_other_way_round_and_odd_copies_are_made_from_them(tiny_tokenizer):
    tok = tiny_tokenizer
    data, teacher = _pairs(tok), _teacher(tok, {"cat": "mat", "sat": "the", "on": "play"})
    out = augment(data, teacher, tok, AugmentConfig(copies=2, probability=1.0, neighbours=1, swap_order=True))
    n = len(PAIRS)
    assert len(out) == 4 * n and out.summary["texts"] == 4 * n
    ids, types = _encoded(tok, [(b, a) for a, b in PAIRS])
    assert out.input_ids[n:2 * n] == ids and out.token_type_ids[n:2 * n] == types  # segment ids follow the order
    assert out.token_type_ids[2 * n:3 * n] == data.token_type_ids  # copy 0: the pair as given, words swapped
    assert tok.convert_ids_to_tokens(out.input_ids[2 * n]) == ["[CLS]", "sat", "mat", "the", "[SEP]", "play",
                                                               "sat", "cat", ".", "[SEP]"]
    assert out.token_type_ids[3 * n:] == types  # copy 1: the other way round, words swapped
    assert tok.convert_ids_to_tokens(out.input_ids[3 * n]) == ["[CLS]", "play", "sat", "cat", ".", "[SEP]",
                                                               "sat", "mat", "the", "[SEP]"]


def test_recombined_pairs_join_a_first_text_to_the_second_text_sharing_most_words(tiny_tokenizer):
    tok = tiny_tokenizer
    pairs = [("cat cat", "mat mat"), ("mat on", "cat on the"), ("sat .", "sat , sat"), ("on on", "play .")]
    config = AugmentConfig(copies=0, recombine=1, draws=64)
    out = augment(_pairs(tok, pairs), _teacher(tok, {}), tok, config)
    made = out.input_ids[len(pairs):]
    # with 64 draws from 3 others each sees every other pair: the best partner is certain
    assert made == _encoded(tok, [("cat cat", "cat on the"), ("mat on", "mat mat"), ("sat .", "play ."),
                                  ("on on", "cat on the")])[0]
    twice = augment(_pairs(tok, pairs), _teacher(tok, {}), tok, config.replace(recombine=2))
    assert len(twice) == 3 * len(pairs) and twice.input_ids[len(pairs):][::2] == made


def test_pair_augmentation_of_single_texts_is_refused_before_any_work(tiny_tokenizer, tiny_sst2, tmp_path):
    with pytest.raises(EdgebertError, match="swap_order and augment.recombine make new pairs, and this task's "
                                            "examples are single texts"):
        augment(_dataset(tiny_tokenizer), _teacher(tiny_tokenizer, {}), tiny_tokenizer, AugmentConfig(swap_order=True))
    recipe = recipes.parse("""
task = "sst2"
stages = ["finetune", "prune", "export"]
[finetune.train]
steps = 4
[prune.recovery.augment]
recombine = 1
""")
    with pytest.raises(EdgebertError, match="prune.recovery.augment.swap_order and prune.recovery.augment.recombine "
                                            "make new pairs, and this task's examples are single texts"):
        compiler.compile(recipe, tmp_path / "out", data_dir=str(tiny_sst2))
    assert not (tmp_path / "out").exists()


def test_an_augment_table_that_makes_nothing_is_refused():
    with pytest.raises(EdgebertError, match="asks for no copies"):
        AugmentConfig(copies=0)
