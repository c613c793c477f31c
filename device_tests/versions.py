"""The versions of the packages that produced or ran a file: one helper for manifests, results and bench."""

from __future__ import annotations

import importlib.metadata
import platform


def versions(*dists: str) -> dict[str, str]:
    """Python's version and each installed distribution's; one that is not installed is left out."""
    found = {"python": platform.python_version()}
    for name in dists:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found
