"""The `local` target: the harness in a subprocess of this Python."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from .job import VERIFY_EXIT, Job, _backend, _check_probe, _load_result, _load_verify, _probe_flags, _verify_args, call


class Local:
    """The harness in a subprocess of this Python: its own process, so thread pools don't collide."""

    emulated = False
    module = "edgebert.device_tests"  # the harness as this Python imports it

    def __init__(self):
        self.name = "local"

    def python(self) -> list[str]:
        return [sys.executable]

    def env(self) -> dict:
        return dict(os.environ)

    def run(self, job: Job) -> dict:
        probe = call(self.python() + _probe_flags(job, self.module), f"{self.name}: probe", job.limit, self.env())
        found = json.loads(probe.stdout.strip().splitlines()[-1])
        backend = _backend(job, found["found"])
        _check_probe(found, backend, f"{self.name} ({found['machine']}, Python {found['python']})")
        with tempfile.TemporaryDirectory(prefix="edgebert-bench-") as tmp:
            if job.golden:  # the first-run check, before any timing
                checked = Path(tmp) / "verify.json"
                verify = _verify_args(job, backend, str(job.model), str(job.manifest), str(checked))
                call(self.python() + ["-m", self.module, *verify], f"{self.name}: verify", job.limit, self.env(),
                     cwd=tmp, ok=VERIFY_EXIT)
            out = Path(tmp) / "result.json"
            cmd = self.python() + ["-m", self.module, "run", "--model", str(job.model), "--inputs",
                                   str(job.inputs), "--backend", backend, "--json", str(out)] + job.flags
            if job.manifest:
                cmd += ["--manifest", str(job.manifest)]
            call(cmd, f"{self.name}: harness", job.limit, self.env(), cwd=tmp)
            result = _load_result(out, self.name)
            if job.golden:
                result["verify"] = _load_verify(checked, self.name)
            return result
