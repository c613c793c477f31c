"""What every target shares: one harness run (`Job`), the client commands that carry it out, and
how their failures become one BenchError line naming the cause and the fix."""

from __future__ import annotations

import json
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .. import device_tests
from ..device_tests import runtimes
from ..errors import EdgebertError

# The harness folder, copied as it is to a board or phone and run there as `python -m device_tests`.
HARNESS = Path(device_tests.__file__).parent
GRACE_S = 30  # a step may take --timeout plus this before the client kills it
VERIFY_EXIT = (0, 1)  # `device_tests verify` exit statuses that come with a result: all checks passed, one failed
HINTS = (  # what ssh/scp/adb say -> what the user should hear
    ("No space left on device", "remote disk full (No space left on device): free space or pick --remote-dir"),
    ("Connection refused", "connection refused: is sshd running and the port right?"),
    ("closed by remote host", "connection lost mid-run (closed by remote host); no results"),
    ("Connection reset", "connection lost mid-run (connection reset); no results"),
    ("Broken pipe", "connection lost mid-run (broken pipe); no results"),
    ("Could not resolve hostname", "unknown host (could not resolve hostname)"),
    ("Permission denied", "permission denied: check the user and --ssh-key"),
    ("Host key verification failed", "host key verification failed: the host's key changed; fix known_hosts"),
    ("no devices/emulators found", "no adb device connected"),
)


class BenchError(EdgebertError):
    """A benchmark target failed; the message says where and what to do."""


@dataclass
class Job:
    """One harness run: files on this machine and the harness settings (`device_tests run` flags)."""

    model: Path
    inputs: Path
    manifest: Path | None
    backend: str | None
    settings: dict  # threads, warmup, runs, duration, batch, pad_to, truncate, logits, emulated
    timeout: float | None = None
    golden: Path | None = None  # the bundle's golden.json, beside the manifest: `verify` runs first when there is one

    @property
    def limit(self) -> float | None:
        """What the client allows each step: the harness stops itself at `timeout`; this is the backstop."""
        return self.timeout + GRACE_S if self.timeout else None

    @property
    def files(self) -> list[Path]:
        return [p for p in (self.model, self.inputs, self.manifest, self.golden) if p]

    @property
    def flags(self) -> list[str]:
        out = []
        for key, value in self.settings.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                out.append(flag)
            elif value is not None and value is not False:
                out += [flag, str(value)]
        if self.timeout:
            out += ["--timeout", str(self.timeout)]
        return out


def _reason(proc: subprocess.CompletedProcess) -> str:
    """The one line that explains a failed command."""
    text = (proc.stderr or "") + (proc.stdout or "")
    for line in text.splitlines():
        if "device_tests: error:" in line:
            return line.split("device_tests: error:", 1)[1].strip()
    for needle, hint in HINTS:
        if needle in text:
            return hint
    if proc.returncode < 0 or proc.returncode in (137, 139, 143):
        sig = -proc.returncode if proc.returncode < 0 else proc.returncode - 128
        return f"killed by {signal.Signals(sig).name}; no results"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(("INFO", "WARNING"))]
    return lines[-1] if lines else f"exit status {proc.returncode}"


def call(cmd: list[str], what: str, timeout: float | None = None, env: dict | None = None,
         cwd: str | None = None, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    """Run a command; an exit status not in `ok`, or any other failure, is one BenchError line starting with `what`."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, check=False)
    except FileNotFoundError:
        raise BenchError(f"{what}: {cmd[0]} is not installed or not on PATH") from None
    except subprocess.TimeoutExpired:
        raise BenchError(f"{what} timed out after {timeout:g} s; no results (raise --timeout)") from None
    if proc.returncode not in ok:
        raise BenchError(f"{what} failed: {_reason(proc)}")
    return proc


def _backend(job: Job, found: dict) -> str:
    """The backend to run: the one asked for, else the first runtime the target has for this format."""
    return job.backend or runtimes.choose(str(job.model), lambda r: bool(found.get(r.name))).name


def _check_probe(report: dict, backend: str, where: str) -> None:
    for name, install in (("numpy", "numpy"), (backend, runtimes.get(backend).install)):
        if not report["found"].get(name):
            error = report["errors"].get(name, "not installed")
            raise BenchError(f"{where} cannot import {name} ({error}): install it there with "
                             f"`python3 -m pip install {install}`")


def _load_result(path: Path, where: str) -> dict:
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        raise BenchError(f"{where}: the harness left no readable result; no results") from None
    if result.get("complete") is not True:
        raise BenchError(f"{where}: the result is incomplete; no results")
    return result


def _verify_args(job: Job, backend: str, model: str, manifest: str, out: str) -> list[str]:
    """`device_tests verify` of the job's model file (as the target names it) in the runtime and on the
    accelerator the run uses, its result written to `out`."""
    args = ["verify", model, "--manifest", manifest, "--backend", backend, "--json", out]
    for flag in ("provider", "delegate"):
        if job.settings.get(flag):
            args += [f"--{flag}", str(job.settings[flag])]
    return args


def _load_verify(path: Path, where: str) -> dict:
    """The one check `_verify_args`' command made: the job's file in the job's runtime."""
    return _load_result(path, f"{where}: verify")["checks"][0]


def _probe_flags(job: Job, module: str = "device_tests") -> list[str]:
    """`module` is the harness as the target imports it: a copied `device_tests` folder on a device,
    the installed `edgebert.device_tests` on this machine."""
    wanted = [job.backend] if job.backend else [r.name for r in runtimes.for_file(str(job.model))]
    return ["-m", module, "probe", "--backends", ",".join(wanted)]
