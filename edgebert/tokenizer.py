"""The checkpoint's own tokenizer, loaded through Hugging Face (fast), described for the manifest.

Token ids must match what the model saw in training, so nothing here re-implements WordPiece, BPE or
SentencePiece's Unigram: `tokenizers` does the splitting, the special tokens and the `[CLS] A [SEP] B [SEP]`
layout.
"""

from __future__ import annotations

import copy
import importlib.util
import warnings
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast

from . import families
from .errors import EdgebertError

# transformers stores int(1e30) as model_max_length when a checkpoint does not say.
_UNKNOWN_LIMIT = 10**9
_SPECIAL = ("cls", "sep", "pad", "unk", "mask", "bos", "eos")


def load_tokenizer(path_or_hub_id: str | Path, **kwargs) -> PreTrainedTokenizerFast:
    """Load the fast tokenizer of a checkpoint folder or hub id.

    `model_max_length` is capped by the model's position table (config.json) when one is found, so
    `check_max_length` refuses lengths the model cannot embed; a tokenizer of another kind than the
    model's family ships (WordPiece next to a RoBERTa, say) is warned about. Extra kwargs go to
    `AutoTokenizer.from_pretrained` (e.g. `add_prefix_space=True` for RoBERTa on pre-split words).
    """
    source = str(path_or_hub_id)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, use_fast=True, **kwargs)
    except (OSError, ValueError, ImportError) as e:
        if _sentencepiece_only(source):
            raise EdgebertError(
                f"cannot load a tokenizer from {source}: its SentencePiece model converts to a fast tokenizer "
                "only with sentencepiece and protobuf installed: pip install 'edgebert[sentencepiece]'"
            ) from e
        raise EdgebertError(
            f"cannot load a tokenizer from {source}: {_first_line(e)}; pass a checkpoint folder "
            "with tokenizer.json (or vocab.txt), or a hub id while online"
        ) from e
    if not tokenizer.is_fast:
        raise EdgebertError(
            f"{source} has only a slow (Python) tokenizer; save it once with a fast tokenizer "
            "(tokenizer.json) so ids match the `tokenizers` runtime"
        )
    positions = _config_positions(source, type(tokenizer.backend_tokenizer.model).__name__)
    if positions is not None and (
        tokenizer.model_max_length >= _UNKNOWN_LIMIT or positions < tokenizer.model_max_length
    ):
        tokenizer.model_max_length = positions
    return tokenizer


def _sentencepiece_only(source: str) -> bool:
    """A folder with a SentencePiece model (DeBERTa-v3's spm.model) but no tokenizer.json, and without
    the packages transformers converts it with."""
    folder = Path(source)
    if not folder.is_dir() or (folder / "tokenizer.json").exists() or not any(folder.glob("*.model")):
        return False
    return any(importlib.util.find_spec(name) is None for name in ("sentencepiece", "google.protobuf"))


def _config_positions(source: str, kind: str) -> int | None:
    """Usable positions of the model next to the tokenizer (of `kind`), or None without a config."""
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError):
        return None
    family = families.lookup(config.model_type)
    if family is None:
        positions = getattr(config, "max_position_embeddings", None)
        return None if positions is None else int(positions)
    if kind not in family.tokenizers:
        warnings.warn(f"{source}: the tokenizer is {kind} but config.json is a {config.model_type} model, whose "
                      f"tokenizers are {'/'.join(family.tokenizers)}: use the checkpoint's own tokenizer, or the "
                      "ids will not be the ones the model was trained on", stacklevel=3)
    return family.from_hf(config.to_dict()).max_length


def max_positions(tokenizer: PreTrainedTokenizerFast) -> int | None:
    """The longest input the model accepts, or None when neither tokenizer nor config says."""
    limit = tokenizer.model_max_length
    return None if limit >= _UNKNOWN_LIMIT else int(limit)


def check_max_length(tokenizer: PreTrainedTokenizerFast, max_length: int) -> None:
    """Refuse a max_length the model cannot embed or that leaves no room for text."""
    if isinstance(max_length, bool) or not isinstance(max_length, int):
        raise EdgebertError(f"max_length must be an integer, got {max_length!r}")
    limit = max_positions(tokenizer)
    if limit is not None and max_length > limit:
        raise EdgebertError(
            f"max_length {max_length} exceeds the model's {limit} positions; "
            f"set max_length = {limit} or less in the recipe"
        )
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    if max_length <= specials:
        raise EdgebertError(
            f"max_length {max_length} leaves no room for text after {specials} special tokens; "
            "set a larger max_length in the recipe"
        )


@dataclass
class Encoded:
    """Unpadded ids per input; `word_ids` maps each token to its word (pre-split input only)."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    word_ids: list[list[int | None]] | None
    truncated: int


def encode(
    tokenizer: PreTrainedTokenizerFast,
    texts: list[str] | list[list[str]],
    text_pairs: list[str] | None = None,
    *,
    max_length: int,
    is_split_into_words: bool = False,
    source: str = "inputs",
) -> Encoded:
    """Encode sentences or pairs as the checkpoint does, truncating to max_length.

    Truncated inputs are counted and warned about (naming `source`), since silently cut text is a
    common cause of accuracy that differs between training and device.
    """
    check_max_length(tokenizer, max_length)
    for name, given in (("texts", texts), ("text_pairs", text_pairs)):
        if isinstance(given, str):  # list("a string") would be its characters, each encoded as a text
            raise EdgebertError(f"{source}: {name} is one string; pass a list of them ([{name[:-1]}])")
    if text_pairs is not None and len(text_pairs) != len(texts):
        raise EdgebertError(
            f"{source}: {len(texts)} texts but {len(text_pairs)} text pairs; pass one pair per text"
        )
    texts, text_pairs = list(texts), None if text_pairs is None else list(text_pairs)
    texts, text_pairs = _clip(texts, max_length, is_split_into_words, source), _clip(text_pairs, max_length, False, source)
    # One token over the limit is enough to tell a truncated input from one that fits exactly.
    probe = _call(tokenizer, texts, text_pairs, max_length + 1, is_split_into_words)
    input_ids, token_type_ids = probe["input_ids"], probe["token_type_ids"]
    word_ids = [probe.word_ids(i) for i in range(len(texts))] if is_split_into_words else None
    long = [i for i, ids in enumerate(input_ids) if len(ids) > max_length]
    if long:
        redo = _call(
            tokenizer,
            [texts[i] for i in long],
            None if text_pairs is None else [text_pairs[i] for i in long],
            max_length,
            is_split_into_words,
        )
        for j, i in enumerate(long):
            input_ids[i], token_type_ids[i] = redo["input_ids"][j], redo["token_type_ids"][j]
            if word_ids is not None:
                word_ids[i] = redo.word_ids(j)
        warnings.warn(
            f"{source}: truncated {len(long)} of {len(texts)} inputs to max_length={max_length} "
            f"tokens; raise max_length in the recipe (model limit {max_positions(tokenizer)}) to keep them",
            stacklevel=2,
        )
    return Encoded(input_ids, token_type_ids, word_ids, len(long))


CHARS_PER_TOKEN = 32  # no word piece is longer; text past max_length * this can never reach the model


def _clip(texts: list | None, max_length: int, words: bool, source: str) -> list | None:
    """Texts cut to what `max_length` tokens can hold, in characters (words for pre-split input), before
    the tokenizer sees them: its memory grows with the input, and a 100k-character pair took gigabytes."""
    if texts is None:
        return None
    chars = max_length * CHARS_PER_TOKEN
    clipped = [t[:max_length] if words else t[:chars] for t in texts]
    cut = sum(len(a) != len(b) for a, b in zip(texts, clipped))
    if cut:
        warnings.warn(f"{source}: {cut} of {len(texts)} inputs are over {chars if not words else max_length} "
                      f"{'words' if words else 'characters'}, more than max_length={max_length} tokens can hold; "
                      "cut before tokenizing", stacklevel=3)
    return clipped


def _call(tokenizer, texts, text_pairs, max_length, is_split_into_words):
    try:
        return tokenizer(
            texts,
            text_pairs,
            truncation=True,
            max_length=max_length,
            is_split_into_words=is_split_into_words,
            return_token_type_ids=True,
            return_attention_mask=False,
        )
    except ValueError as e:  # e.g. RoBERTa on pre-split words without add_prefix_space
        raise EdgebertError(
            f"tokenizer refused the input: {_first_line(e)}; for pre-split words with a BPE "
            "tokenizer load it with load_tokenizer(path, add_prefix_space=True)"
        ) from e


def describe(tokenizer: PreTrainedTokenizerFast, max_length: int) -> dict:
    """The input contract a device runtime must reproduce, for the manifest."""
    check_max_length(tokenizer, max_length)
    normalizer = tokenizer.backend_tokenizer.normalizer
    special = {}
    for name in _SPECIAL:
        token = getattr(tokenizer, f"{name}_token")
        if token is not None:
            special[name] = {"token": str(token), "id": tokenizer.convert_tokens_to_ids(token)}
    return {
        "type": type(tokenizer.backend_tokenizer.model).__name__,
        "vocab_size": len(tokenizer),
        "lowercase": normalizer is not None and normalizer.normalize_str("A") == "a",
        "max_length": max_length,
        "model_max_length": max_positions(tokenizer),
        "pad_id": tokenizer.pad_token_id,
        "pad_token_type_id": tokenizer.pad_token_type_id,
        "padding_side": tokenizer.padding_side,
        "truncation_side": tokenizer.truncation_side,
        "special_tokens": special,
        "single_template": _template(tokenizer, pair=False),
        "pair_template": _template(tokenizer, pair=True),
    }


def _template(tokenizer: PreTrainedTokenizerFast, pair: bool) -> str:
    """E.g. "[CLS] A [SEP] B [SEP]", read off a real encoding rather than assumed per family."""
    encoding = tokenizer("a", "b" if pair else None)
    tokens = tokenizer.convert_ids_to_tokens(encoding["input_ids"])
    parts: list[str] = []
    for token, sequence in zip(tokens, encoding.sequence_ids(), strict=True):
        part = token if sequence is None else "AB"[sequence]
        if sequence is None or not parts or parts[-1] != part:
            parts.append(part)
    return " ".join(parts)


def save(tokenizer: PreTrainedTokenizerFast, folder: str | Path, *, max_length: int | None = None) -> list[Path]:
    """Write tokenizer.json (+ config) and, for WordPiece, the vocab.txt TFLite metadata names.

    `max_length` (a bundle's input contract) becomes tokenizer_config's model_max_length and
    tokenizer.json's truncation and padding length, so a runtime that reads those files (Hugging Face
    tokenizers in an app, say) cuts and pads where the model files expect it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if max_length is not None:
        check_max_length(tokenizer, max_length)
        tokenizer = copy.deepcopy(tokenizer)  # the caller's tokenizer keeps its own settings
        tokenizer.model_max_length = max_length
        backend = tokenizer.backend_tokenizer
        backend.enable_truncation(max_length, direction=tokenizer.truncation_side)
        backend.enable_padding(direction=tokenizer.padding_side, pad_id=tokenizer.pad_token_id,
                               pad_type_id=tokenizer.pad_token_type_id, pad_token=str(tokenizer.pad_token),
                               length=max_length)
    written = {Path(p) for p in tokenizer.save_pretrained(str(folder))}
    vocab_txt = folder / "vocab.txt"
    if type(tokenizer.backend_tokenizer.model).__name__ == "WordPiece" and not vocab_txt.exists():
        vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True)
        by_id = sorted(vocab, key=vocab.__getitem__)
        if [vocab[t] for t in by_id] != list(range(len(by_id))):
            raise EdgebertError(
                f"vocabulary ids of {folder} have gaps, so vocab.txt (one token per id) cannot "
                "be written; re-save the tokenizer with contiguous ids"
            )
        vocab_txt.write_text("".join(f"{t}\n" for t in by_id), encoding="utf-8")
        written.add(vocab_txt)
    return sorted(p for p in written if p.exists())


def _first_line(error: Exception, limit: int = 200) -> str:
    """Keep wrapped library errors to one readable line (some list every model type)."""
    text = str(error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."
