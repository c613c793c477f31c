"""The format registry: one `Format` per kind of model file, the host half of a format whose device half
is its runtime entry (`edgebert.device_tests.runtimes`).

The runtime entry names the format, its suffix and how a file of it runs; the `Format` adds how a file is
written (its export config and exporter), how a bundle describes its inputs and outputs, and which
quantization methods produce it (`quantize_methods`, the recipe's names; `quantizers`, filled in by
`edgebert.quantize`, which export never imports). Each format edgebert writes has a module of its own,
`export/<format name>.py` (a hyphen as an underscore: export/onnx_text.py), that registers its `Format`; the
registry imports those of the formats the runtime table names on first lookup, so a new format is that module
and its runtime's entry. (A format some runtime runs but edgebert does not write has no such module, and no
`Format`.)

A format with a `source` is built from another format's file and the tokenizer, not from PyTorch (the raw-text
model wraps model.onnx): export builds it after its source, and verifies it against that file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path
from typing import Callable

import numpy as np

from edgebert.device_tests import HarnessError, backends, runtimes
from edgebert.errors import EdgebertError
from edgebert.registry import Registry


@dataclass(frozen=True, kw_only=True)
class Format:
    runtime: str  # "litert": the device_tests runtime that runs it here; its entry names the format and suffix
    config: type  # its export options, an edgebert.config.Config subclass
    exporter: Callable  # (model, config, spec: InputSpec, out: Path) -> meta dict; writes `out` atomically
    io: Callable[[Path], dict]  # the input/output contract of a file, as a bundle manifest records it
    input_dtype: str  # the ids' dtype of a file written with default options
    quantize_methods: tuple[str, ...]  # the recipe's `quantize.<name>` choices, the default first; "none": float
    # the methods its exporter does itself: method -> the export config's changes ({"fp16": {"precision": "fp16"}})
    export_methods: dict[str, dict] = field(default_factory=dict)
    quantizers: dict = field(default_factory=dict)  # {quantize config type: method}, see edgebert.quantize
    # built from a file of this format (and the tokenizer): its exporter is then (source: Path, config, out) -> meta
    source: str | None = None
    requires: tuple[str, ...] = ()  # modules writing one imports beyond edgebert[convert]: a recipe without them is refused
    extra: str | None = None  # edgebert's pip extra that installs them
    skips: dict[str, str] = field(default_factory=dict)  # task kind -> why no file of this format serves it

    def missing(self) -> str | None:
        """Why this machine cannot write a file of it (a module it needs is not installed), else None."""
        absent = [m for m in self.requires if find_spec(m) is None]
        if not absent:
            return None
        return (f"{self.name} needs {', '.join(absent)}, which is not installed here: "
                f"pip install 'edgebert[{self.extra}]'")

    @property
    def name(self) -> str:
        """"onnx": how recipes, metadata and bundles name it."""
        return runtimes.get(self.runtime).format

    @property
    def suffix(self) -> str:
        return runtimes.get(self.runtime).suffix

    def open(self, path: str | Path, threads: int = 1) -> backends.Model:
        """The file loaded in its runtime."""
        try:
            return backends.load(str(path), self.runtime, threads)
        except HarnessError as e:
            raise EdgebertError(str(e)) from None

    def run(self, path: str | Path, arrays: dict, threads: int = 1, batch_size: int = 32) -> np.ndarray:
        """Outputs [N, ...] of the file on validated right-padded arrays, in its own runtime."""
        model = self.open(path, threads)
        try:
            return backends.logits(model, arrays, batch_size)
        except HarnessError as e:
            raise EdgebertError(str(e)) from None


def _import_formats() -> None:
    for name in runtimes.formats():
        module = f"{__package__}.{name.replace('-', '_')}"  # onnx-text: export/onnx_text.py
        if find_spec(module):
            import_module(module)


FORMATS: Registry[Format] = Registry("format", load=_import_formats)


def register(fmt: Format) -> Format:
    """Add the format its runtime names; a format whose runtime is unknown is refused."""
    try:
        return FORMATS.register(fmt.name, fmt)
    except HarnessError as e:
        raise EdgebertError(f"format of {fmt.config.__name__}: {e}") from None


def all_formats() -> list[Format]:
    """Every registered format, in the runtime table's order."""
    return FORMATS.values()


def get(name: str) -> Format:
    return FORMATS.get(name)


def of_path(path: str | Path) -> Format | None:
    """The format a file name implies (by suffix); None when no format claims it."""
    suffix = runtimes.suffix_of(path)
    return next((f for f in FORMATS.values() if f.suffix == suffix), None)


def of_file(path: str | Path) -> Format:
    """The format of a model file to run; one error naming the known suffixes when none claims it."""
    fmt = of_path(path)
    if fmt is None:
        raise EdgebertError(f"cannot run {path}: expected a {' or '.join(f.suffix for f in FORMATS.values())} file")
    return fmt


def of_config(config) -> Format | None:
    """The format an export config writes; None for anything else."""
    return next((f for f in FORMATS.values() if type(config) is f.config), None)


def suffix_hint() -> str:
    """"*.onnx or *.tflite": for messages that ask for a file of some known format."""
    return " or ".join(f"*{f.suffix}" for f in FORMATS.values())
