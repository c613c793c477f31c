"""TFLite quantization: dynamic-range, full INT8 with float-kept kinds, QAT; all run in ai-edge-litert."""

import json
import random
from pathlib import Path

import numpy as np
import pytest

from edgebert.errors import EdgebertError
from edgebert.export import Artifact, Budget, TFLiteExportConfig, export, formats
from edgebert.quantize import (DynamicInt8Config, Int8EmbeddingsConfig, MixedPrecisionConfig, QATConfig,
                               StaticInt8Config, quantize, tflite_ptq)

from builders import QUANT_VOCAB as VOCAB

REAL = Path(__file__).resolve().parent.parent / "runs" / "default"  # `edgebert compile --out runs/default`


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


def test_signatures_share_what_they_repeat(fp32, data, tmp_path, monkeypatch):
    """Each quantization table written once for both signatures, the tensors between ops unnamed: a smaller file
    with the same outputs and the same input and output names."""
    from edgebert.quantize import tflite_ptq

    compacted = quantize(fp32, DynamicInt8Config(), out=tmp_path / "c.tflite").path
    monkeypatch.setattr(tflite_ptq, "compact", lambda flatbuffer: flatbuffer)
    plain = quantize(fp32, DynamicInt8Config(), out=tmp_path / "p.tflite").path
    assert compacted.stat().st_size < plain.stat().st_size
    tflite = formats.get("tflite")
    assert np.array_equal(tflite.run(compacted, data), tflite.run(plain, data))
    for a, b in zip(litert(compacted).signatures.values(), litert(plain).signatures.values()):
        for details in ("get_input_details", "get_output_details"):
            assert [d["name"] for d in getattr(a.runner, details)().values()] == \
                [d["name"] for d in getattr(b.runner, details)().values()]
    names = [t["name"] for t in litert(compacted).interpreter.get_tensor_details()]
    assert sum(not n for n in names) > len(names) / 2


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


def test_full_integer_file_is_integer_between_its_edges(fp32, data, tmp_path):
    """keep="int16": every op between the lookups and the logits has integer outputs (what an NPU delegate takes
    whole), and the file names what is left float and what its 16-bit kernels lack."""
    r = quantize(fp32, MixedPrecisionConfig(keep="int16", budget=Budget(max_abs_diff=0.05), samples=16),
                 out=tmp_path / "i.tflite", calibration=data, eval_data=data)
    assert r.meta["method"] == "static_wi8_ai8+ai16" and r.meta["int16"] == []  # all-INT8 meets this budget
    assert r.meta["float_ops"] == ["CAST", "DEQUANTIZE", "EMBEDDING_LOOKUP"]
    assert r.meta["int8_only"] == ["SQUARED_DIFFERENCE"]  # nn.LayerNorm's variance: no 16x8 kernel
    types = tflite_ptq.output_types(r.path.read_bytes())
    assert types["FULLY_CONNECTED"] == types["SOFTMAX"] == types["TRANSPOSE"] == {"INT8"}
    assert np.abs(r.run(data) - Artifact(fp32).run(data)).max() <= 0.05


def test_wide_kinds_get_16_bit_activations(fp32, data):
    raw = fp32.read_bytes()
    wide = tflite_ptq.integer(raw, tflite_ptq.calibrate(raw, data, 16, integer=True), wide_kinds={"softmax", "other"})
    types = tflite_ptq.output_types(wide)
    assert types["SOFTMAX"] == types["TRANSPOSE"] == {"INT16"} and types["FULLY_CONNECTED"] == {"INT8"}


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


@pytest.mark.slow
def test_real_student_as_full_integer_is_within_a_point_of_its_teacher(data_dir, tmp_path):
    """The compiled default's student as a full-integer TFLite, scored in LiteRT on the bundle's SST-2 dev set,
    within 1 point of the teacher that compile measured (issue 32's NPU check)."""
    from edgebert import data, load
    from edgebert.quantize import Int4EmbeddingsConfig
    from edgebert.tokenizer import load_tokenizer

    students = sorted((REAL / "stages").glob("*/model"))
    if not (REAL / "bundle" / "manifest.json").is_file() or not students:
        pytest.skip(f"no compiled default at {REAL}: run `edgebert compile --out runs/default` first")
    manifest = json.loads((REAL / "bundle" / "manifest.json").read_text())
    train = data.load_task("sst2", "train", data_dir=data_dir)
    sample = random.Random(0).sample(train.examples, 128)
    calibration = data.pretokenize_eval(data.Split(train.task, "train", sample), load_tokenizer(students[-1]),
                                        manifest["inputs"]["max_length"])
    lengths = tuple(sorted(litert(REAL / "bundle" / "model.tflite").signatures))
    r = quantize(load(students[-1]), MixedPrecisionConfig(keep="int16", budget=Budget(max_metric_drop=0.01),
                                                          int4_embeddings=Int4EmbeddingsConfig()),
                 out=tmp_path / "npu.tflite", calibration=calibration, eval_data=REAL / "bundle" / "eval.npz",
                 export_as=TFLiteExportConfig(seq_lens=lengths))
    assert r.meta["float_ops"] == ["CAST", "DEQUANTIZE", "EMBEDDING_LOOKUP"]
    assert 100 * r.verification["value"] >= manifest["promise"]["teacher"] - 1.0
