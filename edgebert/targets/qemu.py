"""The `qemu-aarch64[:cpu]` target: the harness under user-mode emulation, in the sysroot's Python."""

from __future__ import annotations

import os
import shutil

from .job import HARNESS, BenchError
from .local import Local
from .sysroot import Sysroot, cache_dir

A76_FEATURES = "fp asimd aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
QEMU_CPUS = {  # QEMU_CPU -> (MIDR variant, part, revision, HWCAP features qemu 7.2 emulates)
    "cortex-a53": (0x0, 0xD03, 4, "fp asimd aes pmull sha1 sha2 crc32 cpuid"),
    "cortex-a57": (0x1, 0xD07, 0, "fp asimd aes pmull sha1 sha2 crc32 cpuid"),
    "cortex-a72": (0x0, 0xD08, 3, "fp asimd aes pmull sha1 sha2 crc32 cpuid"),
    "cortex-a76": (0x4, 0xD0B, 1, A76_FEATURES),
    "neoverse-n1": (0x4, 0xD0C, 1, A76_FEATURES),
}


def _cpuinfo(cpu: str, cores: int) -> str:
    """An Arm /proc/cpuinfo for `cpu`: qemu 7.2 shows the host's x86 one, on which the cpuinfo
    library inside onnxruntime and XNNPACK crashes. `qemu -L` serves SYSROOT/proc/cpuinfo instead."""
    variant, part, revision, features = QEMU_CPUS[cpu]
    block = (f"BogoMIPS\t: 108.00\nFeatures\t: {features}\nCPU implementer\t: 0x41\nCPU architecture: 8\n"
             f"CPU variant\t: {variant:#x}\nCPU part\t: {part:#x}\nCPU revision\t: {revision}\n\n")
    return "".join(f"processor\t: {i}\n{block}" for i in range(cores))


class Qemu(Local):
    """`qemu-aarch64[:cpu]`: the harness under user-mode emulation. Timings are 300-500x slower than
    a real board and always labeled emulated. The sysroot's Python imports the harness folder as
    `device_tests`, as a board does: edgebert itself is not installed there."""

    emulated = True
    module = "device_tests"

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
