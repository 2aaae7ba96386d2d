"""What the CPU is, as /proc/cpuinfo says (`lscpu`'s flags): the class that chooses kernels. No torch."""

from __future__ import annotations

from functools import cache
from pathlib import Path


@cache
def cpu_class() -> str:
    """The CPU's class as its flags say (`lscpu`): AMX, AVX512-BF16, AVX512, AVX2 or baseline."""
    flags = set(cpu_flags())  # x86 names; on other CPUs: baseline
    for flag, name in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX512"), ("avx2", "AVX2")):
        if flag in flags:
            return name
    return "baseline"


def cpu_flags() -> list[str]:
    return _cpuinfo_field("flags").split()


def cpu_model() -> str:
    return _cpuinfo_field("model name")


@cache
def _cpuinfo_field(name: str) -> str:
    """The first processor's `name` line in /proc/cpuinfo ('' where there is none: not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return ""
