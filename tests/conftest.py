"""Shared fixtures: the real data root and a tiny WordPiece tokenizer built offline."""

import json
import random
import string

import pytest
import torch

from builders import PASS_SPECIALS, PASS_WORDS, QUANT_VOCAB, SST2_WORDS, tiny_model

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
# The compile tests' start model and SST-2-shaped data folder (test_compile.py, test_cli.py).



@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A 2-layer, 32-wide classifier saved with the real MiniLM WordPiece vocabulary: compile tests start here."""
    from edgebert import EncoderConfig, HeadConfig, build, save
    from edgebert.checkpoint import default_checkpoint

    torch.manual_seed(0)
    config = EncoderConfig(vocab_size=30522, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                           max_positions=64)
    folder = tmp_path_factory.mktemp("tiny") / "model"
    save(build(config, HeadConfig(num_labels=2, labels=["negative", "positive"])), folder,
         tokenizer_from=default_checkpoint())
    return folder


@pytest.fixture(scope="session")
def tiny_sst2(tmp_path_factory):
    """sst2/train.tsv and dev.tsv: sentences whose label follows their first word."""
    root = tmp_path_factory.mktemp("data")
    (root / "sst2").mkdir()
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", 96), ("dev", 32)):
        rows = ["sentence\tlabel"]
        for _ in range(n):
            idx = torch.randint(0, len(SST2_WORDS), (6,), generator=g).tolist()
            label = int(idx[0] < 3)
            rows.append(" ".join(SST2_WORDS[i] for i in idx) + f" \t{label}")
        (root / "sst2" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return root


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

    names = ("compare", "recovery", "compile_cost", "promise", "_measure", "_figures", "_render", "_timing")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "bench"))
        yield SimpleNamespace(**{name.lstrip("_"): importlib.import_module(name) for name in names})


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
