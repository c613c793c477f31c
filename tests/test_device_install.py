"""The device install as a user on a board gets it: a fresh venv with `pip install "edgebert[device]"`
(the working tree, not editable) holds numpy and onnxruntime but no torch or transformers, stays small,
scores a bundle correctly, says what it can do, and warns when a model is not the bundle's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_models import reference_logits, tiny_module, write_eval, write_manifest, write_onnx

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "edgebert", "export", "quantize", "device_tests")  # what setuptools packs
LIMIT_MB = 300


def _run(cmd, cwd, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, env=env, timeout=600,
                          check=False, **kw)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv with only the device extra, installed from a copy of the working tree (so no stale
    build/ folder of the checkout leaks into it)."""
    root = tmp_path_factory.mktemp("device-install")
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, root / "src" / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            (root / "src").mkdir(exist_ok=True)
            shutil.copy(src, root / "src" / name)
    made = _run([sys.executable, "-m", "venv", root / "venv"], cwd=root)
    assert made.returncode == 0, made.stderr
    pip = _run([root / "venv" / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile",
                "--disable-pip-version-check", f"{root / 'src'}[device]"], cwd=root)
    assert pip.returncode == 0, pip.stderr[-3000:]
    return root / "venv"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> dict:
    """A bundle folder (model.onnx, eval.npz, manifest.json) built with this host's torch, and the numpy
    reference logits of its model."""
    folder = tmp_path_factory.mktemp("device-bundle")
    module = tiny_module()
    write_onnx(module, folder / "model.onnx")
    data = write_eval(folder / "eval.npz")
    write_manifest(folder)
    return {"folder": folder, "reference": reference_logits(module, data), "labels": data["labels"]}


def _harness(venv: Path, model: Path, inputs: Path, out: Path) -> subprocess.CompletedProcess:
    return _run([venv / "bin" / "python", "-m", "edgebert.device_tests", "run", "--model", model, "--inputs", inputs,
                 "--json", out, "--logits", "--warmup", 1, "--runs", 5], cwd=out.parent)


def test_no_torch_or_transformers_and_small(venv):
    found = _run([venv / "bin" / "python", "-c", "import importlib.util as u; "
                  "print([m for m in ('torch', 'transformers', 'numpy', 'onnxruntime') if u.find_spec(m)])"], cwd=venv)
    assert json.loads(found.stdout.replace("'", '"')) == ["numpy", "onnxruntime"], found.stderr
    size = sum(p.stat().st_size for p in venv.rglob("*") if p.is_file() and not p.is_symlink())
    assert size < LIMIT_MB * 2**20, f"device venv is {size / 2**20:.0f} MB"


def test_device_install_scores_a_bundle(venv, bundle, tmp_path):
    proc = _harness(venv, bundle["folder"] / "model.onnx", bundle["folder"] / "eval.npz", tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["model"]["manifest_verified"] and r["warnings"] == []
    reference = bundle["reference"]
    np.testing.assert_allclose(np.array(r["logits"]), reference, atol=1e-4)
    assert r["accuracy"] == pytest.approx(float((reference.argmax(1) == bundle["labels"]).mean()))


def test_edgebert_says_what_the_device_install_does(venv):
    helped = _run([venv / "bin" / "edgebert", "--help"], cwd=venv)
    assert helped.returncode == 0 and "python -m edgebert.device_tests run" in helped.stdout
    assert "host install" in helped.stdout and "torch==2.13.0" in helped.stdout
    verb = _run([venv / "bin" / "edgebert", "bench", "model.onnx"], cwd=venv)
    assert verb.returncode == 2 and "Traceback" not in verb.stderr and "No module named" not in verb.stderr
    assert "device install" in verb.stderr and "missing here: torch, transformers" in verb.stderr


def test_a_file_the_manifest_does_not_hold_runs_with_a_warning(venv, bundle, tmp_path):
    import torch

    folder = bundle["folder"]
    other = tiny_module()
    with torch.no_grad():
        other.out.bias += 5.0  # a tampered model: different outputs under a name the manifest does not list
    write_onnx(other, folder / "tampered.onnx")
    shutil.copy(folder / "model.onnx", folder / "renamed.onnx")
    try:
        proc = _harness(venv, folder / "tampered.onnx", folder / "eval.npz", tmp_path / "t.json")
        assert proc.returncode == 0, proc.stderr
        r = json.loads((tmp_path / "t.json").read_text())
        assert not r["model"]["manifest_verified"] and "does not list it" in r["warnings"][0]
        assert "device_tests: warning: tampered.onnx is unverified" in proc.stderr

        proc = _harness(venv, folder / "renamed.onnx", folder / "eval.npz", tmp_path / "n.json")
        r = json.loads((tmp_path / "n.json").read_text())
        assert r["model"]["manifest_verified"] and r["model"]["listed_as"] == "model.onnx" and not r["warnings"]
    finally:
        (folder / "tampered.onnx").unlink()
        (folder / "renamed.onnx").unlink()

    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(folder / "model.onnx", alone / "model.onnx")
    proc = _harness(venv, alone / "model.onnx", folder / "eval.npz", tmp_path / "a.json")
    r = json.loads((tmp_path / "a.json").read_text())
    assert r["model"]["manifest"] is None and "no manifest.json beside it" in r["warnings"][0]
    assert "device_tests: warning:" in proc.stderr
