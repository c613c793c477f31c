"""bench/tasks.py's pieces without a compile: every task's recipe parses as `edgebert compile` reads it, the
user CSV is written from SST-2-shaped TSV files and read back by the data loader, and the collector turns a
manifest and bench reports into the device-vs-host check and the tables."""

from __future__ import annotations

import csv
import importlib

import pytest

from edgebert.data import DataConfig, load_data
from edgebert.pipeline import recipe as recipes


@pytest.fixture(scope="module")
def tasks():
    from pathlib import Path

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "bench"))
        yield importlib.import_module("tasks")


@pytest.mark.parametrize("quick", [False, True])
def test_every_recipe_parses_with_the_sizes_asked(tasks, tmp_path, quick):
    size = tasks.SIZES["quick" if quick else "full"]
    for name, spec in tasks.TASKS.items():
        r = recipes.parse(tasks.toml(tasks.recipe(name, quick=quick, work=tmp_path)), source=name)
        assert r.model == "minilm" and r.train_limit == size["train_limit"] and r.eval_limit == size["eval_limit"]
        assert r.stages == spec.get("stages", tasks.STAGES)
        assert r.stage("export").formats == ["onnx", "tflite"] and r.stage("export").bench
        assert max(r.stage("export").seq_lens) == r.max_length
        if "finetune" in r.stages:
            assert r.stage("finetune").train.steps == size["finetune"]
        if "quantize" in r.stages:
            assert (r.stage("quantize").onnx, r.stage("quantize").tflite) == ("dynamic", "dynamic")
            assert r.stage("prune").recovery.train.steps == size["prune"]
        if name == "csv":
            assert r.task is None and r.data.train == str(tmp_path / "csv" / "data" / "train.csv")
            assert (r.data.text, r.data.label) == ("sentence", "label")
        else:
            assert r.task == spec["task"] and r.data is None
    assert recipes.parse(tasks.toml(tasks.recipe("mrpc", quick=False, work=tmp_path))).max_length == 128


def test_user_csv_from_sst2_files(tasks, tmp_path):
    (tmp_path / "sst2").mkdir()
    for split, rows in (("train", ['it \'s "good" , really\t1', "dull , flat\t0", "fine\t1"]),
                        ("dev", ["bad\t0", "great fun\t1"])):
        # SST-2's sentences end in a space before the tab
        (tmp_path / "sst2" / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(r.replace("\t", " \t")
                                                                                      for r in rows) + "\n")
    tasks.write_csv(tmp_path, tmp_path / "out")
    with open(tmp_path / "out" / "train.csv", newline="") as f:
        assert list(csv.reader(f))[1] == ['it \'s "good" , really', "positive"]  # quoted, label named
    train, dev, sources = load_data(DataConfig(train=str(tmp_path / "out" / "train.csv"),
                                               dev=str(tmp_path / "out" / "dev.csv"), text="sentence"), seed=0)
    assert train.task.labels == ("negative", "positive") and len(train) == 3 and len(dev) == 2
    assert [e.label for e in dev.examples] == [0, 1]


def _manifest(values: dict[str, float]) -> dict:
    """A bundle manifest as compile writes it: two stages and two verified INT8 files."""
    verify = {f: {"stage": "quantize", "meta": {"config": {"type": "DynamicInt8Config"}},
                  "verify": {"examples": 400, "max_abs_diff": 0.01, "agreement": 0.99, "metric": "f1", "value": v,
                             "metrics": {"f1": v, "accuracy": 0.7}}} for f, v in values.items()}
    return {"task": {"name": "mrpc", "kind": "pair-classification", "metric": "f1"},
            "stages": [{"name": n, "params": {"total": p}, "bytes": 4 * p, "wall_s": 3.0,
                        "metrics": {"f1": 0.81, "accuracy": 0.72}} for n, p in (("finetune", 22_000_000),
                                                                               ("prune", 15_000_000))],
            "verification": verify,
            "files": {**{f: {"sha256": f * 2, "bytes": 15_000_000} for f in values},
                      "classifier.tflite": {"sha256": "c", "bytes": 14_000_000}}}


def _bench(values: dict[str, float], *, emulated=False, p50=None) -> dict:
    return {"complete": True, "runs": [{"model": {"file": f, "bytes": 1, "sha256": f * 2}, "emulated": emulated,
                                        "n_examples": 400, "metric": "f1", "f1": v, "accuracy": 0.7,
                                        "latency_ms": {"p50": (p50 or {}).get(f, 1.0)}, "device": {"cpu_model": "x"}}
                                       for f, v in values.items()]}


def test_collect_checks_device_against_host(tasks, tmp_path):
    manifest = _manifest({"model.onnx": 0.8, "model.tflite": 0.79})
    local = _bench({"model.onnx": 0.8, "model.tflite": 0.79, "classifier.tflite": 0.79},
                   p50={"model.onnx": 2.0, "model.tflite": 1.0})
    qemu = _bench({"model.onnx": 0.8 + 2 / 400, "model.tflite": 0.79}, emulated=True)  # two INT8 flips: noise
    r = tasks.collect("mrpc", manifest, {"local": local, "qemu-aarch64": qemu})
    assert r["device_matches_host"] is True
    assert [s["metrics"] for s in r["stages"]] == [{"f1": 0.81, "accuracy": 0.72}] * 2
    onnx = r["files"]["model.onnx"]
    assert onnx["int8"] and onnx["host"] == {"f1": 0.8, "accuracy": 0.7} and onnx["bytes"] == 15_000_000
    assert onnx["device"]["local"]["tolerance"] == tasks.TOLERANCE
    assert onnx["device"]["qemu-aarch64"]["tolerance"] == pytest.approx(tasks.QEMU_INT8_FLIPS / 400)
    assert r["files"]["model.tflite"]["device"]["local"]["p50_vs_onnx"] == 0.5
    assert r["files"]["classifier.tflite"]["device"]["local"]["matches_host"] is None  # no host figure to match

    off = tasks.collect("mrpc", manifest, {"local": _bench({"model.onnx": 0.8 + 1 / 400, "model.tflite": 0.79})})
    assert off["device_matches_host"] is False  # locally the same runtime: one flipped example is a bug
    assert off["files"]["model.onnx"]["device"]["local"]["matches_host"] is False

    results = {"command": "python bench/tasks.py", "commit": "0" * 40, "tasks": {"mrpc": r, "csv": {"error": "boom"}},
               "load": {"cpus": 2, "before": [0.1, 0.1, 0.1], "after": [1.0, 1.0, 1.0]}}
    text = tasks.markdown(results)
    assert "| finetune | 22,000,000 | 88.0 | 81.00 | 72.00 | 3 |" in text
    assert "| model.onnx | 15.00 | 80.00 | 70.00 | 80.00 | 80.50 | yes, yes* | 2.00 | 1.00 |" in text
    assert "failed: boom" in text


def test_bench_report_reused_only_for_the_same_files(tasks, tmp_path):
    from edgebert.device_tests.files import write_json

    manifest = _manifest({"model.onnx": 0.8})
    report = tmp_path / "bench-local.json"
    assert not tasks.current(report, manifest)
    write_json(report, _bench({"model.onnx": 0.8}))
    assert tasks.current(report, manifest)
    manifest["files"]["model.onnx"]["sha256"] = "rebuilt"
    assert not tasks.current(report, manifest)
