"""bench/compare.py's pieces on tiny models: the timing children, the harness call, the figures
(ratios pair by pair, the Optimum baseline, targets) and the generated table. No real models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tiny_models import NAMES, VOCAB, tiny_module, write_eval

BYTES = "file bytes against 1 (the teacher's FP32 weights)"  # where the size targets are measured
AGAINST = "SST-2 dev accuracy against the teacher's"  # what the accuracy targets compare

ROOT = Path(__file__).resolve().parent.parent


def _child(*args) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "_timing.py"), *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, timeout=300, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory) -> dict:
    import torch

    folder = tmp_path_factory.mktemp("compare-onnx")
    sample = {k: torch.ones(1, 8, dtype=torch.long) for k in NAMES}
    torch.onnx.export(tiny_module(), tuple(sample.values()), str(folder / "model.onnx"), input_names=list(NAMES),
                      output_names=["logits"], dynamic_axes={k: {0: "batch", 1: "seq"} for k in NAMES},
                      opset_version=17, dynamo=False)
    write_eval(folder / "dev.npz", n=12, t=32)
    return {"model": folder / "model.onnx", "inputs": folder / "dev.npz"}


def test_gemm_child_measures_throughput(bench_scripts, tmp_path):
    for op in ("matmulinteger", "matmul"):
        out = tmp_path / f"{op}.json"
        _child("gemm", "--op", op, "--shape", "64x64x64", "--threads", 1, "--seconds", 0.05, "--json", out)
        r = json.loads(out.read_text())
        assert r["complete"] and r["ops_per_call"] == 2 * 64**3 and r["gops_p50"] > 0 and r["calls"] >= 5
    import onnx

    onnx.checker.check_model(bench_scripts.timing.gemm_model("matmulinteger", 8, 16, 4, "u8"))


def test_profile_child_aggregates_op_types(bench_scripts, tiny_onnx, tmp_path):
    out = tmp_path / "p.json"
    _child("profile", "--model", tiny_onnx["model"], "--inputs", tiny_onnx["inputs"], "--runs", 6, "--warmup", 2,
           "--pad-to", 32, "--json", out)
    p = json.loads(out.read_text())
    assert p["runs"] == 6 and p["pad_to"] == 32 and p["mean_length"] == 32
    assert p["ops"] and abs(sum(o["share"] for o in p["ops"]) - 1) < 1e-6
    assert {"Gemm", "MatMul"} & {o["op"] for o in p["ops"]}
    events = [{"cat": "Node", "name": "a_kernel_time", "dur": 3000, "args": {"op_name": "MatMul"}},
              {"cat": "Node", "name": "b_kernel_time", "dur": 1000, "args": {"op_name": "Add"}},
              {"cat": "Node", "name": "b_fence_before", "dur": 5000, "args": {"op_name": "Add"}},
              {"cat": "Node", "name": "rows_kernel_time", "dur": 4200, "args": {"op_name": "Scan"}},  # holds a and b
              {"cat": "Session", "name": "model_run", "dur": 4500}]
    from edgebert.device_tests.profile import aggregate_profile

    agg = aggregate_profile(events, runs=1)
    assert [o["op"] for o in agg["ops"]] == ["MatMul", "Add"] and agg["ops"][0]["share"] == 0.75
    assert agg["kernel_ms"] == 4.0 and agg["gemm_ms"] == 3.0 and agg["model_run_ms"] == 4.5


def test_torch_child_mirrors_the_harness(bench_scripts, tmp_path):
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2)
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path / "hf")
    data = write_eval(tmp_path / "dev.npz", n=6, t=32)
    out = tmp_path / "t.json"
    _child("torch", "--model", tmp_path / "hf", "--inputs", tmp_path / "dev.npz", "--threads", 1, "--warmup", 1,
           "--runs", 5, "--json", out)
    r = json.loads(out.read_text())
    assert r["complete"] and r["settings"]["runs"] == 5 and r["n_examples"] == 6
    assert set(r["latency_ms"]) == {"min", "p50", "p90", "p99", "max", "mean", "std"}
    assert r["model"]["bytes"] == (tmp_path / "hf" / "model.safetensors").stat().st_size and r["peak_rss_mb"] > 0
    with torch.inference_mode():
        preds = [int(model(**{k: torch.from_numpy(data[k][i:i + 1, :n].astype(np.int64)) for k in NAMES}).logits.argmax())
                 for i, n in enumerate(data["lengths"])]
    assert r["predictions"] == preds
    assert r["accuracy"] == pytest.approx(float(np.mean(np.array(preds) == data["labels"])))
    assert bench_scripts.timing.timed_rows(6, 1, 8) == [1, 2, 3, 4, 5, 0, 1, 2]


def test_model2vec_child_mirrors_the_harness_on_the_sentences_text(bench_scripts, tmp_path):
    pytest.importorskip("model2vec", reason="model2vec is in the bench extra: pip install 'edgebert[bench]'")
    from model2vec import StaticModel
    from model2vec.inference import StaticModelPipeline
    from model2vec.inference.mlp import Activation, Layer, MLPHead
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[PAD]", "[UNK]"] + [f"w{i}" for i in range(30)]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    rng = np.random.default_rng(0)
    head = MLPHead([Layer(rng.standard_normal((2, 8)).astype(np.float32), np.zeros(2, np.float32))],
                   Activation.SOFTMAX, classes=np.array([0, 1]))
    vectors = rng.standard_normal((len(words), 8)).astype(np.float32)
    pipeline = StaticModelPipeline(StaticModel(vectors, tokenizer), head)
    pipeline.save_pretrained(str(tmp_path / "m2v"))
    data = write_eval(tmp_path / "ids.npz", n=6, t=16)
    texts = [" ".join(f"w{i}" for i in rng.integers(0, 30, n)) for n in data["lengths"]]
    np.savez(tmp_path / "dev.npz", **data, text=np.array(texts))
    out = tmp_path / "m.json"
    _child("model2vec", "--model", tmp_path / "m2v", "--inputs", tmp_path / "dev.npz", "--threads", 1, "--warmup", 1,
           "--runs", 5, "--json", out)
    r = json.loads(out.read_text())
    assert r["complete"] and r["settings"]["runs"] == 5 and r["n_examples"] == 6 and r["settings"]["pad_to"] is None
    assert set(r["latency_ms"]) == {"min", "p50", "p90", "p99", "max", "mean", "std"} and r["peak_rss_mb"] > 0
    assert r["model"]["bytes"] == sum(f.stat().st_size for f in (tmp_path / "m2v").iterdir())
    assert r["predictions"] == pipeline.predict(texts).tolist()
    assert r["accuracy"] == pytest.approx(float(np.mean(np.array(r["predictions"]) == data["labels"])))


def test_measure_runs_the_harness_and_counts_useful_flops(bench_scripts, tiny_onnx, tmp_path):
    measure, figures = bench_scripts.measure, bench_scripts.figures
    from edgebert.model import EncoderConfig
    from edgebert.stats import flops

    model = {"run": {c: {"kind": "harness", "path": tiny_onnx["model"], "backend": "onnxruntime"} for c in figures.CONDITIONS}}
    for cond in figures.CONDITIONS:
        r = measure.measure(model, cond, tiny_onnx["inputs"], 1, 1, 4, tmp_path / f"{cond}.json", {})
        assert r["complete"] and r["settings"]["runs"] == 4
        assert r["settings"]["pad_to"] == (None if cond == "real" else figures.PAD)
    config = EncoderConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    m = {"flops": lambda t: flops(config, int(t), 2)}
    lengths = np.array([4, 8, 16])
    assert measure.useful_flops(m, "real", lengths, 1, 2) == pytest.approx((flops(config, 8, 2) + flops(config, 16, 2)) / 2)
    assert measure.useful_flops(m, f"pad{figures.PAD}", lengths, 1, 2) == flops(config, figures.PAD, 2)
    trimmed = {**m, "trims": True}  # a file that drops the padding first does the real length's work
    assert measure.useful_flops(trimmed, f"pad{figures.PAD}", lengths, 1, 2) == measure.useful_flops(m, "real", lengths, 1, 2)
    assert measure.useful_flops({"flops": None}, "real", lengths, 1, 2) is None


def test_student_checkpoint_is_the_one_the_manifest_names(bench_scripts, tmp_path):
    import torch

    from edgebert import checkpoint
    from edgebert.model import EncoderConfig, HeadConfig, build

    torch.manual_seed(0)
    model = build(EncoderConfig(vocab_size=VOCAB, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64),
                  HeadConfig(num_labels=2, labels=["negative", "positive"]))
    for key in ("abc", "def"):  # two stages of one shape, from recipes that differ elsewhere
        checkpoint.save(model, tmp_path / "out" / "stages" / f"02-prune-{key}" / "model")
    manifest = {"stages": [{"name": "prune", "params": {"total": 1}, "checkpoint": "stages/02-prune-def/model"}]}
    found, why = bench_scripts.measure.student_checkpoint(tmp_path / "out" / "bundle", manifest, None)
    assert found == tmp_path / "out" / "stages" / "02-prune-def" / "model" and "the manifest's prune stage" in why
    manifest["stages"][0]["checkpoint"] = "stages/02-prune-gone/model"
    found, why = bench_scripts.measure.student_checkpoint(tmp_path / "out" / "bundle", manifest, None)
    assert found is None and "where the manifest puts it" in why
    del manifest["stages"][0]["checkpoint"]
    found, why = bench_scripts.measure.student_checkpoint(tmp_path / "out" / "bundle", manifest, None)
    assert found is None and "compile the bundle again" in why
    manifest = {"verification": {"model.tflite": {"meta": {"config": {"type": "DynamicInt8", "per_channel": True,
                                                                      "target": "x86", "int8_embeddings": False}}}}}
    assert bench_scripts.measure.tflite_int8_options(manifest) == {"per_channel": True, "target": "x86", "int8_embeddings": False}


PTE = "student-executorch-int8"
IDS = ["pytorch-fp32", "optimum-o2-int8", "optimum-int8", "tflite-fp32", "tflite-int8", "student-onnx-int8",
       "student-tflite-int8", PTE]


def _synthetic(bench, pte_na: str | None = None):
    """Three clean repeats whose drift makes the median of ratios differ from the ratio of medians,
    and a fourth that ran beside someone else's job (it must be left out). pte_na: the ExecuTorch row has no
    file, for that reason."""
    p50 = {"pytorch-fp32": [20, 40, 30, 900], "optimum-o2-int8": [8, 9, 10, 1], "optimum-int8": [6, 7, 8, 90],
           "tflite-fp32": [15, 16, 17, 99], "tflite-int8": [10, 11, 12, 99], "student-onnx-int8": [1.0, 2.0, 4.0, 9],
           "student-tflite-int8": [2, 3, 4, 9], PTE: [1.5, 2.5, 5.0, 9]}
    na = {"student-tflite-int8": {"pad128": "n/a: no seq_128"},
          PTE: {c: pte_na for c in bench.figures.CONDITIONS} if pte_na else {}}
    models = [{"id": mid, "group": {"p": "1", "o": "2", "t": "3", "s": "4"}[mid[0]], "label": mid, "how": "how",
               "int8": "int8" in mid, "file": f"/x/{mid}", "bytes": 90_000_000 if "fp32" in mid else
               (8_000_000 if mid.startswith("student") else 23_000_000), "flops": lambda t: 1e9 * t / 32,
               "na": na.get(mid, {})} for mid in IDS]
    if pte_na:
        models[-1].update(file=None, bytes=None)
    raw = {"t1": {c: {mid: ([] if c in na.get(mid, {}) else
                             [{"repeat": r, "p50": p50[mid][r], "p90": p50[mid][r] * 1.5, "mean": p50[mid][r],
                               "peak_rss_mb": 100.0, "flops": 1e6, "warnings": []} for r in range(4)])
                      for mid in IDS} for c in bench.figures.CONDITIONS}}
    accuracy = {mid: {c: {"accuracy": 0.9014 if not mid.startswith("student") else 0.8945, "n": 872}
                      for c in bench.figures.CONDITIONS} for mid in IDS}
    if pte_na:  # nothing ran
        accuracy[PTE] = {}
    gemm_raw = [{"threads": 1, "op": "matmulinteger", "weight": "s8", "shape": [1024, 1024, 1024], "gops_p50": g}
                for g in (90, 100, 110)] + [{"threads": 1, "op": "matmul", "weight": "f32", "shape": [32, 384, 1536],
                                             "gops_p50": 50.0}]
    mach = {"cpu_model": "Test CPU 9000", "architecture": "x86_64", "cores": 2, "cores_usable": 2,
            "isa_features": ["AVX2"], "vnni": False, "os": "Linux", "python": "3.11", "load_average": [0.3, 0.3, 0.3]}
    args = SimpleNamespace(quick=False, teacher="t", bundle="b", static_bundle=None, data=None)
    settings = dict(bench.measure.FULL)
    sets = {"teacher": {"n": 872, "path": "dev.npz"}, "student": {"n": 872, "path": "dev.npz"}}
    manifest = {"task": {"metric": "accuracy"}, "stages": [
        {"name": "distill", "params": {"total": 15}, "bytes": 60, "flops": 9e8, "metrics": {"accuracy": 0.90}, "wall_s": 1},
        {"name": "prune", "params": {"total": 13}, "bytes": 50, "flops": 5e8, "metrics": {"accuracy": 0.895}, "wall_s": 1,
         "tries": [{"seed": 42, "folder": "03-prune-a", "validation": 0.96, "metrics": {"accuracy": 0.89}, "kept": False},
                   {"seed": 43, "folder": "03-prune-b", "validation": 0.963, "metrics": {"accuracy": 0.895},
                    "kept": True}]}],
        "pareto": [{"stage": "distill", "format": "pytorch", "latency_ms": 8.0},
                   {"stage": "prune", "format": "pytorch", "latency_ms": 4.0}],
        "bench_local": {"model.onnx": {"latency_ms": {"p50": 1.0}, "metric": "accuracy",
                                      "metrics": {"accuracy": 0.8945}}}}
    result = bench.figures.summarize(args, settings, [1], mach, models, {"note": "a note"}, sets, accuracy, raw, gemm_raw,
                               {}, manifest, [], [{"repeat": r, "load_average": [0.3, 0.3, 0.3], "other_cores": 0.05 if r < 3 else 1.0, "noisy": r == 3}
                                for r in range(4)], {})
    result["wall_s"] = 60.0
    assert result["stages"]["files"]["model.onnx"]["accuracy"] == 0.8945  # the task metric of the local bench
    return result


def test_ratios_are_pair_by_pair_and_the_baseline_is_the_faster_optimum(bench_scripts):
    result = _synthetic(bench_scripts)
    row = result["timing"]["t1"]["real"]["student-onnx-int8"]
    assert row["speedup_vs_1_by_repeat"] == [20.0, 20.0, 7.5] and row["speedup_vs_1"] == 20.0
    assert row["speedup_vs_1"] != pytest.approx(30 / 2.0)  # not the ratio of the medians
    assert row["repeats_used"] == [0, 1, 2] and row["p50_all_repeats"]["3"] == 9
    assert result["repeats_dropped_noisy"] == [3]
    assert result["baseline_2"]["t1"]["real"] == "optimum-int8"
    assert row["speedup_vs_2_by_repeat"] == [6.0, 3.5, 2.0] and row["speedup_vs_2"] == 3.5
    assert result["gemm"]["t1"]["int8_peak_gops"] == 100.0 and result["gemm"]["t1"]["fp32_peak_gops"] == 50.0
    assert row["achieved_gops"] == pytest.approx(0.5) and row["fraction_of_peak"] == pytest.approx(0.005)
    assert result["models"]["student-onnx-int8"]["size_vs_1"] == 90 / 8
    assert result["timing"]["t1"][f"pad{bench_scripts.figures.PAD}"]["student-tflite-int8"] == {"na": "n/a: no seq_128"}
    lines = {(t["target"][:8], t["where"]): t for t in result["targets"]}
    speed = lines[("≥ 12× fa", "batch 1, real lengths, 1 thread(s)")]
    assert speed["pass"] is True and speed["value"] == 20.0
    assert lines[("≥ 3× fas", "batch 1, real lengths, 1 thread(s)")]["pass"] is True
    assert lines[("INT8 mod", "batch 1, real lengths, 1 thread(s)")]["pass"] is False
    assert lines[("≥ 10× sm", BYTES)]["pass"] is True
    accuracy = lines[("within 1", f"student-onnx-int8, real lengths, {AGAINST}")]
    assert accuracy["pass"] is True and accuracy["value"] == pytest.approx(0.69)
    assert lines[("within 1", f"student-tflite-int8, padded {bench_scripts.figures.PAD}, {AGAINST}")]["pass"] is True
    json.dumps(result)  # the results file is plain JSON


def test_the_fastest_peer_threads_size_and_static_tier_targets(bench_scripts):
    figures = bench_scripts.figures
    result = _synthetic(bench_scripts)
    lines = {(t["target"], t["where"]): t for t in result["targets"]}
    where = "batch 1, real lengths, 1 thread(s)"
    peer = lines[("≥ 4× the fastest peer", f"student-onnx-int8, {where}")]
    # optimum-int8 is the fastest of the teacher's INT8 files (median 7 ms); pair by pair: 6/1, 7/2, 8/4
    assert peer["peer"] == "optimum-int8" and peer["value"] == 3.5 and peer["pass"] is False
    tflite = lines[("≥ 4× the fastest peer", f"student-tflite-int8, {where}")]
    assert tflite["value"] == pytest.approx(7 / 3)  # 6/2, 7/3, 8/4
    assert lines[("≥ 10× smaller", BYTES)]["pass"] is True
    assert lines[("≥ 14× smaller", BYTES)]["pass"] is False
    half = lines[("within 0.5 points", f"student-tflite-int8, real lengths, {AGAINST}")]
    assert half["value"] == pytest.approx(0.69) and half["pass"] is False
    scaling = lines[("≥ 1.6× 1→2 threads", "student-onnx-int8, batch 1, real lengths")]
    assert scaling["pass"] is None  # a run at 1 thread only
    static = [t for t in result["targets"] if t["target"].startswith("static tier")]
    assert [t["pass"] for t in static] == [None, None] and all("no static bundle" in t["display"] for t in static)
    two = {**result["timing"]["t1"]["real"]["student-onnx-int8"], "p50_by_repeat": [0.5, 1.0, 2.5]}
    result["timing"]["t2"] = {c: {"student-onnx-int8": two} for c in figures.CONDITIONS}
    result["baseline_2"]["t2"] = result["baseline_2"]["t1"]
    for mid, accuracy, size, p50 in (("static-onnx-int8", 0.85, 1_900_000, 0.05),
                                     ("static-tflite-int8", 0.845, 1_990_000, 0.08)):
        result["models"][mid] = {"accuracy": {"real": {"accuracy": accuracy}}, "bytes": size}
        result["timing"]["t1"]["real"][mid] = {"p50_ms": p50}
    lines = {(t["target"], t["where"]): t for t in figures.targets(result)}
    scaling = lines[("≥ 1.6× 1→2 threads", "student-onnx-int8, batch 1, real lengths")]
    assert scaling["value"] == 2.0 and scaling["pass"] is True  # 1/0.5, 2/1, 4/2.5
    assert scaling["reason"] == ""  # no profiles at 2 threads in this run
    both = "the static bundle's model.onnx and model.tflite"
    small = lines[("static tier ≥ 84% at ≤ 2 MB", f"{both}, SST-2 dev accuracy at real lengths, file bytes")]
    assert small["pass"] is True
    assert small["display"] == "model.onnx 85.00%, 1,900,000 bytes; model.tflite 84.50%, 1,990,000 bytes"
    fast = lines[("static tier ≤ 0.1 ms", f"{both}, {where}")]
    assert fast["pass"] is True and fast["display"] == "model.onnx 0.050 ms; model.tflite 0.080 ms"
    result["models"]["static-tflite-int8"]["bytes"] = 2_100_000  # both files must fit
    assert next(t for t in figures.targets(result) if t["target"].startswith("static tier ≥"))["pass"] is False
    result["targets"] = figures.targets(result)
    rendered = bench_scripts.render.targets_section(result)
    assert any(line.startswith("| PASS | static tier ≤ 0.1 ms |") for line in rendered)


def test_the_thread_target_says_why_from_the_profiles_at_1_and_2_threads(bench_scripts):
    """A second thread splits only the matrix products: their share of the 1-thread profile bounds the gain, and the
    line says it with the thread count the bundle recommends."""
    figures = bench_scripts.figures
    result = _synthetic(bench_scripts)
    result["timing"]["t2"] = {c: {"student-onnx-int8": result["timing"]["t1"][c]["student-onnx-int8"]}
                              for c in figures.CONDITIONS}
    result["baseline_2"]["t2"] = result["baseline_2"]["t1"]
    profile = {"mean_length": 25.0, "pad_to": None, "ops": [{"op": "MatMulInteger", "ms": 0.3, "share": 0.5}]}
    result["profiles"] = {"student-onnx-int8": {"real": {**profile, "gemm_ms": 0.4, "kernel_ms": 0.7,
                                                         "model_run_ms": 1.0}}}
    result["student_profiles"] = {"t2": {"real": {**profile, "gemm_ms": 0.3, "kernel_ms": 0.6, "model_run_ms": 1.1}}}
    result["stages"]["files"]["model.onnx"]["recommended_threads"] = 1
    lines = {(t["target"], t["where"]): t for t in figures.targets(result)}
    scaling = lines[("≥ 1.6× 1→2 threads", "student-onnx-int8, batch 1, real lengths")]
    assert scaling["reason"] == ("matrix products are 40% of a profiled run (0.400 of 1.000 ms), so halving them "
                                 "would give 1.25× at most; 2 threads take them to 0.300 ms and the rest from 0.600 "
                                 "to 0.800 ms; the bundle recommends 1 thread")
    assert scaling["display"].endswith(scaling["reason"]) and scaling["pass"] is False
    assert lines[("≥ 1.6× 1→2 threads", f"student-onnx-int8, batch 1, padded {figures.PAD}")]["reason"] == ""
    shown = "\n".join(bench_scripts.render.profile_section(result))
    assert ("**student-onnx-int8, 2 threads**, real lengths (mean 25.0 tokens): 0.60 ms in kernels (0.30 in matrix "
            "products), 1.10 ms per run." in shown)


def test_an_accuracy_drop_comes_with_its_paired_interval(bench_scripts):
    figures = bench_scripts.figures
    teacher = {"accuracy": 786 / 872, "n": 872, "wrong": list(range(86))}
    student = {"accuracy": 777 / 872, "n": 872, "wrong": list(range(10, 105))}  # 19 flipped to wrong, 10 to right
    pair = figures.paired(teacher, student)
    # d = (10 - 19) / 872; half-width 1.96 * sqrt(10 + 19 - 9² / 872) / 872, in points
    assert (pair["only_teacher"], pair["only_student"]) == (19, 10)
    assert pair["interval_points"] == [-2.24, 0.18]
    assert figures.paired(teacher, {**student, "wrong": list(range(86))})["interval_points"] == [0.0, 0.0]
    result = _synthetic(bench_scripts)
    for model, entry in (("pytorch-fp32", teacher), ("student-tflite-int8", student)):
        result["models"][model]["accuracy"]["real"] = entry
    line = next(t for t in figures.targets(result) if t["where"] == f"student-tflite-int8, real lengths, {AGAINST}")
    assert line["pass"] is False and line["paired"] == pair
    assert line["display"] == ("89.11% vs 90.14% (-1.03 points; 95% interval -2.24 to +0.18: 19 sentences only the "
                               "teacher gets right, 10 only the student)")
    result["targets"] = figures.targets(result)
    assert "the 95% interval of the student's difference" in bench_scripts.render.render(result)
    del result["models"]["pytorch-fp32"]["accuracy"]["real"]["wrong"]  # a results file from before they were kept
    line = next(t for t in figures.targets(result) if t["where"] == f"student-tflite-int8, real lengths, {AGAINST}")
    assert line["paired"] is None and line["display"] == "89.11% vs 90.14% (-1.03 points)"
    result["targets"] = figures.targets(result)  # nor does the table promise intervals it does not give
    assert "95% interval" not in bench_scripts.render.render(result)


def test_a_padded_file_that_is_not_the_bundles_model_is_a_failure(bench_scripts):
    measure = bench_scripts.measure
    pad = measure.PAD

    def student(real: str, padded: str) -> dict:
        return {"id": "student-tflite-int8", "eval": "student",
                "run": {"real": {"path": Path(real)}, f"pad{pad}": {"path": Path(padded)}}}

    def scored(real_wrong, pad_wrong) -> dict:
        return {"student-tflite-int8": {"real": {"n": 872, "wrong": real_wrong},
                                        f"pad{pad}": {"n": 872, "wrong": pad_wrong}}}

    built = student("bundle/model.tflite", f"work/student-tflite-{pad}/int8.tflite")
    assert measure.disagreements([built], scored([3, 9], [3, 9])) == []
    failure, = measure.disagreements([built], scored([3, 9], [3, 9, 40, 41]))
    assert failure["what"] == f"accuracy student-tflite-int8 pad{pad}"
    assert "disagree on 2 of 872 dev sentences" in failure["error"] and "compile it again" in failure["error"]
    same_file = student("bundle/model.tflite", "bundle/model.tflite")  # a bundle with its own seq_128 signature
    assert measure.disagreements([same_file], scored([3, 9], [3, 9, 40])) == []


def test_the_table_is_generated_and_says_the_machine(bench_scripts, tmp_path, monkeypatch):
    monkeypatch.setattr(bench_scripts.compare, "COMPILE_COST", tmp_path / "no-compile-cost.json")  # not this test's
    monkeypatch.setattr(bench_scripts.compare, "PROMISE", tmp_path / "promise.json")
    result = _synthetic(bench_scripts)
    render = bench_scripts.render.render
    text = render(result)
    assert "do not edit by hand" in text and "Test CPU 9000" in text and "VNNI: no" in text
    assert "| PASS | ≥ 12× faster than 1 (PyTorch FP32) | batch 1, real lengths, 1 thread(s) | 20.00× |" in text
    assert "| MISS | INT8 model > 40% of the measured INT8 GEMM peak |" in text
    assert "Missed: INT8 model > 40%" in text and "| prune | 13 |" in text and "-0.50" in text
    assert "n/a: no seq_128" in text and "optimum-int8 ← 2" in text and "busy" not in text
    assert ("seed 42: validation 96.00%, accuracy 89.00%; seed 43: validation 96.30%, accuracy 89.50% (kept)."
            in text)  # every try's dev figure too, not only the kept one's
    results, md = tmp_path / "r.json", tmp_path / "B.md"
    results.write_text(json.dumps(result))
    assert bench_scripts.compare.main(["--render", "--results", str(results), "--markdown", str(md)]) == 0
    charts = {"latency": "pareto-latency.svg", "size": "pareto-size.svg"}  # beside the results, named from the page
    assert md.read_text() == render({**result, "charts": charts}) and "## The frontier" in md.read_text()
    for name in charts.values():
        svg = (tmp_path / name).read_text()
        assert svg.startswith("<svg") and "the teacher: " in svg and "within 1 point of it" in svg
    assert "## The frontier" not in text  # a render without the charts has no section for them
    cost = {"machine": "a CPU", "runs": {}, "cuts": None}
    (tmp_path / "no-compile-cost.json").write_text(json.dumps(cost))  # bench/compile_cost.py's, shown as found
    assert bench_scripts.compare.main(["--render", "--results", str(results), "--markdown", str(md)]) == 0
    assert md.read_text() == render({**result, "compile_cost": cost, "charts": charts})
    assert "## What a compile costs" in md.read_text()
    promise = {"commit": "abc", "rows": [
        {"task": "mrpc", "metric": "f1", "split": "dev", "teacher": 87.9, "onnx": 84.7, "tflite": 85.2, "drop": 3.2,
         "smaller": 11.5, "vs_optimum_1t": 3.6, "compile_s": {"total": 1452}, "kept": False, "commit": "abc",
         "machine": "a CPU"}]}
    (tmp_path / "promise.json").write_text(json.dumps(promise))  # bench/promise.py's, shown as found
    assert bench_scripts.compare.main(["--render", "--results", str(results), "--markdown", str(md)]) == 0
    assert "| mrpc | f1 (dev) | 87.90 | 84.70 | 85.20 | -3.20 | 11.5× | 3.60× | 24 min | no | abc | 1 |" in md.read_text()
    assert "Machine 1: a CPU." in md.read_text()
    assert "ran beside other work, were re-run and are left out" in text
    result["load_average"][0]["other_cores"] = 0.9  # someone else's job ran during a repeat that was used
    assert "the machine was busy" in render(result)


def test_the_executorch_row_gets_the_student_ratios_but_no_target_lines(bench_scripts):
    result = _synthetic(bench_scripts)
    row = result["timing"]["t1"]["real"][PTE]
    assert row["speedup_vs_1_by_repeat"] == pytest.approx([20 / 1.5, 16.0, 6.0]) and row["repeats_used"] == [0, 1, 2]
    assert row["speedup_vs_2_by_repeat"] == pytest.approx([4.0, 2.8, 1.6]) and row["speedup_vs_2"] == pytest.approx(2.8)
    assert result["models"][PTE]["size_vs_1"] == 90 / 8 and result["models"][PTE]["size_vs_2"] == 23 / 8
    assert not any("executorch" in t["where"] for t in result["targets"])  # the targets stay about ONNX and TFLite
    text = bench_scripts.render.render(result)
    assert f"| 4 | {PTE} | 89.45% | 89.45% | 8.0 | 11.25× | 2.88× |" in text
    assert f"| 4 | {PTE} | 2.50 | 1.50–5.00 | 3.75 | 100 | 13.33× | 2.80× |" in text  # real lengths, 1 thread
    assert text.count(f"| 4 | {PTE} |") == 1 + len(bench_scripts.figures.CONDITIONS)  # accuracy, and each latency


def test_an_executorch_row_without_a_file_says_why(bench_scripts):
    why = "n/a: executorch is not installed (pip install 'edgebert[executorch]')"
    result = _synthetic(bench_scripts, pte_na=why)
    assert result["models"][PTE]["size_vs_1"] is None and result["models"][PTE]["size_vs_2"] is None
    assert all(result["timing"]["t1"][c][PTE] == {"na": why} for c in bench_scripts.figures.CONDITIONS)
    json.dumps(result)
    text = bench_scripts.render.render(result)
    assert f"| 4 | {PTE} | {why} | {why} | n/a | n/a | n/a |" in text
    assert text.count(f"| 4 | {PTE} | {why} | | |") == len(bench_scripts.figures.CONDITIONS)
    assert "| PASS | ≥ 12× faster than 1 (PyTorch FP32) | batch 1, real lengths, 1 thread(s) | 20.00× |" in text


def test_the_executorch_file_is_the_bundles_or_says_why_not(bench_scripts, tmp_path, monkeypatch):
    measure = bench_scripts.measure
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    path, how, built = measure._student_pte(bundle, {}, None, "the manifest lists no model stages", tmp_path)
    assert path is None and built is None
    assert how == "n/a: the bundle has no model.pte and the manifest lists no model stages, so none could be exported"
    (bundle / "model.pte").write_bytes(b"pte")
    manifest = {"inputs": {"files": {"model.pte": {"max_length": 64}}}}
    path, how, _ = measure._student_pte(bundle, manifest, None, "no checkpoint", tmp_path)
    assert path is None and how.startswith("n/a: the bundle's model.pte takes 64 tokens and no checkpoint")
    manifest["inputs"]["files"]["model.pte"]["max_length"] = measure.PAD
    assert measure._student_pte(bundle, manifest, None, "", tmp_path) == (bundle / "model.pte",
                                                                          "the bundle's file as is", None)
    # A machine without executorch: the row is n/a, never a crash.
    absent = measure.runtimes.Runtime(name="executorch", format="executorch", suffix=".pte",
                                      module="edgebert_no_such_module", package="executorch", model="executorch:ExecuTorch")
    monkeypatch.setattr(measure.runtimes, "get", lambda name: absent)
    path, how, _ = measure._student_pte(bundle, manifest, None, "", tmp_path)
    assert path is None and how == "n/a: executorch is not installed (pip install 'edgebert[executorch]')"


def test_the_executorch_row_is_built_from_the_checkpoint_and_runs_both_shapes(bench_scripts, tmp_path):
    """The `pte` build child exports the student checkpoint; the harness runs that one file at real lengths
    and padded to PAD, as compare.py's row does."""
    pytest.importorskip("executorch", reason="ExecuTorch is an optional extra: pip install 'edgebert[executorch]'")
    import torch

    from edgebert import checkpoint
    from edgebert.model import EncoderConfig, HeadConfig, build

    measure, figures = bench_scripts.measure, bench_scripts.figures
    torch.manual_seed(0)
    ckpt = tmp_path / "student"
    checkpoint.save(build(EncoderConfig(vocab_size=VOCAB, hidden_size=32, num_layers=1, num_heads=2,
                                        intermediate_size=64), HeadConfig(num_labels=2, labels=["negative", "positive"])),
                    ckpt)
    path, how, built = measure._student_pte(tmp_path / "bundle", {}, ckpt, "", tmp_path / "work")
    assert path == tmp_path / "work" / PTE / "int8.pte" and path.is_file() and how.startswith("the bundle has no model.pte:")
    assert built["meta"]["precision"] == "int8" and built["meta"]["max_length"] == figures.PAD
    assert measure._student_pte(tmp_path / "bundle", {}, ckpt, "", tmp_path / "work")[2] == built  # cached
    write_eval(tmp_path / "dev.npz", n=6, t=figures.PAD)
    model = {"run": {c: {"kind": "harness", "path": path, "backend": "executorch"} for c in figures.CONDITIONS}}
    for cond in figures.CONDITIONS:
        r = measure.measure(model, cond, tmp_path / "dev.npz", 1, 1, 3, tmp_path / f"{cond}.json", {})
        assert r["complete"] and r["n_examples"] == 6 and r["settings"]["pad_to"] == (None if cond == "real" else figures.PAD)


def test_a_student_shorter_than_the_padded_shape_has_no_padded_files(bench_scripts, tmp_path):
    measure = bench_scripts.measure
    built, how = measure._student_tflite_pad({}, [16, 32, 64], tmp_path, "", tmp_path, longest=64)
    assert built is None and how.startswith("n/a: the student reads at most 64 tokens")
