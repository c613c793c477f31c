"""prune: remove heads, FFN neurons, hidden units (width) or layers by Taylor importance, recovering by distillation
from the unpruned model or (`recover_from = "teacher"`) from the model the distill stage learned from."""

from edgebert.errors import EdgebertError
from edgebert.passes import PruneConfig, prune

from ..context import pass_stage
from .registry import Stage, register


def teacher(ctx, state, options: PruneConfig):
    if options.recover_from != "teacher":
        return None
    if state.teacher is None:
        raise EdgebertError("prune.recover_from = 'teacher' recovers from the distill stage's teacher: put "
                            "\"distill\" before \"prune\" in stages, or use recover_from = 'unpruned'")
    return state.teacher


def cache(options: PruneConfig, root) -> PruneConfig:
    return options if options.recovery is None else options.replace(recovery=options.recovery.cached_in(root))


register(Stage(name="prune", options=PruneConfig, run=pass_stage(prune, teacher, cache)))
