"""`python -m device_tests probe`: what this Python can run, checked before anything big is copied.

Imports nothing at module level beyond the standard library, so it works where numpy is missing.
"""

from __future__ import annotations

import importlib
import json
import platform

from .versions import versions

MODULES = {"numpy": "numpy", "onnxruntime": "onnxruntime", "litert": "ai_edge_litert.interpreter",
           "tflite-runtime": "tflite_runtime.interpreter"}
DISTS = {"numpy": "numpy", "onnxruntime": "onnxruntime", "litert": "ai-edge-litert",
         "tflite-runtime": "tflite-runtime"}


def probe(names: list[str]) -> dict:
    """{name: version or None} plus the import error of each that failed."""
    errors = {}
    for name in names:
        try:
            importlib.import_module(MODULES[name])
        except Exception as e:  # noqa: BLE001  a broken wheel raises anything, not only ImportError
            errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    installed = versions(*(DISTS[name] for name in names if name not in errors))
    found = {name: None if name in errors else installed.get(DISTS[name]) for name in names}
    return {"python": installed["python"], "machine": platform.machine(), "found": found, "errors": errors}


def main(names: list[str]) -> int:
    print(json.dumps(probe(names)))
    return 0
