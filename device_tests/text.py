"""`run --text FILE`: raw text through the bundle's tokenizer.json and the model, read back as labels,
entity spans or vectors — what an app does with the bundle, checked on the device itself.

Tokenization is Hugging Face `tokenizers` reading the bundle's tokenizer.json (it has aarch64 wheels),
the library the model's ids were made with, so nothing here re-implements WordPiece or BPE. It is the
harness's one dependency beyond numpy and a runtime, and only --text imports it. A raw-text model
(model.text.onnx) tokenizes inside its graph: it takes the lines as they are, and tokenizers is not needed.
"""

from __future__ import annotations

import os

import numpy as np

from . import HarnessError, metrics

EMBEDDINGS = "embeddings"  # the output name of a sentence-embedding model


def read_lines(path: str) -> list[tuple[str, str | None]]:
    """(text, pair or None) per non-empty line: one sentence, or a pair split at a tab."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        shown = path if len(path) <= 80 else f"{path[:60]}... ({len(path)} characters)"  # text given for a path
        reason = e.strerror if isinstance(e, OSError) and e.strerror else e
        raise HarnessError(f"cannot read --text {shown} ({reason}): pass a UTF-8 file, one sentence or "
                           "tab-separated pair a line") from None
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) > 2 or not all(p.strip() for p in parts):
            raise HarnessError(f"--text {path}:{number}: expected one sentence or two tab-separated ones, got "
                               f"{len(parts)} fields{' (one empty)' if len(parts) <= 2 else ''}")
        out.append((parts[0], parts[1] if len(parts) == 2 else None))
    if not out:
        raise HarnessError(f"--text {path} has no text: write one sentence (or tab-separated pair) a line")
    return out


def load_tokenizer(path: str, max_length: int | None):
    """tokenizer.json without padding (each line runs at its true length), truncating at its own
    max length, else at the model's longest input."""
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        raise HarnessError(f"--text needs the tokenizers library ({e}): pip install tokenizers") from None
    if not os.path.isfile(path):
        raise HarnessError(f"tokenizer {path} does not exist: copy the bundle's tokenizer.json beside the model "
                           "or pass --tokenizer")
    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001  tokenizers raises untyped errors for bad files
        raise HarnessError(f"cannot read tokenizer {path}: {str(e).splitlines()[0]}") from None
    tokenizer.no_padding()
    if tokenizer.truncation is None and max_length:
        tokenizer.enable_truncation(max_length)
    return tokenizer


def read_labels(path: str | None) -> list[str]:
    if path is None or not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [line for line in f.read().splitlines() if line]


def feeds(encoding) -> dict[str, np.ndarray]:
    """One encoded line as a batch of one at its true length."""
    return {"input_ids": np.array([encoding.ids], dtype=np.int64),
            "attention_mask": np.array([encoding.attention_mask], dtype=np.int64),
            "token_type_ids": np.array([encoding.type_ids], dtype=np.int64)}


def read_out(output: np.ndarray, output_name: str, encoding, text: str, pair: str | None,
             labels: list[str], truncated: bool) -> dict:
    """What one line's output means: a vector, entity spans (from the `encoding`'s words), a score or labels with
    probabilities."""
    line = {"text": text} if pair is None else {"text": text, "pair": pair}
    if truncated:
        line["truncated"] = True
    if output_name == EMBEDDINGS:
        return {**line, "embedding": [float(x) for x in output.reshape(-1)]}
    if output.ndim == 3:
        if pair is not None:
            raise HarnessError("a token-classification model tags one sentence a line: drop the tab-separated pair")
        if not labels:
            raise HarnessError("a token-classification model needs its tag names: pass the bundle's labels.txt "
                               "(--labels)")
        return {**line, **spans(output[0], encoding, text, _names(labels, output.shape[-1]))}
    if output.shape[-1] == 1:
        return {**line, "score": float(output.reshape(-1)[0])}
    probabilities = _softmax(output.reshape(-1).astype(np.float64))
    names = _names(labels, len(probabilities))
    return {**line, "labels": [{"label": names[i], "score": float(probabilities[i])}
                               for i in np.argsort(-probabilities, kind="stable")]}


def spans(logits: np.ndarray, encoding, text: str, tags: list[str]) -> dict:
    """Words with their tags (a word's tag is its first piece's, as training labeled it) and the
    entity spans those tags make (conlleval's chunks), with character offsets into `text`."""
    first, last = {}, {}  # word -> its first / last token
    for token, word in enumerate(encoding.word_ids):
        if word is None or encoding.sequence_ids[token] != 0:
            continue
        first.setdefault(word, token)
        last[word] = token
    order = sorted(first)
    words = [{"word": text[encoding.offsets[first[w]][0]:encoding.offsets[last[w]][1]],
              "start": encoding.offsets[first[w]][0], "end": encoding.offsets[last[w]][1],
              "label": tags[int(logits[first[w]].argmax())]} for w in order]
    found = []
    for start, end, kind in sorted(metrics.entities([w["label"] for w in words])):
        begin, finish = words[start]["start"], words[end - 1]["end"]
        found.append({"label": kind, "text": text[begin:finish], "start": begin, "end": finish,
                      "words": [w["word"] for w in words[start:end]]})
    return {"words": words, "spans": found}


def _names(labels: list[str], n: int) -> list[str]:
    if labels and len(labels) != n:
        raise HarnessError(f"labels.txt names {len(labels)} labels but the model has {n} outputs: pass the "
                           "bundle's labels.txt (--labels)")
    return labels or [str(i) for i in range(n)]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()
