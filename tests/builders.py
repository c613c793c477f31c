"""Tiny models, data and tokenizers the tests build: plain functions (fixtures live in conftest.py).
The torchrun worker in test_passes_ddp.py imports them too."""

from __future__ import annotations

import random

import torch

SST2_WORDS = ["good", "great", "fun", "bad", "awful", "dull", "film", "plot", "the", "a", "very", "not"]
QUANT_VOCAB = 1500  # above Int8Embeddings.min_rows, so the word table is converted


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
