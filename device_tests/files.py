"""Files written so that a crash, a full disk or a bad input never leaves half a file behind, and
the one sha256 everything (manifests, stage keys, bench) uses. Standard library only: the host side
imports these from here, and the harness carries them to the device."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


def sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextmanager
def atomic_path(out: str | Path):
    """Yield a temporary file path beside `out`; move it onto `out` only if the block succeeds."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@contextmanager
def atomic_dir(out: str | Path, *, replace: bool = False, scratch: str | Path | None = None):
    """Yield a temporary folder beside `out` (or in `scratch`, a folder on the same file system, so that
    a killed process leaves its half-written folder there and nowhere else); rename it to `out` only if
    the block succeeds.

    With `replace`, an existing `out` is swapped out and removed only once the new one is in place."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    where = Path(scratch) if scratch is not None else out.parent
    where.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=where))
    try:
        yield tmp
        if replace and out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=where))
            os.replace(out, old)
            try:
                os.replace(tmp, out)
            except BaseException:
                os.replace(old, out)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_bytes(out: str | Path, data: bytes) -> Path:
    with atomic_path(out) as tmp:
        tmp.write_bytes(data)
    return Path(out)


def write_json(out: str | Path, obj, *, indent: int = 2) -> Path:
    return write_bytes(out, (json.dumps(obj, indent=indent, default=str) + "\n").encode())


def sidecar(path: str | Path, kind: str) -> Path:
    """`model.onnx` → `model.onnx.<kind>.json`: metadata lives beside the file it describes."""
    return Path(f"{path}.{kind}.json")
