"""`edgebert compile` end to end on a tiny model and a tiny SST-2-shaped data folder."""

import errno
import json
import shutil
import subprocess
import sys

import onnx
import pytest
import torch

from dataclasses import replace

from edgebert import EdgebertError
from edgebert.export.onnx import all_nodes
from edgebert.pipeline import compile as compiler
from edgebert.pipeline import recipe as recipes
from edgebert.pipeline.context import StageRecord
from edgebert.pipeline.stages import STAGES

def _recipe(model, **top):
    text = f"""
task = "sst2"
model = "{model}"
max_length = 16
stages = {json.dumps(top.pop("stages", ["finetune", "distill", "quantize", "export"]))}
[finetune.train]
steps = 6
batch_size = 8
save_every = 2
[distill]
layers = 1
[distill.train]
steps = 6
batch_size = 8
save_every = 2
[quantize]
accuracy_budget = 10.0
calibration_size = 8
tflite = "none"
[export]
formats = ["onnx"]
bench = false
"""
    return replace(recipes.parse(text), **top)


def _hashes(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    return {name: f["sha256"] for name, f in manifest["files"].items() if name != "report.html"}


def _swap(monkeypatch, name: str, **changes) -> None:
    """Stage `name`'s registry entry with `changes`, for this test."""
    monkeypatch.setitem(STAGES._entries, name, replace(STAGES.get(name), **changes))


def _count_runs(monkeypatch, name: str, ran: list) -> None:
    """Stage `name` runs as before and appends its name to `ran` each time it does."""
    stage = STAGES.get(name)
    _swap(monkeypatch, name, run=lambda *a, **k: (ran.append(name), stage.run(*a, **k))[1])


@pytest.fixture(scope="module")
def finished(tiny_checkpoint, tiny_sst2, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "out"
    bundle = compiler.compile(_recipe(tiny_checkpoint), out, data_dir=str(tiny_sst2))
    return out, bundle


def test_bundle_holds_what_an_app_needs(finished):
    out, bundle = finished
    names = {p.name for p in bundle.iterdir()}
    assert {"model.onnx", "manifest.json", "report.html", "labels.txt", "eval.npz", "golden.json", "vocab.txt"} <= names
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert [s["name"] for s in manifest["stages"]] == ["finetune", "distill"]
    assert manifest["stages"][1]["params"]["total"] < manifest["stages"][0]["params"]["total"]
    assert [s["checkpoint"] for s in manifest["stages"]] == [f"stages/{p.parent.name}/model"  # this run's own
                                                             for p in sorted(out.glob("stages/*/model"))]
    check = manifest["verification"]["model.onnx"]["verify"]  # the INT8 file against PyTorch, on the dev split
    assert check["agreement"] > 0.9 and check["metric_drop"] <= 0.10 and check["max_abs_diff"] < 0.5
    assert (bundle / "labels.txt").read_text() == "negative\npositive\n"
    assert "distill" in compiler.summary(bundle)
    assert "checkpoints chosen on 9 training examples held out (validation)" in compiler.summary(bundle)
    assert set(manifest["stages"][0]["validation"]) == set(manifest["stages"][0]["metrics"])  # chosen on, beside dev


def test_the_promise_is_judged_against_the_teacher(finished, tiny_checkpoint, tiny_sst2, tmp_path):
    out, bundle = finished
    manifest = json.loads((bundle / "manifest.json").read_text())
    promise, teacher = manifest["promise"], manifest["stages"][0]["metrics"]["accuracy"] * 100
    onnx, verify = manifest["promise"]["files"]["model.onnx"], manifest["verification"]["model.onnx"]["verify"]
    assert promise["teacher"] == pytest.approx(teacher, abs=1e-3) and promise["max_drop"] == 1.0
    assert onnx["drop"] == pytest.approx(teacher - verify["value"] * 100, abs=1e-3)  # the file, in its runtime
    assert onnx["smaller"] == pytest.approx(manifest["stages"][0]["bytes"] / manifest["files"]["model.onnx"]["bytes"],
                                            rel=1e-2)
    assert promise["within"] == (onnx["drop"] <= 1.0) and promise["small"] == (onnx["smaller"] >= 10)
    assert "promise: " in compiler.summary(bundle)
    ran = []
    with pytest.MonkeyPatch.context() as m:
        for name in STAGES.names():
            _count_runs(m, name, ran)
        copy = shutil.copytree(out, tmp_path / "out")  # the module's run stays as it is
        strict = compiler.compile(_recipe(tiny_checkpoint, max_drop=10.0), copy, data_dir=str(tiny_sst2), resume=True)
    assert ran == []  # max_drop judges the result: it trains nothing again
    assert json.loads((strict / "manifest.json").read_text())["promise"]["max_drop"] == 10.0


def test_a_static_student_compiles_and_is_judged_against_the_teacher_as_it_reads(tiny_checkpoint, tiny_sst2,
                                                                                  tmp_path):
    from edgebert.passes import evaluate
    from edgebert.pipeline.context import context, task_model

    recipe = recipes.parse(f"""
task = "sst2"
model = "{tiny_checkpoint}"
max_length = 16
stages = ["static", "vocab", "quantize", "export"]
[static]
dim = 8
ngram_features = 16
[static.distill.train]
steps = 6
batch_size = 8
[quantize]
onnx = "static"
accuracy_budget = 100.0
[export]
formats = ["onnx", "tflite"]
seq_lens = [16]
bench = false
""")
    bundle = compiler.compile(recipe, tmp_path / "out", data_dir=str(tiny_sst2))
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert [s["name"] for s in manifest["stages"]] == ["static", "vocab"]
    for name in ("model.onnx", "model.tflite"):
        assert manifest["verification"][name]["verify"]["agreement"] > 0.9
    assert "skipped" in manifest["hf"]  # no transformers config for a model without layers
    nodes = list(all_nodes(onnx.load(str(bundle / "model.onnx")).graph))
    ops = {n.op_type for n in nodes}
    assert "QuantizeLinear" in ops and not {"Scan", "DynamicQuantizeLinear"} & ops  # ranges fixed: no Scan over rows
    assert not {"Conv", "ConvInteger"} & ops  # ORT's ConvInteger took 0.15 ms of a 0.17 ms static student
    assert not [n for n in nodes if n.name.startswith("/model/ngrams/") and n.op_type == "Shape"]  # fixed windows
    # the vocab stage re-encoded the data with its smaller vocabulary; the teacher is scored on its own ids
    ctx = context(recipe, tmp_path / "fresh", str(tiny_sst2))
    teacher = 100 * evaluate(task_model(tiny_checkpoint, ctx.task), ctx.data.eval)["accuracy"]
    assert manifest["promise"]["teacher"] == pytest.approx(teacher, abs=1e-3)


def test_a_student_that_falls_too_far_is_written_and_said_to_miss(tiny_checkpoint, tiny_sst2, tmp_path, capsys):
    from edgebert.pipeline.context import State, context
    from edgebert.pipeline.promise import promise
    from edgebert.pipeline.report import promise_lines

    ctx = context(_recipe(tiny_checkpoint, max_drop=1.0), tmp_path / "out", str(tiny_sst2))
    (tmp_path / "model.onnx").write_bytes(b"x" * 100)
    teacher = StageRecord(name="finetune", params=10, bytes=400, metrics={"accuracy": 0.9})
    state = State(model=tmp_path, files={"model.onnx": tmp_path / "model.onnx"},
                  verification={"model.onnx": {"verify": {"value": 0.895}}})
    assert promise(ctx, [teacher], state, "k")["within"]  # 0.5 points at max_drop 1.0
    capsys.readouterr()
    state.verification["model.onnx"]["verify"]["value"] = 0.875
    record = promise(ctx, [teacher], state, "k")
    assert not record["within"] and not record["small"] and record["files"]["model.onnx"]["smaller"] == 4.0
    said = capsys.readouterr().err.splitlines()
    assert said == ["edgebert: " + line for line in promise_lines(record)]
    assert "promise: NOT kept: model.onnx 87.50 (-2.50) against the teacher's accuracy 90.00" in said[0]
    assert "size NOT kept: model.onnx 4.0x" in said[1]
    with pytest.raises(EdgebertError, match="^max_drop: expected a non-negative number"):
        recipes.parse("max_drop = -1")


def test_checkpoints_are_chosen_on_training_examples_held_out(tiny_checkpoint, tiny_sst2, tmp_path):
    from edgebert.pipeline.context import context

    ctx = context(_recipe(tiny_checkpoint), tmp_path / "a", str(tiny_sst2))
    whole = context(_recipe(tiny_checkpoint, validation=0), tmp_path / "b", str(tiny_sst2))
    assert whole.data.validation is None and len(whole.data.train) == 96
    assert (len(ctx.data.train), len(ctx.data.validation), len(ctx.data.eval)) == (87, 9, 32)  # a tenth at most
    texts = lambda d: [e.text for e in d.split.examples]
    assert sorted(texts(ctx.data.train) + texts(ctx.data.validation)) == sorted(texts(whole.data.train))
    assert texts(ctx.data.eval) == texts(whole.data.eval)  # the reported split is untouched
    assert ctx.sources["validation"] == {"carved_from": "train", "rows": 9, "seed": 44, "dropped": 0}
    with pytest.raises(EdgebertError, match="^validation: expected a non-negative int"):
        recipes.parse("validation = -1")


def test_float_files_agree_with_pytorch(tiny_checkpoint, tiny_sst2, tmp_path):
    bundle = compiler.compile(_recipe(tiny_checkpoint, stages=["finetune", "export"]), tmp_path / "out",
                              data_dir=str(tiny_sst2))
    check = json.loads((bundle / "manifest.json").read_text())["verification"]["model.onnx"]["verify"]
    assert check["max_abs_diff"] < 1e-3 and check["agreement"] == 1.0 and check["metric_drop"] == 0


def test_the_estimate_is_kept_beside_the_time_taken(finished):
    """Said before the first stage trained: every stage that ran has its share, the bundle too."""
    out, bundle = finished
    time = json.loads((bundle / "manifest.json").read_text())["time"]
    said = time["estimate"]
    assert list(said["stages"]) == ["finetune", "distill", "quantize", "export", "bundle"]
    assert all(s > 0 for s in said["stages"].values()) and said["warmup_s"] > 0
    assert said["total_s"] == pytest.approx(said["warmup_s"] + sum(said["stages"].values()), abs=0.2)
    assert said["on"].startswith("cpu") and time["took_s"] > 0
    assert "estimated" in compiler.summary(bundle)


def test_the_estimate_counts_each_stages_work(tiny_checkpoint, tiny_sst2, tmp_path):
    """A stage's training share grows with its steps; a stage that is done costs nothing. Estimates that share a
    timer time each shape once, so they differ only in the work they count (bench/compile_cost.py's cuts)."""
    from edgebert.pipeline.context import context
    from edgebert.pipeline.estimate import Timer, estimate

    recipe = _recipe(tiny_checkpoint, stages=["finetune", "distill"])
    ctx = context(recipe, tmp_path / "out", str(tiny_sst2))
    timer = Timer(ctx)
    once = estimate(ctx, tiny_checkpoint, None, ["finetune", "distill"], timer)
    longer = recipe.options["finetune"].replace(  # patience may stop it early: the estimate counts every step
        train=recipe.options["finetune"].train.replace(steps=600, eval_every=100, patience=2))
    twice = estimate(replace(ctx, recipe=replace(recipe, options={**recipe.options, "finetune": longer})),
                     tiny_checkpoint, None, ["finetune", "distill"], timer)
    assert twice.stages["finetune"] > 20 * once.stages["finetune"]  # 600 steps, not 6
    assert twice.stages["distill"] == once.stages["distill"]
    assert twice.warmup_s < once.warmup_s  # the shapes were timed already
    assert list(estimate(ctx, tiny_checkpoint, None, ["distill"]).stages) == ["distill", "bundle"]


def test_the_estimate_times_distillation_as_it_runs(tiny_checkpoint, tiny_sst2, tmp_path, monkeypatch):
    """A stage that learns from a teacher cache is timed building one, its hidden layers included, and reading it
    with the recipe's own loss; the timing cache is gone after."""
    from edgebert.passes.distill import DistillObjective
    from edgebert.passes.teacher import TeacherCache
    from edgebert.pipeline.context import context
    from edgebert.pipeline.estimate import estimate

    built, forwards = [], []
    build, forward = TeacherCache.build.__func__, DistillObjective.forward
    monkeypatch.setattr(TeacherCache, "build", classmethod(
        lambda cls, teacher, data, hidden, root, **kw: built.append((hidden, root)) or build(cls, teacher, data,
                                                                                             hidden, root, **kw)))
    monkeypatch.setattr(DistillObjective, "forward", lambda self, batch: forwards.append(1) or forward(self, batch))
    recipe = _recipe(tiny_checkpoint, stages=["distill"])
    hidden = recipe.options["distill"].replace(hidden_weight=1.0)
    recipe = replace(recipe, options={**recipe.options, "distill": hidden})
    said = estimate(context(recipe, tmp_path / "out", str(tiny_sst2)), tiny_checkpoint, None, ["distill"])
    assert said.stages["distill"] > 0 and forwards
    assert built and all(layers for layers, _ in built)  # the student's one layer is matched to a teacher's
    assert not any(root.exists() for _, root in built)


def test_the_estimate_times_a_step_on_every_batch_it_picked(tiny_checkpoint, tiny_sst2, tmp_path):
    """Steps over a random few of the picked batches left the long ones out at random: the full default's
    estimate ran a quarter short of its fine-tuning."""
    from edgebert.passes.train import TrainConfig, collate
    from edgebert.pipeline.context import context, task_model
    from edgebert.pipeline.estimate import STEPS, WARM, Timer, _Output

    ctx = context(_recipe(tiny_checkpoint), tmp_path / "out", str(tiny_sst2))
    model, timer = task_model(tiny_checkpoint, ctx.task), Timer(ctx)
    examples, seen = timer.batches(STEPS, 4), []

    def recording(items, indices, step):
        seen.append(list(indices))
        return collate(model, items, indices)

    timer._steps(_Output(model), examples, TrainConfig(batch_size=4), recording)
    assert len(seen) == WARM + STEPS
    assert sorted(i for batch in seen[WARM:] for i in batch) == list(range(len(examples)))


@pytest.mark.parametrize("recover_from,copies,labelled_again", [("teacher", 1, False), ("teacher", 2, True),
                                                                ("unpruned", 1, True)])
def test_the_estimate_counts_what_the_teacher_labelled_before_once(tiny_checkpoint, tiny_sst2, tmp_path, monkeypatch,
                                                                   recover_from, copies, labelled_again):
    """A prune that recovers from distill's teacher on distill's text reads the teacher cache distill built: its
    labelling is not counted again. Other text (more copies), or another labeller (the unpruned student), is."""
    from edgebert.pipeline.context import context
    from edgebert.pipeline.estimate import Timer, estimate
    from edgebert.pipeline.resources import labelled

    monkeypatch.setattr(Timer, "distill", lambda self, student, teacher, config: (0.0, 1.0))  # 1 s a label, all
    monkeypatch.setattr(Timer, "train", lambda self, model, config: 0.0)                    # else free
    monkeypatch.setattr(Timer, "infer", lambda self, model, device, precision="fp32": 0.0)
    text = f"""
task = "sst2"
model = "{tiny_checkpoint}"
max_length = 16
stages = ["finetune", "distill", "prune"]
[distill]
layers = 1
hidden_weight = 1.0
[distill.augment]
copies = 1
[prune]
heads = 0.5
recover_from = "{recover_from}"
[prune.recovery]
hidden_weight = 1.0
[prune.recovery.augment]
copies = {copies}
"""
    ctx = context(recipes.parse(text), tmp_path / "out", str(tiny_sst2))
    said = estimate(ctx, tiny_checkpoint, None, ["finetune", "distill", "prune"])
    assert said.stages["distill"] == labelled(ctx.recipe.stage("distill").augment, ctx.data)
    assert said.stages["prune"] == (labelled(ctx.recipe.stage("prune").recovery.augment, ctx.data) if labelled_again
                                    else 0)

def test_unchanged_rerun_does_no_work(finished, tiny_checkpoint, tiny_sst2, monkeypatch):
    out, bundle = finished
    before = _hashes(bundle)

    def refuse(*args, **kwargs):
        raise AssertionError("a stage ran again")

    for name in ("finetune", "distill", "quantize", "export"):
        _swap(monkeypatch, name, run=refuse)
    again = compiler.compile(_recipe(tiny_checkpoint), out, data_dir=str(tiny_sst2), resume=True)
    assert _hashes(again) == before


def test_a_code_change_rebuilds_the_files_but_not_the_training(finished, tiny_checkpoint, tiny_sst2, tmp_path,
                                                               monkeypatch):
    """A newer quantizer or exporter must not leave stale files behind --resume; retraining is not owed."""
    import shutil

    from edgebert.pipeline.stages import registry

    out = tmp_path / "out"
    shutil.copytree(finished[0], out)
    ran = []

    for name in ("finetune", "distill", "quantize", "export"):
        _count_runs(monkeypatch, name, ran)
    compiler.compile(_recipe(tiny_checkpoint), out, data_dir=str(tiny_sst2), resume=True)
    assert ran == []  # same code: nothing runs
    monkeypatch.setattr(registry, "code_version", lambda: "another edgebert")
    bundle = compiler.compile(_recipe(tiny_checkpoint), out, data_dir=str(tiny_sst2), resume=True)
    assert ran == ["quantize", "export"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert [s["checkpoint"] for s in manifest["stages"]] == [f"stages/{p.parent.name}/model"  # the trained folders,
                                                             for p in sorted(finished[0].glob("stages/*/model"))]
    # reused, keep the seconds they took when they ran, and the manifest says how many of its seconds those were
    first = json.loads((finished[1] / "manifest.json").read_text())["time"]
    time = manifest["time"]
    assert {k: time["stages"][k] for k in ("finetune", "distill")} == \
        {k: first["stages"][k] for k in ("finetune", "distill")} and first["stages"]["finetune"] > 0
    assert first["resumed_s"] == 0
    assert time["resumed_s"] == pytest.approx(first["stages"]["finetune"] + first["stages"]["distill"], abs=0.2)


def test_the_files_are_keyed_by_the_code_that_wrote_them(tiny_checkpoint, tiny_sst2, tmp_path, monkeypatch):
    """Source edited while a compile trains (for hours) must not key the files that the compile's own, older
    code writes afterwards as the edit's, or a --resume under the edit would keep them."""
    from edgebert.pipeline.stages import registry

    code = {"version": "the code the compile runs"}
    monkeypatch.setattr(registry, "code_version", lambda: code["version"])
    distill, ran = STAGES.get("distill"), []

    def edited_meanwhile(*args, **kwargs):
        code["version"] = "an edit made during distillation"
        return distill.run(*args, **kwargs)

    _swap(monkeypatch, "distill", run=edited_meanwhile)
    for name in ("quantize", "export"):
        _count_runs(monkeypatch, name, ran)
    out = tmp_path / "out"
    compiler.compile(_recipe(tiny_checkpoint), out, data_dir=str(tiny_sst2))
    ran.clear()
    compiler.compile(_recipe(tiny_checkpoint), out, data_dir=str(tiny_sst2), resume=True)
    assert ran == ["quantize", "export"]  # under the edit, the files of the code before it are rebuilt


def test_stages_alone_are_the_stages_a_compile_reuses(finished, tiny_checkpoint, tiny_sst2, monkeypatch):
    out, bundle = finished
    manifest = json.loads((bundle / "manifest.json").read_text())
    for name in ("finetune", "distill"):
        _swap(monkeypatch, name, run=lambda *a, **k: pytest.fail("a stage ran again"))
    records = compiler.run_stages(_recipe(tiny_checkpoint, stages=["finetune", "distill"]), out, data_dir=str(tiny_sst2))
    assert [r.name for r in records] == ["finetune", "distill"]
    assert [r.metrics for r in records] == [s["metrics"] for s in manifest["stages"]]


def test_prune_recovers_from_the_teacher_the_distill_stage_learned_from(tiny_checkpoint, tiny_sst2, tmp_path):
    from edgebert.passes import DistillConfig, PruneConfig, TeacherCache, TrainConfig
    from edgebert.pipeline.context import context, task_model
    from edgebert.passes.train import Accelerator

    recovery = DistillConfig(train=TrainConfig(steps=2, batch_size=8, progress=False))
    prune = PruneConfig(heads=0.5, recover_from="teacher", sample_batches=1, batch_size=8, recovery=recovery)
    recipe = _recipe(tiny_checkpoint, stages=["finetune", "distill", "prune"])
    recipe = replace(recipe, options={**recipe.options, "prune": prune})
    out = tmp_path / "out"
    finetuned, _, pruned = compiler.run_stages(recipe, out, data_dir=str(tiny_sst2))
    ctx = context(recipe, out, str(tiny_sst2))
    teacher = task_model(out / "stages" / finetuned.folder / "model", ctx.task)
    cache = out / "work" / "teacher-cache" / TeacherCache.key(teacher, ctx.data.train, [], Accelerator.resolve()[1])
    assert (cache / "meta.json").is_file()  # recovery's labels are the fine-tuned model's, not the student's
    # one cache for the compile: distill labelled the same text with the same teacher, so prune built none
    assert [c.name for c in cache.parent.iterdir()] == [cache.name]
    key = STAGES.get("prune").cache_key  # the new options enter it only when set: prune runs cached before them resume
    assert {"recover_from", "int4_words"} & set(key(replace(recipe, options={**recipe.options,
                                                                            "prune": PruneConfig()}))) == set()
    assert key(recipe)["recover_from"] == "teacher"
    with pytest.raises(EdgebertError, match='put "distill" before "prune"'):  # up front: nothing is written
        compiler.run_stages(replace(recipe, stages=["finetune", "prune"]), tmp_path / "b", data_dir=str(tiny_sst2))
    assert not (tmp_path / "b").exists()


def test_prune_tries_keep_the_best_on_validation_and_reuse_a_single_run(tiny_checkpoint, tiny_sst2, tmp_path,
                                                                       monkeypatch):
    """`tries = 2` prunes from seeds 42 and 43, each a stage of its own: the seed-42 run a `tries = 1` compile
    made is reused, what follows chains from the try best on validation, and the bundle says which was kept."""
    from edgebert.passes import DistillConfig, PruneConfig, TrainConfig

    recovery = DistillConfig(train=TrainConfig(steps=2, batch_size=8, progress=False))
    once = PruneConfig(heads=0.5, sample_batches=1, batch_size=8, recovery=recovery)
    recipe = _recipe(tiny_checkpoint, stages=["finetune", "prune", "quantize", "export"])
    out, ran = tmp_path / "out", []
    _, single = compiler.run_stages(replace(recipe, stages=["finetune", "prune"], options={**recipe.options,
                                                                                         "prune": once}),
                                    out, data_dir=str(tiny_sst2))
    _count_runs(monkeypatch, "prune", ran)
    twice = replace(recipe, options={**recipe.options, "prune": once.replace(tries=2)})
    bundle = compiler.compile(twice, out, data_dir=str(tiny_sst2), resume=True)
    assert ran == ["prune"]  # seed 43 alone: seed 42's stage is the single run's
    pruned = compiler.run_stages(twice, out, data_dir=str(tiny_sst2))[1]
    assert ran == ["prune"]  # and a re-run runs neither
    assert [t["seed"] for t in pruned.tries] == [42, 43] and pruned.tries[0]["folder"] == single.folder
    kept = compiler.best_try([StageRecord(name="prune", details={"validation": {"accuracy": t["validation"]}})
                              for t in pruned.tries], "accuracy")
    assert pruned.folder == pruned.tries[kept]["folder"] and [t["kept"] for t in pruned.tries] == [
        t == kept for t in range(2)]
    stage = json.loads((bundle / "manifest.json").read_text())["stages"][1]
    assert stage["checkpoint"] == f"stages/{pruned.folder}/model" and stage["tries"] == pruned.tries
    assert f"seed {42 + kept} validation" in compiler.summary(bundle) and "(kept)" in compiler.summary(bundle)
    assert f"try from seed {42 + kept}: validation" in (bundle / "report.html").read_text()


def test_the_best_try_is_chosen_on_validation_and_ties_keep_the_first():
    def tried(*scores):
        return [StageRecord(name="prune", details={"validation": {"f1": v}}, metrics={"f1": 1 - v}) for v in scores]

    assert compiler.best_try(tried(0.80, 0.85, 0.83), "f1") == 1  # dev (metrics) would pick the first
    assert compiler.best_try(tried(0.85, 0.85), "f1") == 0


def test_interrupted_stage_resumes_to_the_same_bundle(finished, tiny_checkpoint, tiny_sst2, tmp_path, monkeypatch):
    """Ctrl-C in the middle of distillation (after a resumable save), then --resume."""
    _, reference = finished
    out = tmp_path / "out"
    step = torch.optim.AdamW.step
    calls = {"n": 0}

    def interrupt_mid_distill(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 6 + 4:  # all 6 fine-tune steps, then 4 distillation steps
            raise KeyboardInterrupt
        return step(self, *args, **kwargs)

    def count_from_here(*args, **kwargs):  # the estimate's warm-up steps are not the stages'
        monkeypatch.setattr(torch.optim.AdamW, "step", step)
        said = estimate(*args, **kwargs)
        monkeypatch.setattr(torch.optim.AdamW, "step", interrupt_mid_distill)
        return said

    estimate = compiler.estimate
    monkeypatch.setattr(compiler, "estimate", count_from_here)
    monkeypatch.setattr(torch.optim.AdamW, "step", interrupt_mid_distill)
    with pytest.raises(KeyboardInterrupt):
        compiler.compile(_recipe(tiny_checkpoint), out, data_dir=str(tiny_sst2))
    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    stages = sorted(p.name for p in (out / "stages").iterdir())
    assert len(stages) == 1 and stages[0].startswith("01-finetune")  # nothing half-written
    assert not (out / "bundle").exists()
    resumed = compiler.compile(_recipe(tiny_checkpoint), out, data_dir=str(tiny_sst2), resume=True)
    assert _hashes(resumed) == _hashes(reference)


def test_existing_output_is_refused(finished, tiny_checkpoint, tiny_sst2):
    out, _ = finished
    with pytest.raises(EdgebertError, match="exists: pass --resume to continue it or --force"):
        compiler.compile(_recipe(tiny_checkpoint), out, data_dir=str(tiny_sst2))


def test_disk_full_leaves_nothing_half_written(tiny_checkpoint, tiny_sst2, tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("edgebert.checkpoint.save_model", full)
    out = tmp_path / "out"
    with pytest.raises(EdgebertError, match="disk full"):
        compiler.compile(_recipe(tiny_checkpoint, stages=["finetune", "export"]), out, data_dir=str(tiny_sst2))
    assert not (out / "stages").exists() or not any((out / "stages").iterdir())


def test_bad_inputs_are_one_line(tiny_checkpoint, tiny_sst2, tmp_path):
    with pytest.raises(EdgebertError, match="data folder .* not found; pass --data DIR"):
        compiler.compile(_recipe(tiny_checkpoint), tmp_path / "o1", data_dir=str(tmp_path / "nowhere"))
    broken = tmp_path / "broken"
    (broken / "sst2").mkdir(parents=True)
    (broken / "sst2" / "train.tsv").write_text("text\tscore\nhello\t1\n")
    (broken / "sst2" / "dev.tsv").write_text("text\tscore\nhello\t1\n")
    with pytest.raises(EdgebertError, match=r"train.tsv:1: header \['text', 'score'\] is not the sst2 layout"):
        compiler.compile(_recipe(tiny_checkpoint), tmp_path / "o2", data_dir=str(broken))
    with pytest.raises(EdgebertError, match="teacher .* is not a checkpoint folder"):
        compiler.compile(_recipe(tiny_checkpoint, teacher=str(tmp_path)), tmp_path / "o3", data_dir=str(tiny_sst2))
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()


@pytest.mark.parametrize("text, message", [
    ('stages = ["finetune", "compress"]', "stages: unknown stage 'compress'; known stages: finetune, distill"),
    ('[distill]\nlayers = "four"', 'distill.layers: expected a positive int, got "four"'),
    ('[distill.train]\nlr = "fast"', 'distill.train.lr: expected a non-negative number, got "fast"'),
    ('[prune]\nheads = 1.5', "prune: PruneConfig.heads is a fraction"),
    ('[prune]\ntries = 0', "prune.tries: expected a positive int, got 0"),
    ('validation = 0\n[prune]\ntries = 2', "prune.tries keeps the try best on the validation split"),
    ('[quantize]\nonnx = "int4"', "quantize.onnx: unknown onnx 'int4'"),
    ('[export]\nformats = "onnx"', 'export.formats: expected a list of str, got "onnx"'),
    ("[bogus]\nx = 1", "[bogus]: unknown stage table"),
    ("[distill]\nlayer = 4", "distill.layer: unknown field"),
    ("task = ", "recipe: not valid TOML"),
])
def test_invalid_recipes_name_the_field(text, message):
    with pytest.raises(EdgebertError) as e:
        recipes.parse(text)
    assert message in str(e.value)


def test_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "r.toml"
    bad.write_text('[distill]\nlayers = "four"\n')
    result = subprocess.run([sys.executable, "-m", "edgebert.cli", "compile", str(bad), "--out", str(tmp_path / "o")],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip() == 'edgebert: error: distill.layers: expected a positive int, got "four"'
