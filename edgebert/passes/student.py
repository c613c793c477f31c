"""A student from its teacher: which teacher layers it keeps and imitates, narrowed to the largest
heads and FFN neurons. `DistillConfig(layers=..., heads=..., ffn=...)` asks distill for one."""

from __future__ import annotations

import copy
import math

from torch import nn

from ..errors import EdgebertError
from ..model import EncoderConfig, encoder_of
from .surgery import head_norms, keep_top, layer_choice, neuron_norms, remove_heads, remove_layers, remove_neurons


def default_layers(student_layers: int, teacher: EncoderConfig) -> list[int]:
    """Teacher layers (1-based) that student layers 1..n imitate and start from: every k-th, ending
    at the last (DistilBERT keeps every other layer), or where the teacher's layout fixes which layer
    may go where (ModernBERT's global-attention layers), the nearest layers that keep it."""
    n, t = student_layers, teacher.num_layers
    if not 1 <= n <= t:
        raise EdgebertError(f"a student needs 1..{t} layers, got {n}")
    spread = [math.ceil(i * t / n) for i in range(1, n + 1)]
    return [i + 1 for i in layer_choice(teacher, n, lambda j, i: -abs(i + 1 - spread[j]))]


def init_student(teacher: nn.Module, *, layers: int | None = None, keep_layers: list[int] | None = None,
                 heads: int | None = None, ffn: int | None = None) -> nn.Module:
    """A student copied from the teacher: its layers `keep_layers` (1-based; default every k-th for
    a depth of `layers`), each narrowed to its `heads` largest heads and `ffn` largest FFN neurons."""
    c = encoder_of(teacher).config
    if keep_layers is not None and layers is not None and layers != len(keep_layers):
        raise EdgebertError(f"layers={layers} but keep_layers lists {len(keep_layers)}: give one of them")
    layers = keep_layers if keep_layers is not None else default_layers(layers or c.num_layers, c)
    if any(not 1 <= i <= c.num_layers for i in layers):
        raise EdgebertError(f"student layers {layers} must be 1-based teacher layers 1..{c.num_layers}")
    student = copy.deepcopy(teacher).train()
    remove_layers(student, [i for i in range(c.num_layers) if i + 1 not in layers])
    if heads is not None:
        remove_heads(student, keep_top(head_norms(student), [min(heads, c.heads(i - 1)) for i in layers]))
    if ffn is not None:
        remove_neurons(student, keep_top(neuron_norms(student), [min(ffn, c.ffn(i - 1)) for i in layers]))
    return student


def resolve_layer_map(student: nn.Module, teacher: nn.Module, layer_map: dict[int, int] | None) -> dict[int, int]:
    s_layers, t_config = encoder_of(student).config.num_layers, encoder_of(teacher).config
    t_layers = t_config.num_layers
    if layer_map is None:  # a student with no layers (a static one) has no layer to map
        return {i + 1: t for i, t in enumerate(default_layers(s_layers, t_config))} if s_layers else {}
    layer_map = {int(s): int(t) for s, t in layer_map.items()}
    for s, t in layer_map.items():
        if not (0 <= s <= s_layers and 0 <= t <= t_layers):
            raise EdgebertError(f"layer_map {s}->{t} is out of range: the student has hidden states 0..{s_layers}, "
                                f"the teacher 0..{t_layers}")
    return layer_map
