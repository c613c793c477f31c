"""bench/recovery.py without training: the variant named as the recipe is the compile's own prune stage
(same cache key, so it is found done), every other variant changes only [prune] at the same step budget,
and the choice between them is made on validation, not dev."""

from dataclasses import asdict, replace

from edgebert.pipeline import recipe as recipes
from edgebert.pipeline.stages import STAGES

TEACHER = "../shared/models/minilm-l6-sst2"


def _as_compiled(recovery):
    """The default recipe as `edgebert compile --teacher TEACHER` reads it."""
    return replace(recipes.load(recovery.RECIPE), teacher=TEACHER)


def test_the_recipe_variant_is_the_compiles_own_stage(bench_scripts):
    recovery = bench_scripts.recovery
    compiled = _as_compiled(recovery)
    variant = recovery.variant_recipe(recovery.VARIANTS[recovery.RECIPE_VARIANT][1], TEACHER)
    assert variant.stages == ["finetune", "distill", "prune"]
    assert {k: v for k, v in asdict(variant).items() if k != "stages"} == \
        {k: v for k, v in asdict(compiled).items() if k != "stages"}
    for name in ("distill", "prune"):
        assert STAGES[name].cache_key(variant) == STAGES[name].cache_key(compiled)


def test_other_variants_change_only_prune_at_the_same_budget(bench_scripts):
    recovery = bench_scripts.recovery
    compiled = _as_compiled(recovery)
    total = compiled.stage("prune").rounds * compiled.stage("prune").recovery.train.steps
    keys = set()
    for name, (_, changes) in recovery.VARIANTS.items():
        variant = recovery.variant_recipe(changes, TEACHER)
        prune = variant.stage("prune")
        assert prune.rounds * prune.recovery.train.steps == total, name
        assert STAGES["distill"].cache_key(variant) == STAGES["distill"].cache_key(compiled)
        assert all(variant.stage(s) == compiled.stage(s) for s in STAGES if s != "prune")
        keys.add(repr(STAGES["prune"].cache_key(variant)))
    assert len(keys) == len(recovery.VARIANTS)  # each is a stage of its own


def test_the_choice_is_made_on_validation(bench_scripts):
    recovery = bench_scripts.recovery
    rows = {name: {"what": name, "dev": 0.9, "validation": 0.9} for name in recovery.VARIANTS}
    rows["one-round-logits"].update(dev=0.95, validation=0.80)  # best on dev, worst on validation
    rows["one-round-hidden-augment"].update(dev=0.85, validation=0.99)
    text = recovery.conclusion(rows)
    assert "**one-round-hidden-augment**" in text and "better on validation than the recipe's" in text
    rows[recovery.RECIPE_VARIANT].update(validation=0.9)
    rows["one-round-hidden-augment"].update(validation=0.9 + recovery.MARGIN / 2)  # a lead within the noise
    text = recovery.conclusion(rows)
    assert f"**{recovery.RECIPE_VARIANT}**" in text and "within the 0.5-point margin" in text
