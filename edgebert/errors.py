"""The one exception users see: the CLI prints its message as a single line, never a traceback; and the one
place that tells a full disk from other write failures."""

from __future__ import annotations

import errno
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)  # no space, file-size limit, quota
NEARLY_FULL = 1 << 20  # bytes free under which a writer's failure is taken to be the full disk


class EdgebertError(Exception):
    """Bad input or a broken environment: the message names the problem and the fix."""


def disk_full(error: BaseException, *folders: str | Path) -> bool:
    """Whether `error` is a full disk or file-size limit, or follows one: C++ writers (torch.save, protobuf,
    ONNX Runtime) report it as something else, so a failure while `folders` (or the temp folder) have under
    1 MiB free counts too."""
    if isinstance(error, OSError) and error.errno in FULL:
        return True
    if not folders:
        return False
    where = [Path(f) for f in (*folders, tempfile.gettempdir())]
    return any(shutil.disk_usage(f).free < NEARLY_FULL for f in where if f.is_dir())


@contextmanager
def on_disk_full(message: str, *folders: str | Path):
    """Turn a full disk met while writing under `folders` into one EdgebertError(`message`); any other
    failure passes through unchanged."""
    try:
        yield
    except Exception as e:
        if not disk_full(e, *folders):
            raise
        raise EdgebertError(message) from None
