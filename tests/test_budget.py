"""`edgebert compile --budget`: the grid of prune fractions searched, measured, cached and chosen from."""

import json
from dataclasses import replace

import pytest

from edgebert import EdgebertError
from edgebert.cli import main
from edgebert.device_tests.files import sha256
from edgebert.pipeline import compile as compiler
from edgebert.pipeline import recipe as recipes
from edgebert.pipeline import search as searching
from edgebert.pipeline.promise import teacher_metric
from edgebert.pipeline.search import parse_budget
from edgebert.pipeline.stages import STAGES

RECIPE = """
task = "sst2"
model = "{model}"
max_length = 16
stages = ["finetune", "prune", "quantize", "export"]
[finetune.train]
steps = 6
batch_size = 8
[prune]
sample_batches = 2
batch_size = 8
[prune.recovery.train]
steps = 2
batch_size = 8
[quantize]
accuracy_budget = 100.0
calibration_size = 8
tflite = "none"
[export]
formats = ["onnx"]
seq_lens = [16]
bench = false
[search]
heads = [0.5]
ffn = [0.25, 0.5]
width = [0.0, 0.25]
warmup = 1
runs = 3
"""
pytestmark = pytest.mark.filterwarnings("ignore:.*majority-class baseline")  # a 6-step finetune learns little
SMALLEST = "prune heads=0.5 ffn=0.5 width=0.25"


@pytest.fixture(scope="module")
def searched(tiny_checkpoint, tiny_sst2, tmp_path_factory):
    """A first run whose budget nothing meets: it trains and measures every candidate, then fails."""
    out = tmp_path_factory.mktemp("budget") / "out"
    recipe = recipes.parse(RECIPE.format(model=tiny_checkpoint))
    with pytest.raises(EdgebertError) as failed:
        compiler.compile(recipe, out, data_dir=str(tiny_sst2), budget=parse_budget("size<=1KB,drop<=100"))
    return recipe, out, str(failed.value)


def test_unmeetable_budget_names_the_closest_and_what_it_misses(searched):
    _, out, message = searched
    assert "\n" not in message
    assert message.startswith(f"no candidate meets the budget: closest is {SMALLEST} (")  # only size is missed
    assert "drop " in message and "p50 " in message and message.endswith("> 0.001 MB")
    assert not (out / "bundle").exists()
    assert len(list((out / "stages").glob("*-prune-*"))) == 4  # one folder per candidate
    assert len(list((out / "stages").glob("*-finetune-*"))) == 1  # shared by all


def test_missed_latency_is_named():
    row = {"p50": 0.0213, "p90": 0.05, "size": 2e6, "drop": 0.5}
    assert searching.missed(row, parse_budget("p50<=0.01ms,drop<=1")) == ["p50 0.0213 ms > 0.01 ms"]


def test_a_latency_no_student_can_meet_is_refused_before_any_work(searched, tiny_sst2, tmp_path, monkeypatch):
    recipe, _, _ = searched
    monkeypatch.setitem(STAGES._entries, "finetune", replace(STAGES.get("finetune"), run=lambda *a, **k: 1 / 0))
    with pytest.raises(EdgebertError, match=r"^--budget p50<=0.000001ms: an empty model's call already takes "
                                            r"[0-9.e-]+ ms p50 on local, so no student can meet it; raise the bound$"):
        compiler.compile(recipe, tmp_path / "new", data_dir=str(tiny_sst2), budget=parse_budget("p50<=0.000001ms"))
    assert not (tmp_path / "new").exists()  # refused before the output folder was made


def _refuse_work(monkeypatch):
    """Any stage run or bench call fails the test: a re-run must find everything cached."""
    def refuse(*args, **kwargs):
        raise AssertionError("a stage ran or a file was benched again")

    for name in STAGES:
        monkeypatch.setitem(STAGES._entries, name, replace(STAGES.get(name), run=refuse))
    monkeypatch.setattr("edgebert.bench.bench", refuse)


def test_looser_budget_reuses_every_candidate_and_picks_the_smallest_inside(searched, tiny_sst2, monkeypatch):
    recipe, out, _ = searched
    _refuse_work(monkeypatch)
    bundle = compiler.compile(recipe, out, data_dir=str(tiny_sst2), resume=True,
                              budget=parse_budget("size<=9MB,drop<=100"))
    manifest = json.loads((bundle / "manifest.json").read_text())
    rows = manifest["search"]["candidates"]
    assert len(rows) == 4 and all(not r["missed"] for r in rows)
    chosen = next(r for r in rows if r["chosen"])
    assert chosen["candidate"] == SMALLEST and chosen["size"] == min(r["size"] for r in rows)
    assert chosen["pareto"]  # the smallest cannot be dominated
    # the bundle's file is that candidate's: its export stage's model.onnx, byte for byte
    exported = [p for p in (out / "stages").glob("*-export-*/model.onnx") if p.stat().st_size == chosen["size"]]
    assert sha256(bundle / "model.onnx") in {sha256(p) for p in exported}
    assert manifest["verification"]["model.onnx"]["stage"] == "quantize"
    assert "budget size<=9MB,drop<=100" in compiler.summary(bundle) and "<- picked" in compiler.summary(bundle)
    assert compiler.summary_data(bundle)["search"]["candidates"] == rows
    assert 'id="search"' in (bundle / "report.html").read_text()


def test_pick_p50_takes_the_fastest(searched, tiny_sst2, monkeypatch):
    recipe, out, _ = searched
    _refuse_work(monkeypatch)
    bundle = compiler.compile(recipe, out, data_dir=str(tiny_sst2), resume=True, pick="p50",
                              budget=parse_budget("drop<=100"))
    rows = json.loads((bundle / "manifest.json").read_text())["search"]["candidates"]
    assert next(r for r in rows if r["chosen"])["p50"] == min(r["p50"] for r in rows)


@pytest.mark.parametrize("text, error", [
    ("size<=9", r"'size<=9' needs a size with its unit, e.g. size<=9MB \(units: B, KB, MB"),
    ("p50<=1.5", r"'p50<=1.5' needs a latency with its unit"),
    ("p50<=1.5mb", r"'p50<=1.5mb' needs a latency with its unit"),
    ("drop<=1%", r"cannot read 'drop<=1%'"),
    ("drop<=1MB", r"drop is in points of the task metric; write drop<=1$"),
    ("drop<1", r"'drop<1' uses '<'; every constraint is an upper bound: drop<=VALUE"),
    ("speed<=3", r"unknown constraint 'speed' in 'speed<=3'; use drop, size, p50, p90"),
    ("size<=9MB,size<=8MB", r"size is bounded twice"),
    (" , ", r"no constraint given"),
])
def test_budget_syntax_errors_are_one_line(text, error):
    with pytest.raises(EdgebertError, match=f"^--budget: .*{error}") as e:
        parse_budget(text)
    assert "\n" not in str(e.value)


def test_budget_units():
    bounds = {b.name: b.limit for b in parse_budget("drop<=1.0, size<=9MB,p50<=1500us,p90<=2s")}
    assert bounds == {"drop": 1.0, "size": 9e6, "p50": 1.5, "p90": 2000.0}


def test_grid_mistakes_are_one_line(tiny_checkpoint):
    with pytest.raises(EdgebertError, match=r"^search.heads: an empty list leaves no candidate"):
        recipes.parse(RECIPE.format(model=tiny_checkpoint).replace("heads = [0.5]", "heads = []"))
    bad = recipes.parse(RECIPE.format(model=tiny_checkpoint).replace("width = [0.0, 0.25]", "width = [1.5]"))
    with pytest.raises(EdgebertError, match=r"^search: PruneConfig.width is a fraction in \[0, 1\), got 1.5"):
        searching.candidates(bad)
    with pytest.raises(EdgebertError, match=r'^search.heads: searches the prune stage, which the recipe does not run'):
        searching.candidates(recipes.with_stages(bad, ["finetune", "export"]))
    default = recipes.parse(f'model = "{tiny_checkpoint}"\nstages = ["finetune", "export"]')
    with pytest.raises(EdgebertError, match=r'^--budget: nothing to search; .* add "prune"'):
        searching.candidates(default)


def test_vocab_and_embedding_axes_multiply_the_grid(tiny_checkpoint):
    text = RECIPE.format(model=tiny_checkpoint).replace('"prune", "quantize"', '"prune", "vocab", "quantize"')
    recipe = recipes.parse(text + 'min_count = [1, 2]\nembeddings = ["int8", "int4"]\n')
    found = searching.candidates(recipe)
    assert len(found) == 2 * 2 * 2 * 2
    label, choice, chosen = found[-1]
    assert label == "prune heads=0.5 ffn=0.5 width=0.25 vocab min_count=2 quantize embeddings=int4"
    assert chosen.stage("vocab").min_count == 2 and chosen.stage("quantize").embeddings == "int4"
    assert chosen.stage("prune").width == 0.25 and recipe.stage("prune").width == 0.0  # the recipe is untouched


def test_cli_budget_errors_exit_2_in_one_line(capfd):
    assert main(["compile", "--budget", "size<=9"]) == 2
    err = capfd.readouterr().err.strip()
    assert err.startswith("edgebert: error: --budget: 'size<=9' needs") and "\n" not in err
    assert main(["compile", "--pick", "p50"]) == 2
    assert "--pick belongs to the budget search: pass --budget too" in capfd.readouterr().err


def test_drop_without_finetune_counts_from_the_start_model(tiny_checkpoint, tiny_sst2, tmp_path, monkeypatch):
    from edgebert.passes import evaluate
    from edgebert.pipeline.context import context, task_model

    recipe = recipes.parse(RECIPE.format(model=tiny_checkpoint).replace('"finetune", ', ""))
    ctx = context(recipe, tmp_path, str(tiny_sst2))
    expected = evaluate(task_model(tiny_checkpoint, ctx.task), ctx.data.eval)["accuracy"] * 100
    assert teacher_metric(ctx, [], "k") == pytest.approx(expected)
    monkeypatch.setattr("edgebert.passes.evaluate", lambda *a, **k: pytest.fail("evaluated again"))
    assert teacher_metric(ctx, [], "k") == pytest.approx(expected)  # cached beside the stages
