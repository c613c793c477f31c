"""Accelerators by name (ONNX Runtime execution providers, LiteRT delegates), and which delegates
could take a .tflite file whole, judged by the tensor types of its ops. Standard library only, so the
command line can name them where numpy is missing.

Delegates differ first in the arithmetic they run: an integer-only accelerator (NNAPI NPU drivers,
EdgeTPU, Hexagon/QNN HTP) needs full-integer ops, and a hybrid op (float activations, int8 weights,
as dynamic-range quantization writes) or a float op falls back to the CPU and splits the graph.
This reads the flatbuffer (all signatures) and says, per delegate, which ops break that requirement.
It checks types only: a delegate may still decline an op it does not implement, which its partition
log (benchmark_model, or the runtime's stderr) reports.
"""

from __future__ import annotations

from collections import Counter

from . import HarnessError

# --provider: ONNX Runtime execution providers; CPU stays second so unsupported nodes fall back to it.
PROVIDERS = {"cpu": "CPUExecutionProvider", "xnnpack": "XnnpackExecutionProvider", "nnapi": "NnapiExecutionProvider",
             "coreml": "CoreMLExecutionProvider", "qnn": "QNNExecutionProvider"}
# --delegate: LiteRT delegates. XNNPACK is LiteRT's default CPU delegate (the AUTO op resolver applies it);
# "cpu" is the built-in kernels without it; gpu and nnapi are delegate libraries loaded by name (or a path).
DELEGATE_LIBRARIES = {"gpu": "libtensorflowlite_gpu_delegate.so", "nnapi": "libtensorflowlite_nnapi_delegate.so"}
DELEGATES = ("cpu", "xnnpack", *DELEGATE_LIBRARIES)

FLOAT = ("FLOAT32", "FLOAT16")
QUANTIZED = ("INT8", "UINT8", "INT16")
# Hybrid kernels XNNPACK runs (dynamically quantized activations against int8 weights).
XNNPACK_HYBRID = ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "BATCH_MATMUL")
NEEDS = {
    "xnnpack": "float32/float16 or int8 ops, hybrid only for " + ", ".join(XNNPACK_HYBRID),
    "gpu": "float arithmetic (it runs int8 files on a float view), no int32 index ops",
    "integer-npu": "full-integer ops: int8/uint8/int16 activations and weights, no float or hybrid op "
                   "(NNAPI NPU drivers, EdgeTPU, Hexagon/QNN HTP)",
}


def op_kinds(path: str) -> list[tuple[str, str]]:
    """(op name, kind) of every op in every subgraph; kind is float, integer, hybrid or index."""
    try:
        from ai_edge_litert import schema_py_generated as schema
    except ImportError as e:
        raise HarnessError(f"reading a .tflite file's ops needs ai-edge-litert ({e}): pip install ai-edge-litert") from None
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8 or buf[4:8] != b"TFL3":
        raise HarnessError(f"{path} is not a TFLite flatbuffer (no TFL3 identifier): pass a .tflite file")
    model = schema.Model.GetRootAsModel(buf, 0)
    op_names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    type_names = {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
    found = []
    for g in range(model.SubgraphsLength()):
        graph = model.Subgraphs(g)
        for o in range(graph.OperatorsLength()):
            op = graph.Operators(o)
            code = model.OperatorCodes(op.OpcodeIndex())
            number = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
            name = code.CustomCode().decode() if code.CustomCode() else op_names.get(number, str(number))
            tensors = [graph.Tensors(i) for i in [*op.InputsAsNumpy(), *op.OutputsAsNumpy()] if i >= 0]
            types = [type_names.get(t.Type(), str(t.Type())) for t in tensors]
            quantized = [t for t, ty in zip(tensors, types) if ty in QUANTIZED and _has_scale(t)]
            if any(ty in FLOAT for ty in types):
                kind = "hybrid" if quantized else "float"
            elif quantized:
                kind = "integer"
            else:
                kind = "index"
            found.append((name, kind))
    return found


def _has_scale(tensor) -> bool:
    q = tensor.Quantization()
    return q is not None and q.ScaleLength() > 0


def _blocks(delegate: str, name: str, kind: str) -> bool:
    if delegate == "xnnpack":
        return kind == "index" or (kind == "hybrid" and name not in XNNPACK_HYBRID)
    if delegate == "gpu":
        return kind == "index"
    return kind != "integer"


def fit(path: str) -> dict:
    """{"ops": {kind: count}, "delegates": {name: {"whole", "needs", "blockers": {"OP (kind)": count}}}}."""
    kinds = op_kinds(path)
    report = {"ops": dict(Counter(kind for _, kind in kinds)), "delegates": {}}
    for delegate, needs in NEEDS.items():
        blockers = Counter(f"{name} ({kind})" for name, kind in kinds if _blocks(delegate, name, kind))
        report["delegates"][delegate] = {"whole": not blockers, "needs": needs, "blockers": dict(blockers)}
    return report


def describe(report: dict) -> str:
    """A few lines for a person: each delegate, whether it could take the file whole, and which ops not."""
    lines = ["ops: " + ", ".join(f"{n} {k}" for k, n in sorted(report["ops"].items()))]
    for delegate, d in report["delegates"].items():
        if d["whole"]:
            lines.append(f"{delegate}: could take it whole by tensor types (needs {d['needs']})")
            continue
        kinds = {}
        for blocker, n in d["blockers"].items():
            op, kind = blocker.rsplit(" (", 1)
            kinds.setdefault(kind.rstrip(")"), []).append(f"{op} x{n}")
        off = "; ".join(f"{kind}: {', '.join(ops)}" for kind, ops in sorted(kinds.items()))
        lines.append(f"{delegate}: not whole: needs {d['needs']}; on the CPU instead: {off}")
    return "\n".join(lines)
