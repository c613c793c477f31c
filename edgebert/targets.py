"""Where `edgebert bench` runs the device harness: this machine, a board over ssh, a phone over adb,
or an emulated aarch64 board (qemu user mode with a real aarch64 Python and wheels).

Every target runs the same `python -m device_tests run` and returns its JSON. Failures become one
BenchError line naming the cause and the fix; a run that did not finish never returns a result.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from . import device_tests
from .errors import EdgebertError

# The harness folder, copied as it is to a board or phone and run there as `python -m device_tests`.
HARNESS = Path(device_tests.__file__).parent
INSTALL = {"numpy": "numpy", "onnxruntime": "onnxruntime", "litert": "ai-edge-litert",
           "tflite-runtime": "tflite-runtime 'numpy<2'"}
GRACE_S = 30  # a step may take --timeout plus this before the client kills it
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

    @property
    def limit(self) -> float | None:
        """What the client allows each step: the harness stops itself at `timeout`; this is the backstop."""
        return self.timeout + GRACE_S if self.timeout else None

    @property
    def files(self) -> list[Path]:
        return [p for p in (self.model, self.inputs, self.manifest) if p]

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
         cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run a command; any failure is one BenchError line starting with `what`."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, check=False)
    except FileNotFoundError:
        raise BenchError(f"{what}: {cmd[0]} is not installed or not on PATH") from None
    except subprocess.TimeoutExpired:
        raise BenchError(f"{what} timed out after {timeout:g} s; no results (raise --timeout)") from None
    if proc.returncode != 0:
        raise BenchError(f"{what} failed: {_reason(proc)}")
    return proc


def _backend(job: Job, found: dict) -> str:
    """The backend to run: the one asked for, else the first runtime the target has for this format."""
    if job.backend:
        return job.backend
    if job.model.suffix == ".onnx":
        return "onnxruntime"
    return next((b for b in ("litert", "tflite-runtime") if found.get(b)), "litert")


def _check_probe(report: dict, backend: str, where: str) -> None:
    for name in ("numpy", backend):
        if not report["found"].get(name):
            error = report["errors"].get(name, "not installed")
            raise BenchError(f"{where} cannot import {name} ({error}): install it there with "
                             f"`python3 -m pip install {INSTALL[name]}`")


def _load_result(path: Path, where: str) -> dict:
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        raise BenchError(f"{where}: the harness left no readable result; no results") from None
    if result.get("complete") is not True:
        raise BenchError(f"{where}: the result is incomplete; no results")
    return result


def _probe_flags(job: Job, module: str = "device_tests") -> list[str]:
    """`module` is the harness as the target imports it: a copied `device_tests` folder on a device,
    the installed `edgebert.device_tests` on this machine."""
    wanted = [job.backend] if job.backend else (["onnxruntime"] if job.model.suffix == ".onnx"
                                                 else ["litert", "tflite-runtime"])
    return ["-m", module, "probe", "--backends", ",".join(wanted)]


class Local:
    """The harness in a subprocess of this Python: its own process, so thread pools don't collide."""

    emulated = False

    def __init__(self):
        self.name = "local"

    def python(self) -> list[str]:
        return [sys.executable]

    def env(self) -> dict:
        return dict(os.environ)

    def run(self, job: Job) -> dict:
        probe = call(self.python() + _probe_flags(job, "edgebert.device_tests"), f"{self.name}: probe", job.limit, self.env())
        found = json.loads(probe.stdout.strip().splitlines()[-1])
        backend = _backend(job, found["found"])
        _check_probe(found, backend, f"{self.name} ({found['machine']}, Python {found['python']})")
        with tempfile.TemporaryDirectory(prefix="edgebert-bench-") as tmp:
            out = Path(tmp) / "result.json"
            cmd = self.python() + ["-m", "edgebert.device_tests", "run", "--model", str(job.model), "--inputs",
                                   str(job.inputs), "--backend", backend, "--json", str(out)] + job.flags
            if job.manifest:
                cmd += ["--manifest", str(job.manifest)]
            call(cmd, f"{self.name}: harness", job.limit, self.env(), cwd=tmp)
            return _load_result(out, self.name)


class Remote(ABC):
    """A machine reached over a transport (ssh, adb): stage files, probe, run, fetch the JSON."""

    emulated = False

    def __init__(self, name: str, python: str, remote_dir: str):
        self.name, self.remote_python, self.workdir = name, python, f"{remote_dir.rstrip('/')}/bench"

    @abstractmethod
    def shell(self, command: str, what: str, timeout: float | None = None) -> subprocess.CompletedProcess:
        """Run a shell command there."""

    @abstractmethod
    def push(self, paths: list[Path], what: str, timeout: float | None = None) -> None:
        """Copy files or folders into the work dir there."""

    @abstractmethod
    def pull(self, remote: str, local: Path, what: str) -> None:
        """Copy one file back."""

    def _prepare(self, need_bytes: int, timeout: float | None) -> None:
        """Empty the work dir and check its free space before copying anything big."""
        wd = shlex.quote(self.workdir)
        out = self.shell(f"rm -rf {wd} && mkdir -p {wd} && df -k {wd} | tail -n 1", f"{self.name}: prepare",
                         timeout).stdout.split()
        free_kb = int(out[-3]) if len(out) >= 4 and out[-3].isdigit() else None
        if free_kb is not None and free_kb * 1024 < need_bytes:
            raise BenchError(f"{self.name}: remote disk full: {self.workdir} has {free_kb} kB free but the model, "
                             f"eval set and harness need {need_bytes // 1024 + 1} kB: free space or pick --remote-dir")

    def run(self, job: Job) -> dict:
        with tempfile.TemporaryDirectory(prefix="edgebert-stage-") as tmp:
            stage = Path(tmp) / "device_tests"
            shutil.copytree(HARNESS, stage, ignore=shutil.ignore_patterns("__pycache__"))
            need = sum(p.stat().st_size for p in [*job.files, *stage.iterdir()]) + (256 << 10)  # + the result
            self._prepare(need, job.limit)
            self.push([stage], f"{self.name}: copying the harness", job.limit)
            cd = f"cd {shlex.quote(self.workdir)} && {self.remote_python}"
            probe = self.shell(f"{cd} {shlex.join(_probe_flags(job))}", f"{self.name}: probing {self.remote_python}",
                               job.limit)
            found = json.loads(probe.stdout.strip().splitlines()[-1])
            backend = _backend(job, found["found"])
            _check_probe(found, backend, f"{self.name} ({found['machine']}, Python {found['python']})")
            self.push(job.files, f"{self.name}: copying the model and eval set", job.limit)
            args = ["-m", "device_tests", "run", "--model", job.model.name, "--inputs", job.inputs.name,
                    "--backend", backend, "--json", "result.json"] + job.flags
            if job.manifest:
                args += ["--manifest", job.manifest.name]
            self.shell(f"{cd} {shlex.join(args)}", f"{self.name}: harness", job.limit)
            out = Path(tmp) / "result.json"
            self.pull(f"{self.workdir}/result.json", out, f"{self.name}: fetching the result")
            return _load_result(out, self.name)


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

    def shell(self, command, what, timeout=None):
        return call(["ssh", *self.opts, "-p", self.port, self.dest, command], what, timeout)

    def push(self, paths, what, timeout=None):
        call(["scp", "-q", "-r", *self.opts, "-P", self.port, *map(str, paths), f"{self.dest}:{self.workdir}/"],
             what, timeout)

    def pull(self, remote, local, what):
        call(["scp", "-q", *self.opts, "-P", self.port, f"{self.dest}:{remote}", str(local)], what)


class Adb(Remote):
    """`adb[:serial]`: a phone. With --remote-python the harness runs there (e.g. Termux); otherwise
    TFLite's benchmark_model measures latency only."""

    ROOT = "/data/local/tmp/edgebert"

    def __init__(self, serial: str | None = None, python: str | None = None, benchmark_model: str | None = None,
                 signature: str | None = None):
        super().__init__(f"adb:{serial}" if serial else "adb", python or "", self.ROOT)
        self.adb = ["adb", "-s", serial] if serial else ["adb"]
        self.benchmark_model, self.signature = benchmark_model, signature

    def shell(self, command, what, timeout=None):
        return call([*self.adb, "shell", command], what, timeout)

    def push(self, paths, what, timeout=None):
        for p in paths:
            call([*self.adb, "push", str(p), f"{self.workdir}/"], what, timeout)

    def pull(self, remote, local, what):
        call([*self.adb, "pull", remote, str(local)], what)

    def run(self, job: Job) -> dict:
        if self.remote_python:
            return super().run(job)
        if job.model.suffix != ".tflite":
            raise BenchError(f"{self.name}: benchmark_model runs .tflite only; for {job.model.name} pass "
                             "--remote-python (a Python with numpy and onnxruntime on the phone)")
        return self._benchmark_model(job)

    def _benchmark_model(self, job: Job) -> dict:
        tool = f"{self.ROOT}/benchmark_model"
        if self.benchmark_model:
            call([*self.adb, "push", self.benchmark_model, tool], f"{self.name}: copying benchmark_model", job.limit)
            self.shell(f"chmod 755 {tool}", f"{self.name}: chmod benchmark_model")
        elif self.shell(f"[ -x {tool} ] && echo yes || echo no", f"{self.name}: looking for benchmark_model"
                        ).stdout.strip() != "yes":
            raise BenchError(f"{self.name}: no {tool} on the device: pass --benchmark-model PATH (TFLite's "
                             "android_aarch64 benchmark_model) or --remote-python")
        self._prepare(job.model.stat().st_size + (1 << 20), job.limit)
        self.push([job.model], f"{self.name}: copying the model", job.limit)
        s = job.settings
        signature = self.signature or _signature(job)
        cmd = [tool, f"--graph={self.workdir}/{job.model.name}", f"--num_threads={s['threads']}",
               f"--warmup_runs={s['warmup']}", f"--num_runs={s['runs']}",
               f"--signature_to_run_for_benchmark={signature}",
               "--input_layer_value_range=input_ids,1,99:attention_mask,1,1:token_type_ids,0,0"]
        if s.get("duration"):
            cmd += [f"--min_secs={s['duration']}", f"--max_secs={s['duration']}"]
        proc = self.shell(shlex.join(cmd), f"{self.name}: benchmark_model", job.limit)
        result = parse_benchmark_model(proc.stdout + proc.stderr)
        result["model"] = {"file": job.model.name, "bytes": job.model.stat().st_size}
        result["settings"] = {"threads": s["threads"], "warmup": s["warmup"], "signature": signature,
                              **result.get("settings", {})}
        return result


def _signature(job: Job) -> str:
    """The signature benchmark_model should time: the one --pad-to fits, else the one that fits the
    eval set's median length (read from the model with ai-edge-litert on this machine)."""
    try:
        import numpy as np
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise BenchError("adb: cannot read the model's signatures here (no ai-edge-litert): pass --signature seq_T") from None
    lengths = {int(k.split("_")[1]): k for k in Interpreter(model_path=str(job.model)).get_signature_list()
               if re.fullmatch(r"seq_\d+", k)}
    if not lengths:
        raise BenchError(f"adb: {job.model.name} has no seq_<T> signatures: pass --signature KEY")
    want = job.settings.get("pad_to") or int(np.median(np.load(job.inputs)["lengths"]))
    return lengths[min((t for t in lengths if t >= want), default=max(lengths))]


LATENCY_ONLY = ("benchmark_model times random inputs and measures latency only: no accuracy "
                "(pass --remote-python to run the harness on the phone for that)")


def parse_benchmark_model(text: str) -> dict:
    """TFLite benchmark_model's log as a harness-shaped result: latency only, no accuracy."""
    m = re.search(r"Inference timings in us: Init: ([\d.e+]+), First inference: ([\d.e+]+), "
                  r"Warmup \(avg\): ([\d.e+]+), Inference \(avg\): ([\d.e+]+)", text)
    if not m:
        raise BenchError("benchmark_model printed no 'Inference timings' line: it did not finish; no results")
    init, first, _, avg = (float(g) / 1000 for g in m.groups())
    stats = [dict(re.findall(r"(\w+)=([\d.e+-]+)", line)) for line in text.splitlines() if "count=" in line]
    runs = stats[-1] if stats else {}

    def ms(key):
        return float(runs[key]) / 1000 if key in runs else None
    latency = {"min": ms("min"), "p50": ms("median") or ms("p50"), "p90": ms("p90"), "p99": ms("p99"),
               "max": ms("max"), "mean": avg, "std": ms("std")}
    peak = re.search(r"Overall peak memory footprint \(MB\) via periodic monitoring: ([\d.]+)", text)
    result = {"emulated": False, "complete": True, "runtime": {"backend": "benchmark_model"},
              "load_ms": init, "first_inference_ms": first, "latency_ms": latency,
              "throughput": 1000 / avg, "peak_rss_mb": float(peak.group(1)) if peak else None,
              "warnings": [LATENCY_ONLY]}
    if "count" in runs:
        result["settings"] = {"runs": int(runs["count"])}
    return result


# --- qemu-aarch64: an emulated Arm board --------------------------------------------------------

A76_FEATURES = "fp asimd aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
QEMU_CPUS = {  # QEMU_CPU -> (MIDR variant, part, revision, HWCAP features qemu 7.2 emulates)
    "cortex-a53": (0x0, 0xD03, 4, "fp asimd aes pmull sha1 sha2 crc32 cpuid"),
    "cortex-a57": (0x1, 0xD07, 0, "fp asimd aes pmull sha1 sha2 crc32 cpuid"),
    "cortex-a72": (0x0, 0xD08, 3, "fp asimd aes pmull sha1 sha2 crc32 cpuid"),
    "cortex-a76": (0x4, 0xD0B, 1, A76_FEATURES),
    "neoverse-n1": (0x4, 0xD0C, 1, A76_FEATURES),
}
SYSROOT_SKIP = re.compile(r"(dpkg|perl.*|libperl.*|tar|install-info|mailcap|mime-support|media-types|"
                          r"readline-common|debconf.*)")
WHEELS = ("numpy", "onnxruntime", "ai-edge-litert")


def cache_dir() -> Path:
    return Path(os.environ.get("EDGEBERT_CACHE") or Path.home() / ".cache" / "edgebert") / "qemu-aarch64"


def _cpuinfo(cpu: str, cores: int) -> str:
    """An Arm /proc/cpuinfo for `cpu`: qemu 7.2 shows the host's x86 one, on which the cpuinfo
    library inside onnxruntime and XNNPACK crashes. `qemu -L` serves SYSROOT/proc/cpuinfo instead."""
    variant, part, revision, features = QEMU_CPUS[cpu]
    block = (f"BogoMIPS\t: 108.00\nFeatures\t: {features}\nCPU implementer\t: 0x41\nCPU architecture: 8\n"
             f"CPU variant\t: {variant:#x}\nCPU part\t: {part:#x}\nCPU revision\t: {revision}\n\n")
    return "".join(f"processor\t: {i}\n{block}" for i in range(cores))


class Sysroot:
    """Debian's arm64 python3 and its libraries unpacked under the cache, plus aarch64 wheels of
    numpy, onnxruntime and ai-edge-litert. Built once; later runs reuse it."""

    def __init__(self, base: Path, log=print):
        self.base, self.log = base, log
        self.root, self.site, self.ready = base / "sysroot", base / "site", base / "ready.json"

    def ensure(self) -> dict:
        if not self.ready.exists():
            self.base.mkdir(parents=True, exist_ok=True)
            with open(self.base / ".lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not self.ready.exists():
                    self._build()
        return json.loads(self.ready.read_text())

    def _apt(self, tool: str, *args: str, what: str, timeout: float = 900) -> str:
        apt = self.base / "apt"
        opts = ["-o", "APT::Architecture=arm64", "-o", "APT::Architectures::=arm64",
                "-o", f"Dir::State::Lists={apt}/lists", "-o", f"Dir::Cache={apt}/cache",
                "-o", f"Dir::State::status={apt}/status", "-o", f"Dir::Etc::SourceList={apt}/sources.list",
                "-o", f"Dir::Etc::SourceParts={apt}/parts", "-o", "APT::Sandbox::User=root",
                "-o", "Debug::NoLocking=1"]
        return call([tool, *opts, *args], f"qemu sysroot: {what}", timeout, cwd=str(apt / "debs")).stdout

    def _build(self) -> None:
        if not shutil.which("apt-get") or not shutil.which("dpkg"):
            raise BenchError("qemu sysroot: building it needs Debian's apt-get and dpkg on this machine")
        apt = self.base / "apt"
        for d in ("lists/partial", "cache/archives/partial", "parts", "debs"):
            (apt / d).mkdir(parents=True, exist_ok=True)
        (apt / "status").touch()
        release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().split("\n") if "=" in line)
        suite = release.get("VERSION_CODENAME", "bookworm").strip('"')
        mirror = os.environ.get("EDGEBERT_DEBIAN_MIRROR", "http://deb.debian.org")
        keyring = "signed-by=/usr/share/keyrings/debian-archive-keyring.gpg"
        (apt / "sources.list").write_text(
            f"deb [arch=arm64 {keyring}] {mirror}/debian {suite} main\n"
            f"deb [arch=arm64 {keyring}] {mirror}/debian {suite}-updates main\n"
            f"deb [arch=arm64 {keyring}] {mirror}/debian-security {suite}-security main\n")
        self.log(f"qemu sysroot: fetching Debian {suite} arm64 package lists")
        self._apt("apt-get", "-q", "update", what="apt-get update")
        minor = re.search(r"python3\.(\d+)-minimal", self._apt("apt-cache", "depends", "python3-minimal",
                                                                what="finding python3"))
        if not minor:
            raise BenchError(f"qemu sysroot: Debian {suite} arm64 has no python3.X-minimal package")
        py = f"3.{minor.group(1)}"
        closure = self._apt("apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                            "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances",
                            f"python{py}-minimal", f"libpython{py}-stdlib", "libstdc++6", what="resolving packages")
        names = sorted({ln for ln in closure.splitlines()
                        if ln and not ln.startswith((" ", "<")) and not SYSROOT_SKIP.fullmatch(ln)})
        self.log(f"qemu sysroot: downloading {len(names)} arm64 packages (python {py})")
        for old in (apt / "debs").glob("*.deb"):
            old.unlink()
        self._apt("apt-get", "-q", "download", *names, what="apt-get download")
        build = Path(tempfile.mkdtemp(prefix="build-", dir=self.base))
        debs = sorted((apt / "debs").glob("*.deb"))
        for deb in debs:
            call(["dpkg", "-x", str(deb), str(build / "sysroot")], f"qemu sysroot: unpacking {deb.name}")
        glibc = next(re.match(r"libc6_(\d+)\.(\d+)", d.name) for d in debs if d.name.startswith("libc6_"))
        platforms = [f"manylinux_2_{v}_aarch64" for v in range(17, int(glibc.group(2)) + 1)] + ["manylinux2014_aarch64"]
        self.log(f"qemu sysroot: installing aarch64 wheels of {', '.join(WHEELS)}")
        call([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target",
              str(build / "site"), "--only-binary=:all:", "--python-version", py, "--implementation", "cp",
              *[a for p in platforms for a in ("--platform", p)], *map(_pinned, WHEELS)],
             "qemu sysroot: pip install (aarch64 wheels)", 1800)
        for d in ("sysroot", "site"):
            shutil.rmtree(self.base / d, ignore_errors=True)
            (build / d).rename(self.base / d)
        shutil.rmtree(build)
        (self.root / "proc").mkdir(exist_ok=True)
        self.ready.write_text(json.dumps({"python": py, "suite": suite, "packages": len(names),
                                          "wheels": [_pinned(w) for w in WHEELS]}))


def _pinned(dist: str) -> str:
    """The host's version of a wheel, so x86 and emulated Arm results compare the same runtime."""
    try:
        return f"{dist}=={version(dist)}"
    except PackageNotFoundError:
        return dist


class Qemu(Local):
    """`qemu-aarch64[:cpu]`: the harness under user-mode emulation. Timings are 300-500x slower than
    a real board and always labeled emulated."""

    emulated = True

    def __init__(self, cpu: str | None = None, log=print):
        cpu = cpu or "cortex-a72"
        if cpu == "max":
            raise BenchError("qemu-aarch64:max gives wrong INT8 results on qemu 7.2 (SME): "
                             f"use one of {', '.join(QEMU_CPUS)}")
        if cpu not in QEMU_CPUS:
            raise BenchError(f"unknown qemu cpu {cpu!r}: use one of {', '.join(QEMU_CPUS)} "
                             "(cortex-a72 is a Pi 4, cortex-a76 a Pi 5)")
        self.qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
        if not self.qemu:
            raise BenchError("qemu-aarch64 is not installed: apt-get install qemu-user-static")
        self.cpu, self.name = cpu, f"qemu-aarch64:{cpu}"
        self.sysroot = Sysroot(cache_dir(), log)
        self.py = self.sysroot.ensure()["python"]
        cpuinfo = self.sysroot.root / "proc" / "cpuinfo"
        cpuinfo.parent.mkdir(exist_ok=True)
        cpuinfo.write_text(_cpuinfo(cpu, os.cpu_count() or 1))

    def python(self) -> list[str]:
        root = self.sysroot.root
        return [self.qemu, "-L", str(root), str(root / "usr" / "bin" / f"python{self.py}")]

    def env(self) -> dict:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
                "LANG": "C.UTF-8", "QEMU_CPU": self.cpu, "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONPATH": os.pathsep.join([str(self.sysroot.site), str(HARNESS.parent)])}


def parse(target: str, *, ssh_key=None, ssh_options=(), remote_python=None, remote_dir=None,
          benchmark_model=None, signature=None, log=print):
    """A target object from its spelling: local, ssh://user@host[:port], adb[:serial], qemu-aarch64[:cpu]."""
    if target == "local":
        return Local()
    if target.startswith("ssh://"):
        return Ssh(target[len("ssh://"):], ssh_key, list(ssh_options), remote_python, remote_dir)
    kind, _, arg = target.partition(":")
    if kind == "adb":
        return Adb(arg or None, remote_python, benchmark_model, signature)
    if kind == "qemu-aarch64":
        return Qemu(arg or None, log)
    raise BenchError(f"unknown target {target!r}: use local, ssh://user@host[:port], adb[:serial] "
                     "or qemu-aarch64[:cpu]")
