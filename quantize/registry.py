"""Which implementation handles which (config, file format): public configs stay free of runtime code.

Implementations are stored on the format itself (`edgebert.export.formats.Format.quantizers`), so a
format lists the methods that produce it; export never imports this package to get them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from torch import nn

from edgebert.errors import EdgebertError
from edgebert.export import InputSpec, formats


@dataclass
class Job:
    """Everything an implementation may need; it writes `out` and returns metadata."""

    src: Path | None  # the float file in the output's format (None for methods that take only the module)
    module: nn.Module | None  # the PyTorch model when the caller passed one
    spec: InputSpec
    calibration: dict | None
    eval_data: dict | None
    out: Path  # a temporary path; quantize() moves it into place
    work: Path  # scratch folder


@dataclass(frozen=True)
class Method:
    """One (config, format) implementation and how quantize() prepares its input."""

    run: Callable[[Job, object], dict]
    # the export config a module is exported with first, or a function of the method's config giving it
    # (None: the format's default)
    export_with: object | Callable[[object], object] | None
    float_file: bool  # False: the method works on the module alone and needs no float file

    def export_config(self, config):
        return self.export_with(config) if callable(self.export_with) else self.export_with


def register(config_type: type, fmt: str, *, export_with=None, float_file: bool = True):
    """Register the decorated `fn(job, config) -> meta` as `config_type`'s implementation for format `fmt`."""
    def wrap(fn):
        formats.get(fmt).quantizers[config_type] = Method(fn, export_with, float_file)
        return fn
    return wrap


def lookup(config, fmt: formats.Format) -> Method:
    method = fmt.quantizers.get(type(config))
    if method is None:
        known = sorted(f.name for f in formats.all_formats() if type(config) in f.quantizers)
        raise EdgebertError(f"{type(config).__name__} does not produce {fmt.name} files: use one of {known or 'none'}")
    return method


def need(job: Job, what: str, config) -> dict:
    value = job.calibration if what == "calibration" else job.eval_data
    if value is None:
        raise EdgebertError(f"{type(config).__name__} needs {what}=...: pass tokenized task arrays (input_ids, "
                            "attention_mask, token_type_ids, lengths, labels)")
    return value
