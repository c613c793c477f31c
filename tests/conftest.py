"""Shared fixtures: the real data root and a tiny WordPiece tokenizer built offline."""

import json
import random
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


# ---------------------------------------------------------------------------------------------
# Tiny models and data for the tests of edgebert.passes: plain functions, imported with
# `from conftest import tiny_model, tiny_data, ...` (the torchrun worker in test_passes_ddp.py too).

PASS_WORDS = ["good", "bad", "film", "great", "awful", "plot", "actor", "fun", "dull", "story", "the", "a", "is",
              "was", "very", "not", "and", "but", "scene", "music"]
PASS_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tiny_config(**changes):
    """A 4-layer, 32-wide encoder config without dropout over the PASS_WORDS vocabulary."""
    from edgebert.model import EncoderConfig

    base = {"vocab_size": len(PASS_SPECIALS) + len(PASS_WORDS), "hidden_size": 32, "num_layers": 4, "num_heads": 4,
            "intermediate_size": 64, "max_positions": 64, "dropout": 0.0, "attention_dropout": 0.0}
    return EncoderConfig(**{**base, **changes})


def tiny_model(kind: str = "sequence-classification", num_labels: int = 2, seed: int = 0, nsp: bool = False,
               **changes):
    from edgebert.model import HeadConfig, build

    torch.manual_seed(seed)
    pooler = None if kind == "token-classification" else "tanh"
    return build(tiny_config(**changes), HeadConfig(kind=kind, num_labels=num_labels, pooler=pooler, nsp=nsp))


def tiny_data(n: int = 128, *, task: str = "classification", seed: int = 0) -> list[dict]:
    """Random sentences whose label is learnable: does word 'good' (id 5) or 'great' appear?"""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        length = rng.randint(3, 16)
        words = [rng.randrange(len(PASS_SPECIALS), len(PASS_SPECIALS) + len(PASS_WORDS)) for _ in range(length)]
        ids = [2, *words, 3]
        types = [0] * len(ids)
        if task == "pair-classification":
            split = len(ids) // 2
            types = [0] * split + [1] * (len(ids) - split)
        positive = int(5 in words or 8 in words)
        if task == "regression":
            label = float(words.count(5) - words.count(6))
        elif task == "token-classification":
            label = [-100] + [int(w == 5) + 2 * int(w == 6) for w in words] + [-100]
        else:
            label = positive
        items.append({"input_ids": ids, "token_type_ids": types, "labels": label})
    return items


def sentences(n: int, seed: int = 0) -> list[str]:
    """Text in the vocabulary of conftest's `tiny_tokenizer`."""
    rng = random.Random(seed)
    words = ["the", "cat", "sat", "on", "mat", "playing", ".", ","]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 10))) for _ in range(n)]


def batch_of(items: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    length = max(len(i["input_ids"]) for i in items)
    ids = torch.zeros(len(items), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    types = torch.zeros_like(ids)
    for j, item in enumerate(items):
        n = len(item["input_ids"])
        ids[j, :n], mask[j, :n], types[j, :n] = torch.tensor(item["input_ids"]), 1, torch.tensor(item["token_type_ids"])
    return ids, mask, types


def roundtrip(model, tmp_path, name: str = "m"):
    """Save, reload and export to ONNX (TorchScript exporter, opset 17); returns the reloaded model."""
    from edgebert import checkpoint

    model.eval()
    folder = checkpoint.save(model, tmp_path / name)
    again = checkpoint.load(folder)
    ids, mask, types = batch_of(tiny_data(3, seed=9))
    with torch.no_grad():
        a, b = model(ids, mask, types), again(ids, mask, types)
    a = a[0] if isinstance(a, tuple) else a
    b = b[0] if isinstance(b, tuple) else b
    assert torch.allclose(a, b, atol=1e-5)
    torch.onnx.export(again, (ids, mask, types), str(tmp_path / f"{name}.onnx"), dynamo=False, opset_version=17,
                      input_names=["input_ids", "attention_mask", "token_type_ids"],
                      dynamic_axes={k: {0: "batch", 1: "seq"} for k in ("input_ids", "attention_mask", "token_type_ids")})
    assert (tmp_path / f"{name}.onnx").stat().st_size > 0
    return again


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> dict:
    """The tiny device models (tests/tiny_models.py), built once per session for every device and bench test."""
    import shutil

    from tiny_models import build, paths

    folder = tmp_path_factory.getbasetemp() / "tiny-models"
    if (folder / "done").exists():
        return paths(folder)
    shutil.rmtree(folder, ignore_errors=True)
    return build(folder)


@pytest.fixture(scope="session")
def bench_scripts():
    """bench/'s scripts as modules, imported as `python bench/compare.py` imports them: bench/ first on sys.path."""
    import importlib
    from pathlib import Path
    from types import SimpleNamespace

    names = ("compare", "_measure", "_figures", "_render", "_timing")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "bench"))
        yield SimpleNamespace(**{name.lstrip("_"): importlib.import_module(name) for name in names})


def subword_tokenizer(folder, texts, *, kind="BPE", vocab_size=300, model_max_length=64):
    """Write a tokenizer trained offline on `texts` to `folder` and return its vocabulary size: byte-level BPE
    like ModernBERT's, or a SentencePiece-style Unigram like DeBERTa-v3's; [CLS] A [SEP], cased."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    if kind == "BPE":
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token="[UNK]")
    tok.train_from_iterator(texts, trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                            pad_token="[PAD]", mask_token="[MASK]",
                            model_max_length=model_max_length).save_pretrained(str(folder))
    return tok.get_vocab_size()


# ---------------------------------------------------------------------------------------------
# The fault catalogue's fixture set (tests/test_faults.py): one tiny checkpoint with its tokenizer,
# one tiny SST-2 data folder, and builders of broken copies and recipes.


class FaultKit:
    """A good tiny checkpoint (`ckpt`), data root (`data`) and HF-format checkpoint (`hf`), and copies of them
    with one thing broken; `recipe(...)` writes a recipe that compiles in seconds from them."""

    def __init__(self, root):
        import json as _json

        from edgebert import checkpoint

        self.root = root
        tok = root / "tokenizer"
        tok.mkdir()
        (tok / "vocab.txt").write_text("\n".join(PASS_SPECIALS + PASS_WORDS) + "\n")
        (tok / "tokenizer_config.json").write_text(_json.dumps({"tokenizer_class": "BertTokenizer",
                                                                "do_lower_case": True, "model_max_length": 64}))
        self.tokenizer = tok
        self.ckpt = checkpoint.save(tiny_model(num_layers=2), root / "ckpt", tokenizer_from=tok)
        self.hf = checkpoint.save_hf(tiny_model(num_layers=2), root / "hf", tokenizer_from=tok)
        self.data = root / "data"
        rng = random.Random(0)
        (self.data / "sst2").mkdir(parents=True)
        for split, n in (("train", 48), ("dev", 24)):
            lines = ["sentence\tlabel"]
            for _ in range(n):
                words = [rng.choice(PASS_WORDS) for _ in range(rng.randint(3, 10))]
                lines.append(" ".join(words) + "\t" + str(int("good" in words or "great" in words)))
            (self.data / "sst2" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
        self.count = 0

    def _fresh(self, name):
        self.count += 1
        return self.root / f"{name}{self.count}"

    def data_with(self, train: bytes | None = None, dev: bytes | None = None):
        import shutil

        folder = self._fresh("data")
        shutil.copytree(self.data, folder)
        for split, content in (("train", train), ("dev", dev)):
            if content is not None:
                (folder / "sst2" / f"{split}.tsv").write_bytes(content)
        return folder

    def ckpt_with(self, config=None, drop=(), hf=False, change=None):
        """A copy of the (HF with `hf`) checkpoint: config.json replaced (text, or a dict), or `change(dict)`
        applied to it, files in `drop` removed."""
        import json as _json
        import shutil

        folder = self._fresh("ckpt")
        shutil.copytree(self.hf if hf else self.ckpt, folder)
        if change is not None:
            config = _json.loads((folder / "config.json").read_text())
            change(config)
        if config is not None:
            (folder / "config.json").write_text(config if isinstance(config, str) else _json.dumps(config))
        for name in drop:
            (folder / name).unlink()
        return folder

    def recipe(self, tables: str = "", *, model=None, stages='["finetune", "export"]', max_length=16, top=""):
        path = self._fresh("recipe").with_suffix(".toml")
        path.write_text(f'task = "sst2"\nmodel = "{model or self.ckpt}"\nmax_length = {max_length}\n'
                        f"stages = {stages}\n{top}\n[finetune.train]\nsteps = 1\n"
                        + (tables if "[export]" in tables else
                           '[export]\nformats = ["onnx"]\nseq_lens = [16]\nbench = false\n' + tables))
        return path


@pytest.fixture(scope="session")
def fault_kit(tmp_path_factory) -> FaultKit:
    return FaultKit(tmp_path_factory.mktemp("faults"))
