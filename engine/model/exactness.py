"""The self-check at load: on this machine, does speculation give plain decoding's answer bit for bit?

Whether a position's logits depend on the size of the forward that computes them is a property of the
kernels, and the kernels differ by CPU class, dtype, thread count and library version (see
`model.invariant` for what was measured on AVX512-BF16 and on AVX2). So nothing is assumed: `settle`
runs a fixed probe through the loaded model (a context, then six positions computed one per forward, all
in one forward, and in chunks of 2+4 and 3+3, across a key-length bucket of the row-invariant attention;
and after the context prefilled in two pieces, as a prefix kept from an earlier request is extended),
compares the logits bitwise, and takes the first path that holds, cheapest first:

1. oneDNN's prepacked linear (where it has a kernel for the dtype), a one-token step as one row;
2. the same, a one-token step as two rows (the token twice, the second row dropped);
3. and 4. the same two with ATen's linear kernels.
A model loaded with int8 weights (`model.quantized`) tries its own kernel first, and goes back to the
float paths on its dequantized weights only where that fails.

Where none holds (or on CUDA, where the row-invariant attention does not apply), the model keeps the
fastest path and the verdict says the output is identical to plain decoding "up to near-ties": a position
whose two best tokens are within rounding of each other may come out differently.

The verdict also says on which fewer threads the probe's logits come out the same (`fewer_threads`: one
thread fewer, and one): where they do, a rewrite may run on fewer threads while other programs keep cores
busy (`loop.threads`), and its answer is the same.

The probe costs about 2 s for the 0.5B model in float32 on 2 AVX2 cores (12 forwards; 3.4 s more for
the thread counts), so the command line and the daemon remember a verdict in the cache (`verdicts`),
keyed by everything that chooses the kernels (`fingerprint`): the model's shapes, dtype, weights, device,
thread count, the CPU's model and flags, the steering variables, the versions of torch and transformers,
and the source of this module, of specedit's kernels and of the forward that calls them (`model.invariant`,
`model.kernels`, `model.quantized`, `model.decoder`, and `model.kv_cache`, which rounds the keys and values
it keeps). Anything changed, and the probe runs again;
`specedit doctor` always runs it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Protocol

import torch

from specedit.engine.model import decoder, invariant, kernels, kv_cache, quantized
from specedit.engine.model.cpu import cpu_class, cpu_flags, cpu_model
from specedit.engine.model.kv_cache import Cache, TensorCache
from specedit.engine.model.protocols import ModelConfig
from specedit.engine.store.integrity import is_sealed
from specedit.engine.store.kept import versions, write_atomically

log = logging.getLogger(__name__)

Linear = Literal["int8", "int5", "int4", "onednn-packed", "aten"]
LINEARS = ("int8", "int5", "int4", "onednn-packed", "aten")
INTEGER_LINEARS: dict[int, Linear] = {8: "int8", 5: "int5", 4: "int4"}  # by the narrowest weights' bits

# Environment variables that steer the CPU kernels (read once, when the libraries start), specedit's own last.
KERNEL_ENV = (
    "ONEDNN_MAX_CPU_ISA",
    "ATEN_CPU_CAPABILITY",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_CBWR",
    kernels.VARIANT_VARIABLE,
)

PROBE_CONTEXT = 61  # the probe's positions 61..66 cross the attention's 64-key bucket
PROBE_SPLITS = ((1, 1, 1, 1, 1, 1), (6,), (2, 4), (3, 3))  # the first is the reference: plain decoding
PROBE_PREFILL_SPLIT = (29, 32)  # the context also prefilled in two pieces: a prefix kept, then the rest


@dataclass(frozen=True)
class Exactness:
    """What the self-check found for one loaded model. `bitwise`: speculative output is plain decoding's
    bit for bit; otherwise identical up to near-ties."""

    bitwise: bool
    linear: Linear
    step_rows: int  # the rows a one-token step runs as: 1, or 2 where a 1-row product takes another kernel
    attention: Literal["row-invariant", "transformers"]
    dtype: str
    cache: str  # the dtype the KV cache keeps (`Decoder.new_cache`): float16 where `--kv-cache float16` asks
    device: str
    cpu_class: str  # from the CPU's flags: AMX, AVX512-BF16, AVX512, AVX2 or baseline
    kernels: str  # what torch dispatches to (its CPU capability), and any steering in the environment
    threads: int
    probe_seconds: float
    # Thread counts below `threads` whose logits the probe found equal to those at `threads`, bitwise: a
    # rewrite may run on them when cores are busy (`loop.threads`) and still give the same answer.
    fewer_threads: tuple[int, ...] = ()

    @property
    def claim(self) -> str:
        return "bitwise" if self.bitwise else "up to near-ties"

    def describe(self) -> str:
        """One line for people: `identical to plain decoding bit for bit (AVX2, float32, ...)`."""
        how = "bit for bit" if self.bitwise else "up to near-ties (the self-check found a shape-dependent kernel)"
        rows = "1-row" if self.step_rows == 1 else "2-row"
        return (
            f"identical to plain decoding {how} ({self.cpu_class}, kernels {self.kernels}, {self.dtype}, "
            f"{self.cache} cache, {self.threads} threads, {self.linear} linear, {self.attention} attention, "
            f"{rows} steps)"
        )

    def to_dict(self) -> dict[str, object]:
        record = asdict(self)
        record["claim"] = self.claim
        record["probe_seconds"] = round(self.probe_seconds, 3)
        return record


class Probed(Protocol):
    """What the self-check reads, and sets, of a loaded model (`loading.LoadedModel`)."""

    model: torch.nn.Module
    device: torch.device
    dtype: torch.dtype
    step_rows: int
    exactness: Exactness | None

    @property
    def config(self) -> ModelConfig: ...

    def forward(self, ids: Sequence[int], cache: Cache, logits_to_keep: int = 0) -> torch.Tensor: ...

    def new_cache(self) -> TensorCache: ...


def settle(loaded: Probed, verdicts: Path | None = None) -> Exactness:
    """Choose `loaded`'s kernels by the probe (see the module docstring) and return the verdict.

    `loaded` is a `LoadedModel` whose `step_rows` this sets; its model's linear layers end up packed
    where oneDNN can (the fastest path), unless only ATen's kernels keep the answer. With `verdicts` (a
    folder), a verdict found there for the same fingerprint is used instead of the probe, and a new one is
    saved there.
    """
    start = time.perf_counter()
    model = loaded.model
    on_cpu = loaded.device.type == "cpu"
    attention = on_cpu and invariant.install_attention(model)
    if attention:
        invariant.install_rotary_table(model)
    packable = on_cpu and invariant.can_pack(loaded.dtype)
    integer = _integer_linear(model)  # int8, int5 or int4 weights, on specedit's kernel
    candidates: list[tuple[Linear, int]] = [
        *(((integer, 1),) if integer else ()),
        *((("onednn-packed", rows) for rows in (1, 2)) if packable else ()),
        *(("aten", rows) for rows in (1, 2)),
    ]
    if not attention:
        candidates = []  # without the invariant attention, one kernel that varies is enough to break it
    float_fastest: tuple[Linear, int] = ("onednn-packed" if packable else "aten", 1)
    fastest: tuple[Linear, int] = (integer, 1) if integer else float_fastest
    remembered = verdicts / f"{fingerprint(loaded)}.json" if verdicts is not None else None
    known = _read_verdict(remembered) if remembered is not None else None
    if known is not None and known[1] in (*candidates, fastest):
        bitwise, (linear, rows), fewer = known
    else:
        known = None
        for linear, rows in candidates:
            _use_linear(model, linear)
            loaded.step_rows = rows
            if probe_holds(loaded):
                bitwise = True
                break
        else:  # the fastest path left (a float path tried gave up the int8 weights), with the weaker claim
            bitwise = False
            linear, rows = fastest if quantized.is_quantized(model) else float_fastest
    _use_linear(model, linear)
    loaded.step_rows = rows
    if known is None:
        fewer = tuple(threads for threads in _fewer_threads() if bitwise and same_on_threads(loaded, threads))
    verdict = Exactness(
        bitwise=bitwise,
        linear=linear,
        step_rows=rows,
        attention="row-invariant" if attention else "transformers",
        dtype=str(loaded.dtype).removeprefix("torch."),
        cache=cache_dtype(loaded),
        device=str(loaded.device),
        cpu_class=cpu_class() if on_cpu else torch.cuda.get_device_name(loaded.device),
        kernels=kernel_description() if on_cpu else f"torch {torch.__version__}",
        threads=torch.get_num_threads(),
        probe_seconds=time.perf_counter() - start,
        fewer_threads=fewer,
    )
    log.info("%s; self-check took %.2f s", verdict.describe(), verdict.probe_seconds)
    if remembered is not None and known is None:
        _write_verdict(remembered, verdict)
    return verdict


def remember(loaded: Probed, verdicts: Path) -> None:
    """Save `loaded`'s verdict in the `verdicts` folder, for the next load with the same fingerprint."""
    if loaded.exactness is not None:
        _write_verdict(verdicts / f"{fingerprint(loaded)}.json", loaded.exactness)


def cache_dtype(loaded: Probed) -> str:
    """The dtype `loaded`'s KV cache keeps: a `KVCache`'s own (`Decoder.new_cache`), else the model's."""
    return str(getattr(loaded.new_cache(), "dtype", None) or loaded.dtype).removeprefix("torch.")


def fingerprint(loaded: Probed) -> str:
    """A digest of everything that chooses the kernels a forward of `loaded` runs (module docstring)."""
    modules = (
        invariant.__file__,
        kernels.__file__,
        *map(str, kernels.SOURCES),
        quantized.__file__,
        decoder.__file__,
        kv_cache.__file__,
        __file__,
    )
    sources = [Path(path).read_bytes() for path in modules if path]
    config = {key: value for key, value in loaded.config.to_dict().items() if key != "_name_or_path"}
    described = {
        "config": config,  # the shapes; not the name: the same shapes on the same machine take the same kernels
        "dtype": str(loaded.dtype),
        "weights": _integer_linear(loaded.model) or str(loaded.dtype),
        "device": str(loaded.device),
        "threads": torch.get_num_threads(),
        "cpu": cpu_model() + " " + " ".join(sorted(cpu_flags())),
        "kernels": kernel_description(),
        "cache": cache_dtype(loaded),  # what a kept prompt's cache holds
        "steering": {name: os.environ.get(name) for name in KERNEL_ENV},
        "versions": versions(),
        "sources": [hashlib.sha256(source).hexdigest() for source in sources],
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _fewer_threads() -> list[int]:
    """The thread counts below torch's that the probe tries: one core busy (one fewer), and one thread."""
    threads = torch.get_num_threads()
    return sorted({count for count in (threads - 1, 1) if 1 <= count < threads})


def same_on_threads(loaded: Probed, threads: int) -> bool:
    """Whether the probe's reference (plain decoding) and its one-forward split give the same logits on
    `threads` threads as on torch's own count, bitwise (a kernel may split a sum across threads)."""
    ids = probe_ids(loaded.config.vocab_size, PROBE_CONTEXT + sum(PROBE_SPLITS[0]))
    own = torch.get_num_threads()

    def logits() -> list[torch.Tensor]:
        with torch.inference_mode():
            cache = _prefilled(loaded, ids, (PROBE_CONTEXT,))
            return [_split_logits(loaded, ids, split, cache) for split in PROBE_SPLITS[:2]]

    reference = logits()
    torch.set_num_threads(threads)
    try:
        fewer = logits()
    finally:
        torch.set_num_threads(own)
    return all(torch.equal(a, b) for a, b in zip(reference, fewer, strict=True))


def _read_verdict(path: Path) -> tuple[bool, tuple[Linear, int], tuple[int, ...]] | None:
    """A remembered verdict: (bitwise, (linear, step rows), fewer threads), or None (none yet, or one
    without a seal: the probe decides). A `ModelLoadError` where it changed since it was written."""
    if not is_sealed(path):
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        bitwise, linear, rows = record["bitwise"], record["linear"], record["step_rows"]
        counts = record.get("fewer_threads")
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none yet, or unreadable: the probe decides
    if not isinstance(bitwise, bool) or linear not in LINEARS or rows not in (1, 2):
        return None
    listed = counts if isinstance(counts, list) else []
    return bitwise, (linear, rows), tuple(n for n in listed if isinstance(n, int) and n in _fewer_threads())


def _write_verdict(path: Path, verdict: Exactness) -> None:
    try:
        write_atomically(path, lambda writing: writing.write_text(json.dumps(verdict.to_dict(), indent=1), "utf-8"))
    except OSError as error:  # a read-only cache only costs the probe next time
        log.warning("could not remember the self-check's verdict in %s: %s", path, error)


def probe_ids(vocab_size: int, length: int) -> list[int]:
    """Fixed token ids spread over the vocabulary: the kernels do not read them, any ids would do."""
    return [(index * 7919 + 13) % vocab_size for index in range(length)]


def probe_holds(loaded: Probed) -> bool:
    """True when every split of the probe gives the reference's logits, bitwise: the continuation computed
    in forwards of other sizes, and after the context prefilled in two pieces (as a kept prefix is)."""
    ids = probe_ids(loaded.config.vocab_size, PROBE_CONTEXT + sum(PROBE_SPLITS[0]))
    with torch.inference_mode():
        cache = _prefilled(loaded, ids, (PROBE_CONTEXT,))
        reference = _split_logits(loaded, ids, PROBE_SPLITS[0], cache)
        if not all(torch.equal(_split_logits(loaded, ids, split, cache), reference) for split in PROBE_SPLITS[1:]):
            return False
        pieces = _prefilled(loaded, ids, PROBE_PREFILL_SPLIT)
        return torch.equal(_split_logits(loaded, ids, PROBE_SPLITS[2], pieces), reference)


def _prefilled(loaded: Probed, ids: Sequence[int], pieces: Sequence[int]) -> Cache:
    """A cache holding the probe's context, prefilled `pieces[i]` tokens per forward."""
    cache, position = loaded.new_cache(), 0
    for size in pieces:
        loaded.forward(ids[position : position + size], cache, logits_to_keep=1)
        position += size
    return cache


def _split_logits(loaded: Probed, ids: Sequence[int], split: Sequence[int], cache: Cache) -> torch.Tensor:
    """The probe's continuation, `split[i]` tokens per forward; the cache is left holding the context."""
    rows, position = [], PROBE_CONTEXT
    for size in split:
        rows.append(loaded.forward(ids[position : position + size], cache))
        position += size
    kv_cache.rollback(cache, PROBE_CONTEXT)
    return torch.cat(rows)  # (sum(split), V)


def _integer_linear(model: torch.nn.Module) -> Linear | None:
    """The linear kernel of the model's integer weights (`quantized`): int8, int5 (5 bits where the GGUF has
    them, 8 elsewhere) or int4; None on float ones."""
    bits = quantized.weight_bits(model)
    return INTEGER_LINEARS[bits] if bits is not None else None


def _use_linear(model: torch.nn.Module, linear: Linear) -> None:
    if linear in INTEGER_LINEARS.values():
        return  # loaded so: integer weights cannot come back from the float ones
    quantized.dequantize_linears(model)
    if linear == "onednn-packed":
        invariant.pack_linears(model)
    else:
        invariant.unpack_linears(model)


def cpu_description() -> str:
    """The CPU's model, class and the flags that choose kernels, as `lscpu` shows them."""
    wanted = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16", "avx_ne_convert")
    flags = [flag for flag in wanted if flag in set(cpu_flags())]
    model = cpu_model() or "unknown"
    return f"{model} ({cpu_class()}: {' '.join(flags) or 'no vector flags'}), {os.cpu_count()} cores"


def kernel_description() -> str:
    """torch's CPU capability (what ATen dispatches to), and the steering variables that are set."""
    steering = [f"{name}={os.environ[name]}" for name in KERNEL_ENV if os.environ.get(name)]
    return " ".join([torch.backends.cpu.get_cpu_capability(), *steering])


def native_bf16() -> bool:
    """True where bf16 arithmetic is native (AVX512-BF16 or AMX) and oneDNN is not steered below it."""
    return cpu_class() in ("AMX", "AVX512-BF16") and _onednn_reaches("BF16", "AMX")


def _onednn_reaches(*isas: str) -> bool:
    """Whether `ONEDNN_MAX_CPU_ISA` (unset, `ALL`, `DEFAULT` or an ISA's name) lets oneDNN run the
    instructions of an ISA whose name holds one of `isas` ("AVX512_CORE_BF16", "AVX512_CORE_AMX")."""
    steered = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    return not steered or steered in ("ALL", "DEFAULT") or any(isa in steered for isa in isas)
