"""PyTorch → ONNX with dynamic batch and sequence axes, then ONNX Runtime's BERT fusions.

The legacy TorchScript exporter is used on purpose: its graph matches ORT's fusion patterns
(EmbedLayerNormalization, BiasGelu); the dynamo exporter's does not. The traced
graph is `graph.for_export`'s: a "fused" export also writes plain attention as ORT's MultiHeadAttention node
itself. A fusion is kept only if the fused graph still matches the unfused one numerically.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

from edgebert.config import Config
from edgebert.device_tests import backends
from edgebert.device_tests.files import atomic_path
from edgebert.errors import EdgebertError, on_disk_full
from edgebert import families
from edgebert.model import config_of

from . import formats
from .data import InputSpec
from .graph import for_export

FUSION_TOLERANCE = 1e-4
TRIM = "trim_padding/"  # the name prefix of what trim_padding adds to a graph


@dataclass(frozen=True, kw_only=True)
class OnnxExportConfig(Config):
    """ONNX export options.

    optimize: "fused" (plain attention as ORT's MultiHeadAttention node, then ORT's BERT fusions, falling back
    to "basic" where they do not hold: a graph for ONNX Runtime), "basic" (standard ops, constant folding and
    clean-up only; what static QDQ quantization and other runtimes want), or "none".
    num_heads/hidden_size: for the fusion; read from an edgebert model, else detected from the graph.
    trim_padding: first drop the trailing columns that are padding in every row (see `trim_padding`), so an
    app that pads to a fixed length pays for the real length; only where the output has no sequence axis."""

    opset: int = 17
    input_dtype: Literal["int64", "int32"] = "int64"
    optimize: Literal["fused", "basic", "none"] = "fused"
    fuse_embeddings: bool = True
    num_heads: int | None = None
    hidden_size: int | None = None
    trim_padding: bool = True

    def __post_init__(self):
        if self.opset < 17:
            raise EdgebertError(f"OnnxExportConfig opset {self.opset}: use 17 or newer (LayerNormalization)")

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.int32 if self.input_dtype == "int32" else torch.int64


class Positional(nn.Module):
    """Calls `model(**named inputs)` from positional tensors, so input names and order are ours."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args):
        out = self.model(**dict(zip(self.names, args)))
        if not isinstance(out, torch.Tensor):
            raise EdgebertError(f"{type(self.model).__name__} returns {type(out).__name__}, not one output tensor: "
                                "export a model whose forward returns a single tensor")
        return out


def sample_inputs(model: nn.Module, spec: InputSpec, dtype: torch.dtype, batch: int = 2, t: int = 8,
                  seed: int = 0) -> dict[str, torch.Tensor]:
    """Random in-vocabulary ids with right padding, for tracing and numerical checks."""
    rows = [e.num_embeddings for e in model.modules() if isinstance(e, nn.Embedding) and e.num_embeddings > 2]
    high = min(rows + [1000])
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, high, (batch, t), generator=g)
    mask = torch.ones(batch, t, dtype=torch.long)
    mask[0, t // 2:] = 0
    ids = ids * mask
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros(batch, t, dtype=torch.long)}
    return {k: feeds[k].to(dtype) for k in spec.names}


def _heads(model: nn.Module, config: OnnxExportConfig) -> tuple[int, int]:
    """(num_heads, hidden) for the fusion; (0, 0) lets ORT read them per layer from the graph."""
    if config.num_heads is not None:
        return config.num_heads, config.hidden_size or 0
    c = config_of(model)
    if c is None:
        return 0, 0
    heads = {c.heads(i) for i in range(c.num_layers)}
    if len(heads) != 1 or c.heads(0) * c.head_size != c.hidden_size:
        return 0, 0  # pruned: head counts differ per layer
    return heads.pop(), c.hidden_size


def trace(model: nn.Module, spec: InputSpec, config: OnnxExportConfig, out: Path) -> None:
    """The raw exporter graph at `out`; an op the exporter cannot handle becomes one clear error."""
    args = tuple(sample_inputs(model, spec, config.torch_dtype).values())
    axes = {n: {0: "batch", 1: "sequence"} for n in spec.names}
    axes[spec.output] = {0: "batch"}
    graph = for_export(model, ort_attention=config.optimize == "fused", layer_norm_node=True)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            # (Positional in eval mode: the exporter leaves what it traced in the mode it found it)
            torch.onnx.export(Positional(graph, spec.names).eval(), args, str(out), input_names=list(spec.names),
                              output_names=[spec.output], dynamic_axes=axes, opset_version=config.opset,
                              dynamo=False, do_constant_folding=True)
    except (EdgebertError, OSError):  # an OSError is the disk's, not the op's: export_onnx names it
        raise
    except Exception as e:  # the exporter raises many types; the first line names the op
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise EdgebertError(f"ONNX export of {type(model).__name__} failed ({first[:200]}): "
                            "replace the unsupported op or export with a newer opset") from None
    import onnx

    graph = onnx.load(str(out))
    if graph.graph.output and len(graph.graph.output[0].type.tensor_type.shape.dim) == 3:
        graph.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "sequence"  # token-level logits
        onnx.save(graph, str(out))


def _basic(src: Path, dst: Path) -> None:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(dst)
    options.intra_op_num_threads = 1
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])


def _feeds(model: nn.Module, spec: InputSpec, config: OnnxExportConfig, shapes) -> list[dict[str, np.ndarray]]:
    """`sample_inputs` as numpy feeds, one per (batch, length, seed) of `shapes`: what two graphs are compared on."""
    return [{k: v.numpy() for k, v in sample_inputs(model, spec, config.torch_dtype, b, t, seed).items()}
            for b, t, seed in shapes]


def _same_outputs(a: Path, b: Path, feeds: list[dict[str, np.ndarray]]) -> float:
    sa, sb = backends.Onnx(str(a), 1), backends.Onnx(str(b), 1)
    return max(float(np.abs(sa.run(f) - sb.run(f)).max()) for f in feeds)


def _fuse(raw: Path, dst: Path, model: nn.Module, spec: InputSpec, config: OnnxExportConfig) -> dict:
    """ORT's BERT fusions, kept only when they hold; else basic optimization, with the reason."""
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    heads, hidden = _heads(model, config)
    c = config_of(model)
    model_type = families.get(c.family).fusion if c is not None else "bert"
    options = FusionOptions(model_type)
    options.enable_embed_layer_norm = config.fuse_embeddings
    options.enable_skip_layer_norm = False  # slower than its parts on CPU: see `residual_sums`
    feeds = _feeds(model, spec, config, ((2, 8, 1), (1, 5, 2), (3, 13, 3)))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fused = optimizer.optimize_model(str(raw), model_type=model_type, num_heads=heads, hidden_size=hidden,
                                             optimization_options=options, opt_level=0)
        stats = {k: v for k, v in fused.get_fused_operator_statistics().items() if v}
        residual_sums(fused.model.graph)
        fused.save_model_to_file(str(dst))
        diff = _same_outputs(raw, dst, feeds)
        if diff <= FUSION_TOLERANCE:
            return {"optimization": "fused", "fused_ops": stats, "fusion_max_abs_diff": diff}
        reason = f"fused graph differs from the unfused one by {diff:.3g}"
    except Exception as e:  # an unmatched pattern inside ORT's optimizer
        reason = f"ORT fusion failed: {str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__}"
    _basic(raw, dst)
    return {"optimization": "basic", "fusion_fallback": reason}


def residual_sums(graph) -> None:
    """Write each Add that feeds a LayerNormalization as Sum (the same function), in place.

    ONNX Runtime fuses Add + LayerNormalization into SkipLayerNormalization when it loads a model, and its CPU
    kernel for that op (onnxruntime 1.32) is slower than the two ops apart: in the STS-B embedding student's op
    profile (its bundle's manifest.json, 1 thread), 9 of them took 0.24 ms a run, and the Sum + LayerNormalization
    pairs in their place 0.08 ms. The fusion matches Add only, so a Sum keeps them apart in any app's session,
    with no option to set."""
    norms = {n.input[0] for n in graph.node if n.op_type == "LayerNormalization"}
    for n in graph.node:
        if n.op_type == "Add" and n.output[0] in norms:
            n.op_type = "Sum"


def trim_nodes(names) -> list:
    """Nodes that slice each input in `names` (with `attention_mask` among them) to the last column any row's mask
    marks, as TRIM + name; TRIM + "end" is that length ([1], at least 1)."""
    from onnx import TensorProto, helper

    def const(name: str, values: list[int], dims: list[int] | None = None):
        tensor = helper.make_tensor(name, TensorProto.INT64, [len(values)] if dims is None else dims, values)
        return helper.make_node("Constant", [], [name], value=tensor)

    p = TRIM
    nodes = [
        helper.make_node("Cast", ["attention_mask"], [p + "mask"], to=TensorProto.INT64),
        helper.make_node("Shape", [p + "mask"], [p + "shape"]),
        helper.make_node("ConstantOfShape", [p + "shape"], [p + "ones"],
                         value=helper.make_tensor(p + "one", TensorProto.INT64, [1], [1])),
        const(p + "sequence_axis", [1], dims=[]),
        helper.make_node("CumSum", [p + "ones", p + "sequence_axis"], [p + "column"]),  # 1..T in every row
        helper.make_node("Mul", [p + "mask", p + "column"], [p + "marked"]),
        helper.make_node("ReduceMax", [p + "marked"], [p + "last"], keepdims=0),
        const(p + "at_least", [1]),
        helper.make_node("Max", [p + "last", p + "at_least"], [p + "end"]),  # an all-padding batch keeps a column
        const(p + "start", [0]),
        const(p + "axes", [1]),
    ]
    return nodes + [helper.make_node("Slice", [name, p + "start", p + "end", p + "axes"], [p + name]) for name in names]


def trim_padding(src: Path, dst: Path, spec: InputSpec) -> bool:
    """Write `src` to `dst` with every input sliced to the last column any row's attention mask marks,
    before the encoder reads it.

    Masked positions never reach a real token's attention, and an output without a sequence axis (a
    classifier's [CLS] logits, a pooled embedding) is read from real tokens only, so the result is the
    result at the real length, at its cost. Per-token outputs keep every column: False, nothing written."""
    import onnx

    model = onnx.load(str(src))
    graph = model.graph
    if "attention_mask" not in spec.names or len(graph.output[0].type.tensor_type.shape.dim) != 2:
        return False
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in spec.names:
                node.input[i] = TRIM + name
    nodes = trim_nodes(spec.names) + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))
    return True


def decompose_layernorm(model) -> int:
    """Rewrite each last-axis LayerNormalization of `model` (in place) as ReduceMean, Sub, Pow, ReduceMean, Add,
    Sqrt, Div, Mul, Add: the same function in ops NNAPI takes (it has no LayerNormalization), in the pattern
    ONNX Runtime's CPU LayerNormFusion puts back together. Returns how many it rewrote."""
    from onnx import TensorProto, helper

    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    graph, nodes, done = model.graph, [], 0
    for node in graph.node:
        axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), -1)
        if node.op_type != "LayerNormalization" or axis != -1 or len(node.output) != 1:
            nodes.append(node)
            continue
        p, (x, scale, *bias) = f"{node.name or node.output[0]}/", node.input
        bias = [b for b in bias if b]  # an omitted optional input is ""
        eps = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "epsilon"), 1e-5)
        graph.initializer.extend([helper.make_tensor(p + "two", TensorProto.FLOAT, [], [2.0]),
                                  helper.make_tensor(p + "eps", TensorProto.FLOAT, [], [eps])])
        if opset >= 18:  # ReduceMean's axes became an input
            graph.initializer.append(helper.make_tensor(p + "axes", TensorProto.INT64, [1], [-1]))

        def mean(src, dst):
            return (helper.make_node("ReduceMean", [src, p + "axes"], [dst], keepdims=1) if opset >= 18 else
                    helper.make_node("ReduceMean", [src], [dst], axes=[-1], keepdims=1))

        normed = p + "normed" if bias else node.output[0]
        nodes += [mean(x, p + "mean"), helper.make_node("Sub", [x, p + "mean"], [p + "centred"]),
                  helper.make_node("Pow", [p + "centred", p + "two"], [p + "square"]),
                  mean(p + "square", p + "variance"),
                  helper.make_node("Add", [p + "variance", p + "eps"], [p + "shifted"]),
                  helper.make_node("Sqrt", [p + "shifted"], [p + "std"]),
                  helper.make_node("Div", [p + "centred", p + "std"], [p + "unit"]),
                  helper.make_node("Mul", [p + "unit", scale], [normed])]
        if bias:
            nodes.append(helper.make_node("Add", [normed, bias[0]], [node.output[0]]))
        done += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return done


def graphs(graph):
    """An ONNX graph and every graph inside it (Scan, Loop and If bodies), depth first."""
    import onnx

    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for inner in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs):
                yield from graphs(inner)


def all_nodes(graph):
    """Every node of an ONNX graph, the ones inside its loops and branches included."""
    return (node for g in graphs(graph) for node in g.node)


def trims(graph) -> bool:
    """Whether an ONNX graph slices its inputs to the real length first (`trim_padding`)."""
    return any(o.startswith(TRIM) for n in all_nodes(graph) for o in n.output)


def trims_padding(path: str | Path) -> bool:
    """Whether an ONNX file does (`trims`)."""
    import onnx

    return trims(onnx.load(str(path), load_external_data=False).graph)


def _trimmed(path: Path, trimmed: Path, model: nn.Module, spec: InputSpec, config: OnnxExportConfig) -> bool | str:
    """`trim_padding` of `path` (written at `trimmed` first), kept in its place only when padded inputs still
    give the untrimmed outputs: True, False (a per-token output) or why not."""
    if not trim_padding(path, trimmed, spec):
        return False
    diff = _same_outputs(path, trimmed, _feeds(model, spec, config, ((1, 8, 4), (1, 13, 5), (2, 8, 6))))
    if diff > FUSION_TOLERANCE:
        return f"off: the trimmed graph differs from the padded one by {diff:.3g}"
    shutil.copyfile(trimmed, path)
    return True


def export_onnx(model: nn.Module, config: OnnxExportConfig, spec: InputSpec, out: str | Path) -> dict:
    """Write `out` (atomically) and return its metadata."""
    out = Path(out)
    full = (f"disk full while writing {out} (or its temporary copy in {tempfile.gettempdir()}): free space, "
            "then export again; nothing was left behind")  # met as an OSError, a truncated protobuf or ORT's reject
    with on_disk_full(full, out.parent), tempfile.TemporaryDirectory(prefix="edgebert-onnx-") as tmp, \
            atomic_path(out) as dst:
        raw = Path(tmp) / "raw.onnx"
        trace(model, spec, config, raw)
        if config.optimize == "fused":
            info = _fuse(raw, dst, model, spec, config)
        elif config.optimize == "basic":
            _basic(raw, dst)
            info = {"optimization": "basic"}
        else:
            dst.write_bytes(raw.read_bytes())
            info = {"optimization": "none"}
        if config.trim_padding:
            info["trim_padding"] = _trimmed(dst, Path(tmp) / "trimmed.onnx", model, spec, config)
    return {"format": "onnx", "opset": config.opset, "inputs": list(spec.names), "input_dtype": config.input_dtype,
            "outputs": [spec.output], "dynamic_axes": ["batch", "sequence"], **info}


def onnx_io(path: Path) -> dict:
    """Input and output names, dtypes and (symbolic) shapes, the ops with their counts (domain-qualified when
    not the ONNX standard's), read from the graph, its loop bodies included, and the share of its nodes the
    NPU execution providers would take (`provider_fit`)."""
    import onnx
    from onnx import helper

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for g in graphs(model.graph) for t in g.initializer):
        raise EdgebertError(f"{path.name} keeps weights in external data files: "
                            "export a self-contained .onnx (< 2 GiB)")
    weights = {t.name for t in model.graph.initializer}

    def tensors(values):
        return {v.name: {"dtype": np.dtype(helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)).name,
                         "shape": [d.dim_param if d.HasField("dim_param") else d.dim_value if d.HasField("dim_value")
                                   else None for d in v.type.tensor_type.shape.dim]} for v in values}

    ops = Counter(f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                  for n in all_nodes(model.graph))  # a reduced-operator ONNX Runtime build must keep each
    return {"format": "onnx", "inputs": tensors(v for v in model.graph.input if v.name not in weights),
            "outputs": tensors(model.graph.output), "ops": dict(sorted(ops.items())),
            "accelerators": provider_fit(model)}


# Execution providers whose op coverage ONNX Runtime's own mobile usability checker knows offline (the lists
# of supported ops it ships); QNN's is not among them.
PROVIDER_CHECKS = {"nnapi": lambda checker, model: checker.check_nnapi_partitions(model, False),
                   "coreml": lambda checker, model: checker.check_coreml_partitions(
                       model, False, "coreml_supported_mlprogram_ops.md")}
QNN_OFFLINE = ("ONNX Runtime cannot tell offline: QNN's op support depends on the Qualcomm SoC and the QNN SDK; "
               "run it there with --provider qnn")


def provider_fit(model) -> dict:
    """{"nnapi"/"coreml": {"nodes", "taken", "fraction", "partitions", "cpu_ops"}, "qnn": why not, "how"}: the
    nodes of every graph of an ONNX model (loop bodies included) each provider supports by op type, per ONNX
    Runtime's `onnxruntime.tools.mobile_helpers`, and the ops it leaves to the CPU. Shapes are not held against
    a node: NNAPI also needs fixed input shapes (`python -m onnxruntime.tools.make_dynamic_shape_fixed`)."""
    from onnxruntime.tools.mobile_helpers import usability_checker as checker

    report = {}
    for name, check in PROVIDER_CHECKS.items():
        info = check(checker, model)
        report[name] = {"nodes": info.num_nodes, "taken": info.num_supported_nodes,
                        "fraction": round(info.num_supported_nodes / max(info.num_nodes, 1), 4),
                        "partitions": info.num_partitions, "cpu_ops": sorted(info.unsupported_ops)}
    return {**report, "qnn": QNN_OFFLINE,
            "how": "by op type, shapes aside, from onnxruntime.tools.mobile_helpers' lists of supported ops"}


ONNX = formats.register(formats.Format(runtime="onnxruntime", config=OnnxExportConfig, exporter=export_onnx,
                                       io=onnx_io, input_dtype="int64",
                                       quantize_methods=("dynamic", "static", "mixed", "qat", "none")))
