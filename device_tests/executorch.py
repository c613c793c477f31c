"""The ExecuTorch runtimes' loaded-model class: a .pte file's one method, run by the official
`executorch.runtime` (the `executorch` package, which needs torch) or torch-free by `executorch_numpy_runtime`
(PyPI `executorch-numpy-runtime`, Python 3.12+, numpy only), which loads the files executorch 1.5.1 writes.
The file is lowered to XNNPACK when exported, so the delegate is fixed."""

from __future__ import annotations

import numpy as np

from . import HarnessError
from .backends import Model
from .evalset import INPUTS
from .versions import versions


class ExecuTorch(Model):
    """A .pte file's one method in an ExecuTorch runtime: the official `executorch.runtime` (needs torch) or
    the torch-free `executorch_numpy_runtime`, as the `runtime` entry says. Called as the harness calls every
    runtime's class: (path, threads, accelerator, runtime=entry)."""

    def __init__(self, path: str, threads: int, accelerator: str | None = None, *, runtime):
        if accelerator not in (None, "xnnpack"):
            raise HarnessError(f"{path} is lowered to XNNPACK when exported: drop --delegate {accelerator}")
        module = runtime.import_module()
        self.name, self.version = runtime.name, versions(runtime.package).get(runtime.package, "unknown")
        self.warnings = [runtime.warning] if runtime.warning else []
        self.accelerator = {"delegate": "xnnpack"}
        self.torch = runtime.module == "executorch.runtime"  # the official runtime takes and returns torch tensors
        if self.torch:  # XNNPACK's one pool per process, sized before a method binds to it
            from executorch.extension.pybindings import portable_lib

            portable_lib._unsafe_reset_threadpool(threads)
        try:
            program = module.Runtime.get().load_program(path)
            (self.output,) = program.method_names
            self.method = program.load_method(self.output)
        except Exception as e:  # noqa: BLE001  both runtimes raise untyped load errors; two methods unpack badly
            raise HarnessError(f"{runtime.name} {self.version} cannot load {path} ({str(e).splitlines()[0][:200]}): "
                               "pass a file edgebert exported, with this ExecuTorch version or older") from None
        if self.torch:
            meta = program.metadata(self.output)
            shapes = [list(meta.input_tensor_meta(i).sizes()) for i in range(meta.num_inputs())]
        else:
            if threads != 1:
                self.warnings.append(f"{runtime.package} sizes its thread pool itself: threads={threads} is not "
                                     "applied")
            shapes = [i["shape"] for i in self.method.metadata["inputs"]]
        if not 2 <= len(shapes) <= len(INPUTS) or any(len(s) != 2 for s in shapes):
            raise HarnessError(f"{path} takes {len(shapes)} inputs of shapes {shapes}: expected 2 or 3 int32 "
                               "[batch, tokens] inputs, as edgebert writes them")
        self.names = list(INPUTS[:len(shapes)])
        self.max_batch, self.max_length = shapes[0]  # a dynamic axis reports its upper bound

    def prepare(self, feeds: dict[str, np.ndarray]):
        batch, length = feeds["input_ids"].shape
        if length > self.max_length or batch > self.max_batch:
            raise HarnessError(f"input [{batch}, {length}] exceeds the file's [{self.max_batch}, {self.max_length}]: "
                               "truncate it, or export with a larger max_length / max_batch")
        arrays = [np.ascontiguousarray(feeds[n], dtype=np.int32) for n in self.names]
        if self.torch:
            import torch

            return [torch.from_numpy(a) for a in arrays]
        return arrays

    def infer(self, prepared) -> np.ndarray:
        if self.torch:
            return self.method.execute(prepared)[0].numpy()
        return self.method(prepared)[0]
