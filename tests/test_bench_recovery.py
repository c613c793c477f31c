"""bench/recovery.py without training: every variant starts from one distilled student and changes only
[prune] at the same step budget (but the long ones), the choice between them is made on validation, not
dev, and the recipe's [prune] table is the variant recovery.json chose (run from more importance samples,
its `tries`)."""

import json
from dataclasses import replace

from edgebert.pipeline import recipe as recipes
from edgebert.pipeline.stages import STAGES

TEACHER = "../shared/models/minilm-l6-sst2"


def _as_compiled(recovery):
    """The long recipe as `edgebert compile edgebert/recipes/sst2-minilm-long.toml --teacher TEACHER` reads it."""
    return replace(recipes.load(recovery.RECIPE), teacher=TEACHER)


def test_variants_share_one_start_and_change_only_prune(bench_scripts):
    recovery = bench_scripts.recovery
    compiled = _as_compiled(recovery)
    distills, keys = set(), set()
    for name, (_, changes) in recovery.VARIANTS.items():
        variant = recovery.variant_recipe(changes, TEACHER)
        assert variant.stages == ["finetune", "distill", "prune"]
        prune = variant.stage("prune")
        factor = {"long": 3, "longer": 6, "longest": 12}.get(name.rsplit("-", 1)[-1], 1)
        assert prune.rounds * prune.recovery.train.steps == recovery.BUDGET * factor, name
        assert variant.stage("distill").train.steps == recovery.START["distill"]["train"]["steps"]
        assert all(variant.stage(s) == compiled.stage(s) for s in STAGES if s not in ("distill", "prune"))
        distills.add(repr(STAGES.get("distill").cache_key(variant)))
        keys.add(repr(STAGES.get("prune").cache_key(variant)))
    assert len(distills) == 1  # one distilled student for all
    assert len(keys) == len(recovery.VARIANTS)  # each is a stage of its own


def test_the_recipe_prunes_as_the_study_chose(bench_scripts):
    recovery = bench_scripts.recovery
    results = json.loads((recovery.ROOT / "bench" / "results" / "recovery.json").read_text())
    assert results["chosen"] == recovery.chosen(results["variants"])
    variant = recovery.variant_recipe(recovery.VARIANTS[results["chosen"]][1], TEACHER)
    recipe = _as_compiled(recovery).stage("prune")
    assert variant.stage("prune") == recipe.replace(tries=1)  # the recipe repeats the study's one sample


def test_the_choice_is_made_on_validation(bench_scripts):
    recovery = bench_scripts.recovery
    rows = {name: {"what": name, "dev": 0.9, "validation": 0.9} for name in recovery.VARIANTS}
    rows["one-round-labels"].update(dev=0.95, validation=0.80)  # best on dev, worst on validation
    rows["one-round-hidden-augment"].update(dev=0.85, validation=0.99)
    rows["one-round-fewer-heads-long"].update(validation=1.0)  # another shape: the speed targets' to choose
    assert recovery.chosen(rows) == "one-round-hidden-augment"
    text = recovery.conclusion(rows)
    assert "**one-round-hidden-augment**" in text and "Best on dev: one-round-labels" in text
    rows["one-round-hidden-augment"].update(validation=0.9 + recovery.MARGIN / 2)  # a lead within the noise
    assert recovery.chosen(rows) == recovery.BASELINE
    text = recovery.conclusion(rows)
    assert f"**{recovery.BASELINE}**" in text and "within the 0.5-point margin" in text
