"""Where `edgebert bench` runs the device harness: this machine, a board over ssh, a phone over adb,
an emulated aarch64 board (qemu user mode with a real aarch64 Python and wheels), or a browser (`web`:
ONNX Runtime Web in headless Chromium, through the example app in examples/web, not the harness).

Every target runs the same `python -m device_tests run` and returns its JSON, after `python -m device_tests
verify` of the file when its bundle holds golden outputs (the result's `verify`). Failures become one
BenchError line naming the cause and the fix; a run that did not finish never returns a result.
One module per transport; `sysroot` provisions qemu's aarch64 Python.
"""

from __future__ import annotations

from ..device_tests import runtimes
from .adb import Adb, parse_benchmark_model
from .job import BenchError, Job
from .local import Local
from .qemu import Qemu
from .ssh import Ssh
from .web import Web

__all__ = ["Adb", "BenchError", "Job", "Local", "Qemu", "Ssh", "Web", "check", "jobs_for", "parse",
           "parse_benchmark_model"]


def check(target: str) -> None:
    """Refuse a target that is none of the spellings, in one line and without connecting or provisioning
    (`parse` does both): a compile checks its --target before its stages train."""
    if target not in ("local", "web") and not target.startswith("ssh://") and target.partition(":")[0] not in (
            "adb", "qemu-aarch64"):
        raise BenchError(f"unknown target {target!r}: use local, ssh://user@host[:port], adb[:serial], "
                         "qemu-aarch64[:cpu] or web")


def parse(target: str, *, ssh_key=None, ssh_options=(), remote_python=None, remote_dir=None,
          benchmark_model=None, signature=None, op_profile=False, log=print):
    """A target object from its spelling: local, ssh://user@host[:port], adb[:serial], qemu-aarch64[:cpu], web."""
    check(target)
    if target == "local":
        return Local()
    if target == "web":
        return Web()
    if target.startswith("ssh://"):
        return Ssh(target[len("ssh://"):], ssh_key, list(ssh_options), remote_python, remote_dir)
    kind, _, arg = target.partition(":")
    if kind == "adb":
        return Adb(arg or None, remote_python, benchmark_model, signature, op_profile)
    return Qemu(arg or None, log)


def jobs_for(target, jobs: list) -> list:
    """The jobs (model file first) a target runs: all of them, but `web` runs ONNX files of ids alone, so a
    bundle's other files are left to the other targets; a set with none for it is one line."""
    if not isinstance(target, Web):
        return jobs
    kept = [j for j in jobs if runtimes.for_file(str(j[0]))[0].format == "onnx"]  # not model.text.onnx
    if not kept:
        raise BenchError(f"web runs .onnx files (ONNX Runtime Web) and got only {', '.join(j[0].name for j in jobs)}: "
                         "pass a .onnx model or a bundle with one")
    return kept
