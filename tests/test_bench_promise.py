"""bench/promise.py: one row, end to end, from a compile of the tiny checkpoint (the real rows are 8 to 30 minutes of
training: bench/results/promise.json), the csv row's data as the built-in MRPC reads it, and the verdict."""

from __future__ import annotations

import json
import shutil

import pytest

from edgebert.data import DataConfig, load_data, load_task
from edgebert.pipeline import recipe as recipes


def test_the_csv_row_is_mrpc_as_a_users_file(bench_scripts, data_dir, tmp_path):
    """Same examples, same label order (F1 counts the second class), and --task picks MRPC's recipe for it."""
    promise = bench_scripts.promise
    promise.write_csv(data_dir, tmp_path)
    fields = {"text": "sentence1", "pair": "sentence2", "dev": str(tmp_path / "mrpc-dev.csv")}
    train, dev, _ = load_data(DataConfig(train=str(tmp_path / "mrpc-train.csv"), **fields), seed=42)
    for split, ours in (("train", train), ("dev", dev)):
        assert ours.examples == load_task("mrpc", split, data_dir=data_dir).examples
    assert (train.task.kind, train.task.metric, train.task.labels) == ("pair-classification", "f1",
                                                                       promise.CSV_LABELS)
    assert recipes.for_task(str(tmp_path / "mrpc-train.csv"), **fields).name == "mrpc-minilm.toml"


def test_optimums_copy_of_the_teacher_follows_the_rows_teacher(bench_scripts, tiny_checkpoint, tmp_path):
    promise = bench_scripts.promise

    def optimum_teacher(teacher):
        return promise.optimum_teacher("sst2", teacher, promise.identity(teacher), tmp_path)

    teacher = shutil.copytree(tiny_checkpoint, tmp_path / "teacher")
    made = optimum_teacher(teacher)
    assert (made / "config.json").is_file()
    (made / "mark").touch()
    assert optimum_teacher(teacher) == made and (made / "mark").exists()  # the same teacher: kept
    (teacher / "config.json").write_text((teacher / "config.json").read_text() + "\n")  # the stage written again
    assert optimum_teacher(teacher) == made and not (made / "mark").exists()
    (made / "mark").touch()
    assert optimum_teacher(tiny_checkpoint) == made  # another stage folder
    assert not (made / "mark").exists() and (made / "config.json").is_file()


def test_a_row_from_a_real_compile(bench_scripts, tiny_checkpoint, tiny_sst2, tmp_path, monkeypatch):
    """The compile as typed, the teacher saved for Optimum and exported by it, both files scored and timed in their
    runtimes, and the row's keys as issue 30 names them."""
    promise = bench_scripts.promise
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(f"""
task = "sst2"
model = "{tiny_checkpoint}"
max_length = 16
validation = 0
stages = ["finetune", "quantize", "export"]
[finetune.train]
steps = 4
batch_size = 8
[quantize]
accuracy_budget = 100.0
[export]
seq_lens = [16]
bench = false
""")
    monkeypatch.setitem(promise.ROWS, "sst2", {**promise.ROWS["sst2"], "args": [str(recipe)]})
    row = promise.judged(promise.row_of("sst2", tmp_path / "work", tiny_sst2, repeats=2, runs=20))
    assert set(row) >= {"task", "metric", "teacher", "onnx", "tflite", "smaller", "vs_optimum_1t", "compile_s",
                        "command", "kept"}
    manifest = json.loads((tmp_path / "work" / "sst2" / "bundle" / "manifest.json").read_text())
    onnx = manifest["verification"]["model.onnx"]["verify"]["value"]
    assert row["onnx"] == pytest.approx(100 * onnx, abs=0.01)  # the harness scores what the compile verified
    assert row["teacher"] == pytest.approx(manifest["promise"]["teacher"], abs=0.01)
    assert row["command"] == f"edgebert compile {recipe} --out {tmp_path / 'work' / 'sst2'}"
    assert len(row["vs_optimum_1t_by_repeat"]) == 2 and row["vs_optimum_1t"] > 0
    assert set(row["compile_s"]) >= {"finetune", "quantize", "export", "total"}
    assert row["kept"] == (row["drop"] <= 1.0 and row["smaller"] >= 10 and row["vs_optimum_1t"] >= 3)
    rows = [{**row, "commit": "abc", "machine": "here"}, {**row, "commit": "def", "machine": "there"}]
    lines = promise.table({"rows": rows, "commit": "def"})
    ends = [line.split(" | ")[-2:] for line in lines if line.startswith("| sst2 |")]
    assert ends == [["abc", "1 |"], ["def", "2 |"]]
    assert lines[-2:] == ["Machine 1: here.", "Machine 2: there."]  # each row says where it ran
