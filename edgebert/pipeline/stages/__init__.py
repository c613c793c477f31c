"""The stages a recipe can name, one module each, registered in the order errors list them."""

from . import finetune, distill, prune, share, vocab, quantize, export  # noqa: F401  (each registers itself)
from .registry import STAGES, Stage, order, register

__all__ = ["STAGES", "Stage", "order", "register"]
