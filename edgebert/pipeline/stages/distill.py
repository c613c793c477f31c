"""distill: the current model distilled into a student made from every k-th of its layers."""

from edgebert.errors import EdgebertError
from edgebert.passes import DistillConfig, distill
from edgebert.passes.augment import SINGLE_TEXT_KINDS, check_pairs
from edgebert.passes.student import init_student

from ..context import pass_stage
from ..resources import Training, Work, evaluated, examples, labelled
from .registry import Stage, register


def check(recipe, options: DistillConfig, encoder, tokenizer) -> None:
    n = encoder.num_layers
    if options.keep_layers and max(options.keep_layers) > n:
        raise EdgebertError(f"distill.keep_layers: layer {max(options.keep_layers)} does not exist in the start "
                            f"model's {n} layers; use 1..{n}")
    if options.layers is not None and options.layers > n:
        raise EdgebertError(f"distill.layers: {options.layers} is more than the start model's {n} layers; use 1..{n}")
    check_pairs(options.augment, recipe.kind in SINGLE_TEXT_KINDS, "distill.augment")


def trains(options: DistillConfig) -> Training:
    """The student (its layers) learns while the teacher runs beside it."""
    layers = options.layers or (len(options.keep_layers) if options.keep_layers else None)
    return Training(options.train.batch_size, "train.batch_size", layers=layers, teacher=True)


def work(options: DistillConfig, data) -> Work:
    """The teacher labels the training text (and its copies) once; the student trains."""
    return Work(train=examples(options.train), infer=evaluated(options.train, data),
                teacher=labelled(options.augment, data), config=options.train, distill=options)


def shape(model, options: DistillConfig):
    if not options.makes_student:
        return model
    return init_student(model, layers=options.layers, keep_layers=options.keep_layers, heads=options.heads,
                        ffn=options.ffn)


register(Stage(name="distill", options=DistillConfig, run=pass_stage(distill, cache=DistillConfig.cached_in),
               defaults={"layers": 4}, by_default=True, check=check, trains=trains, work=work, shape=shape,
               makes_model=True, sets_teacher=True))
