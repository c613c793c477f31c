"""The raw-text model, `model.text.onnx`: the bundle's id-input model.onnx (the same graph, so the same numbers)
with its WordPiece tokenizer in front, built from onnxruntime-extensions' custom ops. An app feeds strings and
reads the scores, the label and the ids the model read; it needs onnxruntime and onnxruntime-extensions, and no
tokenizer code.

onnxruntime-extensions' `BertTokenizer` op normalizes otherwise than tokenizer.json (it lower-cases and strips
accents in Latin-1 only, knows fewer punctuation and control characters, and keeps the pieces before a word's
unknown character where WordPiece makes the whole word one [UNK]), so the graph does tokenizer.json's work
itself and leaves the op only the split on spaces and the vocabulary look-up:

1. a special token written in the text ("[SEP]") becomes a marker character, as tokenizer.json matches those on
   the raw text;
2. every character becomes what tokenizer.json's own normalizer and pre-tokenizer make of it, by a table built
   here for every code point: removed (control, private use), a space, set apart by spaces (punctuation, CJK),
   lower-cased and stripped of accents; a character no vocabulary piece holds becomes one stand-in (two regular
   expressions carry the large classes, an ai.onnx.ml LabelEncoder the rest);
3. the op tokenizes, its own normalization off, over the vocabulary plus a piece for each character that lacks
   one, so its greedy search never stops inside a word; a word that used such a piece, or the stand-in, becomes
   the one [UNK] WordPiece makes of it;
4. truncation is tokenizer.json's (longest first for pairs, which the op leaves whole), and the batch is
   right-padded to its longest row.

The op takes one text (or pair) per call, so the graph loops over the batch. The build checks the tokenizer
against tokenizer.json on every vocabulary piece and every table entry, and `export` then checks the whole
file against the id model on the eval set's texts (device_tests/rawtext.py reads them back from the ids).
One limit remains: onnxruntime-extensions reads strings up to their first NUL character, so a text holding
one is cut there (tokenizer.json drops the NUL and reads on).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from edgebert.config import Config
from edgebert.device_tests import HarnessError, backends, runtimes
from edgebert.device_tests.files import atomic_path
from edgebert.device_tests.rawtext import META
from edgebert.errors import EdgebertError, on_disk_full

from . import formats

EXTENSIONS = "ai.onnx.contrib"  # onnxruntime-extensions' op domain
ML = "ai.onnx.ml"  # LabelEncoder's
PREFIX = "text/"  # the names of what the tokenizer adds to the id model's graph
MAX_CHARS = 100  # the op's longest word before it is one [UNK]
PRIVATE = range(0xE000, 0xF900)  # where the stand-in and the markers are taken from: characters the text loses
IDS = ("input_ids", "attention_mask", "token_type_ids")
TOKEN_TASK = ("token classification has no raw-text model: entity spans need each word's character offsets in the "
              "text, and the in-graph tokenizer reads a normalized copy of it; tokenize with tokenizer.json and feed "
              "model.onnx (docs/embedding.md, token labels)")
PROBE_WORDS = 16  # vocabulary pieces per probe text
LONG_RUN = 255  # a run of code points at least one longer than this is matched by a regular expression, not the table


@dataclass(frozen=True, kw_only=True)
class OnnxTextConfig(Config):
    """Options of the raw-text model, built from an id-input .onnx file. tokenizer: the folder holding the
    tokenizer files (or tokenizer.json). max_length: the longest input in tokens, specials included (None: the
    tokenizer's truncation). pair: take two strings, `text` and `pair` (None: when the eval set holds pairs)."""

    tokenizer: str
    max_length: int | None = None
    pair: bool | None = None

    def __post_init__(self):
        if self.max_length is not None and self.max_length < 4:
            raise EdgebertError(f"OnnxTextConfig max_length {self.max_length}: give at least 4 ([CLS] A [SEP] B [SEP] "
                                "with one piece each)")


# The tokenizer: what tokenizer.json does, checked to be what the graph can do.


def _tokenizer(where: str):
    """tokenizers.Tokenizer of a folder (its tokenizer.json, else the files transformers reads) or a .json file."""
    from tokenizers import Tokenizer

    path = Path(where)
    if path.is_file():
        return Tokenizer.from_file(str(path))
    if (path / "tokenizer.json").is_file():
        return Tokenizer.from_file(str(path / "tokenizer.json"))
    from edgebert.tokenizer import load_tokenizer

    return load_tokenizer(path).backend_tokenizer


@dataclass(frozen=True)
class _Spec:
    """What the graph must reproduce of one tokenizer.json."""

    vocab: list[str]  # by id
    prefix: str  # "##"
    unk: int
    cls: int
    sep: int
    pad: int
    specials: dict[str, int]  # added tokens matched in the raw text -> id
    max_length: int


def _spec(tok, max_length: int | None) -> _Spec:
    """The tokenizer's contract, or one error naming what the raw-text model cannot reproduce."""
    spec = json.loads(tok.to_str())
    model, pre = spec["model"], spec.get("pre_tokenizer") or {}
    if model.get("type") != "WordPiece" or pre.get("type") != "BertPreTokenizer":
        raise EdgebertError(f"the raw-text model takes BERT's WordPiece tokenizers; this one is {model.get('type')} "
                            f"with {pre.get('type')}: tokenize in the app instead (docs/embedding.md)")
    if model.get("max_input_chars_per_word", MAX_CHARS) != MAX_CHARS:
        raise EdgebertError(f"the tokenizer's max_input_chars_per_word is {model['max_input_chars_per_word']}; "
                            f"onnxruntime-extensions' BertTokenizer has {MAX_CHARS}: tokenize in the app instead")
    truncation = tok.truncation or {}
    if truncation and (truncation["strategy"] != "longest_first" or truncation["direction"] != "right"):
        raise EdgebertError(f"the tokenizer truncates {truncation['strategy']} from the {truncation['direction']}; the "
                            "raw-text model truncates longest_first from the right: set that in tokenizer.json")
    max_length = max_length or truncation.get("max_length")
    if not max_length:
        raise EdgebertError("the tokenizer does not truncate, so the raw-text model's longest input is unknown: "
                            "pass max_length")
    found = tok.get_vocab(with_added_tokens=True)
    vocab = [""] * len(found)
    for token, i in found.items():
        if i >= len(vocab) or vocab[i]:
            raise EdgebertError("the tokenizer's ids are not 0..N-1, one each: the raw-text model numbers the "
                                "vocabulary by line")
        vocab[i] = token
    bad = next((t for t in vocab if not t or "\n" in t or "\r" in t), None)
    if bad is not None:
        raise EdgebertError(f"vocabulary token {bad!r} is empty or holds a line break, which the op's vocabulary "
                            "file cannot: the raw-text model cannot read this tokenizer")
    specials = {}
    for i, added in tok.get_added_tokens_decoder().items():
        if added.normalized or added.lstrip or added.rstrip or added.single_word:
            raise EdgebertError(f"added token {added.content!r} is matched after normalization or with stripping; "
                                "the raw-text model matches added tokens as written: tokenize in the app instead")
        specials[added.content] = i
    tok = _bare(tok)
    single, pair = tok.encode(""), tok.encode("", "")
    cls, sep = (single.ids + [None, None])[:2]
    if len(single.ids) != 2 or pair.ids != [cls, sep, sep] or pair.type_ids != [0, 0, 1]:
        raise EdgebertError(f"the tokenizer's template is not [CLS] A [SEP] (pair: [CLS] A [SEP] B [SEP], segments 0 "
                            f"and 1): it wraps an empty text as {single.tokens}; tokenize in the app instead")
    unk = found.get(model["unk_token"])
    if unk is None:
        raise EdgebertError(f"the tokenizer's unknown token {model['unk_token']!r} is not in its vocabulary")
    pad = (spec.get("padding") or {}).get("pad_id", found.get("[PAD]", 0))
    return _Spec(vocab=vocab, prefix=model["continuing_subword_prefix"], unk=unk, cls=cls, sep=sep, pad=int(pad),
                 specials=specials, max_length=int(max_length))


def _bare(tok):
    """A copy without padding or truncation: what one text alone tokenizes to."""
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(tok.to_str())
    copy.no_padding()
    copy.no_truncation()
    return copy


# The character table.


@dataclass(frozen=True)
class _Table:
    alphabet: frozenset[str]  # every character of a vocabulary piece (less the continuation prefix)
    removed: list[int]  # code points the text loses, in long runs (a regular expression removes them)
    apart: list[int]  # code points set apart as the stand-in (CJK no piece holds), in long runs
    entries: dict[str, str]  # every other character whose replacement is not the stand-in (a LabelEncoder)
    stand_in: str
    markers: dict[str, str]  # special token -> its marker character


@lru_cache(maxsize=4)
def _normalized(normalizer: str) -> tuple[str, ...]:
    """What the normalizer (its JSON; "null": none) makes of each code point alone ("" for surrogates, which no
    text holds). Cached: a tokenizer's table takes seconds, and tests build several."""
    from tokenizers import Tokenizer

    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": json.loads(normalizer), "pre_tokenizer": None, "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}}
    norm = Tokenizer.from_str(json.dumps(spec)).normalizer
    return tuple("" if 0xD800 <= c <= 0xDFFF else norm.normalize_str(chr(c)) if norm else chr(c)
                 for c in range(0x110000))


def _kinds(pre, chars: list[str]) -> dict[str, str]:
    """"space", "apart" or "word" for each character: how the pre-tokenizer treats it between two letters."""
    text = " ".join(f"a{c}a" for c in chars)
    inside = bytearray(len(text))  # 1: inside a longer word, 2: a word of its own
    for _, (start, end) in pre.pre_tokenize_str(text):
        inside[start:end] = b"\x02" if end - start == 1 else b"\x01" * (end - start)
    return {c: ("word", "apart", "space")[[1, 2, 0].index(inside[4 * i + 1])] for i, c in enumerate(chars)}


def _table(tok, spec: _Spec) -> _Table:
    """Each code point's replacement: tokenizer.json's normalization, pre-tokenizer spaces around what it sets apart,
    and the stand-in for a character no vocabulary piece holds."""
    normal = _normalized(json.dumps(json.loads(tok.to_str()).get("normalizer")))
    alphabet = frozenset(c for t in spec.vocab if t not in spec.specials
                         for c in (t[len(spec.prefix):] if t.startswith(spec.prefix) else t))
    free = [chr(c) for c in PRIVATE if normal[c] == "" and chr(c) not in alphabet]
    if len(free) < len(spec.specials) + 1:
        raise EdgebertError("the tokenizer keeps private-use characters, which the raw-text model uses as markers")
    stand_in, markers = free[0], {s: free[1 + i] for i, s in enumerate(sorted(spec.specials, key=len, reverse=True))}
    kind = _kinds(tok.pre_tokenizer, sorted({c for n in normal for c in n}))

    def piece(c: str) -> str:
        return c if c in alphabet else stand_in

    removed, apart, entries = [], [], {}
    for code, n in enumerate(normal):
        if 0xD800 <= code <= 0xDFFF:
            continue
        v = "".join(" " if kind[c] == "space" else f" {piece(c)} " if kind[c] == "apart" else piece(c) for c in n)
        if v == "":
            removed.append(code)
        elif v == f" {stand_in} ":
            apart.append(code)
        elif v != stand_in:
            entries[chr(code)] = v
    entries.update({m: m for m in markers.values()})
    marked = {ord(m) for m in markers.values()}
    # A regular expression is compiled on every call, so only long runs stay in the two classes; the table takes
    # the rest (a hash look-up each). The stand-in a text holds is removed before the graph writes its own.
    classes = {"": [c for c in removed if c not in marked and c != ord(stand_in)], f" {stand_in} ": apart}
    for value, codes in classes.items():
        runs = _runs(codes)
        classes[value] = [c for a, b in runs if b - a >= LONG_RUN for c in range(a, b + 1)]
        entries.update({chr(c): value for a, b in runs if b - a < LONG_RUN for c in range(a, b + 1)})
    classes[""] = sorted([*classes[""], ord(stand_in)])
    return _Table(alphabet=alphabet, removed=classes[""], apart=classes[f" {stand_in} "], entries=entries,
                  stand_in=stand_in, markers=markers)


def _runs(codes: list[int]) -> list[tuple[int, int]]:
    """The runs of consecutive code points in `codes` (sorted), first and last."""
    runs = []
    for c in codes:
        if runs and runs[-1][1] == c - 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))
    return runs


def _char_class(codes: list[int]) -> str:
    """An RE2 character class matching exactly `codes` (sorted), as ranges."""
    return "[" + "".join(f"\\x{{{a:X}}}" + (f"-\\x{{{b:X}}}" if b != a else "") for a, b in _runs(codes)) + "]"


def _literal(text: str) -> str:
    """`text` as an RE2 pattern matching it literally."""
    return "".join(f"\\{c}" if c.isascii() and not c.isalnum() else c for c in text)


# The graph.


class _Nodes:
    """ONNX nodes appended in order, each output named under PREFIX, constants as initializers of the outer graph."""

    def __init__(self, constants: list, opset: int, count=None):
        self.nodes, self.constants, self.opset = [], constants, opset
        self.count = count or itertools.count()  # shared with the loop body's nodes: one namespace

    def inner(self) -> "_Nodes":
        """Nodes of a subgraph (the loop body), named in the same namespace, their constants the outer graph's."""
        return _Nodes(self.constants, self.opset, self.count)

    def _name(self, hint: str) -> str:
        return f"{PREFIX}{hint}_{next(self.count)}"

    def const(self, value, hint: str = "const") -> str:
        from onnx import numpy_helper

        name = self._name(hint)
        array = np.array(value, dtype=object) if isinstance(value, str) or (
            isinstance(value, list) and value and isinstance(value[0], str)) else np.asarray(value)
        self.constants.append(numpy_helper.from_array(array, name))
        return name

    def op(self, op_type: str, *inputs: str, outputs: int = 1, domain: str = "", name: str | None = None,
           last: str | None = None, **attrs) -> str | list[str]:
        """The node's output name (a list for several): fresh ones, or `name` for a single output, `last` for the
        last of several."""
        from onnx import helper

        names = [name] if name else [self._name(op_type.lower()) + (f"_{i}" if i else "") for i in range(outputs)]
        if last:
            names[-1] = last
        self.nodes.append(helper.make_node(op_type, list(inputs), names, domain=domain, **attrs))
        return names[0] if outputs == 1 else names

    def reduce_max(self, x: str, axis: int) -> str:
        """ReduceMax keeping the axis, whichever way the opset takes its axes."""
        if self.opset >= 18:
            return self.op("ReduceMax", x, self.const([axis]), keepdims=1)
        return self.op("ReduceMax", x, axes=[axis], keepdims=1)


def _prepared(n: _Nodes, text: str, table: _Table, spec: _Spec) -> tuple[str, str]:
    """(each character of every text mapped through the table, where each text starts in it [B + 1])."""
    empty = n.const("", "empty")
    if table.markers:
        text = n.op("StringRegexReplace", text, n.const(_char_class(sorted(ord(m) for m in table.markers.values()))),
                    empty, domain=EXTENSIONS)
        for token, marker in table.markers.items():
            text = n.op("StringRegexReplace", text, n.const(_literal(token)), n.const(f" {marker} "), domain=EXTENSIONS)
    if table.removed:
        text = n.op("StringRegexReplace", text, n.const(_char_class(table.removed)), empty, domain=EXTENSIONS)
    if table.apart:
        text = n.op("StringRegexReplace", text, n.const(_char_class(table.apart)), n.const(f" {table.stand_in} "),
                    domain=EXTENSIONS)
    char = "((?s).)"
    chars, _, _, starts = n.op("StringRegexSplitWithOffsets", text, n.const(char), n.const([char]), outputs=4,
                               domain=EXTENSIONS)
    keys = list(table.entries)
    mapped = n.op("LabelEncoder", chars, domain=ML, keys_strings=keys, values_strings=[table.entries[k] for k in keys],
                  default_string=table.stand_in)
    return mapped, starts


@dataclass(frozen=True)
class _OpVocab:
    lines: list[str]  # the op's vocabulary: the tokenizer's, then a piece for each character lacking one, markers
    real: np.ndarray  # op id -> tokenizer id
    continues: np.ndarray  # op id -> 1 for a continuation piece
    extra: np.ndarray  # op id -> 1 for a piece WordPiece does not have (its word is [UNK])


def _op_vocab(spec: _Spec, table: _Table) -> _OpVocab:
    lines = list(spec.vocab)
    have = set(lines)
    extras = [p for c in sorted(table.alphabet | {table.stand_in}) for p in (c, spec.prefix + c) if p not in have]
    lines += extras
    lines += list(table.markers.values())
    real = np.array([*range(len(spec.vocab)), *[spec.unk] * len(extras),
                     *[spec.specials[t] for t in table.markers]], dtype=np.int64)
    continues = np.array([int(t.startswith(spec.prefix)) for t in lines], dtype=np.int64)
    extra = np.zeros(len(lines), dtype=np.int64)
    extra[len(spec.vocab):len(spec.vocab) + len(extras)] = 1
    return _OpVocab(lines, real, continues, extra)


def _body(outer: _Nodes, spec: _Spec, vocab: _OpVocab, texts: list[tuple[str, str]]):
    """The loop body: one row's text (and pair) joined from its mapped characters, tokenized, every word holding an
    extra piece made one [UNK], truncated as tokenizer.json does and right-padded to max_length."""
    from onnx import TensorProto, helper

    n = outer.inner()
    i = n.op("Unsqueeze", "i", n.const([0]))
    following = n.op("Add", i, n.const([1]))
    strings = []
    for mapped, starts in texts:
        row = n.op("Slice", mapped, n.op("Gather", starts, i), n.op("Gather", starts, following), n.const([0]))
        strings.append(n.op("StringJoin", row, n.const("", "empty"), n.const(np.int64(0)), domain=EXTENSIONS))
    joined = strings[0] if len(strings) == 1 else n.op("Concat", *strings, axis=0)
    ids, types, _ = n.op("BertTokenizer", joined, outputs=3, domain=EXTENSIONS, vocab_file="\n".join(vocab.lines),
                         do_lower_case=0, strip_accents=0, tokenize_chinese_chars=0, do_basic_tokenize=1,
                         unk_token=spec.vocab[spec.unk], cls_token=spec.vocab[spec.cls], sep_token=spec.vocab[spec.sep],
                         pad_token=spec.vocab[spec.pad], mask_token=spec.vocab[spec.unk], suffix_indicator=spec.prefix)
    # a word: a piece that does not continue, and the continuation pieces after it
    starts_word = n.op("Sub", n.const(np.int64(1)), n.op("Gather", n.const(vocab.continues, "continues"), ids))
    extra = n.op("Gather", n.const(vocab.extra, "extra"), ids)
    word = n.op("Sub", n.op("CumSum", starts_word, n.const(np.int64(0))), n.const(np.int64(1)))
    first = n.op("Reshape", n.op("NonZero", starts_word), n.const([-1]))
    length = n.op("Shape", ids)
    last = n.op("Concat", n.op("Sub", n.op("Slice", first, n.const([1]), n.const([2**62])), n.const([1])),
                n.op("Sub", length, n.const([1])), axis=0)
    seen = n.op("CumSum", extra, n.const(np.int64(0)))
    before = n.op("Sub", seen, extra)
    bad = n.op("Greater", n.op("Sub", n.op("Gather", seen, n.op("Gather", last, word)),
                               n.op("Gather", before, n.op("Gather", first, word))), n.const(np.int64(0)))
    keep = n.op("Or", n.op("Not", bad), n.op("Cast", starts_word, to=TensorProto.BOOL))
    real = n.op("Where", bad, n.const(np.int64(spec.unk)), n.op("Gather", n.const(vocab.real, "real"), ids))
    ids = n.op("Compress", real, keep, axis=0)
    types = n.op("Compress", types, keep, axis=0)
    # truncation (tokenizer.json's longest_first): pieces kept of each text
    total = n.op("Shape", ids)
    budget = spec.max_length - (3 if len(texts) == 2 else 2)
    a_len = n.op("Sub", n.op("ReduceSum", n.op("Cast", n.op("Equal", types, n.const(np.int64(0))), to=TensorProto.INT64),
                             n.const([0]), keepdims=1), n.const([2]))
    if len(texts) == 1:
        keep_a = n.op("Min", a_len, n.const([budget]))
        index = n.op("Concat", n.op("Range", n.const(np.int64(0)), n.op("Squeeze", n.op("Add", keep_a, n.const([1])),
                                                                          n.const([0])), n.const(np.int64(1))),
                     n.op("Sub", total, n.const([1])), axis=0)
        cut = n.op("Less", keep_a, a_len)
    else:
        b_len = n.op("Sub", n.op("Sub", total, a_len), n.const([3]))
        short, long_ = n.op("Min", a_len, b_len), n.op("Max", a_len, b_len)
        halves = n.op("Greater", n.op("Mul", short, n.const([2])), n.const([budget]))  # both are cut
        keep_short = n.op("Where", halves, n.const([budget // 2]), short)
        keep_long = n.op("Where", halves, n.const([budget // 2 + budget % 2]), n.op("Sub", n.const([budget]), short))
        fits = n.op("LessOrEqual", n.op("Add", a_len, b_len), n.const([budget]))
        keep_short = n.op("Where", fits, short, keep_short)
        keep_long = n.op("Where", fits, long_, keep_long)
        swapped = n.op("Greater", a_len, b_len)
        keep_a = n.op("Where", swapped, keep_long, keep_short)
        keep_b = n.op("Where", swapped, keep_short, keep_long)

        def span(start, count):
            begin = n.op("Squeeze", start, n.const([0]))
            return n.op("Range", begin, n.op("Add", begin, n.op("Squeeze", count, n.const([0]))), n.const(np.int64(1)))

        b_start = n.op("Add", a_len, n.const([2]))
        index = n.op("Concat", span(n.const([0]), n.op("Add", keep_a, n.const([1]))), n.op("Add", a_len, n.const([1])),
                     span(b_start, keep_b), n.op("Sub", total, n.const([1])), axis=0)
        cut = n.op("Or", n.op("Less", keep_a, a_len), n.op("Less", keep_b, b_len))
    ids, types = n.op("Gather", ids, index), n.op("Gather", types, index)
    kept = n.op("Shape", ids)
    pads = n.op("Concat", n.const([0]), n.op("Sub", n.const([spec.max_length]), kept), axis=0)
    outputs = [n.op("Pad", ids, pads, n.const(np.int64(spec.pad))), n.op("Pad", types, pads, n.const(np.int64(0))),
               n.op("Pad", n.op("ConstantOfShape", kept, value=helper.make_tensor("one", TensorProto.INT64, [1], [1])),
                    pads, n.const(np.int64(0))),
               n.op("Squeeze", cut, n.const([0]))]
    n.op("Identity", "cond", name="cond_out")
    graph = helper.make_graph(
        n.nodes, "tokenize_one",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         *[helper.make_tensor_value_info(o, TensorProto.INT64, [spec.max_length]) for o in outputs[:3]],
         helper.make_tensor_value_info(outputs[3], TensorProto.BOOL, [])])
    return graph


def _tokenizer_nodes(spec: _Spec, table: _Table, vocab: _OpVocab, inputs: list[str], opset: int,
                     dtypes: dict[str, int]) -> tuple[list, list]:
    """(nodes, initializers) turning the string inputs into `input_ids`, `attention_mask`, `token_type_ids` [B, T]
    of `dtypes` and `truncated` [B]."""
    from onnx import TensorProto

    constants: list = []
    n = _Nodes(constants, opset)
    texts = [_prepared(n, name, table, spec) for name in inputs]
    body = _body(n, spec, vocab, texts)
    trips = n.op("Squeeze", n.op("Shape", inputs[0]), n.const([0]))
    ids, types, mask, _ = n.op("Loop", trips, n.const(np.bool_(True)), outputs=4, last="truncated", body=body)
    longest = n.reduce_max(n.op("ReduceSum", mask, n.const([1]), keepdims=0), 0)
    for name, value in (("input_ids", ids), ("attention_mask", mask), ("token_type_ids", types)):
        cut = n.op("Slice", value, n.const([0]), longest, n.const([1]))
        n.op("Cast", cut, to=dtypes.get(name, TensorProto.INT64), name=name)
    return n.nodes, constants


def _ops_model(nodes, constants, inputs, outputs, opsets):
    from onnx import helper

    graph = helper.make_graph(nodes, "raw_text", inputs, outputs, initializer=constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])


def _session(model: bytes):
    """An ONNX Runtime session on `model` with onnxruntime-extensions' ops, as the harness opens the file."""
    try:
        extensions = runtimes.get("onnxruntime-extensions").import_module()
        ort = runtimes.get("onnxruntime").import_module()
        return backends.onnx_session(ort, model, 1, None, library=extensions.get_library_path())[0]
    except HarnessError as e:
        raise EdgebertError(str(e)) from None


def _probes(spec: _Spec, table: _Table) -> list[str]:
    """Texts that hold every vocabulary piece as a word and every table entry, alone and run together."""
    taken = set(spec.specials)
    pieces = [t[len(spec.prefix):] if t.startswith(spec.prefix) else t for t in spec.vocab if t not in taken]
    keys = list(table.entries) + [chr(c) for c in table.removed[::97] + table.apart[::97]]
    chunks = [pieces[i:i + PROBE_WORDS] for i in range(0, len(pieces), PROBE_WORDS)]
    texts = [" ".join(c) for c in chunks]
    for i in range(0, len(keys), PROBE_WORDS):
        chunk = keys[i:i + PROBE_WORDS]
        texts += [" ".join(chunk), "a" + "".join(chunk)]
    return texts + list(spec.specials) + [f"x{s}y" for s in spec.specials]


def _check_probes(tok, spec: _Spec, table: _Table, session, pair: bool) -> int:
    """How many probe texts the tokenizer nodes read as tokenizer.json does; an error naming the first that differs."""
    reference = _bare(tok)
    reference.enable_truncation(spec.max_length)
    texts = _probes(spec, table)
    feeds = {"text": np.array(texts, dtype=object)}
    if pair:
        feeds["pair"] = np.array(texts[::-1], dtype=object)
        want = reference.encode_batch(list(zip(texts, texts[::-1])))
    else:
        want = reference.encode_batch(texts)
    got_ids, got_mask = session.run(["input_ids", "attention_mask"], feeds)
    differ = [i for i, w in enumerate(want) if got_ids[i, :int(got_mask[i].sum())].tolist() != w.ids]
    if differ:
        raise EdgebertError(f"the in-graph tokenizer differs from tokenizer.json on {len(differ)} of {len(texts)} probe "
                            f"texts (first: {texts[differ[0]][:80]!r}): the raw-text model cannot reproduce this "
                            "tokenizer; tokenize in the app instead")
    return len(texts)


@dataclass(frozen=True)
class _Tokenizer:
    """The tokenizer nodes, checked: what the raw-text model puts in front of the id model."""

    model: object  # the nodes alone as an ONNX model
    nodes: list
    constants: list
    inputs: list  # the string inputs' value infos
    spec: _Spec
    table: _Table
    vocab: _OpVocab
    probes: int  # probe texts it read as tokenizer.json does


def _build_tokenizer(tok, max_length: int | None, pair: bool, opset: int, dtypes: dict) -> _Tokenizer:
    from onnx import TensorProto, helper

    spec = _spec(tok, max_length)
    table = _table(tok, spec)
    vocab = _op_vocab(spec, table)
    names = ["text", "pair"] if pair else ["text"]
    inputs = [helper.make_tensor_value_info(name, TensorProto.STRING, ["batch"]) for name in names]
    nodes, constants = _tokenizer_nodes(spec, table, vocab, names, opset, dtypes)
    outputs = [*[helper.make_tensor_value_info(n, dtypes.get(n, TensorProto.INT64), ["batch", "sequence"]) for n in IDS],
               helper.make_tensor_value_info("truncated", TensorProto.BOOL, ["batch"])]
    model = _ops_model(nodes, constants, inputs, outputs, {"": opset, ML: 3, EXTENSIONS: 1})
    probes = _check_probes(tok, spec, table, _session(model.SerializeToString()), pair)
    return _Tokenizer(model, nodes, constants, inputs, spec, table, vocab, probes)


def tokenizer_model(tokenizer: str, *, max_length: int | None = None, pair: bool = False, opset: int = 17):
    """The tokenizer nodes alone as an ONNX model (strings in; input_ids, attention_mask, token_type_ids [B, T] int64
    and truncated [B] out), checked on the probe texts: the raw-text model's front, for comparing with tokenizer.json."""
    return _build_tokenizer(_tokenizer(tokenizer), max_length, pair, opset, {}).model


# The raw-text model: the tokenizer nodes in front of the id model.


def export_text(source: Path, config: OnnxTextConfig, out: Path) -> dict:
    """Write `out` (atomically): `source`'s graph fed by the tokenizer nodes; return its metadata."""
    import importlib.metadata

    import onnx
    from onnx import helper

    model = onnx.load(str(source))
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13:
        raise EdgebertError(f"{source.name} is opset {opset}: the raw-text model needs opset 13 or newer; export again")
    id_inputs = {i.name: i.type.tensor_type.elem_type for i in graph.input}
    unknown = [name for name in id_inputs if name not in IDS]
    if unknown or "input_ids" not in id_inputs:
        raise EdgebertError(f"{source.name} takes {list(id_inputs)}; the raw-text model feeds {list(IDS)}: pass an "
                            "id-input model.onnx")
    main = graph.output[0]
    dims = main.type.tensor_type.shape.dim
    if len(dims) == 3:
        raise EdgebertError(TOKEN_TASK)
    pair = bool(config.pair)
    front = _build_tokenizer(_tokenizer(config.tokenizer), config.max_length, pair, opset,
                             {name: id_inputs.get(name, onnx.TensorProto.INT64) for name in IDS})
    nodes, constants, spec = front.nodes, front.constants, front.spec
    clash = {o for node in graph.node for o in node.output} & {o for node in nodes for o in node.output}
    if clash:
        raise EdgebertError(f"{source.name} already names {sorted(clash)}: the raw-text model cannot splice its tokenizer in")
    head = []
    width = dims[1].dim_value if len(dims) == 2 else 0
    if main.name == "logits" and width != 1:
        head.append(helper.make_node("ArgMax", [main.name], ["label"], axis=-1, keepdims=0))
        extra_outputs = [helper.make_tensor_value_info("label", onnx.TensorProto.INT64, ["batch"])]
    elif main.name == "logits":
        head.append(helper.make_node("Reshape", [main.name, f"{PREFIX}flat"], ["score"]))
        constants.append(onnx.numpy_helper.from_array(np.array([-1], dtype=np.int64), f"{PREFIX}flat"))
        extra_outputs = [helper.make_tensor_value_info("score", onnx.TensorProto.FLOAT, ["batch"])]
    else:
        extra_outputs = []
    ids_outputs = [helper.make_tensor_value_info(name, id_inputs.get(name, onnx.TensorProto.INT64), ["batch", "sequence"])
                   for name in IDS]
    truncated = helper.make_tensor_value_info("truncated", onnx.TensorProto.BOOL, ["batch"])
    rest = list(graph.output)
    kept_nodes = list(graph.node)
    del graph.node[:], graph.input[:], graph.output[:]
    graph.node.extend(nodes + kept_nodes + head)
    graph.input.extend(front.inputs)
    graph.output.extend([*rest, *extra_outputs, *ids_outputs, truncated])
    graph.initializer.extend(constants)
    for domain, version in ((ML, 3), (EXTENSIONS, 1)):
        if not any(o.domain == domain for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(domain, version))
    meta = {"vocab": spec.vocab, "specials": {"cls": spec.cls, "sep": spec.sep}, "prefix": spec.prefix,
            "output": main.name, "max_length": spec.max_length}
    model.metadata_props.append(onnx.StringStringEntryProto(key=META, value=json.dumps(meta, ensure_ascii=False)))
    with on_disk_full(f"the disk is full writing {out}: free space there and export again", Path(out).parent):
        with atomic_path(out) as tmp:
            onnx.save(model, str(tmp))
    return {"format": "onnx-text", "wraps": source.name, "inputs": [i.name for i in front.inputs],
            "outputs": [o.name for o in graph.output], "max_length": spec.max_length, "pair": pair,
            "tokenizer": {"op": "BertTokenizer", "table_entries": len(front.table.entries),
                          "removed": len(front.table.removed), "set_apart": len(front.table.apart),
                          "extra_pieces": int(front.vocab.extra.sum()), "special_tokens": sorted(spec.specials),
                          "probe_texts_same_ids": front.probes},
            "onnxruntime-extensions": importlib.metadata.version("onnxruntime-extensions")}


def text_io(path: Path) -> dict:
    """The strings it takes, what it answers, every op it uses (its loop's too: a reduced-operator build must keep
    them) and what an app needs to load it."""
    import onnx

    from .onnx import onnx_io

    io = onnx_io(path)
    model = onnx.load(str(path), load_external_data=False)
    meta = json.loads(next(p.value for p in model.metadata_props if p.key == META))
    for tensors in (io["inputs"], io["outputs"]):
        for tensor in tensors.values():
            tensor["dtype"] = "string" if tensor["dtype"] == "object" else tensor["dtype"]
    return {**io, "format": "onnx-text", "max_length": meta["max_length"],
            "custom_ops": {"domain": EXTENSIONS, "package": "onnxruntime-extensions"},
            "load": "onnxruntime with onnxruntime-extensions' custom ops: SessionOptions()."
                    "register_custom_ops_library(onnxruntime_extensions.get_library_path())",
            "choose": "a batch of UTF-8 strings (and their pairs), any length: it tokenizes as tokenizer.json does, "
                      f"truncates to {meta['max_length']} tokens and pads the batch to its longest row"}


TEXT = formats.register(formats.Format(runtime="onnxruntime-extensions", config=OnnxTextConfig, exporter=export_text,
                                       io=text_io, input_dtype="string", quantize_methods=(), source="onnx",
                                       requires=("onnxruntime_extensions",), extra="text",
                                       skips={"token-classification": TOKEN_TASK}))
