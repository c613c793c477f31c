"""bench/compile_cost.py without compiling: its cuts lead from the long recipe to the default, and its table says
for every run what was typed, on which commit and machine, and what the compile estimated."""

from edgebert.pipeline import recipe as recipes


def test_the_cuts_lead_from_the_long_recipe_to_the_default(bench_scripts):
    cost = bench_scripts.compile_cost
    recipe = recipes.load(cost.ROOT / cost.LONG)
    for _, cut in cost.CUTS:
        before, recipe = recipe, cut(recipe)
        assert recipe != before  # each cut changes something
    default = recipes.load(cost.ROOT / "edgebert" / "recipes" / "sst2-minilm.toml")
    assert recipe.stages == default.stages and all(recipe.stage(s) == default.stage(s) for s in default.stages)


def test_the_table_names_each_runs_command_commit_and_estimate(bench_scripts):
    cost = bench_scripts.compile_cost
    run = {"command": "edgebert compile --out runs/cost/default", "commit": "abc1234", "device": "cpu",
           "threads_or_gpus": 2, "precision": "fp32", "stage_seconds": {"finetune": 700.0, "prune": 800.0},
           "total_s": 1560.0, "estimate_s": 1500.0, "dev_accuracy": 89.5, "machine": "a CPU"}
    skipped = {"skipped": "no CUDA GPU", "commit": "abc", "machine": "another CPU"}
    lines = cost.table({"runs": {"default": run, "cuda": skipped}, "cuts_machine": "a third CPU",
                        "cuts": [{"cut": "the long recipe", "estimate_s": 6000.0, "saved_s": None},
                                 {"cut": "one try", "estimate_s": 3000.0, "saved_s": 3000.0}]})
    text = "\n".join(lines)
    assert "| default | `edgebert compile --out runs/cost/default` | abc1234 | 1 | cpu | 2 | fp32 | finetune 700, " \
           "prune 800 | 26.0 min | 25.0 min | 89.50% |" in text
    assert "| cuda | | abc | 2 | | | | skipped: no CUDA GPU | | | |" in text
    assert "Machine 1: a CPU." in text and "Machine 2: another CPU." in text  # each run names where it ran
    assert "estimate on machine 3 " in text and "Machine 3: a third CPU." in text  # and the cuts theirs
    assert "| one try | 50.0 min | 50.0 min |" in text
