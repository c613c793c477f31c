"""Check files against the bundle's manifest.json before running, so a truncated copy or a stale
model never produces numbers that look valid."""

from __future__ import annotations

import json
import os

from . import HarnessError


def find(model: str, manifest: str | None) -> str | None:
    """The manifest to use: the one given, else manifest.json beside the model, else none."""
    if manifest:
        if not os.path.isfile(manifest):
            raise HarnessError(f"manifest {manifest} does not exist: fix --manifest or drop it")
        return manifest
    beside = os.path.join(os.path.dirname(os.path.abspath(model)), "manifest.json")
    return beside if os.path.isfile(beside) else None


def verify(manifest: str, path: str, digest: str, required: bool) -> bool:
    """Compare `path` (already hashed to `digest`) with its manifest entry; True if listed."""
    try:
        with open(manifest) as f:
            files = json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HarnessError(f"manifest {manifest} is unreadable ({e}): it needs a 'files' mapping") from None
    name = os.path.basename(path)
    entry = files.get(name)
    if entry is None:
        if required:
            raise HarnessError(f"manifest {manifest} does not list {name}: re-export the bundle or pass the right --manifest")
        return False
    size = os.path.getsize(path)
    if "bytes" in entry and int(entry["bytes"]) != size:
        raise HarnessError(f"{name} is {size} bytes but the manifest says {entry['bytes']}: the copy is "
                           "truncated or stale; copy the file again")
    if entry.get("sha256") and entry["sha256"] != digest:
        raise HarnessError(f"{name} sha256 {digest[:12]}… does not match the manifest's {entry['sha256'][:12]}…: "
                           "the file changed since export; copy the bundle again")
    return True
