"""specedit's own CPU kernels: products whose rows never depend on the rows beside them, loaded as torch ops.

The engine's exactness rests on a row's logits not depending on the forward that computes it (see
`model.invariant`). torch's kernels do so on some CPUs and not on others; these do by construction: every
output of a product is one chain of float32 fused multiply-adds in the order of its inputs (or of its groups
of 32 or 128 inputs, each summed exactly in integers), computed from its own row alone, whatever the number
of rows, the thread count or the CPU. The C++ sits beside this module, one file an op family (`SOURCES`):
linear layers on int8, int5 and int4 weights and their packing (`model.quantized`), causal attention
(torch's flash kernel is not row-invariant on every CPU), a decoder layer's glue and the whole layer in one
call (`model.decoder`), and a C ABI for a process without torch's Python (`model.torchless`). This module
compiles them on first use with the machine's C++ compiler against the installed torch (about 10 s), into a
folder keyed by every source's bytes, torch's version and the flags, sealed there (`integrity`: a library
changed since is never loaded). They need an x86 CPU with AVX2, FMA and F16C; where that fails, `available`
says why and the model keeps torch's kernels. Where torch's own kernels are AVX-512's, so are these, with
VNNI where the CPU has it (`variant`): each output is computed the same way on every variant, bit for bit.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import torch

from specedit.engine.model.cpu import cpu_flags
from specedit.engine.store.integrity import is_sealed, replace_sealed

log = logging.getLogger(__name__)

PANEL = 16  # outputs per packed panel
HEAD_WIDTHS = 16  # `attention` takes heads a multiple of this wide: whole vectors of 8 or 16 lanes
# The library's one translation unit, which includes the others (a compile parses ATen's headers once).
UNIT = Path(__file__).with_name("kernels.cpp")
# Every file the library is compiled from: its cache key and a kept file's name cover all of their bytes.
SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in (
        "kernels.cpp",
        "kernels.h",
        "kernels_linears.cpp",
        "kernels_packing.cpp",
        "kernels_attention.cpp",
        "kernels_layer.cpp",
        "kernels_c_abi.cpp",
        "kernels_peak.cpp",
    )
)
# -ffp-contract=off: a multiply and an add stay two roundings unless the source fuses them itself.
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-std=c++20")
NEEDED_FLAGS = ("avx2", "fma", "f16c")  # what FLAGS compile for, as /proc/cpuinfo names it
# The variants (`runnable_variants`): the same kernels with VNNI's 4-product sums, and on 16-lane vectors,
# the same bits. "avx2-vnni" is AVX-VNNI where the CPU has it (`-mavxvnni`), else AVX-512 VNNI's
# instruction kept to 8 lanes (to compare them).
AVX512_FLAGS = ("-mavx512f", "-mavx512bw")
# `SPECEDIT_KERNELS`: another variant this machine runs than its best, to compare them.
VARIANT_VARIABLE = "SPECEDIT_KERNELS"


def available(folder: Path | None = None) -> str | None:
    """None when the kernels are loaded (compiled into `folder` first if needed; default: a temporary
    folder), else why they are not."""
    return _load(str(folder) if folder is not None else None)


def loaded() -> bool:
    """Whether the kernels are loaded in this process (`available` loads them)."""
    return _registered()


def loaded_library() -> Path | None:
    """The library this process loaded the kernels from (`available`), None before: a process may load
    one library of them only (their ops' namespace is registered once)."""
    return _loaded_from[0] if _loaded_from else None


_loaded_from: list[Path] = []  # (`_load`'s, once)


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, first: int, scale: float) -> torch.Tensor:
    """Causal attention of one sequence's queries at positions first .. first + T - 1: query (H, T, D), keys
    and values (H_kv, first + T or more, D) (grouped-query heads: head h on kv head h // (H / H_kv)) -> (T, H,
    D), row-invariantly. D: a multiple of 16; any strides but D's. The query float32, the keys and values
    float32 or float16 (widened as read, exactly)."""
    output: torch.Tensor = torch.ops.specedit.attention(query, key, value, first, scale)
    return output


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each row of float32 `x` (..., K): weight * (x * (1 / sqrt(mean(x^2) + eps))), the sum of
    squares in double: the same on every CPU, whatever the rows beside it."""
    output: torch.Tensor = torch.ops.specedit.rms_norm(x, weight, eps)
    return output


def rotary(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    """Rotary embeddings of a projection's rows, torch's bits: states (T, heads * D) (or (1, T, heads * D)),
    cos and sin (T, D) -> (heads, T, D)."""
    output: torch.Tensor = torch.ops.specedit.rotary(states, cos, sin, heads)
    return output


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up, elementwise, float32."""
    output: torch.Tensor = torch.ops.specedit.silu_mul(gate, up)
    return output


def variant() -> str:
    """The fastest of `runnable_variants`, or the one `SPECEDIT_KERNELS` names among them."""
    runnable = runnable_variants()
    asked = os.environ.get(VARIANT_VARIABLE, runnable[-1])
    return asked if asked in runnable else runnable[-1]


def runnable_variants() -> list[str]:
    """The variants this CPU runs, fastest last: AVX-512's where torch dispatches to AVX-512 (steering torch
    with ATEN_CPU_CAPABILITY=avx2 steers these too), VNNI's where the CPU has it."""
    flags = set(cpu_flags())
    wide = torch.backends.cpu.get_cpu_capability() == "AVX512" and {"avx512f", "avx512bw"} <= flags
    vnni = "avx_vnni" in flags or (wide and {"avx512_vnni", "avx512vl"} <= flags)
    runnable = ["avx2", *(["avx2-vnni"] if vnni else []), *(["avx512"] if wide else [])]
    return runnable + (["avx512-vnni"] if wide and "avx512_vnni" in flags else [])


def variant_flags(name: str) -> tuple[str, ...]:
    """The compiler's flags for a variant, beyond `FLAGS`."""
    if name == "avx2-vnni":  # AVX-VNNI, or AVX-512 VNNI's instructions on 256-bit registers
        if "avx_vnni" in cpu_flags():
            return ("-mavxvnni",)
        return ("-mavx512f", "-mavx512vl", "-mavx512vnni", "-DSPECEDIT_256")
    return {"avx2": (), "avx512": AVX512_FLAGS, "avx512-vnni": (*AVX512_FLAGS, "-mavx512vnni")}[name]


def _registered() -> bool:
    return hasattr(torch.ops.specedit, "attention")


@cache
def _load(folder: str | None) -> str | None:
    if _registered():
        return None
    found = library(Path(folder) if folder is not None else None)
    if isinstance(found, str):
        return found
    try:
        torch.ops.load_library(str(found))  # type: ignore[no-untyped-call]
    except (OSError, RuntimeError) as error:
        return f"specedit's kernels did not load: {error}"
    _loaded_from.append(found)
    return None


def library(folder: Path | None) -> Path | str:
    """The kernels compiled for this machine in `folder` (default: a temporary folder): found there under
    their seal (`integrity`: a library changed since it was compiled is a `ModelLoadError`, never loaded),
    else compiled and sealed. A string where they cannot be: why."""
    missing = [flag for flag in NEEDED_FLAGS if flag not in cpu_flags()]
    if missing:
        return f"specedit's kernels need an x86 CPU with AVX2, FMA and F16C (this one lacks {', '.join(missing)})"
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        return "specedit's kernels need a C++ compiler (g++) to build them once"
    name = variant()
    flags = compile_flags(name)
    key = hashlib.sha256(b"\0".join([source_bytes(), torch.__version__.encode(), " ".join(flags).encode()]))
    base = folder if folder is not None else Path(tempfile.gettempdir()) / f"specedit-kernels-{os.getuid()}"
    found = base / f"kernels-{name}-{key.hexdigest()[:16]}.so"
    if is_sealed(found):
        return found
    base.mkdir(parents=True, exist_ok=True)
    building = found.with_name(f"{found.name}.tmp-{os.getpid()}")
    log.info("compiling specedit's kernels into %s (once, about 10 s)", found)
    failed = compile_library(compiler, flags, building)
    if failed is not None:
        return failed
    replace_sealed(building, found)  # atomic: a process loading it meanwhile sees all of it or nothing
    return found


def source_bytes() -> bytes:
    """Every source file's bytes, in `SOURCES`' order: what a compiled library, or anything derived by its
    ops, is keyed by."""
    return b"\0".join(path.read_bytes() for path in SOURCES)


def compile_flags(name: str) -> tuple[str, ...]:
    """The compiler's flags for a variant: `FLAGS`, the variant's own, and torch's C++ ABI."""
    return (*FLAGS, *variant_flags(name), f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")


def compile_library(compiler: str, flags: Sequence[str], out: Path) -> str | None:
    """Compiles `UNIT` (which includes the rest of `SOURCES`) with `flags` into the library `out`: None, or
    why it did not compile."""
    torch_dir = Path(torch.__file__).parent
    command = [
        compiler, *flags, f"-I{torch_dir / 'include'}", str(UNIT), "-o", str(out),
        f"-L{torch_dir / 'lib'}", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{torch_dir / 'lib'}",
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"specedit's kernels did not compile: {error}"
    if done.returncode != 0:
        out.unlink(missing_ok=True)
        return f"specedit's kernels did not compile ({compiler}): {done.stderr.strip()[-500:]}"
    return None
