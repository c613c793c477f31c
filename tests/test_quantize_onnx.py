"""ONNX quantization: dynamic, static QDQ, mixed precision, INT8 embeddings, QAT; bad inputs."""

import os

import numpy as np
import onnx
import pytest

from edgebert.device_tests import backends
from edgebert.errors import EdgebertError
from edgebert.config import Config
from edgebert.export import Budget, OnnxExportConfig, export, formats
from edgebert.export.onnx import all_nodes
from edgebert.quantize import (DynamicInt8Config, Int4EmbeddingsConfig, Int8EmbeddingsConfig, MixedPrecisionConfig,
                               QATConfig, StaticInt8Config, quantize)
from edgebert.quantize.config import KINDS
from edgebert.quantize.passes import CALIBRATED
from edgebert.quantize.onnx_ptq import classify

from builders import QUANT_VOCAB as VOCAB, tiny_model


@pytest.fixture(scope="module")
def model(tiny_classifier):
    return tiny_classifier


@pytest.fixture(scope="module")
def data(tiny_arrays):
    return tiny_arrays


@pytest.fixture(scope="module")
def fused(model, tmp_path_factory):
    return export(model, OnnxExportConfig(), out=tmp_path_factory.mktemp("onnx") / "fp32.onnx").path


@pytest.fixture(scope="module")
def kinds(model, tmp_path_factory):
    """Node kinds of the float graph static quantization starts from."""
    path = export(model, CALIBRATED, out=tmp_path_factory.mktemp("basic") / "fp32.onnx").path
    return classify(onnx.load(str(path)))


def ops(path):
    return [n.op_type for n in all_nodes(onnx.load(str(path)).graph)]


def test_dynamic_int8_gives_the_real_length_result_on_padded_rows(fused, data, tmp_path):
    """Dynamic INT8 scales each activation by its range, padding rows included, unless the padding is trimmed
    first (the export's default): then a padded row gives what the row alone gives."""
    q = quantize(fused, DynamicInt8Config(target="x86"), out=tmp_path / "q.onnx")
    session = backends.Onnx(str(q.path), 1)
    n = int(data["lengths"][0])
    assert n < data["input_ids"].shape[1]
    row = {k: data[k][:1] for k in ("input_ids", "attention_mask", "token_type_ids")}
    np.testing.assert_array_equal(session.run(row), session.run({k: v[:, :n] for k, v in row.items()}))


def test_dynamic_int8_close_and_smaller(fused, data, tmp_path):
    r = quantize(fused, DynamicInt8Config(target="x86"), out=tmp_path / "q.onnx", eval_data=data,
                 budget=Budget(max_abs_diff=0.05, min_agreement=0.9))
    assert r.path.stat().st_size < fused.stat().st_size / 2
    assert {"QAttention", "MatMulInteger"} & set(ops(r.path)) and "QEmbedLayerNormalization" in ops(r.path)
    assert r.meta["reduce_range"] is True and r.verification["reference"] == "fp32.onnx"


def _batch_diffs(path, data) -> list[float]:
    """max |output − batch-1 output| at batch 8 and 32 cut to each batch's longest row, and at batch 32 padded to
    the full width; per-token outputs on the real tokens only."""
    loaded = backends.load(str(path), "onnxruntime", 1)
    alone = backends.logits(loaded, data, batch_size=1)
    padded = {**data, "lengths": np.full_like(data["lengths"], data["input_ids"].shape[1])}
    real = data["attention_mask"].astype(bool) if alone.ndim == 3 else slice(None)
    return [float(np.abs(backends.logits(loaded, d, batch_size=n)[real] - alone[real]).max())
            for n, d in ((8, data), (32, data), (32, padded))]


def test_dynamic_int8_answers_a_row_the_same_in_any_batch(fused, data, tmp_path):
    """Dynamic INT8 takes its activation ranges at run time over the whole tensor; edgebert's file runs each row
    alone at its own length (`by_row`), so batch 8 or 32, padded or not, gives batch 1's outputs to the bit,
    where `by_row=False` (ORT's ranges over the whole batch, as Optimum's file has them) does not. Verification
    scores that."""
    r = quantize(fused, DynamicInt8Config(target="x86"), out=tmp_path / "q.onnx", eval_data=data)
    assert r.meta["by_row"] is True and ops(r.path).count("Scan") == 1
    plain = quantize(fused, DynamicInt8Config(target="x86", by_row=False), out=tmp_path / "plain.onnx").path
    assert plain.stat().st_size == pytest.approx(r.path.stat().st_size, rel=0.01) and "Scan" not in ops(plain)
    assert _batch_diffs(r.path, data) == [0.0, 0.0, 0.0]
    assert min(_batch_diffs(plain, data)) > 1e-6  # the batch really moves a plain dynamic-INT8 file
    loaded = backends.load(str(plain), "onnxruntime", 1)
    np.testing.assert_array_equal(backends.logits(loaded, data, batch_size=1),  # and alone, nothing changed
                                  backends.logits(backends.load(str(r.path), "onnxruntime", 1), data, batch_size=1))
    reference = formats.of_file(fused).run(fused, data)
    alone = backends.logits(loaded, data, batch_size=1)
    assert r.verification["max_abs_diff"] == pytest.approx(np.abs(alone - reference).max(), abs=1e-7)


@pytest.mark.parametrize("kind,num_labels", [("token-classification", 3), ("sequence-classification", 1),
                                              ("embedding", 2)])
def test_by_row_keeps_every_head_batch_invariant(kind, num_labels, data, tmp_path):
    """NER, regression and embeddings too. Per-token outputs come back padded to the batch's length, zeros past
    a row's own."""
    model = tiny_model(kind, num_labels=num_labels)
    data = {**data, "input_ids": data["input_ids"] % 20}
    f = export(model.eval(), OnnxExportConfig(), out=tmp_path / "fp32.onnx").path
    r = quantize(f, DynamicInt8Config(target="x86"), out=tmp_path / "q.onnx")
    assert r.meta["by_row"] is True and _batch_diffs(r.path, data) == [0.0, 0.0, 0.0]
    out = backends.load(str(r.path), "onnxruntime", 1).run({k: data[k] for k in ("input_ids", "attention_mask",
                                                                                  "token_type_ids")})
    if kind == "token-classification":
        assert out.shape == (32, 16, 3) and not out[~data["attention_mask"].astype(bool)].any()


def test_static_int8_is_left_as_it_is(model, data, tmp_path):
    """Static scales do not depend on the batch: no Scan where every linear layer is QDQ."""
    r = quantize(model, StaticInt8Config(samples=16, exclude=()), out=tmp_path / "s.onnx", calibration=data)
    assert "Scan" not in ops(r.path) and _batch_diffs(r.path, data)[0] < 1e-5


def test_int8_embeddings_gather_on_int8_table(model, data, tmp_path):
    r = quantize(model, Int8EmbeddingsConfig(), out=tmp_path / "e.onnx", eval_data=data,
                 export_as=OnnxExportConfig(optimize="fused", fuse_embeddings=False), budget=Budget(max_abs_diff=0.05))
    graph = onnx.load(str(r.path)).graph
    table = next(i for i in graph.initializer if i.name.endswith("word_embeddings.weight_int8"))
    assert table.data_type == onnx.TensorProto.INT8 and list(table.dims) == [VOCAB, 32]
    assert not any(i.name.endswith("word_embeddings.weight") for i in graph.initializer)


def test_static_int8_keeps_excluded_kinds_float(model, data, kinds, tmp_path):
    r = quantize(model, StaticInt8Config(method="percentile", samples=16), out=tmp_path / "s.onnx", calibration=data,
                 eval_data=data, budget=Budget(max_abs_diff=0.5))
    assert set(r.meta["float"]) == {"layernorm", "softmax", "gelu", "residual_add", "bias_add", "embedding_add", "mask_add"}
    _assert_float(r.path, kinds, r.meta["float"])
    assert "DequantizeLinear" in ops(r.path)
    assert "LayerNormalization" not in ops(r.path)  # written as primitives an NPU provider takes


def _assert_float(path, found, float_kinds):
    """No node of a reported float kind reads a quantized activation (Quantize → Dequantize pair)."""
    model = onnx.load(str(path))
    q = {o for n in model.graph.node if n.op_type == "QuantizeLinear" for o in n.output}
    dq = {o for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in q for o in n.output}
    checked = 0
    for n in model.graph.node:
        if n.name in found and found[n.name][0] in float_kinds:
            assert not (set(n.input) & dq), f"{n.name} ({found[n.name][0]}) reads a quantized tensor"
            checked += 1
    assert checked


def test_mixed_precision_excludes_what_it_reports(model, data, kinds, tmp_path):
    everything = quantize(model, StaticInt8Config(exclude=(), samples=16), out=tmp_path / "all.onnx", calibration=data,
                          eval_data=data).verification["max_abs_diff"]
    floor = quantize(model, StaticInt8Config(exclude=KINDS, samples=16), out=tmp_path / "floor.onnx", calibration=data,
                     eval_data=data).verification["max_abs_diff"]
    assert floor < everything
    budget = Budget(max_abs_diff=(everything + floor) / 2)  # only a partial float set can meet it
    r = quantize(model, MixedPrecisionConfig(budget=budget, samples=16), out=tmp_path / "m.onnx", calibration=data,
                 eval_data=data)
    assert r.meta["float"] and set(r.meta["sensitivity"]) >= set(r.meta["float"])
    assert r.meta["search_result"]["max_abs_diff"] <= budget.max_abs_diff
    assert r.verification["max_abs_diff"] == pytest.approx(r.meta["search_result"]["max_abs_diff"], rel=1e-3, abs=1e-4)
    _assert_float(r.path, kinds, [k for k in r.meta["float"] if not k.startswith("linear")])


def test_full_integer_is_refused_for_onnx_in_one_line(model, data, tmp_path):
    with pytest.raises(EdgebertError, match="writes full-integer TFLite files") as e:
        quantize(model, MixedPrecisionConfig(keep="int16", budget=Budget(max_abs_diff=0.1), samples=8),
                 out=tmp_path / "m.onnx", calibration=data, eval_data=data)
    assert "\n" not in str(e.value) and list(tmp_path.iterdir()) == []


def test_unmeetable_budget_fails_and_leaves_nothing(model, data, tmp_path):
    before = set(os.listdir("."))
    with pytest.raises(EdgebertError, match="budget cannot be met") as e:
        quantize(model, MixedPrecisionConfig(budget=Budget(max_abs_diff=1e-9), samples=8), out=tmp_path / "m.onnx",
                 calibration=data, eval_data=data)
    assert "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []
    assert set(os.listdir(".")) == before  # no augmented_model.onnx in the cwd


@pytest.mark.parametrize("calibration, message", [
    ({"input_ids": np.zeros((0, 4), np.int32), "attention_mask": np.zeros((0, 4), np.int32),
      "lengths": np.zeros(0, np.int32)}, "empty"),
    ({"input_ids": np.ones((2, 4), np.int32), "lengths": np.ones(2, np.int32)}, "lacks columns"),
    (None, "needs calibration"),
])
def test_bad_calibration_set(model, calibration, message, tmp_path):
    with pytest.raises(EdgebertError, match=message):
        quantize(model, StaticInt8Config(), out=tmp_path / "s.onnx", calibration=calibration)
    assert list(tmp_path.iterdir()) == []


def test_static_needs_unfused_graph(fused, data, tmp_path):
    with pytest.raises(EdgebertError, match="optimize='basic'"):
        quantize(fused, StaticInt8Config(), out=tmp_path / "s.onnx", calibration=data)
    with pytest.raises(EdgebertError, match="keeps the format"):
        quantize(fused, DynamicInt8Config(), out=tmp_path / "q.tflite")
    with pytest.raises(EdgebertError, match="QAT trains the PyTorch model"):
        quantize(fused, QATConfig(), out=tmp_path / "q.onnx", calibration=data)
    assert list(tmp_path.iterdir()) == []


def test_qat_exports_qdq_with_int8_weights(model, data, tmp_path):
    config = QATConfig(train=QATConfig().train.replace(steps=4, batch_size=8), target="arm")
    r = quantize(model, config, out=tmp_path / "q.onnx", calibration=data, eval_data=data,
                 budget=Budget(max_abs_diff=0.1))
    graph = onnx.load(str(r.path)).graph
    assert r.meta["int8_weights"] == 14  # 2 layers x 6 linears + pooler + classifier
    int8 = {i.name for i in graph.initializer if i.data_type == onnx.TensorProto.INT8}
    assert sum(1 for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in int8) >= 14


def test_methods_are_listed_on_the_format_they_write(fused, tmp_path):
    methods = {DynamicInt8Config, StaticInt8Config, MixedPrecisionConfig, Int8EmbeddingsConfig, Int4EmbeddingsConfig,
               QATConfig}
    assert set(formats.get("onnx").quantizers) == set(formats.get("tflite").quantizers) == methods

    class Float8Config(Config):
        pass

    with pytest.raises(EdgebertError, match="Float8Config does not produce onnx files: use one of none"):
        quantize(fused, Float8Config(), out=tmp_path / "q.onnx")
    with pytest.raises(EdgebertError, match=r"cannot tell the format of out=.*q\.bin: name it \*\.onnx or \*\.tflite"):
        quantize(fused, DynamicInt8Config(), out=tmp_path / "q.bin")
    assert list(tmp_path.iterdir()) == []
