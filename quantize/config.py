"""Public quantization configs: frozen, keyword-only `Config` dataclasses, one per method.

Implementations live in `quantize.onnx_ptq`, `quantize.tflite_ptq`, `quantize.mixed` and
`quantize.qat`, registered per format through `quantize.registry`; nothing here imports a runtime.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from edgebert.config import Config
from edgebert.errors import EdgebertError
from edgebert.export import Budget
from edgebert.passes.int4 import BLOCK_SIZES
from edgebert.passes.train import TrainConfig

Target = Literal["x86", "x86-vnni", "arm"]
Method = Literal["minmax", "percentile", "entropy"]  # how calibration turns observed values into a range
IO = Literal["float", "int8"]  # the type of a TFLite file's output tensor
Keep = Literal["float", "int16"]  # what a mixed-precision search keeps the sensitive op kinds in
# Kinds of ops in an exported BERT graph: the unit of float/INT8 choices (see quantize.onnx_ptq.classify).
Kind = Literal["linear", "attention_matmul", "layernorm", "softmax", "gelu", "residual_add", "bias_add",
               "embedding_add", "mask_add"]
KINDS = get_args(Kind)


def host_target() -> Target:
    """The target of this machine: arm, x86 with VNNI (no reduce_range needed) or plain x86."""
    if platform.machine().lower() in ("arm64", "aarch64"):
        return "arm"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "x86"
    return "x86-vnni" if ("avx512_vnni" in flags or "avx_vnni" in flags) else "x86"


@dataclass(frozen=True, kw_only=True)
class Int8EmbeddingsConfig(Config):
    """Weight-only INT8 word embeddings, dequantized after the lookup: a 4× smaller table.

    ONNX: Gather on an int8 table + per-row scale (ORT's QEmbedLayerNormalization where the graph
    has a fused EmbedLayerNormalization); TFLite: int8 EMBEDDING_LOOKUP weights."""

    min_rows: int = 1000  # only tables at least this tall (the word embedding, not positions/types)


@dataclass(frozen=True, kw_only=True)
class Int4EmbeddingsConfig(Config):
    """Block-wise INT4 weight-only word embeddings: about 8× smaller than float, 2× smaller than INT8.

    Each row is cut into blocks of `block_size` values with one scale each. ONNX: ORT's
    GatherBlockQuantized (com.microsoft; 4-bit blocks with zero points and float16 scales, each block
    asymmetric or symmetric, whichever has less squared error) on an unfused embedding, since the fused
    EmbedLayerNormalization has no 4-bit kernel (a fused file keeps its INT8 QEmbedLayerNormalization,
    recorded as the fallback); TFLite: ai-edge-quantizer's blockwise INT4 EMBEDDING_LOOKUP (symmetric,
    float16 scales; each block's the one with the least squared error). Smaller tables get what the INT8
    path gives them. Standalone it quantizes only the embeddings; as `int4_embeddings=` of an INT8 config
    it replaces that config's INT8 word table."""

    block_size: int = 32
    min_rows: int = 1000  # only tables at least this tall (the word embedding, not positions/types)

    def __post_init__(self):
        if self.block_size not in BLOCK_SIZES:
            raise EdgebertError(f"Int4EmbeddingsConfig block_size {self.block_size}: use one of {BLOCK_SIZES}")
        if self.min_rows < 1:
            raise EdgebertError("Int4EmbeddingsConfig min_rows must be >= 1")


def _check_int4(config) -> None:
    if config.int4_embeddings is not None and not config.int8_embeddings:
        raise EdgebertError(f"{type(config).__name__}: int4_embeddings needs int8_embeddings=True "
                            "(it replaces the INT8 word table; drop int4_embeddings to keep the tables float)")


def _check_samples(config, *names: str) -> None:
    for name in names:
        if getattr(config, name) < 1:
            raise EdgebertError(f"{type(config).__name__}.{name} counts examples: give at least 1, got "
                                f"{getattr(config, name)}")


@dataclass(frozen=True, kw_only=True)
class DynamicInt8Config(Config):
    """INT8 weights, activations quantized at run time (ORT dynamic; TFLite dynamic-range).

    target (default: this machine): "x86" (U8 activations/S8 weights, reduce_range for CPUs without
    VNNI), "x86-vnni", or "arm" (S8/S8), following ONNX Runtime's guidance.
    by_row (ONNX): run each batch row alone at its own length, so its answer does not depend on the batch or the
    padding (`onnx_ptq.by_row`); False keeps ORT's ranges over the whole batch tensor, as Optimum's file does."""

    per_channel: bool = True
    target: Target = field(default_factory=host_target)
    int8_embeddings: bool = True
    int4_embeddings: Int4EmbeddingsConfig | None = None  # block-wise INT4 word table instead of INT8
    by_row: bool = True

    def __post_init__(self):
        _check_int4(self)


@dataclass(frozen=True, kw_only=True)
class StaticInt8Config(Config):
    """INT8 weights and activations calibrated on task data (ONNX QDQ; full-INT8 TFLite).

    exclude: op kinds kept in float (KINDS above); the default keeps the known
    outlier-prone ops (LayerNorm, Softmax, GELU, residual/embedding/mask Adds) in FP32.
    io: TFLite only: "float" keeps float logits, "int8" quantizes the output tensor too."""

    method: Method = "minmax"
    samples: int = 256
    target: Target = field(default_factory=host_target)
    per_channel: bool = True
    exclude: tuple[Kind, ...] = ("layernorm", "softmax", "gelu", "residual_add", "embedding_add", "mask_add",
                                 "bias_add")
    int8_embeddings: bool = True
    int4_embeddings: Int4EmbeddingsConfig | None = None  # block-wise INT4 word table instead of INT8
    io: IO = "float"

    def __post_init__(self):
        _check_int4(self)
        _check_samples(self, "samples")


@dataclass(frozen=True, kw_only=True)
class MixedPrecisionConfig(Config):
    """Static INT8, then keep in float the op kinds (or layers) that cost accuracy, most sensitive
    first, until the quantized model is within `budget` of the float one on the eval split
    (sensitivity is measured on its first `search_samples` examples, the budget on all of it).

    The matrix multiplications (where the bytes and the time are) always stay INT8; if the budget
    still fails with everything else in float, quantize raises instead of shipping a worse model.

    keep="int16" (TFLite): a full-integer file for NPUs instead. Every op is static INT8 and the sensitive
    kinds move to 16-bit activations (16x8), not to float; the file's remaining float ops are named."""

    budget: Budget = Budget(max_metric_drop=0.01)  # one point
    method: Method = "minmax"
    samples: int = 256
    search_samples: int = 256  # eval examples for the per-group sensitivity; the budget uses all
    target: Target = field(default_factory=host_target)
    per_channel: bool = True
    int8_embeddings: bool = True
    int4_embeddings: Int4EmbeddingsConfig | None = None  # block-wise INT4 word table instead of INT8
    io: IO = "float"
    keep: Keep = "float"

    def __post_init__(self):
        _check_int4(self)
        _check_samples(self, "samples", "search_samples")
        if self.budget == Budget():
            raise EdgebertError("MixedPrecisionConfig needs a Budget with a limit, e.g. Budget(max_metric_drop=0.01)")


@dataclass(frozen=True, kw_only=True)
class QATConfig(Config):
    """Fake-quant fine-tuning distilled from the float model, then export to QDQ ONNX or INT8 TFLite.

    Linear weights are fake-quantized per channel (symmetric int8) and their inputs per tensor
    with ranges tracked during training; the loss is KL (classification) or MSE to the float
    model, minimised by the passes' training loop with `train`."""

    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        steps=300, lr=2e-5, batch_size=16, weight_decay=0.0, warmup=0, seed=0, progress=False))
    temperature: float = 2.0
    target: Target = field(default_factory=host_target)
    int8_embeddings: bool = True
    seq_lens: tuple[int, ...] = (16, 32, 64, 128)  # TFLite output only

    def __post_init__(self):
        if self.temperature <= 0:
            raise EdgebertError(f"QATConfig.temperature must be positive, got {self.temperature}")
