"""distill: the current model distilled into a student made from every k-th of its layers."""

from edgebert.passes import DistillConfig, distill

from ..context import pass_stage
from .registry import Stage, register

register(Stage(name="distill", options=DistillConfig, run=pass_stage(distill, cache=DistillConfig.cached_in),
               defaults={"layers": 4}))
