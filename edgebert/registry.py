"""The one shape of every registry (stages, formats, families, tasks): the harness's `Registry`, whose bad
name raises `EdgebertError` here. It lives in device_tests because the harness is copied alone to a device."""

from __future__ import annotations

from typing import TypeVar

from .device_tests.registry import Registry as _Registry
from .errors import EdgebertError

T = TypeVar("T")


class Registry(_Registry[T]):
    error = EdgebertError
