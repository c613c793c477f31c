"""`python -m device_tests probe`: what this Python can run, checked before anything big is copied.

Imports nothing at module level beyond the standard library and the runtime table, so it works where numpy
is missing.
"""

from __future__ import annotations

import importlib
import json
import platform

from . import runtimes
from .versions import versions

NUMPY = ("numpy", "numpy")  # (module, distribution): what every runtime needs besides its own


def probe(names: list[str]) -> dict:
    """{"found": {name: version or None}} for numpy and each runtime in `names`, plus each import error."""
    checks = {"numpy": NUMPY, **{n: (runtimes.get(n).module, runtimes.get(n).package) for n in names}}
    errors = {}
    for name, (module, _) in checks.items():
        try:
            importlib.import_module(module)
        except Exception as e:  # noqa: BLE001  a broken wheel raises anything, not only ImportError
            errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    installed = versions(*(dist for name, (_, dist) in checks.items() if name not in errors))
    found = {name: None if name in errors else installed.get(dist) for name, (_, dist) in checks.items()}
    return {"python": installed["python"], "machine": platform.machine(), "found": found, "errors": errors}


def main(names: list[str]) -> int:
    print(json.dumps(probe(names)))
    return 0
