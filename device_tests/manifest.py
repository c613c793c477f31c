"""Check files against the bundle's manifest.json before running, so a truncated copy, a stale model or
a file that is not the bundle's never produces numbers that look valid."""

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


def verify(manifest: str, path: str, digest: str) -> str | None:
    """The manifest's name for `path` (already hashed to `digest`): its own name when listed and its bytes
    and sha256 match (else an error), a listed file's name when the bytes are that file's (a renamed copy),
    None when the manifest does not hold it."""
    try:
        with open(manifest) as f:
            files = json.load(f)["files"]
        digests = {e.get("sha256"): n for n, e in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise HarnessError(f"manifest {manifest} is unreadable ({e}): it needs a 'files' mapping") from None
    name = os.path.basename(path)
    entry = files.get(name)
    if entry is None:
        return digests.get(digest)
    size = os.path.getsize(path)
    if "bytes" in entry and int(entry["bytes"]) != size:
        raise HarnessError(f"{name} is {size} bytes but the manifest says {entry['bytes']}: the copy is "
                           "truncated or stale; copy the file again")
    if entry.get("sha256") and entry["sha256"] != digest:
        raise HarnessError(f"{name} sha256 {digest[:12]}… does not match the manifest's {entry['sha256'][:12]}…: "
                           "the file changed since export; copy the bundle again")
    return name


def check(model: str, digest: str, manifest: str | None) -> tuple[dict, str | None]:
    """Verify the model against the manifest given or beside it: (the result's record, a warning or None).

    A listed file that differs is an error. A file the manifest does not hold, or one with no manifest at
    all, still runs, but unverified and with a warning: its numbers are not known to be a bundle's."""
    found = find(model, manifest)
    name = os.path.basename(model)
    listed = verify(found, model, digest) if found else None
    record = {"manifest": found, "manifest_verified": listed is not None}
    if listed is not None and listed != name:
        record["listed_as"] = listed
    if found is None:
        return record, (f"{name} is unverified: no manifest.json beside it and no --manifest, so nothing shows "
                        "it is a bundle's file; copy the bundle's manifest.json with it")
    if listed is None:
        return record, (f"{name} is unverified: {found} does not list it and no listed file has its sha256, so "
                        "it is not a file of that bundle and its numbers are not the bundle's")
    return record, None


def vocab_size(manifest: str) -> int | None:
    """The ids the bundle's tokenizer makes run 0..vocab_size-1 (its input contract); None if not recorded."""
    try:
        with open(manifest) as f:
            size = json.load(f)["inputs"]["tokenizer"]["vocab_size"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return int(size) if isinstance(size, int) and size > 0 else None
