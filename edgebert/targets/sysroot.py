"""The qemu-aarch64 sysroot: Debian's arm64 Python and aarch64 wheels, provisioned once into the cache."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from ..device_tests import runtimes
from ..device_tests.files import write_json
from ..device_tests.versions import versions
from .job import BenchError, call

SYSROOT_SKIP = re.compile(r"(dpkg|perl.*|libperl.*|tar|install-info|mailcap|mime-support|media-types|"
                          r"readline-common|debconf.*)")
# numpy and every runtime with an aarch64 wheel that fits the sysroot
WHEELS = ("numpy", *(r.package for r in runtimes.RUNTIMES.values() if r.sysroot))


def cache_dir() -> Path:
    return Path(os.environ.get("EDGEBERT_CACHE") or Path.home() / ".cache" / "edgebert") / "qemu-aarch64"


class Sysroot:
    """Debian's arm64 python3 and its libraries unpacked under the cache, plus the aarch64 `WHEELS`.
    Built once; later runs reuse it, until a runtime joins `WHEELS`."""

    def __init__(self, base: Path, log=print):
        self.base, self.log = base, log
        self.root, self.site, self.ready = base / "sysroot", base / "site", base / "ready.json"

    def ensure(self) -> dict:
        if not self._current():
            self.base.mkdir(parents=True, exist_ok=True)
            with open(self.base / ".lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not self._current():
                    self._build()
        return json.loads(self.ready.read_text())

    def _current(self) -> bool:
        """Built, with a wheel of every package in `WHEELS`."""
        if not self.ready.exists():
            return False
        have = {w.split("==")[0] for w in json.loads(self.ready.read_text())["wheels"]}
        return set(WHEELS) <= have

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
        write_json(self.ready, {"python": py, "suite": suite, "packages": len(names),
                                "wheels": [_pinned(w) for w in WHEELS]})


def _pinned(dist: str) -> str:
    """The host's version of a wheel, so x86 and emulated Arm results compare the same runtime."""
    found = versions(dist).get(dist)
    return f"{dist}=={found}" if found else dist
