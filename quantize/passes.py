"""The implementations behind each (config, format) pair, registered with `quantize.registry`."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import onnx

from edgebert.errors import EdgebertError
from edgebert.export import Artifact, OnnxExportConfig

from . import onnx_ptq, tflite_ptq
from .config import (DynamicInt8Config, Int4EmbeddingsConfig, Int8EmbeddingsConfig, MixedPrecisionConfig,
                     StaticInt8Config)
from .mixed import IN_FLOAT, search
from .registry import Job, need, register


def _unfused(job: Job, config) -> onnx.ModelProto:
    """The float source, checked to be unfused, with a finite attention-mask constant (rewritten in place)."""
    model = onnx.load(str(job.src))
    if onnx_ptq.has_fused_ops(model):
        raise EdgebertError(f"{type(config).__name__} needs the unfused graph (QDQ has no fused Attention): "
                            "export with OnnxExportConfig(optimize='basic') or pass the PyTorch model")
    if onnx_ptq.finite_mask(model):
        onnx.save(model, str(job.src))
    return model


def _embed(path: Path, config) -> dict:
    """The word-embedding rewrite, in place, where a standalone table Gather remains: block-wise INT4
    with `config.int4_embeddings`, else per-row INT8 when `config.int8_embeddings`."""
    if not config.int8_embeddings:
        return {"int8_embeddings": []}
    model, int4 = onnx.load(str(path)), config.int4_embeddings
    if int4 is not None:  # what became INT4 is measured from the file (_int4_info)
        tables, int8 = onnx_ptq.int4_embeddings(model, block_size=int4.block_size, min_rows=int4.min_rows), []
    else:
        tables = int8 = onnx_ptq.int8_embeddings(model, Int8EmbeddingsConfig().min_rows)
    if tables:
        onnx.save(model, str(path))
    return {"int8_embeddings": int8}


def _run(path: Path, arrays: dict):
    return Artifact(path).run(arrays)


def _unfused_tables(config) -> OnnxExportConfig | None:
    """INT4 tables need the word Gather outside EmbedLayerNormalization; the other fusions stay."""
    return OnnxExportConfig(fuse_embeddings=False) if config.int4_embeddings is not None else None


@register(DynamicInt8Config, "onnx", export_with=_unfused_tables)
def onnx_dynamic(job: Job, config: DynamicInt8Config) -> dict:
    onnx_ptq.dynamic(job.src, job.out, target=config.target, per_channel=config.per_channel,
                     embeddings=config.int8_embeddings)
    fused_tables = any(n.op_type == "QEmbedLayerNormalization" for n in onnx.load(str(job.out)).graph.node)
    if fused_tables:
        fallback = {"int4_embeddings": {}, "int4_fallback": onnx_ptq.FUSED_TABLES} if config.int4_embeddings else {}
        info = {"int8_embeddings": "QEmbedLayerNormalization", **fallback}
    else:
        info = {**_embed(job.out, config), **_int4_info(job, config)}
    return {"method": "dynamic", "reduce_range": config.target == "x86", **info,
            "by_row": config.by_row and onnx_ptq.by_row_file(job.out)}


def _int4_info(job: Job, config) -> dict:
    """The INT4 tables of the finished file, measured against the float source."""
    if config.int4_embeddings is None:
        return {}
    return {"int4_embeddings": onnx_ptq.int4_report(onnx.load(str(job.src)), onnx.load(str(job.out)))}


@register(Int8EmbeddingsConfig, "onnx")
def onnx_embeddings(job: Job, config: Int8EmbeddingsConfig) -> dict:
    return {"method": "int8_embeddings", **onnx_ptq.embed_int8(job.src, job.out, min_rows=config.min_rows)}


@register(Int4EmbeddingsConfig, "onnx", export_with=OnnxExportConfig(fuse_embeddings=False))
def onnx_int4_embeddings(job: Job, config: Int4EmbeddingsConfig) -> dict:
    return {"method": "int4_embeddings",
            **onnx_ptq.embed_int4(job.src, job.out, block_size=config.block_size, min_rows=config.min_rows)}


def _groups(kinds: dict[str, tuple[str, str]]) -> dict[str, list[str]]:
    """{group: node names}: one group per op kind, and one per layer for the linear layers."""
    groups: dict[str, list[str]] = {}
    for name, (kind, layer) in kinds.items():
        groups.setdefault(f"linear:{layer}" if kind == "linear" else kind, []).append(name)
    return groups


def _static_build(job: Job, config, groups: dict[str, list[str]], cache: Path):
    def build(float_groups: set[str], path: Path) -> None:
        float_nodes = {n for g in float_groups if not g.startswith("linear") for n in groups[g]}
        dynamic_nodes = {n for g in float_groups if g.startswith("linear") for n in groups[g]}
        onnx_ptq.static(job.src, path, cache=cache, method=config.method, target=config.target,
                        per_channel=config.per_channel, float_nodes=float_nodes, dynamic_nodes=dynamic_nodes)
        _embed(path, config)
    return build


# QDQ wants the graph unfused, and calibration stacks activations of one shape: no padding trim
CALIBRATED = OnnxExportConfig(optimize="basic", trim_padding=False)


@register(StaticInt8Config, "onnx", export_with=CALIBRATED)
def onnx_static(job: Job, config: StaticInt8Config) -> dict:
    groups = _groups(onnx_ptq.classify(_unfused(job, config)))
    cache = job.work / "ranges.json"
    onnx_ptq.calibrate(job.src, need(job, "calibration", config), config.method, config.samples, cache)
    float_groups = {g for g in groups if g.split(":")[0] in config.exclude}
    _static_build(job, config, groups, cache)(float_groups, job.out)
    return {"method": f"static_qdq_{config.method}", "float": sorted(float_groups),
            "reduce_range": config.target == "x86", **_embed_info(job, config), "by_row": onnx_ptq.by_row_file(job.out)}


def _embed_info(job: Job, config) -> dict:
    names = [i.name[:-5] for i in onnx.load(str(job.out)).graph.initializer if i.name.endswith("_int8")]
    return {"int8_embeddings": names, **_int4_info(job, config)}


@register(MixedPrecisionConfig, "onnx", export_with=CALIBRATED)
def onnx_mixed(job: Job, config: MixedPrecisionConfig) -> dict:
    if config.keep != "float":
        raise EdgebertError(f"MixedPrecisionConfig(keep={config.keep!r}) writes full-integer TFLite files: for "
                            "ONNX use keep=\"float\" (static QDQ with the sensitive kinds in FP32)")
    groups = _groups(onnx_ptq.classify(_unfused(job, config)))
    arrays = need(job, "eval_data", config)
    cache = job.work / "ranges.json"
    onnx_ptq.calibrate(job.src, need(job, "calibration", config), config.method, config.samples, cache)
    reference = _run(job.src, arrays)  # the budget is relative to the float file
    found = search(sorted(groups), _static_build(job, config, groups, cache), _run,
                   arrays, reference, config.budget, job.work, ".onnx", config.search_samples)
    found["path"].replace(job.out)
    return {"method": f"static_qdq_{config.method}+mixed", "float": found["float"],
            "float_means": "op kinds in FP32; linear:<layer> = that layer's linear layers in dynamic INT8",
            "sensitivity": found["sensitivity"], "search_result": found["result"], "budget": asdict(config.budget),
            "reduce_range": config.target == "x86", **_embed_info(job, config), "by_row": onnx_ptq.by_row_file(job.out)}


def _tflite_int4(job: Job, config) -> dict:
    """The INT4 tables of the written file, measured against the float one."""
    if config.int4_embeddings is None:
        return {}
    return {"int4_embeddings": tflite_ptq.int4_report(job.src.read_bytes(), job.out.read_bytes())}


@register(DynamicInt8Config, "tflite")
def tflite_dynamic(job: Job, config: DynamicInt8Config) -> dict:
    job.out.write_bytes(tflite_ptq.dynamic(job.src.read_bytes(), embeddings=config.int8_embeddings,
                                           int4=config.int4_embeddings))
    return {"method": "dynamic_wi8_afp32", "int8_embeddings": config.int8_embeddings, **_tflite_int4(job, config)}


@register(Int8EmbeddingsConfig, "tflite")
def tflite_embeddings(job: Job, config: Int8EmbeddingsConfig) -> dict:
    job.out.write_bytes(tflite_ptq.embeddings_only(job.src.read_bytes(), min_rows=config.min_rows))
    return {"method": "int8_embeddings", "int8_embeddings": True}


@register(Int4EmbeddingsConfig, "tflite")
def tflite_int4_embeddings(job: Job, config: Int4EmbeddingsConfig) -> dict:
    job.out.write_bytes(tflite_ptq.embeddings_only(job.src.read_bytes(), int4=config))
    tables = tflite_ptq.int4_report(job.src.read_bytes(), job.out.read_bytes())
    if not tables:
        raise EdgebertError(f"no embedding table with >= {config.min_rows} rows found: "
                            "lower Int4EmbeddingsConfig(min_rows=...)")
    return {"method": "int4_embeddings", "int8_embeddings": True, "int4_embeddings": tables}


@register(StaticInt8Config, "tflite")
def tflite_static(job: Job, config: StaticInt8Config) -> dict:
    data = job.src.read_bytes()
    calibration = tflite_ptq.calibrate(data, need(job, "calibration", config), config.samples)
    static_kinds = set(tflite_ptq.TFLITE_OPS) - tflite_ptq.tflite_kinds(config.exclude)
    job.out.write_bytes(tflite_ptq.static(data, calibration, static_kinds=static_kinds, io=config.io,
                                          embeddings=config.int8_embeddings, int4=config.int4_embeddings))
    return {"method": "static_wi8_ai8", "static": sorted(static_kinds),
            "float": sorted(set(tflite_ptq.TFLITE_OPS) - static_kinds), "io": config.io,
            "int8_embeddings": config.int8_embeddings, **_tflite_int4(job, config)}


@register(MixedPrecisionConfig, "tflite")
def tflite_mixed(job: Job, config: MixedPrecisionConfig) -> dict:
    data = job.src.read_bytes()
    arrays = need(job, "eval_data", config)
    integer = config.keep == "int16"
    calibration = tflite_ptq.calibrate(data, need(job, "calibration", config), config.samples, integer=integer)
    kinds = sorted(tflite_ptq.INTEGER_OPS if integer else tflite_ptq.TFLITE_OPS)
    quantized = dict(io=config.io, embeddings=config.int8_embeddings, int4=config.int4_embeddings)

    def build(kept: set[str], path: Path) -> None:
        path.write_bytes(tflite_ptq.integer(data, calibration, wide_kinds=kept, **quantized) if integer else
                         tflite_ptq.static(data, calibration, static_kinds=set(kinds) - kept, **quantized))

    found = search(kinds, build, _run, arrays, _run(job.src, arrays), config.budget, job.work, ".tflite",
                   config.search_samples, kept_as="at 16-bit activations" if integer else IN_FLOAT)
    found["path"].replace(job.out)
    if integer:
        types = tflite_ptq.output_types(job.out.read_bytes())
        kept = {"method": "static_wi8_ai8+ai16", "int16": found["float"],
                "int16_means": "op kinds with 16-bit activations (INT8 weights); every other op INT8",
                "float_ops": sorted(op for op, t in types.items() if "FLOAT32" in t),
                "int8_only": sorted(tflite_ptq.NO_INT16 & set(types))}
    else:
        kept = {"method": "static_wi8_ai8+mixed", "float": found["float"],
                "float_means": "op kinds in float; linear = dynamic-range INT8 fully-connected layers"}
    return {**kept, "sensitivity": found["sensitivity"], "search_result": found["result"],
            "budget": asdict(config.budget), "io": config.io, "int8_embeddings": config.int8_embeddings,
            **_tflite_int4(job, config)}
