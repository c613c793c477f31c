"""prune: remove heads, FFN neurons, hidden units (width) or layers by Taylor importance, recovering by distillation
from the unpruned model or (`recover_from = "teacher"`) from the teacher of a stage before it (distill's)."""

from edgebert.errors import EdgebertError
from edgebert.passes import PruneConfig, prune
from edgebert.passes.augment import SINGLE_TEXT_KINDS, check_pairs
from edgebert.passes.prune import pruned_shape

from ..context import pass_stage
from ..resources import Training, Work, eval_size, evaluated, examples, labelled
from .registry import STAGES, Stage, register


def from_teacher(options: PruneConfig) -> bool:
    """Whether recovery learns from the teacher of a stage before (distill's), not from the model it prunes."""
    return options.recover_from == "teacher"


def check(recipe, options: PruneConfig, encoder, tokenizer) -> None:
    before = recipe.stages[:recipe.stages.index("prune")]
    if from_teacher(options) and not any(STAGES.get(s).sets_teacher for s in before):
        raise EdgebertError("prune.recover_from = 'teacher' recovers from the distill stage's teacher: put "
                            "\"distill\" before \"prune\" in stages, or use recover_from = 'unpruned'")
    augment = options.recovery.augment if options.recovery is not None else None
    check_pairs(augment, recipe.kind in SINGLE_TEXT_KINDS, "prune.recovery.augment")


def trains(options: PruneConfig) -> Training:
    """Scoring, then distillation recovery from a teacher: the larger batch is the peak."""
    peaks = [Training(options.batch_size, "batch_size", teacher=True)]
    if options.recovery is not None:
        peaks.append(Training(options.recovery.train.batch_size, "recovery.train.batch_size", teacher=True))
    return max(peaks, key=lambda p: p.batch)


def tries(options: PruneConfig) -> list[PruneConfig]:
    """One prune per seed, seed + 1, ...: the importance sample and the recovery differ, the best on validation
    is kept."""
    return [options.replace(seed=options.seed + t, tries=1) for t in range(options.tries)]


def teacher(ctx, state, options: PruneConfig):
    return state.teacher if from_teacher(options) else None


def cache(options: PruneConfig, root) -> PruneConfig:
    return options if options.recovery is None else options.replace(recovery=options.recovery.cached_in(root))


def work(options: PruneConfig, data) -> Work:
    """Each round scores a sample (a forward and a backward pass: about three inferences each), then recovers by
    distillation; the teacher labels the text and its copies once, for every round and try."""
    scored = 3 * options.rounds * options.sample_batches * options.batch_size
    recovery = options.recovery
    if recovery is None or not recovery.train.steps:
        return Work(infer=scored + eval_size(data))
    return Work(train=options.rounds * examples(recovery.train),
                infer=scored + options.rounds * evaluated(recovery.train, data),
                teacher=labelled(recovery.augment, data), labels_own_input=not from_teacher(options),
                config=recovery.train, distill=recovery)


register(Stage(name="prune", options=PruneConfig, run=pass_stage(prune, teacher, cache), by_default=True,
               check=check, trains=trains, work=work, shape=pruned_shape, tries=tries, makes_model=True,
               searched={"heads": "heads", "ffn": "ffn", "width": "width"}))
