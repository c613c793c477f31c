"""The stages a recipe can name, one module each, registered in the order they run (and errors list them)."""

from . import finetune, distill, prune, share, static, vocab, quantize, export  # noqa: F401  (each registers itself)
from .registry import STAGES, Stage, bundle_stage, register

__all__ = ["STAGES", "Stage", "bundle_stage", "register"]
