"""`edgebert bench` on this machine: the CLI, the table, the comparison report, bad input."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

from edgebert.bench import bench, load, recommended_threads, register, table, write_report
from edgebert.targets import BenchError


def _cli(*argv) -> None:
    parser = argparse.ArgumentParser(prog="edgebert")
    register(parser.add_subparsers())
    args = parser.parse_args(["bench", *map(str, argv)])
    args.run(args)


def test_cli_benches_a_bundle_and_writes_a_report(tiny, tmp_path, capsys):
    out = tmp_path / "results.json"
    _cli(tiny["bundle"], "--warmup", 1, "--runs", 5, "--json", out)
    printed = capsys.readouterr().out
    assert "model.onnx · onnxruntime · local" in printed and "model.tflite · litert · local" in printed
    report = json.loads(out.read_text())
    assert report["complete"] and len(report["runs"]) == 2
    page = (tmp_path / "results.html").read_text()
    assert "<svg" in page and "<script" not in page and "src=" not in page  # self-contained, offline
    assert "| model.onnx · onnxruntime · local |" in (tmp_path / "results.md").read_text()


def test_compare_labels_emulated_runs(tiny, tmp_path):
    native = bench(tiny["bundle"] / "model.onnx", warmup=1, runs=5, json_out=tmp_path / "a.json")["runs"][0]
    emulated = dict(native, emulated=True, target="qemu-aarch64:cortex-a72")
    (tmp_path / "b.json").write_text(json.dumps(emulated))
    runs = load([tmp_path / "a.json", tmp_path / "b.json"])
    text = table(runs)
    assert "emulated (qemu): not device latency" in text
    emulated_row = next(line for line in text.splitlines() if "qemu-aarch64" in line)
    assert emulated_row.count("*") >= 3
    md, page = write_report(runs, tmp_path / "cmp")
    assert "EMULATED (qemu)" in page.read_text() and md.exists()


def test_two_runs_in_one_folder_keep_their_own_reports(tiny, tmp_path, monkeypatch, capsys):
    native = bench(tiny["bundle"] / "model.onnx", warmup=1, runs=5, json_out=tmp_path / "a.json")["runs"][0]
    (tmp_path / "b.json").write_text(json.dumps(dict(native, target="ssh://pi@board")))
    monkeypatch.chdir(tmp_path)
    _cli("--compare", "a.json", "b.json")
    _cli("--compare", "b.json", "a.json")  # the same second, most likely: the name must still be new
    reports = sorted(tmp_path.glob("edgebert-bench-*.md"))
    assert len(reports) == 2 and len(list(tmp_path.glob("edgebert-bench-*.html"))) == 2
    rows = [[line.split("|")[1] for line in r.read_text().splitlines() if "model.onnx" in line] for r in reports]
    assert rows[0] == rows[1][::-1] and len(set(rows[0])) == 2  # each its own table, in its own order
    printed = capsys.readouterr().out
    assert all(f"comparison: {r.name}" in printed for r in reports)


def test_compare_refuses_incomplete_results(tmp_path):
    (tmp_path / "partial.json").write_text(json.dumps({"complete": False, "latency_ms": {}}))
    with pytest.raises(BenchError, match="incomplete result"):
        load([tmp_path / "partial.json"])


def test_bad_input_is_one_line(tiny, tmp_path):
    with pytest.raises(BenchError, match="unknown target 'gpu'"):
        bench(tiny["bundle"], target="gpu")
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny["bundle"], bundle)
    (bundle / "eval.npz").unlink()
    with pytest.raises(BenchError, match="no eval set .*--inputs"):
        bench(bundle)
    with pytest.raises(BenchError, match="does not exist"):
        bench(tmp_path / "nothing.onnx")
    with pytest.raises(BenchError, match="bad ssh target"):
        bench(tiny["bundle"], target="ssh://user@host:notaport")
    with pytest.raises(BenchError, match="unknown format 'coreml': use one of onnx, tflite"):
        bench(tiny["bundle"], fmt="coreml")
    with pytest.raises(BenchError, match="unknown backend 'tensorrt': use one of onnxruntime, litert, tflite-runtime"):
        bench(tiny["bundle"], backend="tensorrt")
    with pytest.raises(BenchError, match=r"is not a \.onnx or \.tflite"):
        bench(tiny["bundle"] / "eval.npz")


def test_the_qemu_sysroot_holds_each_runtime_with_a_wheel_for_it(tmp_path):
    """A runtime that joins the table (and can live in the sysroot) makes a cached sysroot stale."""
    import json

    from edgebert.targets.sysroot import WHEELS, Sysroot

    assert WHEELS == ("numpy", "onnxruntime", "ai-edge-litert")  # tflite-runtime needs numpy<2
    sysroot = Sysroot(tmp_path)
    assert not sysroot._current()
    sysroot.ready.write_text(json.dumps({"python": "3.11", "wheels": ["numpy==2.0", "onnxruntime==1.2"]}))
    assert not sysroot._current()
    sysroot.ready.write_text(json.dumps({"python": "3.11", "wheels": [f"{w}==1" for w in WHEELS]}))
    assert sysroot._current() and sysroot.ensure()["python"] == "3.11"


def _harness(*argv):
    """`python -m edgebert.device_tests run ...` in its own process: (exit code, stdout, stderr)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "edgebert.device_tests", "run", "--warmup", "1", "--runs", "3",
                           *map(str, argv)], capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def test_onnx_providers_pass_through_or_say_what_is_there(tiny, tmp_path):
    import onnxruntime as ort

    out = tmp_path / "r.json"
    code, _, err = _harness("--model", tiny["bundle"] / "model.onnx", "--inputs", tiny["bundle"] / "eval.npz",
                            "--provider", "cpu", "--json", out)
    assert code == 0, err
    runtime = json.loads(out.read_text())["runtime"]
    assert runtime["provider"] == "cpu" and runtime["providers"] == ["CPUExecutionProvider"]
    for name, provider in (("xnnpack", "XnnpackExecutionProvider"), ("nnapi", "NnapiExecutionProvider"),
                           ("coreml", "CoreMLExecutionProvider"), ("qnn", "QNNExecutionProvider")):
        code, _, err = _harness("--model", tiny["bundle"] / "model.onnx", "--inputs", tiny["bundle"] / "eval.npz",
                                "--provider", name, "--json", out)
        if provider in ort.get_available_providers():
            assert code == 0 and json.loads(out.read_text())["runtime"]["providers"][0] == provider
        else:
            assert code == 2 and err.strip().splitlines()[-1].startswith("device_tests: error: this onnxruntime")
            assert f"no {provider}; available here: cpu" in err and "Traceback" not in err


def test_litert_delegates(tiny, tmp_path):
    """XNNPACK is LiteRT's default delegate; `cpu` runs the built-in kernels without it (the delegate's
    own log line proves which ran); gpu/nnapi libraries are absent here and say so in one line."""
    results = {}
    for delegate in ("xnnpack", "cpu"):
        out = tmp_path / f"{delegate}.json"
        code, _, err = _harness("--model", tiny["int8"] / "model.tflite", "--inputs", tiny["bundle"] / "eval.npz",
                                "--delegate", delegate, "--logits", "--json", out)
        assert code == 0, err
        assert ("XNNPACK delegate" in err) == (delegate == "xnnpack")
        results[delegate] = json.loads(out.read_text())
        assert results[delegate]["runtime"]["delegate"] == delegate
    assert results["cpu"]["predictions"] == results["xnnpack"]["predictions"]
    for delegate in ("gpu", "nnapi"):
        code, _, err = _harness("--model", tiny["bundle"] / "model.tflite", "--inputs", tiny["bundle"] / "eval.npz",
                                "--delegate", delegate)
        assert code == 2 and "available here: cpu, xnnpack" in err and "Traceback" not in err
    code, _, err = _harness("--model", tiny["bundle"] / "model.onnx", "--inputs", tiny["bundle"] / "eval.npz",
                            "--delegate", "xnnpack")
    assert code == 2 and "for onnxruntime pass --provider" in err


def test_delegate_fit_of_the_tiny_files(tiny):
    from edgebert.device_tests.accelerators import fit

    fp32, int8 = fit(str(tiny["bundle"] / "model.tflite")), fit(str(tiny["int8"] / "model.tflite"))
    assert "hybrid" not in fp32["ops"] and int8["ops"]["hybrid"] > 0
    npu = int8["delegates"]["integer-npu"]
    assert not npu["whole"] and npu["blockers"]["FULLY_CONNECTED (hybrid)"] == 6  # 2 layers x 3 signatures
    assert "FULLY_CONNECTED (hybrid)" not in int8["delegates"]["xnnpack"]["blockers"]  # XNNPACK runs hybrid FC
    assert not any("hybrid" in b for b in fp32["delegates"]["integer-npu"]["blockers"])
    assert all(not d["whole"] for d in int8["delegates"].values())  # int32 index ops stay on the CPU


@pytest.mark.parametrize("p50, threads", [
    ({1: 0.84, 2: 0.92}, 1),  # the student at batch 1: a second thread is slower
    ({1: 1.00, 2: 0.95}, 1),  # 5% faster: not worth a core
    ({1: 1.00, 2: 0.60}, 2),
    ({1: 1.00, 2: 0.80, 4: 0.78}, 2),  # 4 threads beat 2 by less than a tenth
    ({1: 1.00, 2: 0.80, 4: 0.50}, 4),
    ({2: 0.5}, 2),  # one count measured: that one
])
def test_a_thread_more_is_recommended_where_it_cuts_the_median_by_a_tenth(p50, threads):
    assert recommended_threads(p50) == threads
