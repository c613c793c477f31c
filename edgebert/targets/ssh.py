"""The `ssh://user@host[:port]` target: a board reached with the system ssh and scp."""

from __future__ import annotations

import re

from .job import BenchError, call
from .remote import Remote


class Ssh(Remote):
    """`ssh://user@host[:port]` with the system ssh/scp, never prompting."""

    def __init__(self, address: str, key: str | None = None, options: list[str] = (),
                 python: str | None = None, remote_dir: str | None = None):
        m = re.fullmatch(r"(?:([^@/:]+)@)?([^@/:]+|\[[0-9a-fA-F:]+\])(?::(\d+))?", address)
        if not m:
            raise BenchError(f"bad ssh target ssh://{address}: use ssh://user@host[:port]")
        user, self.host, self.port = m.group(1), m.group(2), m.group(3) or "22"
        self.dest = f"{user}@{self.host}" if user else self.host
        super().__init__(f"ssh://{self.dest}:{self.port}", python or "python3", remote_dir or "/tmp/edgebert")
        self.opts = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", "-o", "ConnectTimeout=15"]
        for o in options:
            self.opts += ["-o", o]
        if key:
            self.opts += ["-i", key]

    def shell(self, command, what, timeout=None, ok=(0,)):
        return call(["ssh", *self.opts, "-p", self.port, self.dest, command], what, timeout, ok=ok)

    def push(self, paths, what, timeout=None):
        call(["scp", "-q", "-r", *self.opts, "-P", self.port, *map(str, paths), f"{self.dest}:{self.workdir}/"],
             what, timeout)

    def pull(self, remote, local, what):
        call(["scp", "-q", *self.opts, "-P", self.port, f"{self.dest}:{remote}", str(local)], what)
