"""`edgebert bench` on this machine: the CLI, the table, the comparison report, bad input."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

from edgebert.bench import bench, load, register, table, write_report
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
