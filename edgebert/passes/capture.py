"""Reading a model's internal states during a forward pass: what distillation compares."""

from __future__ import annotations

from contextlib import contextmanager

from torch import nn

from ..model import blocks, embeddings


@contextmanager
def capture(model: nn.Module, hidden: set[int], qkv: set[int]):
    """Record hidden states (0 = embeddings, i = layer i) and each listed layer's q/k/v outputs.

    q/k/v are read in call order from the attention projections, so layers that share one module
    (ALBERT) are still told apart."""
    states: dict = {"hidden": {}, "q": [], "k": [], "v": []}
    handles = []
    if 0 in hidden:
        handles.append(embeddings(model).module.register_forward_hook(
            lambda m, i, o: states["hidden"].__setitem__(0, o)))
    layers = blocks(model)
    for i, block in enumerate(layers, start=1):
        if i in hidden:
            handles.append(block.module.register_forward_hook(
                lambda m, inp, out, i=i: states["hidden"].__setitem__(i, out)))
    if qkv:
        seen = set()
        for block in layers:
            for name, module in (("q", block.query), ("k", block.key), ("v", block.value)):
                if id(module) not in seen:
                    seen.add(id(module))
                    handles.append(module.register_forward_hook(
                        lambda m, inp, out, name=name: states[name].append(out)))
    try:
        yield states
    finally:
        for h in handles:
            h.remove()
