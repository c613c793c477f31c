"""The tiny device models (ONNX, multi-signature TFLite and its INT8 twin) the device and bench tests
run, with the numpy reference they must reproduce. Built once per session by conftest's `tiny`."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

NAMES = ("input_ids", "attention_mask", "token_type_ids")
VOCAB, DIM, LENGTHS = 200, 64, (16, 32, 64)


def tiny_module():
    import torch

    class Tiny(torch.nn.Module):
        """Embedding + masked mean pool + MLP: enough weights for dynamic INT8 to quantize."""

        def __init__(self):
            super().__init__()
            self.emb, self.typ = torch.nn.Embedding(VOCAB, DIM), torch.nn.Embedding(2, DIM)
            self.hidden, self.out = torch.nn.Linear(DIM, DIM), torch.nn.Linear(DIM, 2)

        def forward(self, input_ids, attention_mask, token_type_ids):
            h = self.emb(input_ids) + self.typ(token_type_ids)
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
            return self.out(torch.relu(self.hidden(pooled)))

    torch.manual_seed(0)
    return Tiny().eval()


def reference_logits(module, data) -> np.ndarray:
    """The tiny model's logits computed in numpy from its weights, at each example's true length."""
    w = {k: v.detach().numpy().astype(np.float64) for k, v in module.state_dict().items()}
    out = []
    for ids, tt, n in zip(data["input_ids"], data["token_type_ids"], data["lengths"]):
        pooled = (w["emb.weight"][ids[:n]] + w["typ.weight"][tt[:n]]).mean(0)
        hidden = np.maximum(w["hidden.weight"] @ pooled + w["hidden.bias"], 0)
        out.append(w["out.weight"] @ hidden + w["out.bias"])
    return np.array(out)


def write_eval(path: Path, n=24, t=48, seed=0, labels=True) -> dict:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, t + 1, n).astype(np.int32)
    data = {k: np.zeros((n, t), np.int32) for k in NAMES}
    for i, length in enumerate(lengths):
        data["input_ids"][i, :length] = rng.integers(1, VOCAB, length)
        data["attention_mask"][i, :length] = 1
        data["token_type_ids"][i, length // 2:length] = 1
    data["lengths"] = lengths
    if labels:
        data["labels"] = rng.integers(0, 2, n).astype(np.int64)
    np.savez(path, **data)
    return data


def write_manifest(folder: Path) -> None:
    files = {p.name: {"sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "bytes": p.stat().st_size}
             for p in sorted(folder.iterdir()) if p.name != "manifest.json"}
    (folder / "manifest.json").write_text(json.dumps({"files": files}))


def write_onnx(module, path: Path) -> Path:
    """The tiny model as ONNX with dynamic batch and sequence axes (TorchScript exporter, opset 17)."""
    import torch

    sample = tuple(torch.ones(1, 8, dtype=torch.long) for _ in NAMES)
    torch.onnx.export(module, sample, str(path), input_names=list(NAMES), output_names=["logits"],
                      dynamic_axes={k: {0: "batch", 1: "seq"} for k in NAMES}, opset_version=17, dynamo=False)
    return path


def build(folder: Path) -> dict:
    """bundle/ (model.onnx, model.tflite with seq_16/32/64 signatures, eval.npz, manifest.json) and
    int8/ (the TFLite quantized with ai-edge-quantizer dynamic_wi8_afp32)."""
    import litert_torch
    import torch
    from ai_edge_quantizer import quantizer, recipe

    module = tiny_module()
    bundle, int8 = folder / "bundle", folder / "int8"
    bundle.mkdir(parents=True)
    int8.mkdir()
    write_onnx(module, bundle / "model.onnx")
    converter = None
    for t in LENGTHS:
        kwargs = {k: torch.ones(1, t, dtype=torch.int32) for k in NAMES}
        converter = (litert_torch.signature if converter is None else converter.signature)(
            f"seq_{t}", module, sample_kwargs=kwargs)
    converter.convert().export(str(bundle / "model.tflite"))
    q = quantizer.Quantizer(str(bundle / "model.tflite"))
    q.load_quantization_recipe(recipe.dynamic_wi8_afp32())
    (int8 / "model.tflite").write_bytes(q.quantize().quantized_model)
    data = write_eval(bundle / "eval.npz")
    shutil.copy(bundle / "eval.npz", int8 / "eval.npz")
    write_manifest(bundle)
    np.save(folder / "reference.npy", reference_logits(module, data))
    (folder / "done").touch()
    return paths(folder)


def paths(folder: Path) -> dict:
    """The built files, the reference logits, and the accuracy the harness must report for them."""
    reference = np.load(folder / "reference.npy")
    labels = np.load(folder / "bundle" / "eval.npz")["labels"]
    return {"bundle": folder / "bundle", "int8": folder / "int8", "reference": reference,
            "accuracy": float((reference.argmax(1) == labels).mean())}
