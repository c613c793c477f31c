"""TFLite quantization: dynamic-range, full INT8 with float-kept kinds, QAT; all run in ai-edge-litert."""

import numpy as np
import pytest

from edgebert.errors import EdgebertError
from edgebert.export import Artifact, Budget, TFLiteExportConfig, export, formats
from edgebert.quantize import (DynamicInt8Config, Int8EmbeddingsConfig, MixedPrecisionConfig, QATConfig,
                               StaticInt8Config, quantize)

from builders import QUANT_VOCAB as VOCAB


@pytest.fixture(scope="module")
def model(tiny_classifier):
    return tiny_classifier


@pytest.fixture(scope="module")
def data(tiny_arrays):
    return tiny_arrays


@pytest.fixture(scope="module")
def fp32(model, tmp_path_factory):
    return export(model, TFLiteExportConfig(seq_lens=(8, 16)), out=tmp_path_factory.mktemp("tfl") / "fp32.tflite").path


def litert(path):
    return formats.get("tflite").open(path)


def op_counts(path):
    counts = {}
    for d in litert(path).interpreter._get_ops_details():
        counts[d["op_name"]] = counts.get(d["op_name"], 0) + 1
    return counts


def lookup_dtypes(path) -> dict:
    """{rows: dtype} of each table an EMBEDDING_LOOKUP reads: the word table has VOCAB rows."""
    interpreter = litert(path).interpreter
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    return {int(tensors[op["inputs"][1]]["shape"][0]): tensors[op["inputs"][1]]["dtype"]
            for op in interpreter._get_ops_details() if op["op_name"] == "EMBEDDING_LOOKUP"}


def only_words_int8(path) -> bool:
    """The word table INT8 and the segment table (2 rows, under Int8EmbeddingsConfig.min_rows) float, as in
    the ONNX file."""
    return lookup_dtypes(path) == {VOCAB: np.int8, 2: np.float32}


def test_dynamic_range_int8(fp32, data, tmp_path):
    r = quantize(fp32, DynamicInt8Config(), out=tmp_path / "d.tflite", eval_data=data,
                 budget=Budget(max_abs_diff=0.05, min_agreement=0.9))
    assert r.path.stat().st_size < fp32.stat().st_size * 0.65 and only_words_int8(r.path)
    assert r.meta["signatures"] == {"seq_8": 8, "seq_16": 16}


def test_int8_embeddings_only(fp32, data, tmp_path):
    r = quantize(fp32, Int8EmbeddingsConfig(), out=tmp_path / "e.tflite", eval_data=data, budget=Budget(max_abs_diff=0.05))
    assert only_words_int8(r.path) and set(lookup_dtypes(fp32).values()) == {np.float32}


@pytest.mark.parametrize("io", ["float", "int8"])
def test_full_int8_keeps_excluded_kinds_float(fp32, data, tmp_path, io):
    r = quantize(fp32, StaticInt8Config(samples=16, io=io), out=tmp_path / "s.tflite", calibration=data, eval_data=data,
                 budget=Budget(max_abs_diff=0.5))
    assert r.meta["static"] == ["attention_matmul", "linear"]
    assert set(r.meta["float"]) == {"elementwise", "gelu", "layernorm", "softmax"}
    counts = op_counts(r.path)
    assert counts.get("QUANTIZE", 0) > 0 and counts.get("DEQUANTIZE", 0) > 0
    out = litert(r.path).signatures[8].runner.get_output_details()["logits"]
    assert out["dtype"] == (np.float32 if io == "float" else np.int8)
    logits = r.run(data)  # an int8 output comes back dequantized, close to the float file's
    assert logits.dtype == np.float32 and np.abs(logits - Artifact(fp32).run(data)).max() <= 0.5


def test_unmeetable_budget_and_bad_calibration(fp32, data, tmp_path):
    with pytest.raises(EdgebertError, match="budget cannot be met"):
        quantize(fp32, MixedPrecisionConfig(budget=Budget(max_abs_diff=1e-9), samples=8), out=tmp_path / "m.tflite",
                 calibration=data, eval_data=data)
    too_long = {k: v for k, v in data.items()}
    too_long["lengths"] = np.full_like(data["lengths"], 16)
    with pytest.raises(EdgebertError, match="no calibration example fits signature"):
        quantize(fp32, StaticInt8Config(), out=tmp_path / "s.tflite", calibration={
            **{k: np.pad(v, ((0, 0), (0, 4))) for k, v in data.items() if v.ndim == 2},
            "lengths": np.full_like(data["lengths"], 20)})
    assert list(tmp_path.iterdir()) == []


def test_qat_to_int8_tflite(model, data, tmp_path):
    config = QATConfig(train=QATConfig().train.replace(steps=3, batch_size=8), seq_lens=(16,))
    r = quantize(model, config, out=tmp_path / "q.tflite", calibration=data, eval_data=data,
                 budget=Budget(max_abs_diff=0.5))
    assert r.meta["signatures"] == {"seq_16": 16} and r.meta["static"] == ["linear"]
    assert op_counts(r.path).get("QUANTIZE", 0) > 0
