"""finetune: train the start model on the task (skipped when the recipe starts from a teacher)."""

from edgebert.passes import FinetuneConfig, finetune

from ..context import pass_stage
from .registry import Stage, register

register(Stage(name="finetune", options=FinetuneConfig, run=pass_stage(finetune)))
