"""TFLite post-training quantization with ai-edge-quantizer on a multi-signature file.

Op kinds map to TFLite op types; a linear kind left out of static INT8 becomes dynamic-range
INT8 (weights int8, activations quantized at run time), never FP32. Embedding lookups only
support weight-only/dynamic INT8, which is what they get, with one scale for the whole table:
per-row scales are stored again in every signature's tensor metadata (1.5 MB for MiniLM's
30522 rows × 4 signatures) and bought no accuracy on SST-2 (89.91% either way).
"""

from __future__ import annotations

import contextlib
from io import StringIO

import numpy as np

from edgebert.device_tests import HarnessError, backends
from edgebert.errors import EdgebertError

# ONNX-side kinds → the TFLite ops that implement them (the Adds are not told apart by op type).
TFLITE_OPS = {
    "linear": ("FULLY_CONNECTED",),
    "attention_matmul": ("BATCH_MATMUL",),
    "softmax": ("SOFTMAX",),
    "gelu": ("GELU",),
    "layernorm": ("MEAN", "SQUARED_DIFFERENCE", "RSQRT"),
    "elementwise": ("ADD", "SUB", "MUL"),
}
ELEMENTWISE = {"residual_add", "bias_add", "embedding_add", "mask_add", "elementwise"}

_ACT = {"num_bits": 8, "symmetric": False, "granularity": "TENSORWISE", "dtype": "INT"}
_WEIGHT = {"num_bits": 8, "symmetric": True, "granularity": "CHANNELWISE", "dtype": "INT"}


def tflite_kinds(kinds) -> set[str]:
    """ONNX-side kind names → TFLite kind names."""
    return {"elementwise" if k in ELEMENTWISE else k for k in kinds}


def _entry(op: str, mode: str) -> dict:
    if mode == "none":
        return {"regex": ".*", "operation": op, "algorithm_key": "no_quantize"}
    weight = {**_WEIGHT, "granularity": "TENSORWISE"} if op == "EMBEDDING_LOOKUP" else _WEIGHT
    config = {"weight_tensor_config": weight, "compute_precision": "INTEGER", "explicit_dequantize": False,
              "skip_checks": False, "min_weight_elements": 0}
    if mode == "static":
        config["activation_tensor_config"] = _ACT
    return {"regex": ".*", "operation": op, "algorithm_key": "min_max_uniform_quantize", "op_config": config}


def recipe(static_kinds: set[str], *, io: str = "float", embeddings: bool = True) -> list[dict]:
    """Static INT8 for `static_kinds`, dynamic-range INT8 for linear layers outside them, float elsewhere."""
    entries = []
    for kind, ops in TFLITE_OPS.items():
        mode = "static" if kind in static_kinds else ("dynamic" if kind == "linear" else None)
        entries += [_entry(op, mode) for op in ops if mode]
    if embeddings:
        entries.append(_entry("EMBEDDING_LOOKUP", "dynamic"))
    entries.append(_entry("OUTPUT", "static" if io == "int8" else "none"))
    return entries


def _quantizer(flatbuffer: bytes, entries: list[dict]):
    from ai_edge_quantizer import quantizer

    return quantizer.Quantizer(bytearray(flatbuffer), entries)


def _run(q, calibration=None) -> bytes:
    log = StringIO()
    with contextlib.redirect_stderr(log), contextlib.redirect_stdout(log):
        return bytes(q.quantize(calibration, enable_progress_bar=False, enable_progress_report=False).quantized_model)


def dynamic(flatbuffer: bytes, *, embeddings: bool = True) -> bytes:
    """Dynamic-range INT8 (ai-edge-quantizer's dynamic_wi8_afp32), optionally leaving embeddings float."""
    entries = [_entry("*", "dynamic"), _entry("EMBEDDING_LOOKUP", "dynamic" if embeddings else "none")]
    return _run(_quantizer(flatbuffer, entries))


def embeddings_only(flatbuffer: bytes) -> bytes:
    return _run(_quantizer(flatbuffer, [_entry("EMBEDDING_LOOKUP", "dynamic")]))


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


def calibrate(flatbuffer: bytes, arrays: dict, samples: int) -> dict:
    """Tensor ranges for every op kind at once, so each static variant of the search reuses them."""
    try:
        model = backends.TFLite("the float flatbuffer", 1, content=flatbuffer)
    except HarnessError as e:
        raise EdgebertError(str(e)) from None
    lengths = {t: s.key for t, s in model.signatures.items()}
    names = list(next(iter(model.signatures.values())).dtypes)
    q = _quantizer(flatbuffer, recipe(set(TFLITE_OPS)))
    log = StringIO()
    with contextlib.redirect_stderr(log), contextlib.redirect_stdout(log):
        return q.calibrate(calibration_feeds(arrays, lengths, names, samples), num_threads=1)


def static(flatbuffer: bytes, calibration: dict, *, static_kinds: set[str], io: str = "float",
           embeddings: bool = True) -> bytes:
    """Full INT8 (static) for `static_kinds`, dynamic-range linear layers elsewhere, float the rest."""
    return _run(_quantizer(flatbuffer, recipe(static_kinds, io=io, embeddings=embeddings)), calibration)
