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


QUANT_VOCAB = 1500  # above Int8Embeddings.min_rows, so the word table is converted


@pytest.fixture(scope="session")
def tiny_classifier():
    """A 2-layer, 32-wide sentence classifier for the export and quantization tests."""
    from edgebert import EncoderConfig, HeadConfig, build

    torch.manual_seed(0)
    return build(EncoderConfig(vocab_size=QUANT_VOCAB, hidden_size=32, num_layers=2, num_heads=4,
                               intermediate_size=64, max_positions=32), HeadConfig()).eval()


@pytest.fixture(scope="session")
def tiny_arrays():
    """32 random right-padded examples of up to 16 tokens with labels, in the eval-set layout."""
    import numpy as np

    rng = np.random.default_rng(0)
    n, t = 32, 16
    lengths = rng.integers(2, t + 1, n).astype(np.int32)
    mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
    return {"input_ids": (rng.integers(1, QUANT_VOCAB, (n, t)) * mask).astype(np.int32), "attention_mask": mask,
            "token_type_ids": np.zeros((n, t), np.int32), "lengths": lengths, "labels": rng.integers(0, 2, n)}
