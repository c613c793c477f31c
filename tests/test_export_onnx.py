"""ONNX export: outputs match PyTorch in onnxruntime, fused or not; bad inputs fail in one line."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from edgebert.errors import EdgebertError
from edgebert.model import EncoderConfig, HeadConfig, LayerNorm, build
from dataclasses import dataclass

from edgebert.config import Config
from edgebert.device_tests import backends, metrics, runtimes
from edgebert.device_tests.evalset import task_entry
from edgebert.export import Artifact, Budget, InputSpec, OnnxExportConfig, TFLiteExportConfig, export, formats, \
    load_arrays, torch_logits
from edgebert.export.onnx import all_nodes, decompose_layernorm, export_onnx, onnx_io, provider_fit


def tiny(**overrides):
    torch.manual_seed(0)
    head = overrides.pop("head", HeadConfig())
    config = dict(vocab_size=120, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_positions=64)
    return build(EncoderConfig(**{**config, **overrides}), head).eval()


def eval_arrays(n=24, t=20, vocab=120, seed=0, labels=2):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, t + 1, n).astype(np.int32)
    mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
    return {"input_ids": (rng.integers(1, vocab, (n, t)) * mask).astype(np.int32), "attention_mask": mask,
            "token_type_ids": np.zeros((n, t), np.int32), "lengths": lengths, "labels": rng.integers(0, labels, n)}


def ort_loaded(path, tmp_path) -> list[str]:
    """The op types of `path` as ONNX Runtime runs it, after its load-time fusions."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "loaded.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]


def test_fused_fp32_matches_pytorch(tmp_path):
    r = export(tiny(), OnnxExportConfig(), out=tmp_path / "m.onnx", eval_data=eval_arrays(), budget=Budget(max_abs_diff=1e-4))
    assert r.meta["optimization"] == "fused"
    assert {"EmbedLayerNormalization", "BiasGelu"} <= set(r.meta["fused_ops"])
    nodes = [n.op_type for n in onnx.load(str(r.path)).graph.node]
    assert nodes.count("MultiHeadAttention") == 2  # one node per layer's attention, written by the export itself
    assert nodes.count("Sum") == 4 and "SkipLayerNormalization" not in ort_loaded(r.path, tmp_path)  # 2 per layer
    assert r.verification["max_abs_diff"] <= 1e-4 and r.verification["agreement"] == 1.0
    assert json.loads((tmp_path / "m.onnx.verify.json").read_text())["max_abs_diff"] <= 1e-4
    assert json.loads((tmp_path / "m.onnx.meta.json").read_text())["input_dtype"] == "int64"


def test_int32_inputs_and_dynamic_axes(tmp_path):
    r = export(tiny(), OnnxExportConfig(optimize="basic", input_dtype="int32"), out=tmp_path / "m.onnx",
               eval_data=eval_arrays(), budget=Budget(max_abs_diff=1e-4))
    graph = onnx.load(str(r.path)).graph
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(i.type.tensor_type.elem_type == onnx.TensorProto.INT32 for i in graph.input)
    assert [d.dim_param for d in graph.input[0].type.tensor_type.shape.dim] == ["batch", "sequence"]
    assert graph.output[0].name == "logits"


def test_model_without_token_type_ids(tmp_path):
    model = tiny(type_vocab_size=0)
    assert InputSpec.of(model).names == ("input_ids", "attention_mask")
    r = export(model, OnnxExportConfig(), out=tmp_path / "m.onnx", eval_data=eval_arrays(), budget=Budget(max_abs_diff=1e-4))
    assert r.meta["inputs"] == ["input_ids", "attention_mask"]


def test_pruned_heads_verified_fused_or_fallback(tmp_path):
    r = export(tiny(layer_heads=[4, 2], head_size=8), OnnxExportConfig(), out=tmp_path / "m.onnx", eval_data=eval_arrays(),
               budget=Budget(max_abs_diff=1e-4))
    assert r.meta["optimization"] in ("fused", "basic")
    assert r.meta["optimization"] == "fused" or "fusion_fallback" in r.meta


def test_width_pruned_norms_export_as_one_layer_norm_node_each(tmp_path):
    """A LayerNorm that averages over the width before pruning is one LayerNormalization node over its units
    padded with zeros (one ORT kernel), not the dozen elementwise nodes of its PyTorch steps."""
    model = tiny(hidden_size=28, norm_width=32, head_size=8)
    norms = [m for m in model.modules() if isinstance(m, LayerNorm) and m.stats_width == 32]
    r = export(model, OnnxExportConfig(optimize="basic"), out=tmp_path / "m.onnx", eval_data=eval_arrays(),
               budget=Budget(max_abs_diff=1e-4))
    nodes = [n.op_type for n in onnx.load(str(r.path)).graph.node]
    assert len(norms) == 5 and nodes.count("LayerNormalization") == len(norms) and "ReduceMean" not in nodes
    assert r.verification["max_abs_diff"] <= 1e-4


@pytest.mark.parametrize("optimize", ["fused", "basic"])
def test_padding_columns_are_never_read(tmp_path, optimize):
    """A row padded far past its length runs at its real length: its padding holds ids past the vocabulary,
    which any read rejects, and the logits are the unpadded row's. Untrimmed, the same feed fails."""
    model = tiny()
    ids = np.array([[2, 17, 33, 45, 9]])
    padded = np.full((1, 40), 10_000)
    padded[0, :5] = ids
    mask = (padded != 10_000).astype(np.int64)

    def run(path, ids, mask):
        return backends.Onnx(str(path), 1).run({"input_ids": ids, "attention_mask": mask,
                                                "token_type_ids": np.zeros_like(ids)})

    trimmed = export(model, OnnxExportConfig(optimize=optimize), out=tmp_path / "trimmed.onnx")
    assert trimmed.meta["trim_padding"] is True
    np.testing.assert_allclose(run(trimmed.path, padded, mask), run(trimmed.path, ids, np.ones_like(ids)), atol=1e-6)
    whole = export(model, OnnxExportConfig(optimize=optimize, trim_padding=False), out=tmp_path / "whole.onnx")
    with pytest.raises(Exception, match="out of"):
        run(whole.path, padded, mask)


def test_a_cls_classifier_runs_its_last_ffn_for_cls_alone(tmp_path):
    """The [CLS] head reads one row, so the exported graph's last FFN computes one row (the first layer's,
    every row); the logits still match PyTorch."""
    r = export(tiny(), OnnxExportConfig(optimize="basic"), out=tmp_path / "m.onnx", eval_data=eval_arrays(),
               budget=Budget(max_abs_diff=1e-4))
    graph = onnx.load(str(r.path))
    ffn_in = [n.output[0] for n in graph.graph.node if n.op_type == "MatMul" and "intermediate" in n.name]
    graph.graph.output.extend(onnx.ValueInfoProto(name=name) for name in (ffn_in[0], ffn_in[-1]))
    import onnxruntime as ort

    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.arange(1, 25).reshape(2, 12)
    _, first, last = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                        "token_type_ids": np.zeros_like(ids)})
    assert len(ffn_in) == 2 and first.shape == (2, 12, 64) and last.shape == (2, 1, 64)


def test_export_leaves_the_model_as_it_was(tmp_path):
    """The export rewrites (export.graph) go into a copy holding the same weights: the model keeps its modules,
    its weights and its eval mode (the exporter used to hand it back in training mode)."""
    model = tiny(hidden_size=28, norm_width=32, head_size=8)
    modules = [type(m) for m in model.modules()]
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    export(model, OnnxExportConfig(), out=tmp_path / "m.onnx")
    assert not model.training and [type(m) for m in model.modules()] == modules
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


def test_token_classifier_logits_per_token(tmp_path):
    model = tiny(head=HeadConfig(kind="token-classification", num_labels=5))
    data = eval_arrays()
    data["labels"] = np.where(np.arange(20)[None] < data["lengths"][:, None], 1, -100)
    data["task"] = task_entry("tiny-ner", "token-classification", "entity_f1", ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"])
    r = export(model, OnnxExportConfig(), out=tmp_path / "m.onnx", eval_data=data, budget=Budget(max_abs_diff=1e-4))
    assert r.verification["metric"] == "entity_f1"  # the task's metric, never token accuracy
    assert set(r.verification["metrics"]) == {"entity_f1", "precision", "recall"}
    assert torch_logits(model, load_arrays(data), InputSpec()).shape == (24, 20, 5)
    assert r.meta["trim_padding"] is False  # a logit per column, padding included


class Eigh(torch.nn.Module):
    def forward(self, input_ids, attention_mask, token_type_ids):
        x = input_ids.float()[:, :2]
        return torch.linalg.eigh(x.T @ x)[0][None].expand(input_ids.shape[0], 2)


def test_unsupported_op_is_one_line_and_leaves_nothing(tmp_path):
    with pytest.raises(EdgebertError) as e:
        export(Eigh(), OnnxExportConfig(), out=tmp_path / "m.onnx")
    assert "linalg_eigh" in str(e.value) and "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad, message", [
    ({}, "lacks columns"),
    ({"input_ids": np.zeros((0, 8), np.int32), "attention_mask": np.zeros((0, 8), np.int32),
      "lengths": np.zeros(0, np.int32)}, "empty"),
])
def test_bad_eval_set(tmp_path, bad, message):
    with pytest.raises(EdgebertError, match=message):
        export(tiny(), OnnxExportConfig(), out=tmp_path / "m.onnx", eval_data=bad)
    assert list(tmp_path.iterdir()) == []


def test_bad_config_and_suffix(tmp_path):
    with pytest.raises(EdgebertError, match="input_dtype"):
        OnnxExportConfig(input_dtype="float32")
    with pytest.raises(EdgebertError, match="name the output"):
        export(tiny(), OnnxExportConfig(), out=tmp_path / "m.tflite")


def test_budget_violation_names_the_limit(tmp_path):
    with pytest.raises(EdgebertError, match="agreement"):
        export(tiny(), OnnxExportConfig(), out=tmp_path / "m.onnx", eval_data=eval_arrays(), budget=Budget(min_agreement=1.01))


def test_artifact_runs_and_verifies_itself(tmp_path):
    model, data = tiny(), eval_arrays()
    artifact = export(model, OnnxExportConfig(), out=tmp_path / "m.onnx")
    assert artifact.verification is None and not (tmp_path / "m.onnx.verify.json").exists()
    reference = torch_logits(model, load_arrays(data), InputSpec())
    np.testing.assert_allclose(Artifact(artifact.path).run(data), reference, atol=1e-4)
    result = artifact.verify(data, reference, budget=Budget(max_abs_diff=1e-4))
    assert artifact.verification == result == json.loads((tmp_path / "m.onnx.verify.json").read_text())
    # the metric is a fraction, the same number the device harness computes
    assert result["metric"] == "accuracy" and result["value"] == metrics.accuracy(reference.argmax(-1), data["labels"])


def test_metric_drop_is_a_fraction_printed_in_points(tmp_path):
    model, data = tiny(), eval_arrays()
    artifact = export(model, OnnxExportConfig(), out=tmp_path / "m.onnx")
    reference = torch_logits(model, load_arrays(data), InputSpec())
    data["labels"] = reference[:, ::-1].argmax(-1)  # the reference is always right, the file always wrong
    with pytest.raises(EdgebertError, match=r"accuracy drop 100\.00 points > 50"):
        artifact.verify(data, reference[:, ::-1].copy(), budget=Budget(max_metric_drop=0.5))
    result = json.loads((tmp_path / "m.onnx.verify.json").read_text())
    assert result["value"] == 0.0 and result["reference_value"] == 1.0 and result["metric_drop"] == 1.0


def test_formats_are_looked_up_by_name_suffix_and_config(tmp_path):
    assert [f.name for f in formats.all_formats()][:2] == ["onnx", "tflite"]
    assert formats.of_path("a/m.onnx") is formats.get("onnx") is formats.of_config(OnnxExportConfig())
    assert formats.of_config(TFLiteExportConfig()).suffix == ".tflite" and formats.of_path("m.bin") is None
    with pytest.raises(EdgebertError, match="unknown format 'coreml'"):
        formats.get("coreml")
    with pytest.raises(EdgebertError, match="cannot run m.bin: expected a .onnx or .tflite"):
        Artifact("m.bin").run(eval_arrays())
    with pytest.raises(EdgebertError, match="export config Budget: use one of"):
        export(tiny(), Budget(), out=tmp_path / "m.onnx")


@dataclass(frozen=True, kw_only=True)
class Int32OnnxConfig(Config):
    pass


def test_a_new_format_is_one_registration(tmp_path, monkeypatch):
    """export, Artifact.run and verification dispatch through the registry alone."""
    runtime = runtimes.Runtime(name="onnxruntime-o32", format="onnx32", suffix=".o32", module="onnxruntime",
                               package="onnxruntime", model="backends:Onnx", accelerator_flag="provider")
    monkeypatch.setitem(runtimes.RUNTIMES._entries, runtime.name, runtime)
    fmt = formats.Format(runtime=runtime.name, config=Int32OnnxConfig, io=onnx_io, input_dtype="int32",
                         exporter=lambda m, c, spec, out: export_onnx(m, OnnxExportConfig(input_dtype="int32"), spec, out),
                         quantize_methods=("none",))
    monkeypatch.setitem(formats.FORMATS._entries, fmt.name, fmt)
    r = export(tiny(), Int32OnnxConfig(), out=tmp_path / "m.o32", eval_data=eval_arrays(), budget=Budget(max_abs_diff=1e-4))
    assert r.format is fmt and r.meta["input_dtype"] == "int32" and r.verification["agreement"] == 1.0
    assert fmt.io(r.path)["inputs"]["input_ids"] == {"dtype": "int32", "shape": ["batch", "sequence"]}


def _graph(path, ops: list[str]):
    """x [2, 4] through each op in turn (MatMul on a 4x4 weight, the rest elementwise), saved at `path`."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, last = [], "x"
    for i, op in enumerate(ops):
        inputs = [last, "w"] if op == "MatMul" else [last, last] if op == "Add" else [last]
        domain = "com.microsoft" if op == "FastGelu" else ""
        nodes.append(helper.make_node(op, inputs, [f"y{i}"], domain=domain))
        last = f"y{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info(last, TensorProto.FLOAT, [2, 4])],
                              initializer=[numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)]), str(path))
    return path


def test_the_contract_says_how_much_of_the_file_each_npu_provider_takes(tmp_path):
    """By op type, ONNX Runtime's own lists: an op a provider lacks stays on the CPU and splits the graph."""
    whole = onnx_io(_graph(tmp_path / "whole.onnx", ["MatMul", "Add", "Relu"]))["accelerators"]
    assert whole["nnapi"] == {"nodes": 3, "taken": 3, "fraction": 1.0, "partitions": 1, "cpu_ops": []}
    assert whole["coreml"]["fraction"] == 1.0 and "cannot tell offline" in whole["qnn"]
    split = onnx_io(_graph(tmp_path / "split.onnx", ["MatMul", "FastGelu", "Relu"]))["accelerators"]
    for provider in ("nnapi", "coreml"):
        assert split[provider]["taken"] == 2 and split[provider]["partitions"] == 2
        assert split[provider]["cpu_ops"] == ["com.microsoft:FastGelu"]


def test_provider_fit_counts_the_nodes_inside_loops(tmp_path):
    """A file whose graph is a Scan body (edgebert's dynamic INT8) is judged by the nodes inside it."""
    from edgebert.quantize import DynamicInt8Config, quantize

    model = build(EncoderConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                                max_positions=16), HeadConfig()).eval()
    fp32 = export(model, OnnxExportConfig(), out=tmp_path / "fp32.onnx").path
    int8 = quantize(fp32, DynamicInt8Config(target="x86"), out=tmp_path / "int8.onnx").path
    fit = onnx_io(int8)["accelerators"]["nnapi"]
    assert fit["nodes"] == len([n for n in all_nodes(onnx.load(str(int8)).graph)])
    assert "ai.onnx:Scan" in fit["cpu_ops"] and "ai.onnx:DynamicQuantizeLinear" in fit["cpu_ops"]
