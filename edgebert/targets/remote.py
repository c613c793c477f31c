"""What ssh and adb targets share: stage the harness and files there, probe, run, fetch the JSON."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tempfile
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .job import (HARNESS, VERIFY_EXIT, BenchError, Job, _backend, _check_probe, _load_result, _load_verify,
                  _probe_flags, _verify_args)


class Remote(ABC):
    """A machine reached over a transport (ssh, adb): stage files, probe, run, fetch the JSON."""

    emulated = False

    def __init__(self, name: str, python: str, remote_dir: str):
        self.name, self.remote_python, self.root = name, python, remote_dir.rstrip("/")
        self.workdir = ""  # this run's own folder under root, while a run holds one (_workdir)

    @abstractmethod
    def shell(self, command: str, what: str, timeout: float | None = None,
              ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
        """Run a shell command there; an exit status not in `ok` is a BenchError."""

    @abstractmethod
    def push(self, paths: list[Path], what: str, timeout: float | None = None) -> None:
        """Copy files or folders into the work dir there."""

    @abstractmethod
    def pull(self, remote: str, local: Path, what: str) -> None:
        """Copy one file back."""

    @contextmanager
    def _workdir(self, need_bytes: int, timeout: float | None) -> Iterator[None]:
        """A work dir of this run's own under the remote dir, so benches that share a board never touch each
        other's files, its free space checked before anything big is copied; removed when the run ends."""
        self.workdir = f"{self.root}/bench-{uuid.uuid4().hex[:12]}"
        wd = shlex.quote(self.workdir)
        out = self.shell(f"mkdir -p {wd} && df -k {wd} | tail -n 1", f"{self.name}: prepare", timeout).stdout.split()
        try:
            free_kb = int(out[-3]) if len(out) >= 4 and out[-3].isdigit() else None
            if free_kb is not None and free_kb * 1024 < need_bytes:
                raise BenchError(f"{self.name}: remote disk full: {self.root} has {free_kb} kB free but the model, "
                                 f"eval set and harness need {need_bytes // 1024 + 1} kB: free space or pick --remote-dir")
            yield
        finally:
            try:
                self.shell(f"rm -rf {wd}", f"{self.name}: cleaning up", 60)
            except BenchError:
                pass  # the board went away: the error that matters is the run's own

    def run(self, job: Job) -> dict:
        with tempfile.TemporaryDirectory(prefix="edgebert-stage-") as tmp:
            stage = Path(tmp) / "device_tests"
            shutil.copytree(HARNESS, stage, ignore=shutil.ignore_patterns("__pycache__"))
            need = sum(p.stat().st_size for p in [*job.files, *stage.iterdir()]) + (256 << 10)  # + the result
            with self._workdir(need, job.limit):
                return self._run_there(job, stage, Path(tmp))

    def _run_there(self, job: Job, stage: Path, tmp: Path) -> dict:
        """Copy the harness, probe the Python there, copy the files, verify (with golden outputs), run, fetch the
        results into `tmp`."""
        self.push([stage], f"{self.name}: copying the harness", job.limit)
        cd = f"cd {shlex.quote(self.workdir)} && {self.remote_python}"
        probe = self.shell(f"{cd} {shlex.join(_probe_flags(job))}", f"{self.name}: probing {self.remote_python}",
                           job.limit)
        found = json.loads(probe.stdout.strip().splitlines()[-1])
        backend = _backend(job, found["found"])
        _check_probe(found, backend, f"{self.name} ({found['machine']}, Python {found['python']})")
        self.push(job.files, f"{self.name}: copying the model and eval set", job.limit)
        if job.golden:  # the first-run check, before any timing
            verify = _verify_args(job, backend, job.model.name, job.manifest.name, "verify.json")
            self.shell(f"{cd} {shlex.join(['-m', 'device_tests', *verify])}", f"{self.name}: verify", job.limit,
                       ok=VERIFY_EXIT)
            self.pull(f"{self.workdir}/verify.json", tmp / "verify.json", f"{self.name}: fetching the verify result")
        args = ["-m", "device_tests", "run", "--model", job.model.name, "--inputs", job.inputs.name,
                "--backend", backend, "--json", "result.json"] + job.flags
        if job.manifest:
            args += ["--manifest", job.manifest.name]
        self.shell(f"{cd} {shlex.join(args)}", f"{self.name}: harness", job.limit)
        out = tmp / "result.json"
        self.pull(f"{self.workdir}/result.json", out, f"{self.name}: fetching the result")
        result = _load_result(out, self.name)
        if job.golden:
            result["verify"] = _load_verify(tmp / "verify.json", self.name)
        return result
