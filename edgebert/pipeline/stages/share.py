"""share: ALBERT-style layer sharing and factorized embeddings; lowers size, not FLOPs."""

from edgebert.passes import ShareConfig, share

from ..context import pass_stage
from .registry import Stage, register

register(Stage(name="share", options=ShareConfig, run=pass_stage(share)))
