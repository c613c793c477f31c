"""vocab: drop the vocabulary the task never uses (as TextPruner does), rows and tokenizer together.

Word embeddings are most of a small student's bytes, and a task reads a few thousand of its 30k+
tokens. Kept: the special and added tokens, every token the training text (plus an optional corpus)
produces under the original tokenizer, and every single-character piece with its continuation form
(`x` and `##x`; `x` and `▁x` for SentencePiece; the byte alphabet for byte-level BPE), so any word
still tokenizes, into smaller pieces where its own are gone. Text whose tokens are all kept tokenizes
to the same strings as before (WordPiece's longest match, Unigram's best segmentation and BPE's merges
restricted to the kept ones all pick what they picked before), so the model's outputs on it do not
change. Ids are renumbered in their old order; the model's table rows (and an MLM head's bias) follow.
"""

from __future__ import annotations

import difflib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn

from ..config import Config
from ..data import EncodedDataset, TaskData
from ..errors import EdgebertError
from ..model import MaskedLM, embeddings, encoder_of
from .surgery import set_config
from .train import Result, measure, task_evaluator

KINDS = ("WordPiece", "Unigram", "BPE")  # the `tokenizers` models this pass rewrites
_BYTE_PIECE = 6  # SentencePiece's byte-fallback pieces look like <0x41>


@dataclass(frozen=True, kw_only=True)
class VocabConfig(Config):
    """Which tokens to keep beyond the special and single-character ones."""

    corpus: str | None = None  # a UTF-8 text file, one text per line, whose tokens are kept too (the app's text)
    min_count: int = 1  # keep a training/corpus token seen at least this often (higher = smaller, more splitting)
    keep_words: bool = False  # also every whole word of the vocabulary in ASCII letters: unseen words keep their piece
    keep_positions: bool = False  # also the position rows past the longest input the data is encoded to


@dataclass
class VocabResult(Result):
    """Result plus the pruned tokenizer: the model's new ids are that tokenizer's, not the original's."""

    tokenizer: object  # transformers.PreTrainedTokenizerFast


def kind_of(tokenizer) -> str:
    return type(tokenizer.backend_tokenizer.model).__name__


def token_counts(tokenizer, data: TaskData, corpus: str | None) -> Counter:
    """How often each id occurs in the training text and the corpus file, under `tokenizer`."""
    counts = Counter(i for ids in data.train.input_ids for i in ids)
    if corpus is not None:
        path = Path(corpus)
        try:
            lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise EdgebertError(f"vocab.corpus {corpus}: cannot read it as UTF-8 text ({e}): pass a text file, "
                                "one text per line") from None
        for start in range(0, len(lines), 1000):
            batch = tokenizer(lines[start : start + 1000], add_special_tokens=False)["input_ids"]
            counts.update(i for ids in batch for i in ids)
    return counts


def check_prunable(tokenizer) -> None:
    """Refuse, in one line naming it, a tokenizer kind whose files this pass cannot rewrite."""
    kind = kind_of(tokenizer)
    if kind not in KINDS:
        raise EdgebertError(f"vocab: cannot prune a {kind} tokenizer (it prunes {', '.join(KINDS)}): drop the vocab "
                            "stage for this model")
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    if kind == "BPE" and (model.get("continuing_subword_prefix") or model.get("end_of_word_suffix")):
        raise EdgebertError("vocab: cannot prune a BPE tokenizer with a continuing_subword_prefix or "
                            "end_of_word_suffix (its merges do not concatenate): drop the vocab stage for this model")


def word_marker(tokenizer) -> tuple[str, bool]:
    """The tokenizer's word-piece marker and whether it marks word starts: WordPiece marks
    continuations (`##`), SentencePiece (`▁`) and byte-level BPE (`Ġ`) mark word starts."""
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    if model["type"] == "WordPiece":
        return model.get("continuing_subword_prefix") or "##", False
    tokens = tokenizer.convert_ids_to_tokens(list(range(min(2000, len(tokenizer)))))
    marker = next((m for m in ("▁", "Ġ") if any(t.startswith(m) for t in tokens)), None)
    if marker is None:
        raise EdgebertError(f"cannot tell where words start in this {model['type']} tokenizer (no ▁ or Ġ "
                            "pieces): drop distill.augment and vocab.keep_words for this model")
    return marker, True


def word_starts(tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(starts a word, is a whole alphabetic word of 2+ letters) per id, from `word_marker`."""
    marker, marks_start = word_marker(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    special = set(tokenizer.all_special_ids)
    if marks_start:
        start = np.array([t.startswith(marker) for t in tokens])
        word = [t[len(marker):] if s else "" for t, s in zip(tokens, start)]
    else:
        start = np.array([not t.startswith(marker) for t in tokens])
        word = tokens
    whole = np.array([bool(s) and len(w) > 1 and w.isalpha() and i not in special
                      for i, (s, w) in enumerate(zip(start, word))])
    start[list(special)] = True  # a special token ends the word before it
    return start, whole


def kept_ids(tokenizer, counts: Counter, *, min_count: int = 1, extra: tuple[int, ...] = (),
             words: bool = False) -> list[int]:
    """The ids to keep, in old order: added/special tokens, `extra`, tokens seen `min_count` times, single
    characters with their continuation forms, with `words` every whole ASCII word of the vocabulary, and
    (BPE) every piece a kept token is merged from."""
    check_prunable(tokenizer)
    kind = kind_of(tokenizer)
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True)
    keep = {t for t, i in vocab.items() if counts.get(i, 0) >= min_count}
    if words:
        whole = word_starts(tokenizer)[1]
        keep |= {t for t, i in vocab.items() if i < len(whole) and whole[i] and t.isascii()}
    keep |= {str(t) for t in tokenizer.added_tokens_decoder.values()}
    keep |= {t for t, i in vocab.items() if i in extra}
    prefix = None if kind == "BPE" else word_marker(tokenizer)[0]  # byte-level BPE keeps its byte alphabet below
    for token in vocab:
        core = token[len(prefix):] if prefix and token.startswith(prefix) and len(token) > len(prefix) else token
        if len(core) == 1 or (len(token) == _BYTE_PIECE and token.startswith("<0x") and token.endswith(">")):
            keep.add(token)
    if kind == "BPE":
        keep = _merge_closure(keep, _merges(model))
    return sorted(vocab[t] for t in keep)


def _merges(model: dict) -> list[tuple[str, str]]:
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]


def _merge_closure(keep: set[str], merges: list[tuple[str, str]]) -> set[str]:
    """`keep` plus the parts of every merge that makes a kept token, recursively, so each still forms."""
    makes = defaultdict(list)
    for a, b in merges:
        makes[a + b].append((a, b))
    keep, stack = set(keep), list(keep)
    while stack:
        for pair in makes.get(stack.pop(), ()):
            for part in pair:
                if part not in keep:
                    keep.add(part)
                    stack.append(part)
    return keep


def pruned_tokenizer(tokenizer, keep: list[int]):
    """A copy of `tokenizer` holding only the ids `keep`, renumbered 0.. in their old order."""
    kind = kind_of(tokenizer)
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    model = spec["model"]
    old = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True)
    by_id = {i: t for t, i in old.items()}
    new = {by_id[i]: n for n, i in enumerate(keep)}
    if kind == "Unigram":
        pieces = model["vocab"]
        model["vocab"] = [pieces[i] for i in keep if i < len(pieces)]
        if model.get("unk_id") is not None:
            model["unk_id"] = new[pieces[model["unk_id"]][0]]
    else:
        model["vocab"] = {t: n for t, n in new.items() if t in model["vocab"]}
    if kind == "BPE":
        model["merges"] = [m for m, (a, b) in zip(model["merges"], _merges(model))
                           if a in new and b in new and a + b in new]
    for added in spec["added_tokens"]:
        added["id"] = new[added["content"]]
    _renumber(spec.get("post_processor"), new)
    if spec.get("padding"):
        spec["padding"]["pad_id"] = new[spec["padding"]["pad_token"]]
    backend = Tokenizer.from_str(json.dumps(spec))
    kwargs = {k: v for k, v in tokenizer.init_kwargs.items()
              if k not in ("vocab_file", "merges_file", "tokenizer_file", "name_or_path", "added_tokens_decoder")}
    pruned = type(tokenizer)(tokenizer_object=backend, **kwargs)
    pruned.model_max_length = tokenizer.model_max_length
    got = pruned.backend_tokenizer.get_vocab(with_added_tokens=True)
    if got != new or len(pruned) != len(keep):
        raise EdgebertError(f"vocab: the pruned {kind} tokenizer numbers its tokens differently from the kept rows "
                            "(added tokens out of order?): drop the vocab stage for this model")
    return pruned


def _renumber(processor: dict | None, new: dict[str, int]) -> None:
    """The post-processor's special-token ids ([CLS], [SEP], <s>...) under the new numbering."""
    if not processor:
        return
    for child in processor.get("processors") or ():  # a Sequence
        _renumber(child, new)
    for special in (processor.get("special_tokens") or {}).values():  # TemplateProcessing
        special["ids"] = [new[t] for t in special["tokens"]]
    for name in ("cls", "sep"):  # BertProcessing, RobertaProcessing: [token, id]
        if processor.get(name):
            processor[name] = [processor[name][0], new[processor[name][0]]]


def prune_rows(model: nn.Module, keep: list[int]) -> None:
    """Keep word-embedding rows `keep` (in that order) and an MLM head's matching bias entries, in place."""
    c = encoder_of(model).config
    emb = embeddings(model)
    index = torch.as_tensor(keep, dtype=torch.long)
    old = emb.word
    pad = keep.index(c.pad_token_id)
    table = nn.Embedding(len(keep), old.embedding_dim, padding_idx=pad)
    table.weight = nn.Parameter(old.weight.detach().index_select(0, index).clone(),
                                requires_grad=old.weight.requires_grad)
    emb.word = table
    if isinstance(model, MaskedLM):
        model.bias = nn.Parameter(model.bias.detach().index_select(0, index).clone())
    set_config(model, vocab_size=len(keep), pad_token_id=pad)


def trim_positions(model: nn.Module, length: int) -> int:
    """Keep the learned position rows that inputs of at most `length` tokens read (a 4-layer student's 512 × 288
    table is 0.6 MB of its 7.8 MB file, and the bundle takes 64 tokens), in place; the rows dropped."""
    c = encoder_of(model).config
    emb = embeddings(model)
    rows = c.position_offset + length
    if emb.position is None or rows >= c.max_positions:
        return 0
    old = emb.position
    table = nn.Embedding(rows, old.embedding_dim)
    table.weight = nn.Parameter(old.weight.detach()[:rows].clone(), requires_grad=old.weight.requires_grad)
    emb.position = table
    emb.module.position_ids = emb.module.position_ids[:, :rows]
    set_config(model, max_positions=rows)
    return c.max_positions - rows


def changed_share(old_ids: list[list[int]], new_ids: list[list[int]], old_tok, new_tok) -> tuple[float, float]:
    """(share of non-special tokens, share of examples) whose tokenization differs between the two."""
    specials = set(old_tok.all_special_tokens)
    changed = total = examples = 0
    for a, b in zip(old_ids, new_ids):
        a = [t for t in old_tok.convert_ids_to_tokens(a) if t not in specials]
        b = [t for t in new_tok.convert_ids_to_tokens(b) if t not in specials]
        same = sum(block.size for block in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks())
        changed, total, examples = changed + len(a) - same, total + len(a), examples + (a != b)
    return changed / max(total, 1), examples / max(len(old_ids), 1)


def _word_bytes(model: nn.Module) -> int:
    word = embeddings(model).word.weight
    bias = model.bias if isinstance(model, MaskedLM) else None
    return word.numel() * word.element_size() + (bias.numel() * bias.element_size() if bias is not None else 0)


def prune_vocab(model: nn.Module, config: VocabConfig, data: TaskData, *, teacher: nn.Module | None = None,
                work_dir: str | Path | None = None) -> VocabResult:
    """Prune `model`'s vocabulary (in place) to what `data.train` and `config.corpus` use under
    `data.tokenizer`; return the model, its record and the pruned tokenizer. It trains nothing: rows
    are copied, so `teacher` and `work_dir` (the verb's shape) are not read."""
    tokenizer = data.tokenizer
    if tokenizer is None:
        raise EdgebertError("vocab: the data carries no tokenizer to prune: build TaskData with the tokenizer "
                            "that encoded it")
    c = encoder_of(model).config
    if len(tokenizer) > c.vocab_size:
        raise EdgebertError(f"vocab: the tokenizer has {len(tokenizer)} tokens but the model embeds {c.vocab_size}: "
                            "pass the tokenizer the model was trained with")
    before = {"vocab_size": c.vocab_size, "embedding_bytes": _word_bytes(model)}
    scored = data.eval is not None and not isinstance(model, MaskedLM)  # an MLM has no task metric
    metrics_before = task_evaluator(model, data.eval)[0](model) if scored else {}
    keep = kept_ids(tokenizer, token_counts(tokenizer, data, config.corpus), min_count=config.min_count,
                    extra=(c.pad_token_id,), words=config.keep_words)
    new_tok = pruned_tokenizer(tokenizer, keep)
    prune_rows(model, keep)
    dropped = 0 if config.keep_positions else trim_positions(model, data.train.max_length)
    details = {"kind": kind_of(tokenizer), "before": before,
               "after": {"vocab_size": len(keep), "embedding_bytes": _word_bytes(model)},
               "metrics_before": metrics_before, "min_count": config.min_count, "corpus": config.corpus,
               "keep_words": config.keep_words, "positions_dropped": dropped}
    metrics = {}
    if data.eval is not None:
        new_eval = EncodedDataset(data.eval.split, new_tok, data.eval.max_length)
        tokens, examples = changed_share(data.eval.input_ids, new_eval.input_ids, tokenizer, new_tok)
        details.update(dev_tokens_changed=round(tokens, 6), dev_examples_changed=round(examples, 6))
        metrics = task_evaluator(model, new_eval)[0](model) if scored else {}
    record = measure("vocab", model, metrics=metrics, details=details)
    return VocabResult(model, record, new_tok)
