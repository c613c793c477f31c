"""share: ALBERT-style layer sharing and factorized embeddings; lowers size, not FLOPs."""

from edgebert.passes import ShareConfig, share

from ..context import pass_stage
from ..resources import Training
from .registry import Stage, register


def trains(options: ShareConfig) -> Training | None:
    """Recovery distils the shared model from a copy of the unshared one."""
    if options.recovery is None or not options.recovery.train.steps:
        return None
    return Training(options.recovery.train.batch_size, "recovery.train.batch_size", teacher=True)


register(Stage(name="share", options=ShareConfig, run=pass_stage(share), trains=trains, makes_model=True))
