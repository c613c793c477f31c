"""Block-wise INT4 word embeddings: ORT's GatherBlockQuantized and LiteRT's blockwise EMBEDDING_LOOKUP."""

import copy
import json

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from edgebert.errors import EdgebertError
from edgebert.model import embeddings
from edgebert.passes.int4 import int4_grid
from edgebert.export import Budget, OnnxExportConfig, TFLiteExportConfig, export
from edgebert.export.onnx import all_nodes
from edgebert.pipeline import compile as compiler
from edgebert.pipeline import recipe as recipes
from edgebert.pipeline.stages.quantize import QuantizeStageConfig
from edgebert.quantize import (DynamicInt8Config, Int4EmbeddingsConfig, Int8EmbeddingsConfig, StaticInt8Config,
                               quantize)

from builders import QUANT_VOCAB as VOCAB

WORD = "model.encoder.embeddings.word_embeddings.weight"
CLOSE = Budget(max_abs_diff=0.05, min_agreement=0.9)  # 4-bit tables: a loose budget on the logits


@pytest.fixture(scope="module")
def model(tiny_classifier):
    return tiny_classifier


@pytest.fixture(scope="module")
def data(tiny_arrays):
    return tiny_arrays


@pytest.fixture(scope="module")
def table(model):
    return embeddings(model).word.weight.detach().numpy()


def _nibbles(packed: np.ndarray, n: int) -> np.ndarray:
    return np.stack([packed & 15, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)[..., :n].astype(np.float32)


@pytest.mark.parametrize("block_size", [32, 64])
def test_onnx_int4_table_round_trips_within_half_a_step(model, table, data, tmp_path, block_size):
    r = quantize(model, Int4EmbeddingsConfig(block_size=block_size), out=tmp_path / "e.onnx", eval_data=data,
                 budget=CLOSE)
    graph = onnx.load(str(r.path)).graph
    node = next(n for n in graph.node if n.op_type == "GatherBlockQuantized")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert node.domain == "com.microsoft" and attrs == {"bits": 4, "block_size": block_size, "gather_axis": 0,
                                                          "quantize_axis": 1}
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    assert WORD not in inits  # the float table is gone
    data_, scales, zeros = (inits[i] for i in (node.input[0], node.input[2], node.input[3]))
    assert data_.dtype == np.uint8 and data_.shape == (VOCAB, 16)  # two 4-bit codes per byte
    w = table
    zero, scale = (np.repeat(b, block_size, axis=1)[:, :32] for b in (_nibbles(zeros, scales.shape[1]), scales))
    err = np.abs(w - (_nibbles(data_, 32) - zero) * scale)
    assert (err <= scale / 2 + 1e-7).all()  # every value within half its block's step
    report = r.meta["int4_embeddings"][WORD]
    assert report["max_abs_error"] == pytest.approx(err.max(), rel=1e-5)
    assert report["mean_abs_error"] == pytest.approx(err.mean(), rel=1e-5)
    assert report["bytes_before"] == w.nbytes and report["bytes_after"] == data_.nbytes + scales.nbytes + zeros.nbytes


def test_onnx_int4_runs_smaller_than_int8_and_close_to_pytorch(model, data, tmp_path):
    int8 = quantize(model, Int8EmbeddingsConfig(), out=tmp_path / "e8.onnx",
                    export_as=OnnxExportConfig(fuse_embeddings=False))
    int4 = quantize(model, Int4EmbeddingsConfig(), out=tmp_path / "e4.onnx", eval_data=data, budget=CLOSE)
    assert int4.path.stat().st_size < int8.path.stat().st_size
    assert int4.verification["reference"] == "pytorch" and int4.verification["agreement"] >= 0.9
    assert 0 < int4.verification["max_abs_diff"] <= 0.05  # quantize() raises past the budget


def test_dynamic_int8_with_int4_table_unfuses_only_the_embedding(model, data, tmp_path):
    r = quantize(model, DynamicInt8Config(target="x86", int4_embeddings=Int4EmbeddingsConfig()),
                 out=tmp_path / "d4.onnx", eval_data=data, budget=CLOSE)
    ops = {n.op_type for n in all_nodes(onnx.load(str(r.path)).graph)}
    assert "GatherBlockQuantized" in ops and "EmbedLayerNormalization" not in ops
    assert "QAttention" in ops or "MatMulInteger" in ops  # the rest stays dynamic INT8
    d8 = quantize(model, DynamicInt8Config(target="x86"), out=tmp_path / "d8.onnx")
    assert r.path.stat().st_size < d8.path.stat().st_size and WORD in r.meta["int4_embeddings"]


def test_static_int8_with_int4_table(model, data, tmp_path):
    r = quantize(model, StaticInt8Config(samples=16, int4_embeddings=Int4EmbeddingsConfig()), out=tmp_path / "s.onnx",
                 calibration=data, eval_data=data, budget=Budget(max_abs_diff=0.5))
    ops = [n.op_type for n in all_nodes(onnx.load(str(r.path)).graph)]
    assert "GatherBlockQuantized" in ops and "DequantizeLinear" in ops
    assert r.meta["int8_embeddings"] == [] and r.meta["int4_embeddings"][WORD]["max_abs_error"] > 0


def test_fused_file_keeps_int8_tables_and_says_why(model, data, tmp_path):
    fused = export(model, OnnxExportConfig(), out=tmp_path / "fp32.onnx").path
    r = quantize(fused, DynamicInt8Config(int4_embeddings=Int4EmbeddingsConfig()), out=tmp_path / "d.onnx")
    assert r.meta["int8_embeddings"] == "QEmbedLayerNormalization" and r.meta["int4_embeddings"] == {}
    assert "fuse_embeddings=False" in r.meta["int4_fallback"]
    assert "GatherBlockQuantized" not in {n.op_type for n in all_nodes(onnx.load(str(r.path)).graph)}


@pytest.fixture(scope="module")
def fp32_tflite(model, tmp_path_factory):
    return export(model, TFLiteExportConfig(seq_lens=(8, 16)), out=tmp_path_factory.mktemp("tfl") / "fp32.tflite").path


def test_tflite_int4_table_smaller_and_close(model, table, fp32_tflite, data, tmp_path):
    int8 = quantize(fp32_tflite, Int8EmbeddingsConfig(), out=tmp_path / "e8.tflite")
    int4 = quantize(model, Int4EmbeddingsConfig(), out=tmp_path / "e4.tflite", eval_data=data, budget=CLOSE,
                    export_as=TFLiteExportConfig(seq_lens=(8, 16)))
    assert int4.path.stat().st_size < int8.path.stat().st_size
    assert int4.verification["reference"] == "pytorch" and 0 < int4.verification["max_abs_diff"] <= 0.05
    (report,) = int4.meta["int4_embeddings"].values()  # the word table only: the 2-row type table stays INT8
    assert (report["rows"], report["cols"], report["block_size"]) == (VOCAB, 32, 32)
    assert report["bytes_after"] == VOCAB * 16 + VOCAB * 2  # packed codes + one float16 scale per block
    # the report dequantizes the file's table: exactly int4_grid's, symmetric codes -7..7 times one scale a
    # block, chosen for least squared error, so below what max-abs scales (max|w|/7) give
    grid = int4_grid(torch.from_numpy(table), 32).numpy()
    assert report["max_abs_error"] == pytest.approx(np.abs(grid - table).max(), rel=1e-5)
    assert 0 < report["mean_abs_error"] == pytest.approx(np.abs(grid - table).mean(), rel=1e-5)
    assert max(len(np.unique(block)) for block in grid.reshape(-1, 32)) <= 15
    scale = np.abs(table).max(axis=1, keepdims=True) / 7
    assert np.square(grid - table).sum() < np.square(np.round(table / scale) * scale - table).sum()


@pytest.mark.parametrize("suffix", ["onnx", "tflite"])
def test_int4_files_hold_a_table_on_its_grid_exactly(model, data, tmp_path, suffix):
    """What `PruneConfig.int4_words` trains on is what both INT4 files store: nothing is rounded twice."""
    on_grid = copy.deepcopy(model)
    word = embeddings(on_grid).word
    word.weight.data = int4_grid(word.weight, 32)
    int4 = quantize(on_grid, Int4EmbeddingsConfig(), out=tmp_path / f"g4.{suffix}", eval_data=data, budget=CLOSE,
                    export_as=TFLiteExportConfig(seq_lens=(8, 16)) if suffix == "tflite" else None)
    (report,) = int4.meta["int4_embeddings"].values()
    assert report["max_abs_error"] == 0 and report["mean_abs_error"] == 0


def test_tflite_dynamic_with_int4_table(fp32_tflite, data, tmp_path):
    d4 = quantize(fp32_tflite, DynamicInt8Config(int4_embeddings=Int4EmbeddingsConfig()), out=tmp_path / "d4.tflite",
                  eval_data=data, budget=CLOSE)
    d8 = quantize(fp32_tflite, DynamicInt8Config(), out=tmp_path / "d8.tflite")
    assert d4.path.stat().st_size < d8.path.stat().st_size and len(d4.meta["int4_embeddings"]) == 1


@pytest.mark.parametrize("build, message", [
    (lambda: Int4EmbeddingsConfig(block_size=48), "block_size 48"),
    (lambda: DynamicInt8Config(int8_embeddings=False, int4_embeddings=Int4EmbeddingsConfig()), "int8_embeddings=True"),
    (lambda: QuantizeStageConfig(embeddings="int2"), "quantize.embeddings: unknown embeddings .int2."),
    (lambda: QuantizeStageConfig(embeddings="int4", onnx="qat"), "does not apply to onnx = 'qat'"),
])
def test_bad_int4_options(build, message):
    with pytest.raises(EdgebertError, match=message):
        build()


def test_no_table_tall_enough_is_refused(model, tmp_path):
    with pytest.raises(EdgebertError, match="min_rows"):
        quantize(model, Int4EmbeddingsConfig(min_rows=10**6), out=tmp_path / "e.onnx")
    assert not (tmp_path / "e.onnx").exists()


def test_recipe_with_int4_embeddings_compiles(tiny_checkpoint, tiny_sst2, tmp_path):
    recipe = recipes.parse(f"""
task = "sst2"
model = "{tiny_checkpoint}"
max_length = 16
stages = ["quantize", "export"]
[quantize]
embeddings = "int4"
accuracy_budget = 10.0
tflite = "none"
[export]
formats = ["onnx"]
bench = false
""")
    bundle = compiler.compile(recipe, tmp_path / "out", data_dir=str(tiny_sst2))
    check = json.loads((bundle / "manifest.json").read_text())["verification"]["model.onnx"]
    assert "GatherBlockQuantized" in {n.op_type for n in all_nodes(onnx.load(str(bundle / "model.onnx")).graph)}
    (report,) = check["meta"]["int4_embeddings"].values()
    assert report["rows"] == 30522 and report["bytes_after"] < report["bytes_before"] / 6
    assert check["verify"]["agreement"] > 0.9
