"""ONNX post-training quantization: dynamic INT8, static QDQ INT8, INT8 and block-wise INT4 embedding tables.

Static QDQ runs on the unfused graph (ORT's QDQ quantizer has no fused Attention); node kinds
(`classify`) let callers keep outlier-prone ops in float, and linear layers left out of the
static part are quantized dynamically instead of staying FP32, so the weights are always INT8.
"""

from __future__ import annotations

import copy
import logging
import re
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgebert.errors import EdgebertError
from edgebert.device_tests.backends import batches
from edgebert.export.onnx import TRIM, all_nodes, decompose_layernorm, trim_nodes, trims


def _quant_types(target: str):
    from onnxruntime.quantization import QuantType

    activation = QuantType.QInt8 if target == "arm" else QuantType.QUInt8
    return activation, QuantType.QInt8, target == "x86"  # reduce_range: U8S8 saturates without VNNI


def classify(model: onnx.ModelProto) -> dict[str, tuple[str, str]]:
    """{node name: (kind, layer)} for the nodes whose precision matters; layer is "layer.<i>" or "other"."""
    inits = {i.name for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    from_mask, from_embedding = {"attention_mask"}, set()
    for n in model.graph.node:  # graph order is topological
        acts = [i for i in n.input if i and i not in inits]
        if n.op_type == "Gather" and n.input[0] in inits:
            from_embedding.update(n.output)
        elif acts and all(i in from_mask for i in acts):
            from_mask.update(n.output)
    kinds: dict[str, tuple[str, str]] = {}

    def put(node, kind):
        m = re.search(r"layer\.(\d+)", node.name)
        kinds[node.name] = (kind, f"layer.{m.group(1)}" if m else "other")

    for n in model.graph.node:
        acts = [i for i in n.input if i and i not in inits]
        if all(o in from_mask for o in n.output):  # (1 - mask) * -big: part of the mask Add
            put(n, "mask_add")
        elif n.op_type in ("MatMul", "Gemm"):
            put(n, "linear" if len(acts) == 1 else "attention_matmul")
        elif n.op_type == "LayerNormalization":
            put(n, "layernorm")
        elif n.op_type == "Softmax":
            put(n, "softmax")
        elif n.op_type in ("Erf", "Gelu", "Tanh") and "pooler" not in n.name:
            put(n, "gelu")
            if n.op_type == "Erf":  # x * 0.5 * (1 + erf(x / sqrt2)): the Div before, the Add and Muls after
                chain = [producer.get(n.input[0])]
                nxt = consumers.get(n.output[0], [])
                while nxt and nxt[0].op_type in ("Add", "Mul") and len(chain) < 5:
                    chain.append(nxt[0])
                    nxt = consumers.get(nxt[0].output[0], [])
                for c in chain:
                    if c is not None:
                        put(c, "gelu")
        elif n.op_type == "Add" and n.name not in kinds:
            if any(i in from_mask for i in n.input):
                put(n, "mask_add")
            elif all(i in from_embedding for i in acts):
                put(n, "embedding_add")
                from_embedding.update(n.output)
            elif len(acts) == 1:
                put(n, "bias_add")
            else:
                put(n, "residual_add")
    return kinds


def finite_mask(model: onnx.ModelProto) -> int:
    """Replace the mask's float-min constant (-3.4e38) by -1e4, in place: softmax output is the same
    (exp(-1e4) == 0 in float32), and calibration histograms and QDQ scales stay finite."""
    inits = {i.name: i for i in model.graph.initializer}
    mask_path, replaced = {"attention_mask"}, 0
    for n in model.graph.node:
        acts = [i for i in n.input if i and i not in inits]
        if not (acts and all(i in mask_path for i in acts)):
            continue
        mask_path.update(n.output)
        for i in n.input:
            if i in inits and inits[i].data_type == onnx.TensorProto.FLOAT:
                value = numpy_helper.to_array(inits[i])
                if value.size and (value <= -1e30).all():
                    inits[i].CopyFrom(numpy_helper.from_array(np.full_like(value, -1e4), i))
                    replaced += 1
    return replaced


def has_fused_ops(model: onnx.ModelProto) -> bool:
    """Whether ORT's fusions (its com.microsoft ops: attention, GELU, embedding LayerNorm) are in the graph."""
    return any(n.domain == "com.microsoft" for n in model.graph.node)


def _feeds(model_path: Path, arrays: dict, fixed: bool):
    """Calibration batches typed like the graph's inputs; `fixed` pads all to one length, because
    ORT's histogram calibrators stack every batch's tensors into one array."""
    model = onnx.load(str(model_path), load_external_data=False)
    names = tuple(i.name for i in model.graph.input)
    dtype = np.int32 if model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT32 else np.int64
    if fixed:
        t = int(arrays["lengths"].max())
        arrays = {**arrays, "lengths": np.full_like(arrays["lengths"], t)}
    return [feed for _, feed in batches(arrays, names, 8, dtype)]


def calibrate(src: Path, arrays: dict, method: str, samples: int, cache: Path) -> None:
    """Tensor ranges of `src` on up to `samples` examples, saved to `cache` (ORT's JSON) for reuse."""
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod
    from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data

    class Reader(CalibrationDataReader):
        def __init__(self, feeds):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    methods = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
               "entropy": CalibrationMethod.Entropy}
    with tempfile.TemporaryDirectory(prefix="edgebert-calib-") as tmp:  # the augmented model goes here, not the cwd
        calibrator = create_calibrator(src, ["MatMul", "Gemm", "Add", "Mul", "LayerNormalization", "Softmax"],
                                       augmented_model_path=str(Path(tmp) / "augmented_model.onnx"),
                                       calibrate_method=methods[method], extra_options={"symmetric": False})
        calibrator.execution_providers = ["CPUExecutionProvider"]
        calibrator.collect_data(Reader(_feeds(src, {k: v[:samples] for k, v in arrays.items()}, fixed=method != "minmax")))
        save_tensors_data(calibrator.compute_data(), cache)


def static(src: Path, dst: Path, *, cache: Path, method: str, target: str, per_channel: bool,
           float_nodes: set[str], dynamic_nodes: set[str]) -> None:
    """QDQ INT8 of `src` except `float_nodes`; `dynamic_nodes` (linear layers) get dynamic INT8 instead."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_dynamic, quantize_static

    activation, weight, reduce_range = _quant_types(target)
    methods = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
               "entropy": CalibrationMethod.Entropy}
    model = onnx.load(str(src))
    quantized = [n.name for n in model.graph.node if n.name not in float_nodes | dynamic_nodes]
    with tempfile.TemporaryDirectory(prefix="edgebert-static-") as tmp:
        qdq = Path(tmp) / "qdq.onnx"
        logging.disable(logging.WARNING)  # ORT warns about pre-processing on every call
        try:
            quantize_static(model, str(qdq), None, quant_format=QuantFormat.QDQ,
                            op_types_to_quantize=["MatMul", "Gemm", "Add", "Mul", "LayerNormalization", "Softmax"],
                            nodes_to_quantize=quantized, per_channel=per_channel, reduce_range=reduce_range,
                            activation_type=activation, weight_type=weight, calibrate_method=methods[method],
                            calibration_cache_path=str(cache),
                            extra_options={"ActivationSymmetric": target == "arm", "WeightSymmetric": True,
                                           # float MatMul outputs: int8 compute, no requantization error
                                           "OpTypesToExcludeOutputQuantization": ["MatMul", "Gemm"]})
            model = onnx.load(str(qdq))
            keep_float(model, float_nodes | dynamic_nodes)
            decompose_layernorm(model)  # a static file is the one an NPU provider is given: no op NNAPI lacks
            onnx.save(model, str(qdq))
            if dynamic_nodes:
                quantize_dynamic(str(qdq), str(dst), op_types_to_quantize=["MatMul"],
                                 nodes_to_quantize=sorted(dynamic_nodes), per_channel=per_channel,
                                 reduce_range=reduce_range, weight_type=weight,
                                 extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
            else:
                dst.write_bytes(qdq.read_bytes())
        finally:
            logging.disable(logging.NOTSET)


def keep_float(model: onnx.ModelProto, float_nodes: set[str]) -> None:
    """Point float nodes back at the float tensor where ORT gave them a shared Quantize→Dequantize
    output (e.g. a residual Add reading a LayerNorm output that the next MatMul quantizes); drop
    pairs nobody reads any more."""
    producer = {o: n for n in model.graph.node for o in n.output}
    for n in model.graph.node:
        if n.name not in float_nodes:
            continue
        for k, name in enumerate(n.input):
            dq = producer.get(name)
            q = producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
            if q is not None and q.op_type == "QuantizeLinear":
                n.input[k] = q.input[0]
    while True:
        read = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
        dead = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")
                and not any(o in read for o in n.output)]
        if not dead:
            return
        for n in dead:
            model.graph.node.remove(n)


def dynamic(src: Path, dst: Path, *, target: str, per_channel: bool, embeddings: bool) -> None:
    """ORT dynamic INT8 (fused Attention, MatMul and a static student's Conv; EmbedLayerNormalization when
    `embeddings`)."""
    from onnxruntime.quantization import quantize_dynamic

    _, weight, reduce_range = _quant_types(target)
    ops = ["MatMul", "Attention"] + (["EmbedLayerNormalization"] if embeddings else [])
    logging.disable(logging.WARNING)
    try:
        quantize_dynamic(str(src), str(dst), op_types_to_quantize=ops, per_channel=per_channel,
                         reduce_range=reduce_range, weight_type=weight,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        logging.disable(logging.NOTSET)


def _tables(model: onnx.ModelProto, min_rows: int):
    """(node index, Gather node, table) for each float 2-D table of >= `min_rows` rows read only by one axis-0 Gather
    (a table a tied output layer also reads must stay float)."""
    inits = {i.name: i for i in model.graph.initializer}
    readers: dict[str, int] = {}
    for n in model.graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    for k, n in enumerate(model.graph.node):
        table = inits.get(n.input[0]) if n.op_type == "Gather" else None
        axis = next((helper.get_attribute_value(a) for a in n.attribute if a.name == "axis"), 0)
        if table is not None and table.data_type == onnx.TensorProto.FLOAT and len(table.dims) == 2 \
                and table.dims[0] >= min_rows and axis == 0 and readers[table.name] == 1:
            yield k, n, table


def _replace(model: onnx.ModelProto, new_nodes: dict[int, list]) -> None:
    """Swap each node whose index is in `new_nodes` for its replacement, keeping graph order."""
    nodes = [m for k, n in enumerate(model.graph.node) for m in new_nodes.get(k, [n])]
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def int8_embeddings(model: onnx.ModelProto, min_rows: int) -> list[str]:
    """Replace each float table Gather with ≥ `min_rows` rows by an int8 table + per-row scale:
    Gather(int8) → Cast → Mul(Gather(scale)). Returns the tables converted (in place)."""
    done, new_nodes = [], {}
    for k, n, table in list(_tables(model, min_rows)):
        w = numpy_helper.to_array(table)
        scale = np.maximum(np.abs(w).max(axis=1, keepdims=True), 1e-12) / 127.0
        q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
        base = table.name
        model.graph.initializer.remove(table)
        model.graph.initializer.extend([numpy_helper.from_array(q, f"{base}_int8"),
                                        numpy_helper.from_array(scale.astype(np.float32), f"{base}_scale")])
        out, ids = n.output[0], n.input[1]
        new_nodes[k] = [
            helper.make_node("Gather", [f"{base}_int8", ids], [f"{out}_q"], name=f"{n.name}_int8"),
            helper.make_node("Cast", [f"{out}_q"], [f"{out}_f"], to=onnx.TensorProto.FLOAT, name=f"{n.name}_cast"),
            helper.make_node("Gather", [f"{base}_scale", ids], [f"{out}_s"], name=f"{n.name}_scale"),
            helper.make_node("Mul", [f"{out}_f", f"{out}_s"], [out], name=f"{n.name}_dequant")]
        done.append(base)
    _replace(model, new_nodes)
    return done


def pack4(codes: np.ndarray) -> np.ndarray:
    """4-bit codes (0..15) → uint8, two per byte along the last axis, low nibble first (ORT's layout)."""
    if codes.shape[-1] % 2:
        codes = np.pad(codes, [(0, 0)] * (codes.ndim - 1) + [(0, 1)])
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack4(packed: np.ndarray, n: int) -> np.ndarray:
    """The first `n` 4-bit codes of each row of `packed` (pack4's inverse)."""
    return np.stack([packed & 15, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)[..., :n]


def int4_blocks(w: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """4-bit blocks of `block_size` values along each row: (codes uint8 [rows, cols], scales float16
    [rows, blocks], zero points uint8 [rows, blocks]).

    Each block is the one of two with less squared error: asymmetric, its range widened to hold 0 so
    the zero point is an integer code in 0..15; or symmetric (zero point 8, codes 1..15, scale max-abs / 7),
    which holds a table already on TFLite's grid (`PruneConfig.int4_words`) exactly. Either way every value is
    within scale/2 of (code − zero point) · scale; a partial last block is allowed. A scale is rounded up
    to a float16 (half the bytes of float32; at least float16's smallest normal) before the codes are
    chosen, so the bound holds for the stored scale."""
    rows, cols = w.shape
    blocks = -(-cols // block_size)
    padded = np.pad(w, ((0, 0), (0, blocks * block_size - cols)), mode="edge").reshape(rows, blocks, block_size)
    lo, hi = np.minimum(padded.min(axis=2), 0), np.maximum(padded.max(axis=2), 0)
    asymmetric = _half_up((hi - lo) / 15)
    symmetric = _half_up(np.maximum(hi, -lo) / 7)
    for scale in (asymmetric, symmetric):
        scale[hi == lo] = 1.0  # an all-zero block: any scale reproduces it
    zeros = np.clip(np.round(-lo / asymmetric), 0, 15), np.full(symmetric.shape, 8.0)
    (a_codes, a_error), (s_codes, s_error) = (_codes(padded, scale, zero)
                                              for scale, zero in zip((asymmetric, symmetric), zeros))
    better = s_error < a_error
    codes = np.where(better[..., None], s_codes, a_codes)
    scale, zero = np.where(better, symmetric, asymmetric), np.where(better, zeros[1], zeros[0])
    return codes.reshape(rows, -1)[:, :cols].astype(np.uint8), scale.astype(np.float16), zero.astype(np.uint8)


def _codes(blocks: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`blocks` [rows, n, block_size] coded at one scale and zero point a block, and each block's squared error."""
    codes = np.clip(np.round(blocks / scale[..., None]) + zero[..., None], 0, 15)
    return codes, np.square((codes - zero[..., None]) * scale[..., None] - blocks).sum(axis=2)


def _half_up(exact: np.ndarray) -> np.ndarray:
    """`exact` rounded up to float16 values (at least float16's smallest normal), as float32."""
    exact = np.maximum(exact, np.finfo(np.float16).tiny).astype(np.float32)
    half = exact.astype(np.float16)
    return np.where(half.astype(np.float32) < exact, np.nextafter(half, np.float16(np.inf)), half).astype(np.float32)


def table_report(w: np.ndarray, w_hat: np.ndarray, bytes_after: int, **extra) -> dict:
    """What a table's quantization cost: its bytes before/after and the reconstruction error |w − ŵ|."""
    err = np.abs(w.astype(np.float64) - w_hat)
    return {"rows": int(w.shape[0]), "cols": int(w.shape[1]), **extra, "bytes_before": int(w.nbytes),
            "bytes_after": int(bytes_after), "max_abs_error": float(err.max()), "mean_abs_error": float(err.mean())}


def int4_embeddings(model: onnx.ModelProto, *, block_size: int, min_rows: int) -> list[str]:
    """Replace each float table Gather with ≥ `min_rows` rows by ORT's GatherBlockQuantized on a packed
    4-bit table with per-block scales and zero points. Returns the tables converted (in place)."""
    done, new_nodes = [], {}
    for k, n, table in list(_tables(model, min_rows)):
        codes, scale, zero = int4_blocks(numpy_helper.to_array(table), block_size)
        base = table.name
        model.graph.initializer.remove(table)
        model.graph.initializer.extend([numpy_helper.from_array(pack4(codes), f"{base}_int4"),
                                        numpy_helper.from_array(scale, f"{base}_scales"),
                                        numpy_helper.from_array(pack4(zero), f"{base}_zero_points")])
        out = n.output[0]
        new_nodes[k] = [  # float16 scales give float16 rows: one Cast back for the float graph
            helper.make_node("GatherBlockQuantized", [f"{base}_int4", n.input[1], f"{base}_scales",
                                                      f"{base}_zero_points"], [f"{out}_f16"], name=f"{n.name}_int4",
                             domain="com.microsoft", bits=4, block_size=block_size, gather_axis=0, quantize_axis=1),
            helper.make_node("Cast", [f"{out}_f16"], [out], to=onnx.TensorProto.FLOAT, name=f"{n.name}_int4_cast")]
        done.append(base)
    if done:
        _replace(model, new_nodes)
        if not any(o.domain == "com.microsoft" for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return done


def int4_report(float_model: onnx.ModelProto, model: onnx.ModelProto) -> dict[str, dict]:
    """{table: table_report} for each GatherBlockQuantized table of `model`, dequantized from the file
    and compared with the same table of `float_model`."""
    floats = {i.name: i for i in float_model.graph.initializer}
    inits = {i.name: i for i in model.graph.initializer}
    report = {}
    for n in all_nodes(model.graph):
        if n.op_type != "GatherBlockQuantized":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        base, block = n.input[0][:-len("_int4")], attrs["block_size"]
        w = numpy_helper.to_array(floats[base])
        data, scale, zeros = (numpy_helper.to_array(inits[n.input[i]]) for i in (0, 2, 3))
        zero = unpack4(zeros, scale.shape[1]).astype(np.float32)
        per_value = np.repeat(np.stack([zero, scale.astype(np.float32)]), block, axis=2)[:, :, :w.shape[1]]
        w_hat = (unpack4(data, w.shape[1]) - per_value[0]) * per_value[1]
        report[base] = table_report(w, w_hat, data.nbytes + scale.nbytes + zeros.nbytes, block_size=block)
    return report


FUSED_TABLES = ("the word table sits in a fused EmbedLayerNormalization, which has no 4-bit kernel: it stays INT8 "
                "(QEmbedLayerNormalization); export with OnnxExportConfig(fuse_embeddings=False) for INT4")


def embed_int4(src: Path, dst: Path, *, block_size: int, min_rows: int) -> dict:
    """INT4 word embeddings on any graph; a fused EmbedLayerNormalization keeps INT8, recorded as the fallback."""
    model = onnx.load(str(src))
    if any(n.op_type == "EmbedLayerNormalization" for n in model.graph.node):
        return {**embed_int8(src, dst, min_rows=min_rows), "int4_embeddings": {}, "int4_fallback": FUSED_TABLES}
    if not int4_embeddings(model, block_size=block_size, min_rows=min_rows):
        raise EdgebertError(f"no embedding table with >= {min_rows} rows found: "
                            "lower Int4EmbeddingsConfig(min_rows=...)")
    onnx.save(model, str(dst))
    return {"int4_embeddings": int4_report(onnx.load(str(src)), model)}


def embed_int8(src: Path, dst: Path, *, min_rows: int) -> dict:
    """INT8 embeddings on any graph: our per-row Gather rewrite, or ORT's QEmbedLayerNormalization
    when the tables sit inside a fused EmbedLayerNormalization."""
    model = onnx.load(str(src))
    if any(n.op_type == "EmbedLayerNormalization" for n in model.graph.node):
        from onnxruntime.quantization import quantize_dynamic

        logging.disable(logging.WARNING)
        try:
            quantize_dynamic(str(src), str(dst), op_types_to_quantize=["EmbedLayerNormalization"],
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        finally:
            logging.disable(logging.NOTSET)
        return {"int8_embeddings": "QEmbedLayerNormalization"}
    tables = int8_embeddings(model, min_rows)
    if not tables:
        raise EdgebertError(f"no embedding table with >= {min_rows} rows found: lower Int8EmbeddingsConfig(min_rows=...)")
    onnx.save(model, str(dst))
    return {"int8_embeddings": tables}


ROW = "edgebert_row/"
DYNAMIC_OPS = {"DynamicQuantizeLinear", "DynamicQuantizeMatMul"}  # ranges taken at run time, over the tensor


def by_row_file(path: Path) -> bool:
    """`by_row` on the file at `path`, in place, where it quantizes activations at run time: whether it did.
    Static scales (QDQ) and float files give a row the same answer in any batch already."""
    model = onnx.load(str(path))
    if not any(n.op_type in DYNAMIC_OPS for n in model.graph.node):
        return False
    by_row(model)
    onnx.save(model, str(path))
    return True


def by_row(model: onnx.ModelProto) -> None:
    """Give every batch row what it gets alone at its own length, in place: the graph becomes the body of a Scan
    over the batch rows.

    Dynamic INT8 takes each activation's range over the whole tensor, so without this a row's answer depends on
    the other rows of its batch and on how far it is padded. A graph that does not already drop the padding
    (`trim_padding`: one with per-token outputs) gets it here, per row, and its per-token outputs padded back
    with zeros to the input's length. The weights move into the body: read from the outer graph instead, they
    made batch 1 measurably slower in ONNX Runtime. What the Scan costs and saves is in bench/results/batch.json."""
    graph = model.graph
    weights = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in weights]
    names = [i.name for i in inputs]
    outputs = [(o.name, o.type.tensor_type.elem_type, len(o.type.tensor_type.shape.dim)) for o in graph.output]
    core = list(graph.node)
    if "attention_mask" in names and not trims(graph):
        core = _cut_rows(core, names, outputs)
    answers = {name for name, *_ in outputs}
    for n in core:  # a body may not reuse the outer graph's input and output names
        n.input[:] = [ROW + "row/" + x if x in names or x in answers else x for x in n.input]
        n.output[:] = [ROW + "row/" + x if x in answers else x for x in n.output]
    axes = helper.make_node("Constant", [], [ROW + "axes"], value=numpy_helper.from_array(np.array([0]), ROW + "axes"))
    rows = [helper.make_node("Unsqueeze", [ROW + "in/" + x, ROW + "axes"], [ROW + "row/" + x]) for x in names]
    answer = [helper.make_node("Squeeze", [ROW + "row/" + o, ROW + "axes"], [ROW + "out/" + o]) for o, *_ in outputs]
    body = helper.make_graph(
        [axes, *rows, *core, *answer],
        "row", [helper.make_tensor_value_info(ROW + "in/" + i.name, i.type.tensor_type.elem_type, ["sequence"])
                for i in inputs],
        [helper.make_tensor_value_info(ROW + "out/" + name, dtype, None) for name, dtype, _ in outputs],
        initializer=list(graph.initializer), value_info=list(graph.value_info))
    scan = helper.make_node("Scan", names, [name for name, *_ in outputs], name=ROW + "scan", body=body,
                            num_scan_inputs=len(names))
    del graph.node[:], graph.initializer[:], graph.value_info[:]
    graph.node.append(scan)


def _cut_rows(core: list, inputs: list[str], outputs: list) -> list:
    """`core` run on a batch-1 row cut to its length (`trim_nodes`), its per-token outputs padded back."""
    for n in core:
        n.input[:] = [TRIM + x if x in inputs else x for x in n.input]
    cut = trim_nodes(inputs) + core
    for name, _, rank in outputs:
        if rank < 3:
            continue
        short, p = TRIM + "short/" + name, TRIM + "pad/" + name
        for n in cut:
            n.output[:] = [short if x == name else x for x in n.output]
        cut += [helper.make_node("Shape", ["attention_mask"], [p + "padded"], start=1, end=2),
                helper.make_node("Sub", [p + "padded", TRIM + "end"], [p + "missing"]),
                helper.make_node("Constant", [], [p + "before"],
                                 value=numpy_helper.from_array(np.zeros(rank + 1, dtype=np.int64), p + "before")),
                helper.make_node("Constant", [], [p + "after"],
                                 value=numpy_helper.from_array(np.zeros(rank - 2, dtype=np.int64), p + "after")),
                # pads: every axis' start, then every axis' end; only the sequence axis (1) grows, at its end
                helper.make_node("Concat", [p + "before", p + "missing", p + "after"], [p + "pads"], axis=0),
                helper.make_node("Pad", [short, p + "pads"], [name])]
    return cut
