"""Shared fixtures: the real data root and a tiny WordPiece tokenizer built offline."""

import json
import string

import pytest
import torch

torch.set_num_threads(1)  # the CI machine's cores are shared


@pytest.fixture(scope="session")
def data_dir():
    """The real benchmark data; tests that need it skip, with the reason, when it is absent."""
    from edgebert.data import data_root
    from edgebert.errors import EdgebertError

    try:
        return data_root()
    except EdgebertError as e:
        pytest.skip(f"real data not available: {e}")


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """Uncased WordPiece, 65 tokens, 32 positions; "playing" splits into play ##ing."""
    from edgebert.tokenizer import load_tokenizer

    letters = list(string.ascii_lowercase)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = ["the", "cat", "sat", "on", "mat", "play", "##ing", ".", ","]
    vocab = [*specials, *letters, *[f"##{c}" for c in letters], *words]
    folder = tmp_path_factory.mktemp("tiny_tokenizer")
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 32}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return load_tokenizer(folder)
