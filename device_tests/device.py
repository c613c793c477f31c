"""What the numbers were measured on: CPU, ISA features that decide which kernels run, OS."""

from __future__ import annotations

import os
import platform
import sys

# MIDR part numbers (implementer 0x41, Arm) of cores found in phones and boards.
ARM_PARTS = {
    0xD03: "Cortex-A53", 0xD04: "Cortex-A35", 0xD05: "Cortex-A55", 0xD07: "Cortex-A57",
    0xD08: "Cortex-A72", 0xD09: "Cortex-A73", 0xD0A: "Cortex-A75", 0xD0B: "Cortex-A76",
    0xD0C: "Neoverse-N1", 0xD0D: "Cortex-A77", 0xD40: "Neoverse-V1", 0xD41: "Cortex-A78",
    0xD44: "Cortex-X1", 0xD46: "Cortex-A510", 0xD47: "Cortex-A710", 0xD48: "Cortex-X2",
    0xD49: "Neoverse-N2", 0xD4D: "Cortex-A715", 0xD4E: "Cortex-X3", 0xD80: "Cortex-A520",
    0xD81: "Cortex-A720", 0xD82: "Cortex-X4",
}
ARM_FEATURES = {"asimd": "NEON", "asimdhp": "FP16", "asimddp": "dotprod", "i8mm": "i8mm",
                "bf16": "BF16", "sve": "SVE", "sve2": "SVE2", "sme": "SME"}
X86_FEATURES = {"avx2": "AVX2", "fma": "FMA", "avx512f": "AVX-512", "avx512_vnni": "AVX512-VNNI",
                "avx_vnni": "AVX-VNNI", "avx512_bf16": "AVX512-BF16", "amx_int8": "AMX-INT8"}


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _cpuinfo() -> list[dict[str, str]]:
    """/proc/cpuinfo as one dict per block (per processor; ARM may add a trailing global block)."""
    blocks = []
    for block in _read("/proc/cpuinfo").split("\n\n"):
        fields = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if fields:
            blocks.append(fields)
    return blocks


def _arm_cores(blocks: list[dict[str, str]]) -> list[str]:
    names = []
    for b in blocks:
        if "CPU part" in b:
            part = int(b["CPU part"], 16)
            implementer = int(b.get("CPU implementer", "0"), 16)
            names.append(ARM_PARTS.get(part, f"part {part:#x}") if implementer == 0x41
                         else f"implementer {implementer:#x} part {part:#x}")
    return names


def _cpu_model(blocks: list[dict[str, str]]) -> str:
    for b in blocks:
        if b.get("model name"):
            return b["model name"]
    cores = _arm_cores(blocks)
    if cores:  # big.LITTLE: "4x Cortex-A55 + 4x Cortex-A76"
        counts = {name: cores.count(name) for name in dict.fromkeys(cores)}
        return " + ".join(f"{n}x {name}" for name, n in counts.items())
    for b in blocks:
        if b.get("Hardware"):
            return b["Hardware"]
    return platform.processor() or "unknown"


def _features(blocks: list[dict[str, str]]) -> list[str]:
    flags = set()
    for b in blocks:
        flags.update((b.get("flags") or b.get("Features") or "").split())
    table = X86_FEATURES if "flags" in (blocks[0] if blocks else {}) else ARM_FEATURES
    if platform.machine().lower() in ("aarch64", "arm64") and not flags:
        flags = {"asimd"}  # NEON is mandatory on AArch64 even where cpuinfo is unreadable
    return [name for flag, name in table.items() if flag in flags]


def describe() -> dict:
    """The `device` section of a result."""
    blocks = _cpuinfo()
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    info = {
        "architecture": platform.machine(),
        "cpu_model": _cpu_model(blocks),
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "isa_features": _features(blocks),
        "os": platform.platform(),
        "python": platform.python_version(),
    }
    arm = _arm_cores(blocks)
    if arm:
        info["cpu_cores"] = arm
    board = _read("/proc/device-tree/model").strip("\x00\n ")
    if board:
        info["board"] = board
    if os.path.exists("/system/build.prop"):
        info["android"] = True
    if sys.platform == "darwin":
        info["os"] = f"macOS {platform.mac_ver()[0]}"
    return info
