"""Write outputs so that a crash or a bad input never leaves a half-written file behind."""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(out: str | Path):
    """Yield a temporary path beside `out`; move it onto `out` only if the block succeeds."""
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


def write_bytes(out: str | Path, data: bytes) -> Path:
    with atomic_path(out) as tmp:
        tmp.write_bytes(data)
    return Path(out)


def write_json(out: str | Path, obj: dict) -> Path:
    return write_bytes(out, (json.dumps(obj, indent=2, default=str) + "\n").encode())


def sidecar(path: str | Path, kind: str) -> Path:
    """`model.onnx` → `model.onnx.<kind>.json`: metadata lives beside the file it describes."""
    return Path(f"{path}.{kind}.json")
