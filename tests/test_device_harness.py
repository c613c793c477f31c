"""The on-device harness run locally on real ONNX and TFLite models, and its failure modes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import importlib

import numpy as np
import pytest
from tiny_models import LENGTHS, write_eval

from edgebert.device_tests import HarnessError, backends, runtimes

ROOT = Path(__file__).resolve().parent.parent


def harness(*args, env=None, cwd=None) -> subprocess.CompletedProcess:
    """`python -m device_tests ...` in a subprocess, one thread, as on a device."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "device_tests", *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=cwd or ROOT, timeout=300, check=False)


def run_ok(model, inputs, out, *extra) -> dict:
    proc = harness("run", "--model", model, "--inputs", inputs, "--json", out, "--warmup", 2, "--runs", 20, *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(Path(out).read_text())


def run_error(*args, **kw) -> str:
    """The one error line of a failing run; fails the test on a traceback or a written result."""
    proc = harness(*args, **kw)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("device_tests: error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("name", ["model.onnx", "model.tflite"])
def test_local_run_measures_and_scores(tiny, tmp_path, name):
    bundle = tiny["bundle"]
    r = run_ok(bundle / name, bundle / "eval.npz", tmp_path / "r.json", "--logits")
    assert r["complete"] is True and r["emulated"] is False
    assert set(r["latency_ms"]) == {"min", "p50", "p90", "p99", "max", "mean", "std"}
    lat = r["latency_ms"]
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert r["settings"]["runs"] == 20 and r["throughput"] > 0 and r["peak_rss_mb"] > 0
    assert r["load_ms"] > 0 and r["first_inference_ms"] > 0
    assert r["model"]["sha256"] == hashlib.sha256((bundle / name).read_bytes()).hexdigest()
    assert r["model"]["manifest_verified"] is True
    dev = r["device"]
    assert dev["architecture"] and dev["cores"] >= 1 and isinstance(dev["isa_features"], list)
    assert r["runtime"]["backend"] == ("onnxruntime" if name.endswith("onnx") else "litert")
    ref = tiny["reference"]
    np.testing.assert_allclose(np.array(r["logits"]), ref, atol=1e-4)
    labels = np.load(bundle / "eval.npz")["labels"]
    assert r["n_examples"] == len(labels)
    assert r["predictions"] == ref.argmax(1).tolist()
    assert r["accuracy"] == pytest.approx(float((ref.argmax(1) == labels).mean()))


def test_tflite_picks_smallest_signature_and_matches_unpadded(tiny, tmp_path):
    bundle = tiny["bundle"]
    onnx = run_ok(bundle / "model.onnx", bundle / "eval.npz", tmp_path / "o.json", "--logits")
    lite = run_ok(bundle / "model.tflite", bundle / "eval.npz", tmp_path / "t.json", "--logits")
    lengths = np.load(bundle / "eval.npz")["lengths"]
    expected = {f"seq_{min(t for t in LENGTHS if t >= n)}" for n in lengths}
    assert lite["signatures_used"] == sorted(expected)
    np.testing.assert_allclose(lite["logits"], onnx["logits"], atol=1e-5)


def test_pad_to_and_batch(tiny, tmp_path):
    bundle = tiny["bundle"]
    r = run_ok(bundle / "model.onnx", bundle / "eval.npz", tmp_path / "r.json", "--pad-to", 64, "--batch", 4,
               "--logits")
    assert r["settings"]["batch"] == 4 and r["settings"]["pad_to"] == 64
    np.testing.assert_allclose(r["logits"], tiny["reference"], atol=1e-4)
    lite = run_ok(bundle / "model.tflite", bundle / "eval.npz", tmp_path / "t.json", "--pad-to", 64)
    assert lite["signatures_used"] == ["seq_64"]


def test_duration_mode(tiny, tmp_path):
    bundle = tiny["bundle"]
    r = run_ok(bundle / "model.onnx", bundle / "eval.npz", tmp_path / "r.json", "--duration", 0.5)
    assert r["settings"]["duration_s"] == 0.5 and r["settings"]["runs"] > 1


def test_too_long_for_signatures_fails_unless_truncate(tiny, tmp_path):
    data = write_eval(tmp_path / "long.npz", n=6, t=80, seed=3)
    assert data["lengths"].max() > 64
    model = tiny["bundle"] / "model.tflite"
    line = run_error("run", "--model", model, "--inputs", tmp_path / "long.npz", "--manifest",
                     tiny["bundle"] / "manifest.json", "--json", tmp_path / "r.json")
    assert "longest signature (64 tokens)" in line and "--truncate" in line
    assert not (tmp_path / "r.json").exists()
    r = run_ok(model, tmp_path / "long.npz", tmp_path / "r.json", "--truncate")
    assert r["complete"] and any("truncated" in w for w in r["warnings"])


def test_manifest_mismatch_is_one_line(tiny, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny["bundle"], bundle)
    data = bytearray((bundle / "model.onnx").read_bytes())
    data[-1] ^= 1
    (bundle / "model.onnx").write_bytes(bytes(data))
    line = run_error("run", "--model", bundle / "model.onnx", "--inputs", bundle / "eval.npz",
                     "--json", tmp_path / "r.json")
    assert "sha256" in line and "does not match the manifest" in line
    assert not (tmp_path / "r.json").exists()


def test_missing_runtime_is_one_line(tiny, tmp_path):
    bundle = tiny["bundle"]
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "onnxruntime.py").write_text("raise ImportError('onnxruntime is not installed here')\n")
    line = run_error("run", "--model", bundle / "model.onnx", "--inputs", bundle / "eval.npz",
                     env={"PYTHONPATH": f"{blocker}{os.pathsep}{ROOT}"})
    assert "onnxruntime cannot be imported" in line and "pip install onnxruntime" in line


@pytest.mark.parametrize("broken, message", [
    ({"drop": "lengths"}, "lacks lengths"),
    ({"lengths": 999}, "lengths must be"),
    ({"labels_shape": True}, "labels has shape"),
])
def test_bad_eval_set_is_one_line(tiny, tmp_path, broken, message):
    data = dict(np.load(tiny["bundle"] / "eval.npz"))
    if "drop" in broken:
        del data[broken["drop"]]
    if "lengths" in broken:
        data["lengths"][0] = broken["lengths"]
    if "labels_shape" in broken:
        data["labels"] = data["labels"][:-1]
    np.savez(tmp_path / "bad.npz", **data)
    line = run_error("run", "--model", tiny["bundle"] / "model.onnx", "--inputs", tmp_path / "bad.npz")
    assert message in line


def test_timeout_is_one_line(tiny):
    bundle = tiny["bundle"]
    line = run_error("run", "--model", bundle / "model.onnx", "--inputs", bundle / "eval.npz",
                     "--duration", 30, "--timeout", 1)
    assert "timed out after 1 s during timed runs" in line


def test_probe_reports_runtimes():
    proc = harness("probe", "--backends", "onnxruntime,litert")
    report = json.loads(proc.stdout)
    assert report["found"]["numpy"] and report["found"]["onnxruntime"] and report["found"]["litert"]
    everything = json.loads(harness("probe").stdout)["found"]
    assert list(everything) == ["numpy", *runtimes.RUNTIMES]
    line = run_error("probe", "--backends", "onnxruntime,coreml")
    assert "unknown backend 'coreml': use one of onnxruntime, litert, tflite-runtime" in line


def test_each_runtime_entry_names_a_model_class_and_formats_name_their_runtime():
    from edgebert.export import formats

    for runtime in runtimes.RUNTIMES.values():
        module, _, name = runtime.model.partition(":")
        assert issubclass(getattr(importlib.import_module(f"edgebert.device_tests.{module}"), name), backends.Model)
    for fmt in formats.all_formats():  # a format built from another's file (model.text.onnx) has no method of its own
        assert runtimes.get(fmt.runtime).suffix == fmt.suffix
        assert fmt.quantize_methods[-1] == "none" if fmt.source is None else fmt.quantize_methods == ()


def test_the_runtime_for_a_file_is_the_first_there_for_its_suffix():
    assert runtimes.choose("m.tflite").name == "litert"
    assert runtimes.choose("m.tflite", lambda r: r.name == "tflite-runtime").name == "tflite-runtime"
    assert runtimes.choose("m.tflite", lambda r: False).name == "litert"  # whose load names the pip package
    assert runtimes.formats().items() >= {"onnx": ".onnx", "tflite": ".tflite"}.items()
    with pytest.raises(HarnessError, match=r"cannot tell the backend from m\.bin: pass a \.onnx or \.tflite"):
        runtimes.choose("m.bin")
    with pytest.raises(HarnessError, match="one suffix per format"):
        runtimes.register(runtimes.Runtime(name="ort-format", format="onnx", suffix=".ort", module="onnxruntime",
                                           package="onnxruntime", model="backends:Onnx"))
    assert "ort-format" not in runtimes.RUNTIMES


def test_a_flag_for_another_runtime_is_one_line(tiny):
    with pytest.raises(HarnessError, match="--provider cpu is for onnxruntime, onnxruntime-extensions: for litert pass "
                                           "--delegate"):
        backends.load(str(tiny["bundle"] / "model.tflite"), "litert", 1, provider="cpu")


FORBIDDEN = {"torch", "transformers", "edgebert", "export", "quantize", "tensorflow"}


@pytest.mark.parametrize("name", ["model.onnx", "model.tflite"])
def test_harness_runs_with_forbidden_modules_blocked(tiny, tmp_path, name):
    """Dynamic check: a full run with torch, transformers and edgebert made unimportable."""
    hook = tmp_path / "sitecustomize.py"
    hook.write_text(
        "import sys\n"
        f"FORBIDDEN = {sorted(FORBIDDEN)!r}\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in FORBIDDEN:\n"
        "            print('FORBIDDEN IMPORT', name, file=sys.stderr)\n"
        "            raise ImportError('forbidden on a device: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n")
    bundle = tiny["bundle"]
    proc = harness("run", "--model", bundle / name, "--inputs", bundle / "eval.npz", "--runs", 5,
                   "--json", tmp_path / "r.json", env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    assert proc.returncode == 0, proc.stderr
    assert "FORBIDDEN IMPORT" not in proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["complete"] is True
