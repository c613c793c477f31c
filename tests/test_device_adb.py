"""The adb target against a fake `adb` on PATH that runs push/pull/shell locally under a fake
/data/local/tmp, so the real command lines and the benchmark_model parsing are exercised."""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
import pytest

from edgebert.bench import bench
from edgebert.targets import BenchError, parse_benchmark_model

FAKE_ADB = r'''#!PYTHON
"""A fake adb: -s SERIAL, push, pull and shell, with /data/local/tmp mapped under $FAKE_ADB_ROOT."""
import os, shutil, subprocess, sys
root, args = os.environ["FAKE_ADB_ROOT"], sys.argv[1:]
with open(os.path.join(root, "adb.log"), "a") as log:
    log.write(" ".join(args) + "\n")
if args[0] == "-s":
    if args[1] != os.environ.get("FAKE_ADB_SERIAL"):
        sys.exit(f"adb: device '{args[1]}' not found")
    args = args[2:]
local = lambda p: p.replace("/data/local/tmp", root + "/data/local/tmp")
if args[0] == "push":
    src, dst = args[1], local(args[2])
    if dst.endswith("/"):
        dst = os.path.join(dst, os.path.basename(src.rstrip("/")))
    (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, dst)
elif args[0] == "pull":
    shutil.copy(local(args[1]), args[2])
elif args[0] == "shell":
    sys.exit(subprocess.run(["sh", "-c", local(args[1])]).returncode)
'''

FAKE_BENCHMARK_MODEL = r'''#!/bin/sh
echo "$@" > "$(dirname "$0")/benchmark_model.args"
cat <<'LOG'
INFO: STARTING!
INFO: Num threads: [1]
INFO: Created TensorFlow Lite XNNPACK delegate for CPU.
INFO: Initialized session in 3.2ms.
INFO: Running benchmark for at least 1 iterations and at least 0.5 seconds but terminate if exceeding 150 seconds.
INFO: count=4123 first=112 curr=98 min=95 max=412 avg=101.3 std=12 p5=96 median=99 p95=110

INFO: Running benchmark for at least 50 iterations and at least 1 seconds but terminate if exceeding 150 seconds.
INFO: count=9876 first=101 curr=99 min=94 max=388 avg=100.2 std=10 p5=95 median=99.5 p95=108

INFO: Inference timings in us: Init: 3200, First inference: 112, Warmup (avg): 101.3, Inference (avg): 100.2
INFO: Memory footprint delta from the start of the tool (MB): init=2.5 overall=3.1
INFO: Overall peak memory footprint (MB) via periodic monitoring: 9.8
LOG
case "$*" in *--enable_op_profiling=true*) cat <<'LOG'
Profiling Info for Benchmark Initialization:
============================== Summary by node type ==============================
	             [Node type]	  [count]	  [avg ms]	    [avg %]	    [cdf %]	  [mem KB]	[times called]
	 ModifyGraphWithDelegate	        1	     2.000	   100.000%	   100.000%	     0.000	        1

Operator-wise Profiling Info for Regular Benchmark Runs:
============================== Summary by node type ==============================
	             [Node type]	  [count]	  [avg ms]	    [avg %]	    [cdf %]	  [mem KB]	[times called]
	                 EMBEDDING_LOOKUP	        2	     0.010	    10.000%	    10.000%	     0.000	        2
	 TfLiteXNNPackDelegate	        1	     0.080	    80.000%	    90.000%	     0.000	        1
	                 RESHAPE	        3	     0.010	    10.000%	   100.000%	     0.000	        3

Timings (microseconds): count=50 first=101 curr=99 min=94 max=388 avg=100.2 std=10
LOG
;; esac
'''


@pytest.fixture
def adb(tmp_path, monkeypatch):
    """A fake adb first on PATH; the phone's /data/local/tmp lives under tmp_path/phone."""
    bin_dir, phone = tmp_path / "bin", tmp_path / "phone"
    bin_dir.mkdir()
    (phone / "data" / "local" / "tmp" / "edgebert").mkdir(parents=True)
    (bin_dir / "adb").write_text(FAKE_ADB.replace("PYTHON", sys.executable))
    (bin_dir / "adb").chmod(0o755)
    tool = tmp_path / "benchmark_model"
    tool.write_text(FAKE_BENCHMARK_MODEL)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ADB_ROOT", str(phone))
    monkeypatch.setenv("FAKE_ADB_SERIAL", "emulator-5554")
    return {"phone": phone / "data" / "local" / "tmp" / "edgebert", "tool": tool, "log": phone / "adb.log"}


def test_adb_benchmark_model_latency_only(tiny, adb):
    report = bench(tiny["bundle"], fmt="tflite", target="adb:emulator-5554", benchmark_model=str(adb["tool"]),
                   threads=2, warmup=3, runs=50)
    (r,) = report["runs"]
    assert r["complete"] and r["runtime"]["backend"] == "benchmark_model" and "accuracy" not in r
    assert any("latency only" in w for w in r["warnings"])
    assert r["latency_ms"]["p50"] == pytest.approx(0.0995) and r["latency_ms"]["min"] == pytest.approx(0.094)
    assert r["latency_ms"]["p90"] is None and r["latency_ms"]["mean"] == pytest.approx(0.1002)
    assert r["load_ms"] == pytest.approx(3.2) and r["first_inference_ms"] == pytest.approx(0.112)
    assert r["peak_rss_mb"] == pytest.approx(9.8) and r["settings"]["runs"] == 9876
    args = (adb["phone"] / "benchmark_model.args").read_text().split()
    median = int(np.median(np.load(tiny["bundle"] / "eval.npz")["lengths"]))
    expected = min(t for t in (16, 32, 64) if t >= median)
    # what the phone saw: the model in this run's own folder, removed afterwards (the tool stays)
    assert re.search(r"--graph=/data/local/tmp/edgebert/bench-[0-9a-f]{12}/model\.tflite", adb["log"].read_text())
    assert sorted(p.name for p in adb["phone"].iterdir()) == ["benchmark_model", "benchmark_model.args"]
    assert {"--num_threads=2", "--warmup_runs=3", "--num_runs=50", f"--signature_to_run_for=seq_{expected}"} <= set(args)
    assert not any(a.startswith(("--use_", "--enable_op_profiling")) for a in args)  # benchmark_model's defaults
    assert "-s emulator-5554 push" in adb["log"].read_text()


@pytest.mark.parametrize("delegate, flag", [("gpu", "--use_gpu=true"), ("nnapi", "--use_nnapi=true"),
                                            ("xnnpack", "--use_xnnpack=true"), ("cpu", "--use_xnnpack=false")])
def test_adb_passes_delegate_signature_and_op_profiling(tiny, adb, delegate, flag):
    (r,) = bench(tiny["bundle"] / "model.tflite", target="adb:emulator-5554", benchmark_model=str(adb["tool"]),
                 warmup=1, runs=5, delegate=delegate, signature="seq_32", op_profile=True)["runs"]
    args = (adb["phone"] / "benchmark_model.args").read_text().split()
    assert {flag, "--signature_to_run_for=seq_32", "--enable_op_profiling=true"} <= set(args)
    assert r["runtime"]["delegate"] == delegate and r["settings"]["signature"] == "seq_32"
    ops = r["op_profile"]["ops"]  # the regular runs' table, not the initialization one
    assert [o["op"] for o in ops] == ["TfLiteXNNPackDelegate", "EMBEDDING_LOOKUP", "RESHAPE"]
    assert ops[0]["ms"] == pytest.approx(0.08) and ops[0]["share"] == pytest.approx(0.8)
    assert ops[2]["calls_per_run"] == 3


def test_adb_refuses_what_benchmark_model_cannot_take(tiny, adb):
    with pytest.raises(BenchError, match="benchmark_model takes --delegate xnnpack, cpu, gpu, nnapi"):
        bench(tiny["bundle"] / "model.tflite", target="adb:emulator-5554", benchmark_model=str(adb["tool"]),
              delegate="/vendor/lib64/libedgetpu.so")
    with pytest.raises(BenchError, match="--op-profile is benchmark_model's"):
        bench(tiny["bundle"] / "model.onnx", target="local", op_profile=True)


def test_adb_with_remote_python_runs_the_harness(tiny, adb, tmp_path):
    report = bench(tiny["bundle"] / "model.onnx", target="adb:emulator-5554", remote_python=sys.executable,
                   warmup=1, runs=5, json_out=tmp_path / "r.json")
    (r,) = report["runs"]
    assert r["complete"] and r["target"] == "adb:emulator-5554"
    assert r["accuracy"] == pytest.approx(tiny["accuracy"])
    assert r["predictions"] == tiny["reference"].argmax(1).tolist()
    assert list(adb["phone"].iterdir()) == []  # the run's folder, harness and all, is gone
    assert json.loads((tmp_path / "r.json").read_text())["complete"]


def test_adb_errors_are_one_line(tiny, adb):
    with pytest.raises(BenchError, match="benchmark_model runs .tflite only"):
        bench(tiny["bundle"] / "model.onnx", target="adb:emulator-5554")
    with pytest.raises(BenchError, match="not found"):
        bench(tiny["bundle"] / "model.tflite", target="adb:R58M123", benchmark_model=str(adb["tool"]))
    with pytest.raises(BenchError, match="no /data/local/tmp/edgebert/benchmark_model on the device"):
        bench(tiny["bundle"] / "model.tflite", target="adb:emulator-5554")


def test_benchmark_model_cut_short_is_not_a_result():
    with pytest.raises(BenchError, match="did not finish"):
        parse_benchmark_model("INFO: STARTING!\nINFO: count=3 first=1 min=1 max=2 avg=1.5 std=0\n")


def test_fan_out_runs_every_target_into_one_table(tiny, adb, tmp_path, capsys):
    import argparse

    from edgebert.bench import register

    parser = argparse.ArgumentParser(prog="edgebert")
    register(parser.add_subparsers())
    out = tmp_path / "fleet.json"
    args = parser.parse_args(["bench", str(tiny["bundle"] / "model.tflite"), "--target", "local", "--target",
                              "adb:emulator-5554", "--benchmark-model", str(adb["tool"]), "--warmup", "1",
                              "--runs", "5", "--json", str(out)])
    args.run(args)
    runs = json.loads(out.read_text())["runs"]
    assert [r["target"] for r in runs] == ["local", "adb:emulator-5554"]  # target order, whatever finished first
    table = (tmp_path / "fleet.md").read_text()
    assert "| model.tflite · litert · local |" in table and "| model.tflite · benchmark_model · adb:emulator-5554 |" in table
    with pytest.raises(BenchError, match=r"1 of 2 targets failed, so no results were written: adb:R58M123.*not found"
                                         r".*\(finished: local\)"):
        bench(tiny["bundle"] / "model.tflite", target=["local", "adb:R58M123"], benchmark_model=str(adb["tool"]),
              warmup=1, runs=5, json_out=tmp_path / "partial.json")
    assert not (tmp_path / "partial.json").exists()
