"""vocab: the pruned tokenizer and embedding rows agree, kept text is untouched, and a compile ships them."""

import json
from dataclasses import replace

import pytest
import torch

from builders import sentences, subword_tokenizer, tiny_model
from edgebert import EdgebertError
from edgebert.data import EncodedDataset, Example, Split, Task, TaskData
from edgebert.model import embeddings
from edgebert.passes import VocabConfig, prune_vocab
from edgebert.tokenizer import load_tokenizer

TASK = Task("toy", "classification", ("no", "yes"))
TRAIN = ["the cat sat on the mat .", "the mat sat , the cat sat"]  # never "playing"
HELD_OUT = "the cat playing on the mat ."


def _data(tok, train, dev=(HELD_OUT,)):
    def split(name, texts):
        return Split(TASK, name, [Example(t, label=i % 2) for i, t in enumerate(texts)])

    return TaskData(EncodedDataset(split("train", train), tok, 32), EncodedDataset(split("dev", list(dev)), tok, 32), tok)


def _words(tok, text):
    """Each word's pieces under `tok`, as strings."""
    enc = tok(text, add_special_tokens=False)
    words = {}
    for piece, word in zip(tok.convert_ids_to_tokens(enc["input_ids"]), enc.word_ids()):
        words.setdefault(word, []).append(piece)
    return list(words.values())


def _join(pieces):
    return "".join(p.removeprefix("##") for p in pieces)


def _logits(model, tok, text):
    enc = tok(text, return_tensors="pt", return_token_type_ids=True)
    with torch.no_grad():
        return model.eval()(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])


def test_held_out_words_keep_their_pieces_or_decompose(tiny_tokenizer):
    result = prune_vocab(tiny_model(vocab_size=len(tiny_tokenizer)), VocabConfig(), _data(tiny_tokenizer, TRAIN))
    new = result.tokenizer
    assert len(new) < len(tiny_tokenizer) and "play" not in new.get_vocab() and "##ing" not in new.get_vocab()
    for old_word, new_word in zip(_words(tiny_tokenizer, HELD_OUT), _words(new, HELD_OUT), strict=True):
        kept = all(p in new.get_vocab() for p in old_word)
        assert new_word == old_word if kept else _join(new_word) == _join(old_word) and len(new_word) > len(old_word)
    assert new.unk_token_id not in new(HELD_OUT)["input_ids"]  # "playing" spells out from single characters


def test_keep_words_keeps_every_whole_word_of_the_vocabulary(tiny_tokenizer):
    model = tiny_model(vocab_size=len(tiny_tokenizer))
    new = prune_vocab(model, VocabConfig(keep_words=True), _data(tiny_tokenizer, TRAIN)).tokenizer
    assert "play" in new.get_vocab() and "##ing" not in new.get_vocab()  # a word, never seen; a piece, dropped
    assert _words(new, HELD_OUT)[2] == ["play", "##i", "##n", "##g"]


@pytest.mark.parametrize("kind", ["sequence-classification", "masked-lm"])
def test_outputs_on_kept_tokens_are_unchanged(tiny_tokenizer, kind):
    model = tiny_model(kind, vocab_size=len(tiny_tokenizer))
    before = _logits(model, tiny_tokenizer, TRAIN[0])
    result = prune_vocab(model, VocabConfig(), _data(tiny_tokenizer, TRAIN))
    after = _logits(result.model, result.tokenizer, TRAIN[0])
    rows = result.model.config.vocab_size
    assert rows == len(result.tokenizer) == embeddings(result.model).word.weight.shape[0]
    if kind == "masked-lm":  # the decoder scores the kept tokens only, each with its own bias
        old_vocab, new_vocab = tiny_tokenizer.get_vocab(), result.tokenizer.get_vocab()
        order = sorted(new_vocab, key=new_vocab.get)
        before = before[..., [old_vocab[t] for t in order]]
    torch.testing.assert_close(after, before, rtol=0, atol=1e-6)
    assert result.model.config.pad_token_id == result.tokenizer.pad_token_id


def test_position_rows_past_the_longest_input_go_and_the_outputs_stay(tiny_tokenizer, tmp_path):
    from edgebert import checkpoint

    model = tiny_model(vocab_size=len(tiny_tokenizer))  # 64 positions; the data is encoded to 32 tokens
    before = _logits(model, tiny_tokenizer, TRAIN[0])
    result = prune_vocab(model, VocabConfig(), _data(tiny_tokenizer, TRAIN))
    assert result.model.config.max_positions == 32 == embeddings(result.model).position.weight.shape[0]
    assert result.record.details["positions_dropped"] == 32
    again = checkpoint.load(checkpoint.save(result.model, tmp_path / "m"))
    torch.testing.assert_close(_logits(again, result.tokenizer, TRAIN[0]), before, rtol=0, atol=1e-6)
    with pytest.raises(EdgebertError, match="33"):  # a longer input is refused in one line, as before at 65
        again(torch.ones(1, 33, dtype=torch.long))
    kept = prune_vocab(tiny_model(vocab_size=len(tiny_tokenizer)), VocabConfig(keep_positions=True),
                       _data(tiny_tokenizer, TRAIN))
    assert kept.model.config.max_positions == 64 and kept.record.details["positions_dropped"] == 0


def test_record_gives_sizes_changed_tokens_and_metric(tiny_tokenizer, tmp_path):
    corpus = tmp_path / "app.txt"
    corpus.write_text("playing\n")
    model = tiny_model(vocab_size=len(tiny_tokenizer))
    plain = prune_vocab(model, VocabConfig(), _data(tiny_tokenizer, TRAIN)).record
    d = plain.details
    assert d["before"]["vocab_size"] == len(tiny_tokenizer) > d["after"]["vocab_size"]
    assert d["after"]["embedding_bytes"] == d["after"]["vocab_size"] * 32 * 4 < d["before"]["embedding_bytes"]
    # "playing" is 2 of the 8 held-out tokens (play ##ing) and becomes 7 characters; the rest match
    assert d["dev_tokens_changed"] == pytest.approx(2 / 8) and d["dev_examples_changed"] == 1.0
    assert set(plain.metrics) >= {"accuracy"} and set(d["metrics_before"]) >= {"accuracy"}
    with_corpus = prune_vocab(tiny_model(vocab_size=len(tiny_tokenizer)), VocabConfig(corpus=str(corpus)),
                              _data(tiny_tokenizer, TRAIN))
    assert with_corpus.record.details["dev_tokens_changed"] == 0.0  # the app's own words are kept
    assert {"play", "##ing"} <= set(with_corpus.tokenizer.get_vocab())
    fewer = prune_vocab(tiny_model(vocab_size=len(tiny_tokenizer)), VocabConfig(min_count=3),
                        _data(tiny_tokenizer, TRAIN)).tokenizer.get_vocab()
    assert "the" in fewer and "sat" in fewer and "on" not in fewer  # "on" is seen once, "the" and "sat" 4 times
    with pytest.raises(EdgebertError, match="vocab.corpus"):
        prune_vocab(tiny_model(vocab_size=len(tiny_tokenizer)), VocabConfig(corpus=str(tmp_path / "none.txt")),
                    _data(tiny_tokenizer, TRAIN))


@pytest.mark.parametrize("kind", ["BPE", "Unigram"])
def test_subword_tokenizers_prune_exactly_on_kept_text(tmp_path, kind):
    words = ("the cat sat on a mat while dogs were running quickly over brown foxes in happy "
             "movies with great awful stories").split()
    texts = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(8)) for i in range(300)]
    subword_tokenizer(tmp_path, texts, kind=kind, vocab_size=400 if kind == "BPE" else 120)
    tok = load_tokenizer(tmp_path)
    train = ["the cat sat on a mat", "dogs were running quickly"]
    model = tiny_model(vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    before = _logits(model, tok, train[0])
    result = prune_vocab(model, VocabConfig(), _data(tok, train, dev=["happy foxes sat on the mat"]))
    new = result.tokenizer
    assert len(new) < len(tok) == result.record.details["before"]["vocab_size"]
    torch.testing.assert_close(_logits(result.model, new, train[0]), before, rtol=0, atol=1e-6)
    for text in ("happy foxes sat on the mat", "Zebras!"):  # unseen words: smaller pieces of the same text
        was, now = (t.convert_ids_to_tokens(t(text, add_special_tokens=False)["input_ids"]) for t in (tok, new))
        assert "".join(now) == "".join(was) and now.count(new.unk_token) == was.count(tok.unk_token)
    assert new.tokenize(train[1]) == tok.tokenize(train[1])


def test_other_tokenizer_kinds_are_refused_by_name(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "the": 2, "cat": 3}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")
    with pytest.raises(EdgebertError, match="cannot prune a WordLevel tokenizer"):
        prune_vocab(tiny_model(vocab_size=4), VocabConfig(), _data(tok, ["the cat"]))


@pytest.mark.filterwarnings("ignore:.*majority-class baseline")
def test_compile_with_a_vocab_stage_ships_a_matching_tokenizer(tiny_checkpoint, tiny_sst2, tmp_path):
    import shutil

    from edgebert.pipeline import compile as compiler
    from edgebert.pipeline import recipe as recipes

    text = """
task = "sst2"
max_length = 16
stages = ["finetune", "vocab", "export"]
[finetune.train]
steps = 4
batch_size = 8
[export]
formats = ["onnx"]
bench = false
"""
    recipe, out = replace(recipes.parse(text), model=str(tiny_checkpoint)), tmp_path / "out"
    _check_bundle(compiler.compile(recipe, out, data_dir=str(tiny_sst2)), out)
    # resumed after the vocab stage: the export and the bundle still read the pruned tokenizer's ids
    shutil.rmtree(next((out / "stages").glob("*-export-*")))
    shutil.rmtree(out / "bundle")
    _check_bundle(compiler.compile(recipe, out, data_dir=str(tiny_sst2), resume=True), out)


def _check_bundle(bundle, out):
    """tokenizer.json, vocab.txt, the ONNX table, the manifest and the eval set agree; every file verifies."""
    import numpy as np
    import onnx

    from edgebert import checkpoint
    from edgebert.pipeline.bundle import read_bundle

    manifest = read_bundle(bundle)  # every file matches its sha256
    vocab_txt = (bundle / "vocab.txt").read_text(encoding="utf-8").splitlines()
    tokenizer_json = json.loads((bundle / "tokenizer.json").read_text())["model"]["vocab"]
    graph = onnx.load(str(bundle / "model.onnx")).graph
    (rows,) = [i.dims[0] for i in graph.initializer if "word_embeddings" in i.name]
    stage = next((out / "stages").glob("*-vocab-*"))
    record = json.loads((stage / "record.json").read_text())
    assert len(vocab_txt) == len(tokenizer_json) == rows == record["details"]["after"]["vocab_size"] < 30522
    assert vocab_txt == sorted(tokenizer_json, key=tokenizer_json.get)
    assert manifest["inputs"]["tokenizer"]["vocab_size"] == rows
    assert checkpoint.load(stage / "model").config.vocab_size == rows
    check = manifest["verification"]["model.onnx"]["verify"]
    assert check["max_abs_diff"] < 1e-3 and check["agreement"] == 1.0
    ids = np.load(bundle / "eval.npz")["input_ids"]
    assert ids.max() < rows
    assert load_tokenizer(bundle).convert_ids_to_tokens([int(ids[0][0])]) == ["[CLS]"]


def test_recipe_mistakes_fail_before_any_stage(tiny_checkpoint, tiny_sst2, tmp_path):
    from edgebert.pipeline import compile as compiler
    from edgebert.pipeline import recipe as recipes

    with pytest.raises(EdgebertError, match="'distill' cannot run after 'vocab'"):  # distill's teacher keeps the old ids
        recipes.parse('stages = ["vocab", "distill", "export"]')
    recipe = recipes.parse(f'stages = ["vocab", "export"]\nmax_length = 16\n[vocab]\ncorpus = "{tmp_path}/none.txt"')
    with pytest.raises(EdgebertError, match="vocab.corpus: .* is not a file"):
        compiler.compile(replace(recipe, model=str(tiny_checkpoint)), tmp_path / "out", data_dir=str(tiny_sst2))
    assert not (tmp_path / "out").exists()
