"""The runtime registry: one `Runtime` entry per runtime a model file runs in, and the one place that says
which file format it runs, what to import and pip-install for it, and which class loads a file.

The harness, `probe`, the command lines, the bench targets and the qemu sysroot all read this table; a new
runtime is its loaded-model class (a `backends.Model`, in a module of its own here) plus one `register`
line below. Standard library only, so `probe` and `--help` read it where numpy is missing: a runtime's
class is named here as "module:Class" and imported when a file is loaded.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import HarnessError
from .registry import Registry

TFLITE_INT8_WARNING = ("tflite-runtime is a legacy runtime whose dynamic-range INT8 kernels gave silently "
                       "wrong outputs on ai-edge-quantizer models: check its accuracy against ai-edge-litert")


@dataclass(frozen=True, kw_only=True)
class Runtime:
    name: str  # "litert": how --backend, probe and results name it
    format: str  # "tflite": the file format it runs, as recipes, bundles and `bench --format` name it
    suffix: str  # ".tflite": the files of that format
    module: str  # "ai_edge_litert.interpreter": what must import for it to run (probe imports it)
    package: str  # "ai-edge-litert": its PyPI distribution, whose version results report
    model: str  # "backends:TFLite": its loaded-model class, module:class inside device_tests
    accelerator_flag: str | None = None  # "provider" or "delegate": the run flag naming its accelerator; None: none
    pip: str = ""  # what `pip install` takes when more than `package` ("tflite-runtime 'numpy<2'")
    warning: str | None = None  # a caveat every result it produces carries
    sysroot: bool = True  # the qemu-aarch64 sysroot installs its aarch64 wheel (False: none fits the sysroot's numpy)
    needs: tuple[str, ...] = ()  # other packages its class's module imports ("torch": bindings that take tensors)

    @property
    def install(self) -> str:
        return self.pip or self.package

    def installed(self) -> bool:
        """Whether its top-level package is there to import (without importing it)."""
        return importlib.util.find_spec(self.module.split(".")[0]) is not None

    def import_module(self):
        """Its Python module; one HarnessError naming the pip package when it does not import."""
        try:
            return importlib.import_module(self.module)
        except ImportError as e:
            raise HarnessError(f"backend {self.name} cannot be imported ({e}): pip install {self.install}") from None

    def open(self, path: str, threads: int, accelerator: str | None = None, **options):
        """`path` loaded in this runtime: its class called as (path, threads, accelerator, runtime=self, **options)
        (ONNX Runtime's classes take `profile`, a profiler file prefix)."""
        module, _, name = self.model.partition(":")
        cls = getattr(importlib.import_module(f".{module}", __package__), name)
        return cls(path, threads, accelerator, runtime=self, **options)


RUNTIMES: Registry[Runtime] = Registry("backend")


def register(runtime: Runtime) -> Runtime:
    """Add a runtime; the runtimes of one format share its suffix, and a suffix belongs to one format."""
    for other in RUNTIMES.values():
        if (other.format == runtime.format) != (other.suffix == runtime.suffix):
            raise HarnessError(f"runtime {runtime.name} ({runtime.format}, {runtime.suffix}) disagrees with "
                               f"{other.name} ({other.format}, {other.suffix}): one suffix per format")
    return RUNTIMES.register(runtime.name, runtime)


def get(name: str) -> Runtime:
    return RUNTIMES.get(name)


def formats() -> dict[str, str]:
    """{format: suffix} of every format some runtime runs, in registration order."""
    return {r.format: r.suffix for r in RUNTIMES.values()}


def suffix_of(path) -> str | None:
    """The registered suffix `path` ends with, the longest when several do (model.text.onnx: .text.onnx, not .onnx);
    None when none does."""
    name = Path(path).name
    return max((r.suffix for r in RUNTIMES.values() if name.endswith(r.suffix)), key=len, default=None)


def for_file(path: str) -> list[Runtime]:
    """The runtimes that run `path`, by its suffix, preferred first."""
    suffix = suffix_of(path)
    found = [r for r in RUNTIMES.values() if r.suffix == suffix] if suffix else []
    if not found:
        raise HarnessError(f"cannot tell the backend from {path}: pass a {' or '.join(formats().values())} file "
                           f"or --backend {'|'.join(RUNTIMES)}")
    return found


def choose(path: str, have: Callable[[Runtime], bool] = Runtime.installed) -> Runtime:
    """The runtime to run `path` with: the first for its suffix that `have` finds, else the first (whose
    load then names the package to install)."""
    candidates = for_file(path)
    return next((r for r in candidates if have(r)), candidates[0])


def defaults() -> str:
    """"onnxruntime for .onnx; litert, else tflite-runtime, for .tflite": for --backend's help."""
    by_suffix: dict[str, list[str]] = {}
    for r in RUNTIMES.values():
        by_suffix.setdefault(r.suffix, []).append(r.name)
    return "; ".join(f"{', else '.join(names)}{',' if len(names) > 1 else ''} for {suffix}"
                     for suffix, names in by_suffix.items())


register(Runtime(name="onnxruntime", format="onnx", suffix=".onnx", module="onnxruntime", package="onnxruntime",
                 model="backends:Onnx", accelerator_flag="provider"))
register(Runtime(name="litert", format="tflite", suffix=".tflite", module="ai_edge_litert.interpreter",
                 package="ai-edge-litert", model="backends:TFLite", accelerator_flag="delegate"))
register(Runtime(name="tflite-runtime", format="tflite", suffix=".tflite", module="tflite_runtime.interpreter",
                 package="tflite-runtime", model="backends:TFLite", accelerator_flag="delegate",
                 pip="tflite-runtime 'numpy<2'", warning=TFLITE_INT8_WARNING, sysroot=False))
register(Runtime(name="executorch", format="executorch", suffix=".pte", module="executorch.runtime",
                 package="executorch", model="executorch:ExecuTorch", sysroot=False, needs=("torch",)))
register(Runtime(name="executorch-numpy", format="executorch", suffix=".pte", module="executorch_numpy_runtime",
                 package="executorch-numpy-runtime", model="executorch:ExecuTorch", sysroot=False))
register(Runtime(name="onnxruntime-extensions", format="onnx-text", suffix=".text.onnx", module="onnxruntime_extensions",
                 package="onnxruntime-extensions", model="rawtext:RawText", accelerator_flag="provider",
                 pip="onnxruntime onnxruntime-extensions", sysroot=False))
