"""The app bundle: complete, reproducible, verified, and never half-written."""

import errno
import html
import json
import re
import shutil
import subprocess
import zipfile
from collections import Counter

import numpy as np
import onnx
import pytest
import torch

from edgebert import EdgebertError, EncoderConfig, HeadConfig, build
from edgebert.export import OnnxExportConfig, export
from edgebert.pipeline.bundle import read_bundle, verify_bundle, write_bundle
from edgebert.pipeline.report import optimal

pytest.importorskip("onnx", reason="onnx is not installed (pip install 'edgebert[convert]')")

LABELS = ["negative", "positive"]
STAGES = [{"name": "finetune", "params": {"epochs": 3, "lr": 5e-5}, "bytes": 90_000_000, "flops": 1_400_000_000,
           "metrics": {"accuracy": 0.913}, "wall_s": 812.5},
          {"name": "quantize", "params": {"scheme": "static-int8"}, "bytes": 23_000_000, "metrics": {"accuracy": 0.908}}]
POINTS = [{"stage": "finetune", "format": "onnx", "latency_ms": 9.5, "metric": 91.3, "bytes": 90_000_000},
          {"stage": "quantize", "format": "onnx", "latency_ms": 4.1, "metric": 90.8, "bytes": 23_000_000},
          {"stage": "quantize", "format": "tflite", "latency_ms": 5.0, "metric": 90.1, "bytes": 24_000_000}]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_tokenizer):
    """A tiny classifier exported to ONNX, its tokenizer folder, and a tokenized eval set."""
    torch.manual_seed(0)
    model = build(EncoderConfig(vocab_size=len(tiny_tokenizer), hidden_size=16, num_layers=1, num_heads=2,
                                intermediate_size=32, max_positions=32), HeadConfig(num_labels=2, labels=LABELS))
    folder = tmp_path_factory.mktemp("bundle_inputs")
    onnx = export(model, OnnxExportConfig(optimize="none"), out=folder / "model.onnx").path
    tokenizer_dir = folder / "tokenizer"
    tiny_tokenizer.save_pretrained(tokenizer_dir)
    enc = tiny_tokenizer(["the cat sat on the mat .", "playing", "cats sat"], padding="max_length", max_length=12)
    arrays = {k: np.array(enc[k]) for k in ("input_ids", "attention_mask", "token_type_ids")}
    arrays["lengths"] = arrays["attention_mask"].sum(1)
    arrays["labels"] = np.array([1, 0, 1])
    return {"models": {"model.onnx": onnx}, "tokenizer_dir": tokenizer_dir, "labels": LABELS, "eval_arrays": arrays,
            "manifest": {"task": "sst2", "quantization": {"scheme": "dynamic-int8"}, "stages": STAGES},
            "report_points": POINTS}


def _leftovers(parent, keep=()):
    return sorted(p.name for p in parent.iterdir() if p.name not in keep)


def test_bundle_holds_everything_an_app_needs(inputs, tmp_path):
    out = write_bundle(tmp_path / "b", **inputs)
    names = {p.name for p in out.iterdir()}
    assert {"model.onnx", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "labels.txt", "eval.npz",
            "golden.json", "report.html", "manifest.json"} <= names
    assert _leftovers(tmp_path) == ["b"]  # no temporary folder left beside it
    manifest = verify_bundle(out)
    assert set(manifest["files"]) == names - {"manifest.json"}
    assert (out / "labels.txt").read_text() == "negative\npositive\n"
    with np.load(out / "eval.npz") as f:
        assert {k: str(f[k].dtype) for k in f.files} == {"input_ids": "int32", "attention_mask": "int32",
                                                          "token_type_ids": "int32", "lengths": "int32",
                                                          "labels": "int64"}
        assert f["lengths"].tolist() == [9, 4, 5]
    contract = manifest["inputs"]
    assert contract["names"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert contract["files"]["model.onnx"]["inputs"]["input_ids"] == {"dtype": "int64", "shape": ["batch", "sequence"]}
    graph = onnx.load(str(out / "model.onnx")).graph  # the ops as shipped, counted, with their domain
    counted = Counter(f"{n.domain}.{n.op_type}" if n.domain else n.op_type for n in graph.node)
    assert contract["files"]["model.onnx"]["ops"] == dict(counted) and sum(counted.values()) == len(graph.node)
    ops = ", ".join(f"{op} ×{n}" for op, n in sorted(counted.items()))
    assert f"<td>{html.escape(ops)}</td>" in (out / "report.html").read_text()
    assert contract["tokenizer"]["lowercase"]
    assert contract["tokenizer"]["special_tokens"]["cls"] == {"token": "[CLS]", "id": 2}
    assert contract["max_length"] == 32  # no TFLite file: the model's positions
    assert [s["name"] for s in manifest["stages"]] == ["finetune", "quantize"]
    assert manifest["stages"][1]["flops"] is None and manifest["stages"][1]["wall_s"] is None
    assert {"python", "edgebert", "torch", "onnx"} <= set(manifest["versions"])
    assert "no model.tflite" in manifest["mediapipe"]["skipped"]  # nothing to derive a MediaPipe file from
    golden = json.loads((out / "golden.json").read_text())  # each model file's outputs on the 3 eval examples
    assert manifest["golden"]["file"] == "golden.json" and list(manifest["golden"]["files"]) == ["model.onnx"]
    assert sorted(manifest["golden"]["examples"]) == [0, 1, 2] and len(golden["files"]["model.onnx"]["outputs"]) == 3
    assert read_bundle(out)["quantization"] == {"scheme": "dynamic-int8"}


def test_same_inputs_give_byte_identical_files(inputs, tmp_path):
    a = read_bundle(write_bundle(tmp_path / "a", **inputs))
    b = read_bundle(write_bundle(tmp_path / "b", **inputs))
    assert a["files"] == b["files"]
    assert {k: v for k, v in a.items() if k != "created"} == {k: v for k, v in b.items() if k != "created"}


def test_existing_bundle_is_replaced_only_with_force(inputs, tmp_path):
    out = write_bundle(tmp_path / "b", **inputs)
    with pytest.raises(EdgebertError, match="already exists"):
        write_bundle(out, **inputs)
    write_bundle(out, **{**inputs, "labels": ["neg", "pos"]}, force=True)
    assert (out / "labels.txt").read_text() == "neg\npos\n"
    assert _leftovers(tmp_path) == ["b"]


def test_bad_input_writes_nothing(inputs, tmp_path):
    cases = [({"models": {"model.onnx": tmp_path / "missing.onnx"}}, "does not exist"),
             ({"models": {"../model.onnx": inputs["models"]["model.onnx"]}}, "plain file name"),
             ({"labels": ["a", "a"]}, "name 'a' twice"),
             ({"manifest": {"files": {}}}, "computed by write_bundle"),
             ({"manifest": {"stages": [{"params": {}}]}}, "with a name"),
             ({"report_points": [{"stage": "x", "format": "onnx", "latency_ms": 0, "metric": 1, "bytes": 1}]},
              "latency_ms > 0"),
             ({"eval_arrays": {"input_ids": np.zeros((2, 4))}}, "lacks columns"),
             ({"max_length": 64}, "exceeds the model's 32 positions"),
             ({"mediapipe": True}, "needs a models entry 'model.tflite'")]
    for change, message in cases:
        with pytest.raises(EdgebertError, match=message) as e:
            write_bundle(tmp_path / "b", **{**inputs, **change})
        assert "\n" not in str(e.value)
        assert _leftovers(tmp_path) == []


def test_failure_mid_write_leaves_nothing_and_keeps_the_old_bundle(inputs, tmp_path, monkeypatch):
    out = write_bundle(tmp_path / "b", **inputs)
    before = read_bundle(out)["files"]
    calls = []

    def full_disk(src, dst, *a, **k):
        calls.append(dst)
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    monkeypatch.setattr(shutil, "copyfile", full_disk)
    for target in (tmp_path / "new", out):
        with pytest.raises(EdgebertError, match="no space left") as e:
            write_bundle(target, **inputs, force=True)
        assert "\n" not in str(e.value)
    assert calls and _leftovers(tmp_path) == ["b"]
    assert verify_bundle(out)["files"] == before

    monkeypatch.undo()
    monkeypatch.setattr("edgebert.pipeline.report.render", lambda *a: 1 / 0)  # any error, after most files are written
    with pytest.raises(ZeroDivisionError):
        write_bundle(tmp_path / "new", **inputs)
    assert _leftovers(tmp_path) == ["b"]


def test_full_disk_leaves_nothing(inputs, tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True,
                      check=False).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root); the monkeypatched ENOSPC test covers this")
    try:
        with pytest.raises(EdgebertError, match="no space left"):
            write_bundle(mount / "b", **inputs)
        assert _leftovers(mount) == []
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_tampering_is_detected(inputs, tmp_path):
    out = write_bundle(tmp_path / "b", **inputs)
    labels = out / "labels.txt"
    labels.write_text("negative\npositivE\n")  # same size, different bytes
    with pytest.raises(EdgebertError, match="labels.txt sha256 differs"):
        verify_bundle(out)
    with pytest.raises(EdgebertError, match="labels.txt sha256 differs"):
        read_bundle(out)
    assert read_bundle(out, verify=False)["labels"] == LABELS
    labels.write_text("negative\npositive\n")
    with open(out / "model.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(EdgebertError, match="model.onnx is .* bytes, the manifest says"):
        verify_bundle(out)
    from edgebert.device_tests import HarnessError
    from edgebert.device_tests.files import sha256
    from edgebert.device_tests.manifest import verify

    with pytest.raises(HarnessError, match="truncated or stale"):  # the on-device harness reads the same manifest
        verify(str(out / "manifest.json"), str(out / "model.onnx"), sha256(str(out / "model.onnx")))
    (out / "model.onnx").unlink()
    with pytest.raises(EdgebertError, match="lacks model.onnx"):
        verify_bundle(out)
    (out / "manifest.json").write_text("{")
    with pytest.raises(EdgebertError, match="not a bundle manifest"):
        verify_bundle(out)


def test_report_is_self_contained_with_table_and_chart(inputs, tmp_path):
    out = write_bundle(tmp_path / "b", **inputs)
    html = (out / "report.html").read_text()
    assert "<table" in html and "<svg" in html and "</svg>" in html
    assert "<td>finetune</td>" in html and "epochs=3" in html and ">91.30<" in html  # metrics in points
    assert all(f"{p['stage']} · {p['format']}: {p['metric']:.2f}" in html for p in POINTS)  # one legend entry each
    assert "<script" not in html and "src=" not in html
    assert {link[0] for link in re.findall(r'href="(.)', html)} <= {"#"}  # links only inside its own SVGs
    assert "812.5" not in html  # wall time varies between runs; it lives in manifest.json only
    assert json.loads((out / "manifest.json").read_text())["pareto"][0]["metric_name"] == "accuracy"
    with zipfile.ZipFile(out / "eval.npz") as zf:
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_pareto_front():
    assert optimal(POINTS) == [True, True, False]  # the tflite point is slower, less accurate and larger
    assert optimal(POINTS[:1] * 2) == [True, True]  # ties do not dominate
