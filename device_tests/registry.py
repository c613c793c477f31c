"""The one shape of every registry (runtimes here; stages, formats, families, tasks through `edgebert.registry`):
entries registered once, by the module that defines them, and looked up by name with one error that lists the
known names. It lives in the harness because the harness is copied alone to a device and imports nothing else."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from . import HarnessError

T = TypeVar("T")


class Registry(Generic[T]):
    """Named entries of one kind, in registration order. `load`, when given, is called before the first
    lookup (a package that imports its entries' modules on demand). `error` is what a bad name raises."""

    error: type[Exception] = HarnessError

    def __init__(self, kind: str, load: Callable[[], None] | None = None):
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._load = load

    def register(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise self.error(f"{self.kind} {name!r} is registered twice: give the new {self.kind} its own name")
        self._entries[name] = entry
        return entry

    def _all(self) -> dict[str, T]:
        if self._load is not None:
            load, self._load = self._load, None
            load()
        return self._entries

    def get(self, name: str) -> T:
        entries = self._all()
        if name not in entries:
            raise self.error(f"unknown {self.kind} {name!r}: use one of {', '.join(entries)}")
        return entries[name]

    def names(self) -> list[str]:
        return list(self._all())

    def values(self) -> list[T]:
        return list(self._all().values())

    def __contains__(self, name: object) -> bool:
        return name in self._all()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._all())
