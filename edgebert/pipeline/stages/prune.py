"""prune: remove heads, FFN neurons, hidden units (width) or layers by Taylor importance, recovering by distillation."""

from edgebert.passes import PruneConfig, prune

from ..context import pass_stage
from .registry import Stage, register

register(Stage(name="prune", options=PruneConfig, run=pass_stage(prune)))
