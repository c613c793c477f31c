"""The format registry: one `Format` per kind of model file, registered by its own module
(`export/onnx.py`, `export/tflite.py`), so a new format is one file plus its registration.

A format says how a file of it is written (its export config and exporter), how it runs (the
`edgebert.device_tests.backends` runtime that loads it, the same one the device harness uses),
how a bundle describes its inputs and outputs, and which quantization methods produce it
(`quantizers`, filled in by `edgebert.quantize`, which export never imports).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from edgebert.device_tests import HarnessError, backends
from edgebert.errors import EdgebertError


@dataclass(frozen=True, kw_only=True)
class Format:
    name: str  # "onnx": how recipes, metadata and bundles name it
    suffix: str  # ".onnx"
    config: type  # its export options, an edgebert.config.Config subclass
    exporter: Callable  # (model, config, spec: InputSpec, out: Path) -> meta dict; writes `out` atomically
    backend: str  # the device_tests backend that runs it on the host
    io: Callable[[Path], dict]  # the input/output contract of a file, as a bundle manifest records it
    input_dtype: str  # the ids' dtype of a file written with default options
    quantizers: dict = field(default_factory=dict)  # {quantize config type: method}, see edgebert.quantize

    def open(self, path: str | Path, threads: int = 1):
        """The file loaded in its runtime (a `device_tests.backends` object)."""
        try:
            return backends.load(str(path), self.backend, threads)
        except HarnessError as e:
            raise EdgebertError(str(e)) from None

    def run(self, path: str | Path, arrays: dict, threads: int = 1, batch_size: int = 32) -> np.ndarray:
        """Outputs [N, ...] of the file on validated right-padded arrays, in its own runtime."""
        model = self.open(path, threads)
        try:
            return backends.logits(model, arrays, batch_size)
        except HarnessError as e:
            raise EdgebertError(str(e)) from None


_FORMATS: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    if fmt.name in _FORMATS or any(f.suffix == fmt.suffix for f in _FORMATS.values()):
        raise EdgebertError(f"format {fmt.name} ({fmt.suffix}) is registered twice: give it a new name and suffix")
    _FORMATS[fmt.name] = fmt
    return fmt


def all_formats() -> list[Format]:
    """Every registered format, in registration order."""
    return list(_FORMATS.values())


def get(name: str) -> Format:
    if name not in _FORMATS:
        raise EdgebertError(f"unknown format {name!r}: use one of {list(_FORMATS)}")
    return _FORMATS[name]


def of_path(path: str | Path) -> Format | None:
    """The format a file name implies (by suffix); None when no format claims it."""
    return next((f for f in _FORMATS.values() if f.suffix == Path(path).suffix), None)


def of_file(path: str | Path) -> Format:
    """The format of a model file to run; one error naming the known suffixes when none claims it."""
    fmt = of_path(path)
    if fmt is None:
        raise EdgebertError(f"cannot run {path}: expected a {' or '.join(f.suffix for f in _FORMATS.values())} file")
    return fmt


def of_config(config) -> Format | None:
    """The format an export config writes; None for anything else."""
    return next((f for f in _FORMATS.values() if type(config) is f.config), None)


def suffix_hint() -> str:
    """"*.onnx or *.tflite": for messages that ask for a file of some known format."""
    return " or ".join(f"*{f.suffix}" for f in _FORMATS.values())
