"""Which implementation handles which (config, file format): public configs stay free of runtime code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from torch import nn

from edgebert.errors import EdgebertError
from edgebert.export.data import InputSpec

_IMPLS: dict[tuple[type, str], Callable] = {}


@dataclass
class Job:
    """Everything an implementation may need; it writes `out` and returns metadata."""

    src: Path | None  # the float file in the output's format (None only for QAT)
    module: nn.Module | None  # the PyTorch model when the caller passed one
    spec: InputSpec
    calibration: dict | None
    eval_data: dict | None
    out: Path  # a temporary path; quantize() moves it into place
    work: Path  # scratch folder


def register(config_type: type, fmt: str):
    def wrap(fn):
        _IMPLS[(config_type, fmt)] = fn
        return fn
    return wrap


def lookup(config, fmt: str) -> Callable:
    impl = _IMPLS.get((type(config), fmt))
    if impl is None:
        known = sorted(f for (c, f) in _IMPLS if c is type(config))
        raise EdgebertError(f"{type(config).__name__} does not produce {fmt} files: use one of {known or 'none'}")
    return impl


def need(job: Job, what: str, config) -> dict:
    value = job.calibration if what == "calibration" else job.eval_data
    if value is None:
        raise EdgebertError(f"{type(config).__name__} needs {what}=...: pass tokenized task arrays (input_ids, "
                            "attention_mask, token_type_ids, lengths, labels)")
    return value
