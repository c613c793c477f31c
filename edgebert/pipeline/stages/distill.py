"""distill: the current model distilled into a student made from every k-th of its layers."""

from edgebert.passes import DistillConfig, distill

from ..context import pass_stage
from .registry import Stage, register


def cache(options: DistillConfig, root) -> DistillConfig:
    return options if options.cache_dir else options.replace(cache_dir=str(root))


register(Stage(name="distill", options=DistillConfig, run=pass_stage(distill, cache=cache), defaults={"layers": 4}))
