"""Quantization-aware training: fake-quantized linear layers fine-tuned to match the float model.

Every nn.Linear becomes `x_q @ W_q + b` with W fake-quantized per output channel (symmetric
int8) and x per tensor over a range tracked during training. The exported ONNX keeps those
Quantize/DequantizeLinear pairs (weights folded to int8 initializers), so ORT runs the same int8
arithmetic the training saw. For TFLite the weights are snapped to the int8 grid and the file is
statically quantized on calibration data with ai-edge-quantizer (litert-torch does not lower fake-quant ops).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from edgebert.errors import EdgebertError
from edgebert.device_tests.backends import batches
from edgebert.export import InputSpec, OnnxExportConfig, TFLiteExportConfig, export
from edgebert.passes.losses import output_loss
from edgebert.passes.train import Objective, train

from . import onnx_ptq, tflite_ptq
from .config import QATConfig
from .registry import Job, need, register


class FakeQuantLinear(nn.Module):
    """A Linear whose weight and input pass through int8 fake quantization (straight-through gradients)."""

    def __init__(self, linear: nn.Linear, *, act_range: tuple[int, int], weight_max: int, momentum: float = 0.9):
        super().__init__()
        self.weight_t = nn.Parameter(linear.weight.detach().t().contiguous())  # [in, out]: MatMul's layout
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None
        self.qmin, self.qmax = act_range
        self.weight_max, self.momentum = weight_max, momentum
        self.register_buffer("lo", torch.tensor(float("inf")))
        self.register_buffer("hi", torch.tensor(float("-inf")))
        self.observe = True
        self.frozen: tuple[torch.Tensor, ...] | None = None

    def freeze(self) -> None:
        """Fix the scales as constants, so the exported graph carries them as initializers."""
        self.observe = False
        scale, zero = self.act_qparams()
        self.frozen = (scale.detach(), zero.detach(), self.weight_scale())

    def act_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = torch.clamp(self.lo, max=0.0), torch.clamp(self.hi, min=0.0)
        scale = torch.clamp((hi - lo) / (self.qmax - self.qmin), min=1e-8)
        zero = torch.clamp(torch.round(self.qmin - lo / scale), self.qmin, self.qmax).to(torch.int32)
        return scale, zero

    def weight_scale(self) -> torch.Tensor:
        return torch.clamp(self.weight_t.detach().abs().amax(0) / self.weight_max, min=1e-12)

    def weight_fq(self) -> torch.Tensor:
        scale = self.frozen[2] if self.frozen else self.weight_scale()
        return torch.fake_quantize_per_channel_affine(self.weight_t, scale, torch.zeros_like(scale, dtype=torch.int32),
                                                      1, -128, 127)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.observe:
            lo, hi = x.detach().min(), x.detach().max()
            first = torch.isinf(self.lo)
            self.lo.copy_(torch.where(first, lo, self.momentum * self.lo + (1 - self.momentum) * lo))
            self.hi.copy_(torch.where(first, hi, self.momentum * self.hi + (1 - self.momentum) * hi))
        scale, zero = self.frozen[:2] if self.frozen else self.act_qparams()
        x = torch.fake_quantize_per_tensor_affine(x, scale, zero, self.qmin, self.qmax)
        y = x @ self.weight_fq()
        return y + self.bias if self.bias is not None else y


def prepare(model: nn.Module, *, act_range: tuple[int, int], weight_max: int) -> nn.Module:
    """A copy of `model` with every nn.Linear replaced by a FakeQuantLinear."""
    student = copy.deepcopy(model).eval()
    for parent in list(student.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, FakeQuantLinear(child, act_range=act_range, weight_max=weight_max))
    if not any(isinstance(m, FakeQuantLinear) for m in student.modules()):
        raise EdgebertError(f"{type(model).__name__} has no nn.Linear layers to quantize: QAT needs a transformer encoder")
    return student


class MatchFloat(Objective):
    """The fake-quantized student's output loss (passes.losses: soft logits, an embedder's cosine)
    against the float model.

    The float model is not a submodule (never trained or saved), and the student stays in eval mode
    while it trains: no dropout, so the ranges it observes are those it will meet at inference."""

    def __init__(self, student: nn.Module, model: nn.Module, names: tuple[str, ...], temperature: float):
        super().__init__(student)
        object.__setattr__(self, "reference", model.eval())
        self.names, self.temperature = names, temperature

    def train(self, mode: bool = True) -> "MatchFloat":
        super().train(mode)
        self.model.eval()
        return self

    def forward(self, batch):
        feed = {k: batch[k] for k in self.names}
        with torch.no_grad():
            target = self.reference(**feed)
        return output_loss(self.model, self.model(**feed), target, self.temperature)


def _items(arrays: dict) -> list[dict]:
    """Right-padded task arrays as the ragged items the training loop batches."""
    types = arrays.get("token_type_ids", np.zeros_like(arrays["input_ids"]))
    return [{"input_ids": arrays["input_ids"][i, :n].tolist(), "token_type_ids": types[i, :n].tolist()}
            for i, n in enumerate(arrays["lengths"].tolist())]


def fine_tune(model: nn.Module, student: nn.Module, arrays: dict, spec: InputSpec, config: QATConfig) -> list[float]:
    """Observe ranges on a first pass, then fine-tune the student toward the float model's logits
    with the passes' training loop; returns the loss history."""
    batch_size = config.train.batch_size
    with torch.no_grad():
        student.eval()
        for _, feed in batches({k: v[: 4 * batch_size] for k, v in arrays.items()}, spec.names, batch_size):
            student(**{k: torch.from_numpy(v) for k, v in feed.items()})
    result = train(MatchFloat(student, model, spec.names, config.temperature), _items(arrays), config=config.train,
                   name="qat")
    for m in student.modules():
        if isinstance(m, FakeQuantLinear):
            m.freeze()
    return [loss for _, loss, _ in result.history]


def fold_weight_quantizers(model: onnx.ModelProto) -> int:
    """QuantizeLinear on a constant weight → an int8 initializer feeding the DequantizeLinear directly."""
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    keep, folded = [], 0
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and all(i in consts for i in n.input[:3]) and consts[n.input[0]].ndim == 2:
            w, scale, zero = (consts[i] for i in n.input[:3])
            axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
            shape = [1] * w.ndim
            shape[axis] = -1
            q = np.clip(np.round(w / scale.reshape(shape)) + zero.reshape(shape), -128, 127).astype(np.int8)
            model.graph.initializer.append(numpy_helper.from_array(q, n.output[0]))
            folded += 1
        else:
            keep.append(n)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    used = {i for n in model.graph.node for i in n.input}
    unused = [i for i in model.graph.initializer if i.name not in used]
    for i in unused:  # the float weights the int8 copies replaced
        model.graph.initializer.remove(i)
    return folded


def _student(job: Job, config: QATConfig, fmt: str) -> tuple[nn.Module, list[float]]:
    if job.module is None:
        raise EdgebertError("QAT trains the PyTorch model: pass the nn.Module, not an exported file")
    arrays = need(job, "calibration", config)
    tflite = fmt == "tflite"
    act_range = (-128, 127) if tflite or config.target == "arm" else (0, 255)
    weight_max = 63 if (config.target == "x86" and not tflite) else 127  # reduce_range on non-VNNI x86
    student = prepare(job.module, act_range=act_range, weight_max=weight_max)
    return student, fine_tune(job.module, student, arrays, job.spec, config)


@register(QATConfig, "onnx", float_file=False)
def qat_onnx(job: Job, config: QATConfig) -> dict:
    student, losses = _student(job, config, "onnx")
    with tempfile.TemporaryDirectory(prefix="edgebert-qat-") as tmp:
        raw = export(student, OnnxExportConfig(optimize="none"), out=Path(tmp) / "qat.onnx", inputs=job.spec).path
        model = onnx.load(str(raw))
    folded = fold_weight_quantizers(model)
    tables = onnx_ptq.int8_embeddings(model, 1000) if config.int8_embeddings else []
    onnx.save(model, str(job.out))
    return {"method": "qat_qdq", "steps": config.train.steps, "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None, "int8_weights": folded, "int8_embeddings": tables}


@register(QATConfig, "tflite", float_file=False)
def qat_tflite(job: Job, config: QATConfig) -> dict:
    student, losses = _student(job, config, "tflite")
    with torch.no_grad():  # snap weights to their int8 grid, then drop the fake-quant wrappers
        for parent in list(student.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, FakeQuantLinear):
                    linear = nn.Linear(child.weight_t.shape[0], child.weight_t.shape[1], bias=child.bias is not None)
                    linear.weight.copy_(child.weight_fq().t())
                    if child.bias is not None:
                        linear.bias.copy_(child.bias)
                    setattr(parent, name, linear)
    with tempfile.TemporaryDirectory(prefix="edgebert-qat-") as tmp:
        data = export(student, TFLiteExportConfig(seq_lens=config.seq_lens), out=Path(tmp) / "qat.tflite",
                      inputs=job.spec).path.read_bytes()
    calibration = tflite_ptq.calibrate(data, need(job, "calibration", config), 256)
    job.out.write_bytes(tflite_ptq.static(data, calibration, static_kinds={"linear"}, embeddings=config.int8_embeddings))
    return {"method": "qat+static_wi8_ai8", "static": ["linear"], "steps": config.train.steps,
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
            "signatures": {f"seq_{t}": t for t in sorted(config.seq_lens)}}
