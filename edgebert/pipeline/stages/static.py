"""static: the current model's static student (passes/static.py): its token vectors, n-gram features, a maximum and
a classifier, distilled from it."""

from edgebert.errors import EdgebertError
from edgebert.passes.static import StaticConfig, check_tokenizer, check_width, static, static_shape

from ..context import pass_stage
from ..resources import Training
from .distill import work as distill_work
from .registry import Stage, register


def check(recipe, options: StaticConfig, encoder, tokenizer) -> None:
    kind = recipe.kind
    if kind in ("token-classification", "embedding"):
        raise EdgebertError(f"stages: a static student pools a sentence's context-free token vectors into one, so "
                            f"it has no {kind} head: drop \"static\" for "
                            f"{f'the {recipe.task} task' if recipe.task else 'this data'}")
    check_width(options, encoder.hidden_size)
    check_tokenizer(tokenizer)


register(Stage(name="static", options=StaticConfig, run=pass_stage(static, cache=StaticConfig.cached_in),
               check=check, trains=lambda o: Training(o.distill.train.batch_size, "distill.train.batch_size",
                                                      teacher=True),
               work=lambda options, data: distill_work(options.distill, data), shape=static_shape, makes_model=True,
               sets_teacher=True))
