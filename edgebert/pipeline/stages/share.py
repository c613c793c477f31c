"""share: ALBERT-style layer sharing and factorized embeddings; lowers size, not FLOPs."""

from edgebert.passes import ShareConfig, share

from ..context import pass_stage
from ..resources import Training, Work, eval_size, evaluated, examples
from .registry import Stage, register


def trains(options: ShareConfig) -> Training | None:
    """Recovery distils the shared model from a copy of the unshared one."""
    if options.recovery is None or not options.recovery.train.steps:
        return None
    return Training(options.recovery.train.batch_size, "recovery.train.batch_size", teacher=True)


def work(options: ShareConfig, data) -> Work:
    """The unshared model labels the training text once; the shared one recovers."""
    recovery = options.recovery
    if recovery is None or not recovery.train.steps:
        return Work(infer=eval_size(data))
    return Work(train=examples(recovery.train), infer=evaluated(recovery.train, data), teacher=len(data.train),
                config=recovery.train)


register(Stage(name="share", options=ShareConfig, run=pass_stage(share), trains=trains, work=work,
               makes_model=True))
