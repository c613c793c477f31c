"""ExecuTorch export: a .pte with one dynamic-shape method matches PyTorch in the ExecuTorch runtime, FP32
and INT8; bad options and oversized inputs fail in one line."""

import json

import numpy as np
import pytest

pytest.importorskip("executorch", reason="ExecuTorch is an optional extra: pip install 'edgebert[executorch]'")

from edgebert.errors import EdgebertError
from edgebert.export import Budget, InputSpec, export, formats, load_arrays, torch_logits
from edgebert.export.executorch import ExecuTorchExportConfig
from edgebert.export.verify import compare
from test_export_onnx import eval_arrays, tiny


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    out = tmp_path_factory.mktemp("et") / "m.pte"
    return export(tiny(), ExecuTorchExportConfig(max_length=32), out=out, eval_data=eval_arrays(),
                  budget=Budget(max_abs_diff=1e-4))


def test_fp32_matches_pytorch_at_every_length(fp32):
    """Each example runs unpadded at its own length (2..20 tokens) through one `forward`."""
    assert fp32.verification["max_abs_diff"] <= 1e-4 and fp32.verification["agreement"] == 1.0
    meta = json.loads(fp32.path.with_name("m.pte.meta.json").read_text())
    assert meta["inputs"] == ["input_ids", "attention_mask", "token_type_ids"] and meta["input_dtype"] == "int32"
    assert meta["max_length"] == 32 and meta["outputs"] == ["logits"]
    runtime = formats.of_file(fp32.path).open(fp32.path)
    assert (runtime.name, runtime.output, runtime.max_length) == ("executorch", "logits", 32)


def test_batches_run_as_one_call(fp32):
    """A right-padded batch of mixed lengths gives each row's own logits (the mask hides the padding)."""
    arrays = load_arrays(eval_arrays(n=8))
    runtime = formats.get("executorch").open(fp32.path)
    got = runtime.run({k: arrays[k] for k in runtime.names})
    ref = torch_logits(tiny(), arrays, InputSpec())
    assert compare(arrays, got, ref)["max_abs_diff"] <= 1e-4


def test_int8_is_smaller_and_agrees(fp32, tmp_path):
    r = export(tiny(), ExecuTorchExportConfig(precision="int8", max_length=32), out=tmp_path / "q.pte",
               eval_data=eval_arrays(), budget=Budget(max_abs_diff=0.05, min_agreement=0.95))
    assert r.meta["precision"] == "int8"
    assert r.path.stat().st_size < 0.8 * fp32.path.stat().st_size
    assert 0 < r.verification["max_abs_diff"]  # quantized for real, not a float copy


def test_two_input_model_and_length_limit(tmp_path):
    model = tiny(type_vocab_size=0)
    r = export(model, ExecuTorchExportConfig(max_length=12), out=tmp_path / "m.pte")
    runtime = formats.get("executorch").open(r.path)
    assert runtime.names == ["input_ids", "attention_mask"] and runtime.max_length == 12
    ids = np.arange(1, 13)[None]
    np.testing.assert_allclose(runtime.run({"input_ids": ids, "attention_mask": np.ones_like(ids)}),
                               torch_logits(model, load_arrays({"input_ids": ids, "attention_mask": np.ones_like(ids),
                                                                "lengths": np.array([12])}),
                                            InputSpec.of(model)), atol=1e-4)
    long = np.arange(1, 14)[None]
    with pytest.raises(Exception, match="exceeds the file's"):
        runtime.run({"input_ids": long, "attention_mask": np.ones_like(long)})


def test_a_file_for_batch_one_fixes_that_axis(tmp_path):
    """max_batch = 1 (an app that runs one text at a time) exports, runs one row, and refuses two."""
    model = tiny(type_vocab_size=0)
    r = export(model, ExecuTorchExportConfig(max_length=12, max_batch=1), out=tmp_path / "m.pte")
    runtime = formats.get("executorch").open(r.path)
    assert runtime.max_batch == 1
    ids = np.arange(1, 9)[None]
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    np.testing.assert_allclose(runtime.run(feeds), torch_logits(model, load_arrays({**feeds, "lengths": np.array([8])}),
                                                                InputSpec.of(model)), atol=1e-4)
    with pytest.raises(Exception, match="exceeds the file's"):
        runtime.run({k: np.repeat(v, 2, axis=0) for k, v in feeds.items()})


@pytest.mark.parametrize("options, message", [
    ({"precision": "int4"}, "precision 'int4'"),
    ({"max_length": 1}, "max_length 1"),
    ({"max_batch": 0}, "max_batch 0"),
])
def test_bad_options_fail_in_one_line(options, message):
    with pytest.raises(EdgebertError, match=message):
        ExecuTorchExportConfig(**options)


def test_longer_than_the_model_is_refused_before_exporting(tmp_path):
    with pytest.raises(EdgebertError, match="exceeds the model's 64 positions"):
        export(tiny(), ExecuTorchExportConfig(max_length=65), out=tmp_path / "m.pte")
    assert not (tmp_path / "m.pte").exists()


def test_a_compile_ships_an_int8_pte_in_the_bundle(tiny_checkpoint, tiny_sst2, tmp_path):
    """The recipe names the format and its quantize method; the bundle holds model.pte, verified in its runtime and
    described in the manifest, and the harness scores it like any model file."""
    from edgebert.device_tests.evalset import EvalSet
    from edgebert.pipeline import compile as compiler, recipe as recipes

    recipe = recipes.parse(f"""
task = "sst2"
model = "{tiny_checkpoint}"
max_length = 16
stages = ["quantize", "export"]
[quantize]
onnx = "none"
executorch = "dynamic"
[export]
formats = ["onnx", "executorch"]
bench = false""")
    bundle = compiler.compile(recipe, tmp_path / "out", data_dir=str(tiny_sst2))
    manifest = json.loads((bundle / "manifest.json").read_text())
    pte = manifest["verification"]["model.pte"]
    assert pte["stage"] == "quantize" and pte["meta"]["precision"] == "int8" and pte["verify"]["agreement"] >= 0.9
    assert manifest["verification"]["model.onnx"]["stage"] == "export"  # onnx = "none": the float file
    data = EvalSet(str(bundle / "eval.npz"))
    outputs = formats.get("executorch").run(bundle / "model.pte", load_arrays(bundle / "eval.npz"))
    assert outputs.shape == (data.n, 2)
    assert set(manifest["golden"]["files"]) == {"model.onnx", "model.pte"}  # golden outputs of every model file
    from edgebert.device_tests.cli import main

    assert main(["verify", str(bundle), "--backend", "executorch"]) == 0  # its own outputs, in its own runtime
