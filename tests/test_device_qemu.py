"""The qemu-aarch64 target end to end: a real aarch64 Python with aarch64 numpy, onnxruntime and
ai-edge-litert under user-mode emulation must reproduce the x86 results. The sysroot is built once
into the cache (EDGEBERT_CACHE, default ~/.cache/edgebert): tens of MB from Debian and PyPI."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from edgebert.bench import bench
from edgebert.targets import BenchError, Qemu

pytestmark = pytest.mark.skipif(not (shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")),
                                reason="qemu-user-static not installed (apt-get install qemu-user-static; "
                                       ".ci/setup-system)")


def _by_file(report: dict) -> dict:
    return {r["model"]["file"]: r for r in report["runs"]}


def test_emulated_arm_matches_x86(tiny):
    """FP32 logits within 1e-4 (ONNX and TFLite) and INT8 TFLite predictions identical."""
    settings = {"logits": True, "warmup": 1, "runs": 3}
    x86 = _by_file(bench(tiny["bundle"], **settings))
    arm = _by_file(bench(tiny["bundle"], target="qemu-aarch64:cortex-a72", **settings))
    for name in ("model.onnx", "model.tflite"):
        a, x = arm[name], x86[name]
        assert a["complete"] and a["emulated"] and "emulated run: timings are not device latency" in a["warnings"]
        assert a["device"]["architecture"] == "aarch64" and a["device"]["cpu_model"].endswith("Cortex-A72")
        assert "NEON" in a["device"]["isa_features"]
        np.testing.assert_allclose(a["logits"], x["logits"], atol=1e-4)
        assert a["predictions"] == x["predictions"] and a["accuracy"] == x["accuracy"]
    int8_x86 = bench(tiny["int8"], **settings)["runs"][0]
    int8_arm = bench(tiny["int8"], target="qemu-aarch64:cortex-a76", **settings)["runs"][0]
    assert int8_arm["device"]["cpu_model"].endswith("Cortex-A76") and "dotprod" in int8_arm["device"]["isa_features"]
    assert int8_arm["predictions"] == int8_x86["predictions"]
    assert int8_x86["model"]["bytes"] < arm["model.tflite"]["model"]["bytes"]  # it really is quantized
    np.testing.assert_allclose(int8_x86["logits"], x86["model.tflite"]["logits"], atol=0.1)


def test_qemu_refuses_max_and_unknown_cpus():
    with pytest.raises(BenchError, match="wrong INT8 results"):
        Qemu("max")
    with pytest.raises(BenchError, match="unknown qemu cpu 'cortex-a99'"):
        Qemu("cortex-a99")
