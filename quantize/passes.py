"""The implementations behind each (config, format) pair, registered with `quantize.registry`."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import onnx

from edgebert.errors import EdgebertError
from edgebert.export import Artifact, OnnxExportConfig

from . import onnx_ptq, tflite_ptq
from .config import DynamicInt8Config, Int8EmbeddingsConfig, MixedPrecisionConfig, StaticInt8Config
from .mixed import search
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


def _embed(path: Path, enabled: bool) -> dict:
    """The per-row INT8 word-embedding rewrite, in place, where a standalone table Gather remains."""
    if not enabled:
        return {"int8_embeddings": []}
    model = onnx.load(str(path))
    tables = onnx_ptq.int8_embeddings(model, Int8EmbeddingsConfig().min_rows)
    if tables:
        onnx.save(model, str(path))
    return {"int8_embeddings": tables}


def _run(path: Path, arrays: dict):
    return Artifact(path).run(arrays)


@register(DynamicInt8Config, "onnx")
def onnx_dynamic(job: Job, config: DynamicInt8Config) -> dict:
    onnx_ptq.dynamic(job.src, job.out, target=config.target, per_channel=config.per_channel,
                     embeddings=config.int8_embeddings)
    fused_tables = any(n.op_type == "QEmbedLayerNormalization" for n in onnx.load(str(job.out)).graph.node)
    info = {"int8_embeddings": "QEmbedLayerNormalization"} if fused_tables else _embed(job.out, config.int8_embeddings)
    return {"method": "dynamic", "reduce_range": config.target == "x86", **info}


@register(Int8EmbeddingsConfig, "onnx")
def onnx_embeddings(job: Job, config: Int8EmbeddingsConfig) -> dict:
    return {"method": "int8_embeddings", **onnx_ptq.embed_int8(job.src, job.out, min_rows=config.min_rows)}


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
        _embed(path, config.int8_embeddings)
    return build


@register(StaticInt8Config, "onnx", export_with=OnnxExportConfig(optimize="basic"))  # QDQ wants it unfused
def onnx_static(job: Job, config: StaticInt8Config) -> dict:
    groups = _groups(onnx_ptq.classify(_unfused(job, config)))
    cache = job.work / "ranges.json"
    onnx_ptq.calibrate(job.src, need(job, "calibration", config), config.method, config.samples, cache)
    float_groups = {g for g in groups if g.split(":")[0] in config.exclude}
    _static_build(job, config, groups, cache)(float_groups, job.out)
    return {"method": f"static_qdq_{config.method}", "float": sorted(float_groups),
            "reduce_range": config.target == "x86", **_embed_info(job.out)}


def _embed_info(path: Path) -> dict:
    names = [i.name[:-5] for i in onnx.load(str(path)).graph.initializer if i.name.endswith("_int8")]
    return {"int8_embeddings": names}


@register(MixedPrecisionConfig, "onnx", export_with=OnnxExportConfig(optimize="basic"))
def onnx_mixed(job: Job, config: MixedPrecisionConfig) -> dict:
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
            "reduce_range": config.target == "x86", **_embed_info(job.out)}


@register(DynamicInt8Config, "tflite")
def tflite_dynamic(job: Job, config: DynamicInt8Config) -> dict:
    job.out.write_bytes(tflite_ptq.dynamic(job.src.read_bytes(), embeddings=config.int8_embeddings))
    return {"method": "dynamic_wi8_afp32", "int8_embeddings": config.int8_embeddings}


@register(Int8EmbeddingsConfig, "tflite")
def tflite_embeddings(job: Job, config: Int8EmbeddingsConfig) -> dict:
    job.out.write_bytes(tflite_ptq.embeddings_only(job.src.read_bytes()))
    return {"method": "int8_embeddings", "int8_embeddings": True}


@register(StaticInt8Config, "tflite")
def tflite_static(job: Job, config: StaticInt8Config) -> dict:
    data = job.src.read_bytes()
    calibration = tflite_ptq.calibrate(data, need(job, "calibration", config), config.samples)
    static_kinds = set(tflite_ptq.TFLITE_OPS) - tflite_ptq.tflite_kinds(config.exclude)
    job.out.write_bytes(tflite_ptq.static(data, calibration, static_kinds=static_kinds, io=config.io,
                                          embeddings=config.int8_embeddings))
    return {"method": "static_wi8_ai8", "static": sorted(static_kinds),
            "float": sorted(set(tflite_ptq.TFLITE_OPS) - static_kinds), "io": config.io,
            "int8_embeddings": config.int8_embeddings}


@register(MixedPrecisionConfig, "tflite")
def tflite_mixed(job: Job, config: MixedPrecisionConfig) -> dict:
    data = job.src.read_bytes()
    arrays = need(job, "eval_data", config)
    calibration = tflite_ptq.calibrate(data, need(job, "calibration", config), config.samples)
    kinds = sorted(tflite_ptq.TFLITE_OPS)

    def build(float_groups: set[str], path: Path) -> None:
        path.write_bytes(tflite_ptq.static(data, calibration, static_kinds=set(kinds) - float_groups,
                                           io=config.io, embeddings=config.int8_embeddings))

    found = search(kinds, build, _run, arrays, _run(job.src, arrays),
                   config.budget, job.work, ".tflite", config.search_samples)
    found["path"].replace(job.out)
    return {"method": "static_wi8_ai8+mixed", "float": found["float"],
            "float_means": "op kinds in float; linear = dynamic-range INT8 fully-connected layers",
            "sensitivity": found["sensitivity"], "search_result": found["result"], "budget": asdict(config.budget),
            "io": config.io, "int8_embeddings": config.int8_embeddings}
