"""Children of bench/compare.py that build the comparison's model files, each in its own process
(heavy imports and thread pools never share a process with a timing run).

    python bench/_build.py optimum --teacher DIR --out DIR --config avx2|avx512_vnni [--kind KIND]
    python bench/_build.py tflite --model DIR --out DIR --seq-lens 16,32,64,128 [--int8 JSON]
    python bench/_build.py pte --model DIR --out DIR [--int8] [--max-length N]
    python bench/_build.py model2vec --teacher DIR --out DIR [--data DIR]

Each writes `info.json` into --out last: a folder with info.json is complete and is reused.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from edgebert.device_tests.files import write_json
from edgebert.device_tests.versions import versions


def _default_tensor_type_quantizer(original):
    """ORT's ONNXQuantizer with extra_options DefaultTensorType=FLOAT added.

    ORTQuantizer.quantize fails on an ORTOptimizer-fused graph ("Unable to find data type for
    weight_name=...": shape inference cannot type the outputs of com.microsoft fused ops) and has no
    way to pass extra_options (huggingface/optimum PR #1959, unmerged; the workaround users apply).
    The option only supplies a type where inference found none; it changes nothing else."""
    import onnx

    def factory(*args, **kwargs):
        kwargs["extra_options"] = {**(kwargs.get("extra_options") or {}), "DefaultTensorType": onnx.TensorProto.FLOAT}
        return original(*args, **kwargs)

    return factory


# the ORTModel class Optimum's users load a model of each task kind with
OPTIMUM_CLASSES = {"classification": "ORTModelForSequenceClassification",
                   "pair-classification": "ORTModelForSequenceClassification",
                   "regression": "ORTModelForSequenceClassification",
                   "token-classification": "ORTModelForTokenClassification",
                   "embedding": "ORTModelForFeatureExtraction"}


def build_optimum(teacher: str, out: Path, config_name: str, kind: str = "classification") -> dict:
    """Optimum as its users run it: export, ORTOptimizer O2, ORTQuantizer dynamic INT8 with the
    AutoQuantizationConfig of this CPU. Also the same quantizer on the plain export (no offline
    optimizer; ORT still applies its online fusions at load), in case that one is faster here."""
    import optimum.onnxruntime as ort_models
    import optimum.onnxruntime.quantization as oq
    from optimum.onnxruntime import ORTOptimizer, ORTQuantizer
    from optimum.onnxruntime.configuration import AutoOptimizationConfig, AutoQuantizationConfig

    steps = {}
    t0 = time.time()
    model = getattr(ort_models, OPTIMUM_CLASSES[kind]).from_pretrained(teacher, export=True)
    model.save_pretrained(out / "fp32")
    steps["export_s"] = round(time.time() - t0, 1)

    t0 = time.time()
    optimization = AutoOptimizationConfig.O2()
    ORTOptimizer.from_pretrained(model).optimize(save_dir=out / "o2", optimization_config=optimization)
    steps["optimize_s"] = round(time.time() - t0, 1)

    qconfig = getattr(AutoQuantizationConfig, config_name)(is_static=False)
    t0 = time.time()
    original = oq.ONNXQuantizer
    oq.ONNXQuantizer = _default_tensor_type_quantizer(original)
    try:
        ORTQuantizer.from_pretrained(out / "o2", file_name="model_optimized.onnx").quantize(
            save_dir=out / "o2-int8", quantization_config=qconfig)
    finally:
        oq.ONNXQuantizer = original
    steps["quantize_o2_s"] = round(time.time() - t0, 1)

    t0 = time.time()
    ORTQuantizer.from_pretrained(out / "fp32", file_name="model.onnx").quantize(
        save_dir=out / "int8", quantization_config=qconfig)
    steps["quantize_plain_s"] = round(time.time() - t0, 1)

    return {
        "files": {"o2-int8": "o2-int8/model_optimized_quantized.onnx", "int8": "int8/model_quantized.onnx",
                  "fp32": "fp32/model.onnx", "o2": "o2/model_optimized.onnx"},
        "optimization": {"level": "O2", "config": {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
                                                     for k, v in vars(optimization).items()}},
        "quantization": {"auto_config": f"AutoQuantizationConfig.{config_name}(is_static=False)",
                         "per_channel": qconfig.per_channel, "reduce_range": qconfig.reduce_range,
                         "weights_dtype": str(qconfig.weights_dtype), "activations_dtype": str(qconfig.activations_dtype),
                         "mode": str(qconfig.mode), "format": str(qconfig.format),
                         "operators": [str(o) for o in qconfig.operators_to_quantize],
                         "o2_workaround": "extra_options DefaultTensorType=FLOAT (huggingface/optimum PR #1959)"},
        "steps": steps,
        "versions": versions("optimum", "optimum-onnx", "onnxruntime", "transformers", "torch", "onnx"),
    }


def build_tflite(model_dir: str, out: Path, seq_lens: tuple[int, ...], int8: dict | None) -> dict:
    """The project's TFLite path: litert-torch FP32 export with one signature per length, then
    ai-edge-quantizer dynamic-range INT8 (`quantize.DynamicInt8Config`, i.e. dynamic_wi8_afp32)."""
    import torch

    import edgebert
    from edgebert.export import TFLiteExportConfig, export
    from edgebert.quantize import DynamicInt8Config, Int4EmbeddingsConfig, quantize

    torch.set_num_threads(1)
    model = edgebert.load(model_dir)
    steps = {}
    t0 = time.time()
    export(model, TFLiteExportConfig(seq_lens=seq_lens), out=out / "fp32.tflite")
    steps["export_s"] = round(time.time() - t0, 1)
    options = dict(int8 or {})
    if options.get("int4_embeddings") is not None:  # the manifest records it as a table
        options["int4_embeddings"] = Int4EmbeddingsConfig(**options["int4_embeddings"])
    config = DynamicInt8Config(**options)
    t0 = time.time()
    quantize(out / "fp32.tflite", config, out=out / "int8.tflite")
    steps["quantize_s"] = round(time.time() - t0, 1)
    return {"files": {"fp32": "fp32.tflite", "int8": "int8.tflite"}, "seq_lens": list(seq_lens),
            "int8_config": {"type": type(config).__name__, "per_channel": config.per_channel, "target": config.target,
                            "int8_embeddings": config.int8_embeddings,
                            "int4_embeddings": options.get("int4_embeddings") and options["int4_embeddings"].to_dict()},
            "steps": steps, "versions": versions("litert-torch", "ai-edge-quantizer", "ai-edge-litert", "torch")}


def build_pte(model_dir: str, out: Path, int8: bool, max_length: int | None) -> dict:
    """The project's ExecuTorch path: one .pte lowered to XNNPACK, FP32 or INT8 (int8 weights per channel,
    int8 activations quantized per call), taking every length up to max_length. The runtime plans its memory
    for the longest input: MiniLM-L6 peaks at 1.7 GB RSS from a 512-token file, 0.5 GB from a 128-token one."""
    import torch

    import edgebert
    from edgebert.export import export
    from edgebert.export.executorch import ExecuTorchExportConfig

    torch.set_num_threads(1)
    model = edgebert.load(model_dir)
    config = ExecuTorchExportConfig(precision="int8" if int8 else "fp32", max_length=max_length)
    t0 = time.time()
    artifact = export(model, config, out=out / f"{config.precision}.pte")
    return {"files": {config.precision: artifact.path.name}, "config": config.to_dict(), "meta": artifact.meta,
            "steps": {"export_s": round(time.time() - t0, 1)},
            "versions": versions("executorch", "torchao", "torch")}


def build_model2vec(teacher: str, out: Path, data: str | None) -> dict:
    """model2vec as its users run it: distill() the teacher's token vectors from its local folder (no hub), a
    StaticModelForClassification fit on SST-2 train with its defaults (early stopping on 10% held out), and its
    pipeline saved with the vectors at int8, the smallest dtype model2vec saves."""
    import torch
    from model2vec.distill import distill
    from model2vec.model import quantize_model
    from model2vec.train import StaticModelForClassification

    from edgebert.data import load_task

    torch.set_num_threads(1)
    steps = {}
    t0 = time.time()
    static = distill(teacher, device="cpu")
    steps["distill_s"] = round(time.time() - t0, 1)
    train = load_task("sst2", "train", data_dir=data)
    t0 = time.time()
    classifier = StaticModelForClassification.from_static_model(model=static).fit(
        [e.text for e in train.examples], [e.label for e in train.examples], device="cpu")
    steps["fit_s"] = round(time.time() - t0, 1)
    pipeline = classifier.to_pipeline()
    pipeline.model = quantize_model(pipeline.model, quantize_to="int8")
    pipeline.save_pretrained(str(out / "model"))
    return {"files": {"model": "model"}, "train_examples": len(train.examples),
            "vectors": list(pipeline.model.embedding.shape), "dtype": str(pipeline.model.embedding.dtype),
            "steps": steps, "versions": versions("model2vec", "torch", "transformers")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    o = sub.add_parser("optimum")
    o.add_argument("--teacher", required=True)
    o.add_argument("--out", required=True)
    o.add_argument("--config", default="avx2", choices=("avx2", "avx512", "avx512_vnni", "arm64"))
    o.add_argument("--kind", default="classification", choices=tuple(OPTIMUM_CLASSES), help="the task's kind")
    t = sub.add_parser("tflite")
    t.add_argument("--model", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--seq-lens", default="16,32,64,128")
    t.add_argument("--int8", help="DynamicInt8Config options as JSON")
    e = sub.add_parser("pte")
    e.add_argument("--model", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--int8", action="store_true", help="INT8 (default FP32)")
    e.add_argument("--max-length", type=int, help="the longest input (default: the model's positions)")
    m = sub.add_parser("model2vec")
    m.add_argument("--teacher", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--data", help="data root (default: EDGEBERT_DATA, else ../shared/data)")
    args = p.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    t0 = time.time()
    if args.what == "optimum":
        info = build_optimum(args.teacher, out, args.config, args.kind)
    elif args.what == "pte":
        info = build_pte(args.model, out, args.int8, args.max_length)
    elif args.what == "model2vec":
        info = build_model2vec(args.teacher, out, args.data)
    else:
        info = build_tflite(args.model, out, tuple(int(x) for x in args.seq_lens.split(",")),
                            json.loads(args.int8) if args.int8 else None)
    info["wall_s"] = round(time.time() - t0, 1)
    write_json(out / "info.json", info, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
