"""A stage is its registry entry: a stage registered here runs in a compile, is checked up front and has its
memory estimated, with no edit to the pipeline; the pipeline's own files name no stage; the stage folders
of the shipped recipe keep their keys; records written by earlier code still load."""

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from edgebert import EdgebertError, checkpoint
from edgebert.config import Config
from edgebert.passes import evaluate, measure
from edgebert.pipeline import compile as compiler
from edgebert.pipeline import recipe as recipes
from edgebert.pipeline.context import StageRecord, task_model
from edgebert.pipeline.resources import Training
from edgebert.pipeline.stages import STAGES, Stage

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, kw_only=True)
class ScaleConfig(Config):
    factor: float = 2.0  # the classifier's logits are multiplied by it
    batch_size: int = 8


def _scale(ctx, state, options: ScaleConfig, dest, work) -> StageRecord:
    model = task_model(state.model, ctx.task)
    with torch.no_grad():
        model.classifier.weight.mul_(options.factor)
        model.classifier.bias.mul_(options.factor)
    checkpoint.save(model, dest / "model", tokenizer_from=ctx.tokenizer_dir)
    return StageRecord.from_dict(measure("scale", model, metrics=evaluate(model, ctx.data.eval)).to_dict())


def _check_factor(recipe, options: ScaleConfig, encoder, tokenizer) -> None:
    if options.factor <= 0:
        raise EdgebertError(f"scale.factor: {options.factor} flips or zeroes the logits; use a positive number")


SCALE = Stage(name="scale", options=ScaleConfig, run=_scale, check=_check_factor, makes_model=True,
              trains=lambda o: Training(o.batch_size, "batch_size"))


@pytest.fixture
def scale(monkeypatch):
    """SCALE registered for one test, after the training stages and before the file stages."""
    names = STAGES.names()
    at = next(i for i, n in enumerate(names) if STAGES.get(n).writes_files)
    entries = {n: STAGES.get(n) for n in names}
    monkeypatch.setattr(STAGES, "_entries", {n: entries.get(n, SCALE) for n in [*names[:at], "scale", *names[at:]]})


def _recipe(model, tables: str = "") -> recipes.Recipe:
    return recipes.parse(f"""
task = "sst2"
model = "{model}"
max_length = 16
stages = ["scale", "export"]
[export]
formats = ["onnx"]
bench = false
{tables}""")


@pytest.mark.filterwarnings("ignore:scale. accuracy")  # an untrained tiny model
def test_a_registered_stage_runs_in_a_compile(scale, tiny_checkpoint, tiny_sst2, tmp_path):
    import onnxruntime as ort

    out = tmp_path / "out"
    bundle = compiler.compile(_recipe(tiny_checkpoint, "[scale]\nfactor = 3.0"), out, data_dir=str(tiny_sst2))
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert [s["name"] for s in manifest["stages"]] == ["scale"] and "accuracy" in manifest["stages"][0]["metrics"]
    (folder,) = (out / "stages").glob("01-scale-*")
    assert StageRecord.from_dict(json.loads((folder / "record.json").read_text())).params > 0
    eval_set = np.load(bundle / "eval.npz")
    feed = {k: eval_set[k][:4].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
    logits = ort.InferenceSession(str(bundle / "model.onnx")).run(["logits"], feed)[0]
    with torch.no_grad():  # export started from the scaled model: three times the start model's logits
        start = checkpoint.load(tiny_checkpoint).eval()(*(torch.from_numpy(feed[k]) for k in feed))
    np.testing.assert_allclose(logits, 3.0 * start.numpy(), atol=1e-3)


def test_a_registered_stage_is_checked_before_any_work(scale, tiny_checkpoint, tiny_sst2, tmp_path):
    with pytest.raises(EdgebertError, match=r"^scale.factor: 0.0 flips or zeroes the logits"):
        compiler.compile(_recipe(tiny_checkpoint, "[scale]\nfactor = 0.0"), tmp_path / "a", data_dir=str(tiny_sst2))
    with pytest.raises(EdgebertError, match=r"^scale needs about .* available: lower scale.batch_size or max_length"):
        compiler.compile(_recipe(tiny_checkpoint, "[scale]\nbatch_size = 100000000"), tmp_path / "b",
                         data_dir=str(tiny_sst2))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_share_trains_and_has_its_memory_checked(tiny_checkpoint):
    recipe = recipes.parse(f'model = "{tiny_checkpoint}"\nmax_length = 16\nstages = ["share"]\n'
                           "[share.recovery.train]\nbatch_size = 100000000\n")
    encoder = checkpoint.load(tiny_checkpoint).config
    with pytest.raises(EdgebertError, match=r"^share needs about .* lower share.recovery.train.batch_size"):
        recipe.check(encoder, None)


def test_the_pipeline_names_no_stage():
    """compile, context, resources, search and recipe ask the entries (their flags), never a name."""
    names = "|".join(STAGES.names())
    for name in ("compile", "context", "resources", "search", "recipe"):
        text = (ROOT / "edgebert" / "pipeline" / f"{name}.py").read_text()
        assert not re.findall(rf'"({names})"', text), name


def test_the_shipped_recipe_keeps_its_training_folders():
    """--resume reuses the training stages an earlier edgebert ran: their folder names must not move (in fp32, what
    every CPU trained in before bf16 became auto's on a CPU with bf16 hardware)."""
    recipe = recipes.with_device(recipes.load(ROOT / "edgebert" / "recipes" / "sst2-minilm-long.toml"), "cpu", "fp32")
    key, folders = "START", []
    for i, name in enumerate(recipe.stages, 1):
        if STAGES.get(name).keyed_by_code:
            continue
        keys = [compiler._key(key, name, STAGES.get(name).cache_key(r)) for r in compiler._tries(recipe, name)]
        folders += [f"{i:02d}-{name}-{k}" for k in keys]
        key = keys[0]
    assert folders == ["01-finetune-4e0159006897", "02-distill-07c60e70751f", "03-prune-841458c3080e",
                       "03-prune-3feb4b20b61b"]


def test_records_written_by_earlier_code_load():
    trained = {"name": "distill", "wall_s": 12.5, "params": 1000, "bytes": 4000, "flops_128": 9, "metrics":
               {"accuracy": 0.9}, "steps": 6, "details": {"validation": {"accuracy": 0.8}}}
    files = {"name": "quantize", "wall_s": 3.0, "files": {"model.onnx": {"meta": {}, "verify": {"agreement": 1.0}}}}
    vocab = {**trained, "name": "vocab", "new_tokenizer": True}
    for old in (trained, files, vocab):
        record = StageRecord.from_dict(old)
        assert StageRecord.from_dict(record.to_dict()) == record and old.items() <= record.to_dict().items()
    assert StageRecord.from_dict(files).params is None and StageRecord.from_dict(vocab).new_tokenizer
