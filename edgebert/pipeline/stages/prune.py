"""prune: remove heads, FFN neurons, hidden units (width) or layers by Taylor importance, recovering by distillation
from the unpruned model or (`recover_from = "teacher"`) from the model the distill stage learned from."""

import dataclasses

from edgebert.errors import EdgebertError
from edgebert.passes import PruneConfig, prune

from ..context import pass_stage
from .registry import Stage, register

ADDED = ("recover_from", "int4_words")  # options newer than the first cached runs: in the key only when set


def teacher(ctx, state, options: PruneConfig):
    if options.recover_from != "teacher":
        return None
    if state.teacher is None:
        raise EdgebertError("prune.recover_from = 'teacher' recovers from the distill stage's teacher: put "
                            "\"distill\" before \"prune\" in stages, or use recover_from = 'unpruned'")
    return state.teacher


def key(recipe) -> dict:
    """The options, less the ADDED ones at their defaults, so a run cached before they existed resumes."""
    defaults = {f.name: f.default for f in dataclasses.fields(PruneConfig)}
    return {k: v for k, v in recipe.stage("prune").to_dict().items() if k not in ADDED or v != defaults[k]}


register(Stage(name="prune", options=PruneConfig, run=pass_stage(prune, teacher), key=key))
