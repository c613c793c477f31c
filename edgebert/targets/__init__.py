"""Where `edgebert bench` runs the device harness: this machine, a board over ssh, a phone over adb,
or an emulated aarch64 board (qemu user mode with a real aarch64 Python and wheels).

Every target runs the same `python -m device_tests run` and returns its JSON, after `python -m device_tests
verify` of the file when its bundle holds golden outputs (the result's `verify`). Failures become one
BenchError line naming the cause and the fix; a run that did not finish never returns a result.
One module per transport; `sysroot` provisions qemu's aarch64 Python.
"""

from __future__ import annotations

from .adb import Adb, parse_benchmark_model
from .job import BenchError, Job
from .local import Local
from .qemu import Qemu
from .ssh import Ssh

__all__ = ["Adb", "BenchError", "Job", "Local", "Qemu", "Ssh", "check", "parse", "parse_benchmark_model"]


def check(target: str) -> None:
    """Refuse a target that is none of the spellings, in one line and without connecting or provisioning
    (`parse` does both): a compile checks its --target before its stages train."""
    if target != "local" and not target.startswith("ssh://") and target.partition(":")[0] not in ("adb",
                                                                                                  "qemu-aarch64"):
        raise BenchError(f"unknown target {target!r}: use local, ssh://user@host[:port], adb[:serial] "
                         "or qemu-aarch64[:cpu]")


def parse(target: str, *, ssh_key=None, ssh_options=(), remote_python=None, remote_dir=None,
          benchmark_model=None, signature=None, op_profile=False, log=print):
    """A target object from its spelling: local, ssh://user@host[:port], adb[:serial], qemu-aarch64[:cpu]."""
    check(target)
    if target == "local":
        return Local()
    if target.startswith("ssh://"):
        return Ssh(target[len("ssh://"):], ssh_key, list(ssh_options), remote_python, remote_dir)
    kind, _, arg = target.partition(":")
    if kind == "adb":
        return Adb(arg or None, remote_python, benchmark_model, signature, op_profile)
    return Qemu(arg or None, log)
