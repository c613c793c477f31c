"""TFLite post-training quantization with ai-edge-quantizer on a multi-signature file.

Op kinds map to TFLite op types; a linear kind left out of static INT8 becomes dynamic-range
INT8 (weights int8, activations quantized at run time), never FP32. Embedding lookups only
support weight-only/dynamic INT8, which the word table gets, with one scale for the whole table:
per-row scales bought no accuracy on SST-2 (89.91% either way). Tables shorter than
`min_rows` (the segment table; positions are a constant slice, not a lookup) stay float, as in the ONNX
file: a few hundred floats, and INT8 there shifts every token's input by the same rounding error. The
word table may instead be block-wise INT4 (ai-edge-quantizer's BLOCKWISE_<n> 4-bit EMBEDDING_LOOKUP, which
ai-edge-litert 2.3.0 runs): its float16 scales live in a buffer the signatures share. That quantizer
takes only symmetric blocks scaled by their max-abs, so the table is first moved onto the symmetric grid
with the least squared error (`edgebert.passes.int4.int4_grid`), which it then reproduces.
Every quantized file is then `compact`: the quantizer writes each signature's quantization tables again
and names every tensor, 0.48 MB of the 5.76 MB SST-2 student with three signatures.
"""

from __future__ import annotations

import contextlib
import re
from io import StringIO

import numpy as np
import torch

from edgebert.device_tests import HarnessError, backends
from edgebert.errors import EdgebertError
from edgebert.passes.int4 import int4_grid

from .config import Int4EmbeddingsConfig, Int8EmbeddingsConfig
from .onnx_ptq import table_report

# ONNX-side kinds → the TFLite ops that implement them (the Adds are not told apart by op type).
TFLITE_OPS = {
    "linear": ("FULLY_CONNECTED",),
    "attention_matmul": ("BATCH_MATMUL",),
    "softmax": ("SOFTMAX",),
    "gelu": ("GELU",),
    "layernorm": ("MEAN", "SQUARED_DIFFERENCE", "RSQRT"),
    "elementwise": ("ADD", "SUB", "MUL"),
}
# A full-integer file quantizes the ops between the kinds too; they pass activations on, so a wide (16-bit) kind
# gains only where they are wide as well
INTEGER_OPS = {**TFLITE_OPS, "other": ("RESHAPE", "TRANSPOSE", "SLICE", "STRIDED_SLICE", "CONCATENATION", "TANH")}
ELEMENTWISE = {"residual_add", "bias_add", "embedding_add", "mask_add", "elementwise"}

_ACT = {"num_bits": 8, "symmetric": False, "granularity": "TENSORWISE", "dtype": "INT"}
# 16-bit activations with INT8 weights (ai-edge-quantizer's static_wi8_ai16, LiteRT's 16x8 kernels): the wider
# integer a full-integer file keeps its sensitive kinds in; its policy lacks SQUARED_DIFFERENCE, which stays INT8
_ACT16 = {"num_bits": 16, "symmetric": True, "granularity": "TENSORWISE", "dtype": "INT"}
NO_INT16 = {"SQUARED_DIFFERENCE"}
_WEIGHT = {"num_bits": 8, "symmetric": True, "granularity": "CHANNELWISE", "dtype": "INT"}


def tflite_kinds(kinds) -> set[str]:
    """ONNX-side kind names → TFLite kind names."""
    return {"elementwise" if k in ELEMENTWISE else k for k in kinds}


def _entry(op: str, mode: str, *, regex: str = ".*", weight: dict | None = None, activation: dict = _ACT) -> dict:
    if mode == "none":
        return {"regex": regex, "operation": op, "algorithm_key": "no_quantize"}
    weight = weight or ({**_WEIGHT, "granularity": "TENSORWISE"} if op == "EMBEDDING_LOOKUP" else _WEIGHT)
    config = {"weight_tensor_config": weight, "compute_precision": "INTEGER", "explicit_dequantize": False,
              "skip_checks": False, "min_weight_elements": 0}
    if mode == "static":
        config["activation_tensor_config"] = activation
    return {"regex": regex, "operation": op, "algorithm_key": "min_max_uniform_quantize", "op_config": config}


def _lookups(flatbuffer: bytes):
    """(model, subgraph, EMBEDDING_LOOKUP op) for every lookup of the file."""
    from ai_edge_quantizer.utils import tfl_flatbuffer_utils as tfl

    model = tfl.read_model(flatbuffer)
    code = tfl.TFL_OP_NAME_TO_CODE["EMBEDDING_LOOKUP"]
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            if model.operatorCodes[op.opcodeIndex].builtinCode == code:
                yield model, subgraph, op


def lookup_tables(flatbuffer: bytes, *, embeddings: bool = True, min_rows: int = Int8EmbeddingsConfig().min_rows,
                  int4: Int4EmbeddingsConfig | None = None) -> tuple[bytes, list[dict]]:
    """The recipe entries for the file's lookups: tables of >= min_rows rows (`int4.min_rows` with `int4`)
    INT8, or with `int4` block-wise INT4, by op scope; every other lookup float, and every one without
    `embeddings` (the recipe's latest matching entry wins, so the scoped entries override the float one before
    them). With `int4`, the file comes back with each such table moved onto its `int4_grid`."""
    from ai_edge_litert.tools.flatbuffer_utils import convert_object_to_bytearray
    from ai_edge_quantizer.utils import tfl_flatbuffer_utils as tfl

    if not embeddings:
        return flatbuffer, [_entry("EMBEDDING_LOOKUP", "none")]
    weight, min_rows = None, min_rows if int4 is None else int4.min_rows
    if int4 is not None:
        weight = {"num_bits": 4, "symmetric": True, "granularity": f"BLOCKWISE_{int4.block_size}", "dtype": "INT"}
    entries, model, snapped = [_entry("EMBEDDING_LOOKUP", "none")], None, set()
    for model, sg, op in _lookups(flatbuffer):
        t = sg.tensors[op.inputs[1]]
        if t.shape[0] < min_rows:
            continue
        entries.append(_entry("EMBEDDING_LOOKUP", "dynamic", weight=weight,
                              regex=f"^{re.escape(tfl.get_op_scope(op, sg.tensors))}$"))
        if int4 is not None and t.buffer not in snapped:  # one table the signatures share
            snapped.add(t.buffer)
            table = np.frombuffer(bytes(model.buffers[t.buffer].data), np.float32).reshape(t.shape)
            grid = int4_grid(torch.from_numpy(table.copy()), int4.block_size).numpy()
            model.buffers[t.buffer].data = np.frombuffer(grid.tobytes(), np.uint8)
    return (bytes(convert_object_to_bytearray(model)) if snapped else flatbuffer), entries


def int4_report(float_flatbuffer: bytes, quantized: bytes) -> dict[str, dict]:
    """{table: table_report} for each INT4 table of `quantized`, dequantized (signed nibbles, low first,
    times its block's float16 scale) and compared with the same lookup's table in the float file (the lookups
    in the same order: `compact` drops the quantized file's names)."""
    floats = []
    for model, sg, op in _lookups(float_flatbuffer):
        t = sg.tensors[op.inputs[1]]
        floats.append((t.name, np.frombuffer(bytes(model.buffers[t.buffer].data), np.float32).reshape(t.shape)))
    report, seen = {}, set()
    for (float_name, table), (model, sg, op) in zip(floats, _lookups(quantized), strict=True):
        t = sg.tensors[op.inputs[1]]
        details = t.quantization.details if t.quantization is not None else None
        if t.type != 17 or details is None or t.buffer in seen:  # 17: INT4 in the TFLite schema
            continue
        seen.add(t.buffer)
        packed = np.frombuffer(bytes(model.buffers[t.buffer].data), np.uint8)
        nibbles = np.stack([packed & 15, packed >> 4], axis=1).reshape(-1)[:int(np.prod(t.shape))]
        codes = np.where(nibbles > 7, nibbles.astype(np.int16) - 16, nibbles).reshape(t.shape)
        scales_t = sg.tensors[details.scales]
        scales = np.frombuffer(bytes(model.buffers[scales_t.buffer].data), np.float16).reshape(scales_t.shape)
        w_hat = codes * np.repeat(scales.astype(np.float32), details.blockSize, axis=1)[:, :t.shape[1]]
        name = float_name.decode() if isinstance(float_name, bytes) else float_name
        report[name] = table_report(table, w_hat, packed.nbytes + scales.nbytes, block_size=details.blockSize)
    return report


def compact(flatbuffer: bytes) -> bytes:
    """The same model with what its signatures repeat written once: one quantization table for all the tensors
    that carry the same one (each signature's copy of a weight does), and no names on the tensors between ops
    (the interpreter reads none; signatures and MediaPipe read the inputs' and outputs')."""
    from ai_edge_litert import schema_py_generated as fb

    from edgebert.export.tflite import pack, unpack

    packed = {}

    class Shared(fb.QuantizationParametersT):
        def Pack(self, builder):
            key = _quantization_key(self)
            if key not in packed:
                packed[key] = super().Pack(builder)
            return packed[key]

    tree = unpack(flatbuffer)
    for sg in tree.subgraphs:
        named = set(sg.inputs) | set(sg.outputs)
        for i, t in enumerate(sg.tensors):
            if i not in named:
                t.name = None
            if t.quantization is not None:
                t.quantization.__class__ = Shared
    return pack(tree)


def _quantization_key(q) -> tuple:
    def raw(values):
        return None if values is None else np.asarray(values).tobytes()

    details = q.details
    return (raw(q.min), raw(q.max), raw(q.scale), raw(q.zeroPoint), q.quantizedDimension, q.detailsType,
            None if details is None else tuple(sorted((k, raw(v) if isinstance(v, (list, np.ndarray)) else v)
                                                      for k, v in vars(details).items())))


def recipe(static_kinds: set[str], *, io: str = "float") -> list[dict]:
    """Static INT8 for `static_kinds`, dynamic-range INT8 for linear layers outside them, float elsewhere
    (lookups too: `lookup_tables` gives theirs)."""
    entries = []
    for kind, ops in TFLITE_OPS.items():
        mode = "static" if kind in static_kinds else ("dynamic" if kind == "linear" else None)
        entries += [_entry(op, mode) for op in ops if mode]
    entries.append(_entry("OUTPUT", "static" if io == "int8" else "none"))
    return entries


def integer_recipe(wide_kinds: set[str], *, io: str = "float") -> list[dict]:
    """Full integer: static INT8 for every op the quantizer takes ("*": the reshapes and transposes between the
    kinds too), 16-bit activations for the ops of `wide_kinds`, INTEGER_OPS' keys (lookups: `lookup_tables`
    gives theirs)."""
    entries = [_entry("*", "static")]
    for kind in sorted(wide_kinds):
        entries += [_entry(op, "static", activation=_ACT16) for op in INTEGER_OPS[kind] if op not in NO_INT16]
    entries.append(_entry("OUTPUT", "static" if io == "int8" else "none"))
    return entries


def output_types(flatbuffer: bytes) -> dict[str, set[str]]:
    """{op type: the types of its outputs} over the file's signatures: a full-integer file should have float
    outputs only at its edges (the weight-only lookups, the mask's cast, the dequantized logits)."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_quantizer.utils import tfl_flatbuffer_utils as tfl

    ops = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    types = {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
    model, found = tfl.read_model(flatbuffer), {}
    for sg in model.subgraphs:
        for op in sg.operators:
            name = ops.get(model.operatorCodes[op.opcodeIndex].builtinCode, "CUSTOM")
            found.setdefault(name, set()).update(types[sg.tensors[i].type] for i in op.outputs)
    return found


def _quantizer(flatbuffer: bytes, entries: list[dict]):
    from ai_edge_quantizer import quantizer

    return quantizer.Quantizer(bytearray(flatbuffer), entries)


def _run(q, calibration=None) -> bytes:
    log = StringIO()
    with contextlib.redirect_stderr(log), contextlib.redirect_stdout(log):
        quantized = bytes(q.quantize(calibration, enable_progress_bar=False, enable_progress_report=False)
                          .quantized_model)
    return compact(quantized)


def dynamic(flatbuffer: bytes, *, embeddings: bool = True, int4: Int4EmbeddingsConfig | None = None) -> bytes:
    """Dynamic-range INT8 (ai-edge-quantizer's dynamic_wi8_afp32), optionally leaving embeddings float
    or making the word table block-wise INT4."""
    flatbuffer, lookups = lookup_tables(flatbuffer, embeddings=embeddings, int4=int4)  # they override "*"
    return _run(_quantizer(flatbuffer, [_entry("*", "dynamic")] + lookups))


def embeddings_only(flatbuffer: bytes, *, min_rows: int = Int8EmbeddingsConfig().min_rows,
                    int4: Int4EmbeddingsConfig | None = None) -> bytes:
    flatbuffer, lookups = lookup_tables(flatbuffer, min_rows=min_rows, int4=int4)
    return _run(_quantizer(flatbuffer, lookups))


def calibration_feeds(arrays: dict, lengths: dict[int, str], names: list[str], samples: int) -> dict:
    """{signature: [feeds]}: each example padded to its bucket; buckets no example falls in get the
    shorter examples padded up, because every signature needs ranges."""
    n = len(arrays["lengths"])
    per = max(4, samples // len(lengths))
    feeds = {}
    for t, key in lengths.items():
        fits = [i for i in range(n) if arrays["lengths"][i] <= t]
        own = [i for i in fits if backends.pick_signature(int(arrays["lengths"][i]), lengths) == t]
        chosen = (own + [i for i in fits if i not in set(own)])[:per]
        if not chosen:
            raise EdgebertError(f"no calibration example fits signature {key}: every example is longer than {t} tokens")
        rows = []
        for i in chosen:
            feed = {}
            for name in names:
                row = np.zeros((1, t), dtype=np.int32)
                L = int(arrays["lengths"][i])
                row[0, :L] = arrays[name][i, :L]
                feed[name] = row
            rows.append(feed)
        feeds[key] = rows
    return feeds


def calibrate(flatbuffer: bytes, arrays: dict, samples: int, *, integer: bool = False) -> dict:
    """Tensor ranges for every op kind at once (with `integer`, for every op), so each static variant of the
    search reuses them."""
    try:
        model = backends.TFLite("the float flatbuffer", 1, content=flatbuffer)
    except HarnessError as e:
        raise EdgebertError(str(e)) from None
    lengths = {t: s.key for t, s in model.signatures.items()}
    names = list(next(iter(model.signatures.values())).dtypes)
    q = _quantizer(flatbuffer, integer_recipe(set()) if integer else recipe(set(TFLITE_OPS)))
    log = StringIO()
    with contextlib.redirect_stderr(log), contextlib.redirect_stdout(log):
        return q.calibrate(calibration_feeds(arrays, lengths, names, samples), num_threads=1)


def static(flatbuffer: bytes, calibration: dict, *, static_kinds: set[str], io: str = "float",
           embeddings: bool = True, int4: Int4EmbeddingsConfig | None = None) -> bytes:
    """Full INT8 (static) for `static_kinds`, dynamic-range linear layers elsewhere, float the rest."""
    flatbuffer, lookups = lookup_tables(flatbuffer, embeddings=embeddings, int4=int4)
    return _run(_quantizer(flatbuffer, recipe(static_kinds, io=io) + lookups), calibration)


def _widened(flatbuffer: bytes, calibration: dict, wide_kinds: set[str], margin: float) -> dict:
    """`calibration` with the ranges of the wide kinds' tensors `margin` times as wide: at 16 bits the
    resolution that costs is nothing, while text longer or rarer than the calibration set's no longer clips."""
    from ai_edge_quantizer.utils import tfl_flatbuffer_utils as tfl

    wide = {tfl.TFL_OP_NAME_TO_CODE[op] for k in wide_kinds for op in INTEGER_OPS[k] if op in tfl.TFL_OP_NAME_TO_CODE}
    model, names = tfl.read_model(flatbuffer), set()
    for sg in model.subgraphs:
        for op in sg.operators:
            if model.operatorCodes[op.opcodeIndex].builtinCode in wide:
                names.update(tfl.get_tensor_name(sg.tensors[i]) for i in (*op.inputs, *op.outputs) if i >= 0)
    return {name: {k: v * margin for k, v in ranges.items()} if name in names else ranges
            for name, ranges in calibration.items()}


def integer(flatbuffer: bytes, calibration: dict, *, wide_kinds: set[str], io: str = "float",
            embeddings: bool = True, int4: Int4EmbeddingsConfig | None = None, margin: float = 1.5) -> bytes:
    """Full integer (`integer_recipe`), from `calibrate(..., integer=True)`'s ranges, the 16-bit ones widened."""
    calibration = _widened(flatbuffer, calibration, wide_kinds, margin)
    flatbuffer, lookups = lookup_tables(flatbuffer, embeddings=embeddings, int4=int4)
    return _run(_quantizer(flatbuffer, integer_recipe(wide_kinds, io=io) + lookups), calibration)
