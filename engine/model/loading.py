"""Loading a causal LM and its tokenizer: a local folder, a hub id, or a GGUF file; device and dtype."""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from specedit.engine.model import decoder, exactness, invariant, kernels, kv_cache, quantized
from specedit.engine.model.kv_cache import Cache, TensorCache
from specedit.engine.model.memory import release_freed_memory
from specedit.engine.model.protocols import ModelConfig, Tokenizer
from specedit.engine.model.tokenizer import KeptTokenizer, compact_pipeline, kept_files
from specedit.engine.records.errors import ModelLoadError
from specedit.engine.records.options import DTYPE_CHOICES
from specedit.engine.store.integrity import is_sealed
from specedit.engine.store.kept import kept_file, write_atomically
from specedit.engine.store.store import auto_weights, source_gguf

if TYPE_CHECKING:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


class Interrupted(Exception):
    """A forward stopped between two layers (`LoadedModel.interruptible`): the cache holds it in some
    layers and not in others, until it is rolled back."""


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


@dataclass
class LoadedModel:
    """A model on torch and its tokenizer: a `protocols.Target` for the loop, and what the self-check and
    the drafters on torch read besides (the module, its dtype, its layers)."""

    model: torch.nn.Module  # `model.decoder`'s `Decoder`, or a transformers model
    tokenizer: Tokenizer
    device: torch.device
    dtype: torch.dtype
    name: str
    step_rows: int = 1  # rows a one-token step runs as after the prompt (2: see `forward`)
    exactness: exactness.Exactness | None = None  # the self-check's verdict (`load_model`), for a target
    kept_weights: Path | None = None  # where its integer weights are kept (`_quantize`), if they are
    _cache_argument: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # transformers 5.x renamed `past_key_values` to `cache` in the forward signatures.
        parameters = inspect.signature(self.model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"

    @property
    def dtype_name(self) -> str:
        """The dtype as the command line spells it: `bfloat16`, `float32`, ..."""
        return str(self.dtype).removeprefix("torch.")

    @property
    def config(self) -> ModelConfig:
        return cast(ModelConfig, self.model.config)  # (a module's attributes are typed as modules or tensors)

    @property
    def row_invariant(self) -> bool:
        """True when the self-check found speculation keeps plain decoding's answer bit for bit."""
        return self.exactness is not None and self.exactness.bitwise

    @property
    def max_positions(self) -> int | None:
        value = getattr(self.model.config, "max_position_embeddings", None) or getattr(
            self.model.config, "n_positions", None
        )
        return int(value) if value else None

    def forward(self, ids: Sequence[int], cache: Cache, logits_to_keep: int = 0) -> torch.Tensor:
        """One forward over `ids` after what `cache` holds; the cache grows by len(ids) positions.

        Returns (T, V) logits, or only the last `logits_to_keep` rows. With `step_rows` 2 (where the
        self-check found that a linear layer takes another kernel for a single row), one token after the
        prompt runs as two rows (the token twice) and the second is dropped.
        """
        if self.step_rows == 2 and len(ids) == 1 and kv_cache.length(cache):
            logits = self._run([ids[0], ids[0]], cache, 0)[:1]
            kv_cache.rollback(cache, kv_cache.length(cache) - 1)
            return logits
        return self._run(ids, cache, logits_to_keep)

    def new_cache(self) -> TensorCache:
        """An empty KV cache of the kind the model takes (`kv_cache.new_cache`)."""
        return kv_cache.new_cache(self.model)

    def inference(self) -> contextlib.AbstractContextManager[None]:
        """The context the loop runs its forwards in: torch's inference mode."""
        return torch.inference_mode()

    def get_threads(self) -> int:
        """The threads a forward runs on (torch's count: this thread's)."""
        return torch.get_num_threads()

    def set_threads(self, count: int) -> None:
        torch.set_num_threads(count)

    @contextlib.contextmanager
    def interruptible(self, should_stop: Callable[[], bool]) -> Iterator[None]:
        """Forwards in this block raise `Interrupted` before a layer once `should_stop()` is true: a long
        forward (prefilling a file in idle time) gives way to a request within one layer's time. The
        caller rolls the cache back (`kv_cache.rollback` crops each layer to what it held before)."""

        def check(*_: object) -> None:
            if should_stop():
                raise Interrupted

        handles = [layer.register_forward_pre_hook(check) for layer in self._layers()]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _layers(self) -> list[torch.nn.Module]:
        """The decoder's layers: the module list as long as the model is deep."""
        depth = getattr(self.model.config, "num_hidden_layers", None)
        for module in self.model.modules():
            if isinstance(module, torch.nn.ModuleList) and len(module) == depth:
                return list(module)
        return []

    def _run(self, ids: Sequence[int], cache: Cache, logits_to_keep: int) -> torch.Tensor:
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)  # (1, T)
        arguments = {self._cache_argument: cache, "use_cache": True, "logits_to_keep": logits_to_keep}
        logits: torch.Tensor = self.model(input_ids=input_ids, **arguments).logits[0]  # (T, V)
        return logits


# `SPECEDIT_DECODER=transformers`: transformers' model classes even where `model.decoder` covers the model.
DECODER_VARIABLE = "SPECEDIT_DECODER"

# What ATen dispatches to (its CPU capability, which follows ATEN_CPU_CAPABILITY) where `weights="auto"`
# takes int8 (see `int8_weights`): measured faster end to end on both (docs/benchmarks.md, "int8 weights").
AUTO_INT8_CAPABILITIES = ("AVX2", "AVX512")
INTEGER_WEIGHTS = {"int8": 8, "int5": 5, "int4": 4}  # `weights` on specedit's kernel, and their bits


def precision(
    dtype: str, weights: str, device: torch.device, kernel_folder: Path | None = None
) -> tuple[torch.dtype, bool]:
    """The dtype a model computes in, and whether its linear layers take int8 weights (`int8_weights`).

    `dtype="auto"` is float32 where the linear layers then take int8 weights (asked for, or `auto` on a CPU
    whose kernels run them); else bf16 on CUDA and on CPUs with native bf16 (AVX512-BF16, AMX), float32
    elsewhere (bf16 without native arithmetic costs 4-7x float32). Where both run, int8 is the faster: it
    reads half of bf16's bytes at each step, and AMX's bf16 kernels are not row-invariant (docs/kernels.md).
    """
    if dtype != "auto":
        try:
            chosen = DTYPES[dtype]
        except KeyError:
            raise ModelLoadError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_CHOICES)}") from None
        return chosen, int8_weights(weights, device, chosen, kernel_folder)
    if int8_weights(weights, device, torch.float32, kernel_folder):
        return torch.float32, True
    native = device.type == "cuda" or (device.type == "cpu" and exactness.native_bf16())
    return (torch.bfloat16 if native else torch.float32), False


def int8_weights(weights: str, device: torch.device, dtype: torch.dtype, kernel_folder: Path | None = None) -> bool:
    """Whether the linear layers take integer weights (`model.quantized`) in `dtype`: asked for
    (`weights="int8"`, `"int5"` or `"int4"`; a `ModelLoadError` where the kernel cannot run), or `auto` on a CPU
    running float32 on AVX2 or AVX-512 kernels: int8, or the model's own (`auto_integer`: int5 for the 0.5B
    model's Q5_0 layers on AVX2 without VNNI, int4 for the 1.5B model's Q4_K)."""
    if weights == "float" or (weights == "auto" and not (device.type == "cpu" and dtype == torch.float32)):
        return False
    if weights == "auto" and torch.backends.cpu.get_cpu_capability() not in AUTO_INT8_CAPABILITIES:
        return False
    unavailable = "int8 weights run on the CPU only" if device.type != "cpu" else None
    unavailable = unavailable or ("the int8 kernel computes in float32" if dtype != torch.float32 else None)
    unavailable = unavailable or kernels.available(kernel_folder)
    if unavailable is None:
        return True
    if weights in INTEGER_WEIGHTS:
        raise ModelLoadError(f"--weights {weights}: {unavailable}")
    log.info("float32 weights: %s", unavailable)
    return False


def load_model(
    name_or_path: str,
    *,
    dtype: str = "auto",
    weights: str = "auto",
    kv_cache: str = "float32",
    device: str | None = None,
    target: bool = True,
    verdicts: Path | None = None,
    kernel_folder: Path | None = None,
    kept_folder: Path | None = None,
    tokenizer: Tokenizer | None = None,
) -> LoadedModel:
    """Load a model for inference. Every failure is a `ModelLoadError` that says what was tried.

    A `target`'s logits decide the output, so its kernels are chosen by the self-check
    (`model.exactness`), which also says whether speculation keeps plain decoding's answer bit for bit.
    A draft model's logits never decide the output: it simply gets the fastest kernels. `verdicts`: a
    folder where the self-check's verdicts are remembered (see `exactness.settle`). `dtype` and
    `weights`: see `precision`; `kv_cache`: float16 keeps the KV cache so on specedit's kernels (a model of
    `model.decoder`'s; `Decoder.new_cache`); `kernel_folder`: where specedit's kernels are compiled
    (`model.kernels`; default: a temporary folder); `kept_folder`: where what loading derives from a model
    folder is kept for the next start (`kept_file`: its tokenizer as built, its int8 weights as quantized;
    default: nothing kept);
    `tokenizer`: the model's, where it is being read already (`aside.read_aside`).
    """
    torch_device = torch.device(device) if device else default_device()
    source, kwargs = _source(name_or_path)
    # Linear layers packed for oneDNN (the CPU's fastest kernels, see `model.invariant`) are upcast as
    # they are packed, so the rest loads in the dtype it was stored in: 2-4 s instead of 6-9 s for the
    # 0.5B model in float32 on 2 AVX2 cores (the time is spent first-touching new memory).
    # int8 weights are quantized from the stored ones too, in their stored dtype (`quantized.quantize`).
    if torch_device.type == "cpu":
        kernels.available(kernel_folder)  # compiled once; the attention and int8 weights use them
    torch_dtype, int8 = precision(dtype, weights, torch_device, kernel_folder)
    pack = torch_device.type == "cpu" and invariant.can_pack(torch_dtype)
    stored = "auto" if pack or int8 else torch_dtype
    try:
        if tokenizer is None:
            tokenizer = load_tokenizer(source, kwargs, kept_folder)
        # specedit's own forward on the CPU (on a GPU, not measured here: transformers' classes, as before)
        mine = not kwargs and torch_device.type == "cpu" and os.environ.get(DECODER_VARIABLE) != "transformers"
        own = decoder.covered(Path(source)) if mine else None
        if own is not None:
            model: torch.nn.Module = decoder.load(Path(source), own, stored)
        else:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(source, dtype=stored, **kwargs)
    except ModelLoadError:  # a kept file changed since it was written (`integrity`): its own message
        raise
    except Exception as error:  # transformers raises many kinds; all mean "did not load"
        raise ModelLoadError(f"could not load model {name_or_path!r}: {error}") from error
    kept_weights = None
    if int8:
        integer = weights if weights in INTEGER_WEIGHTS else auto_integer(source)
        gguf = source_gguf(source) if integer == "int5" else None
        kept_weights = _quantize(model, weight_files(name_or_path), kept_folder, INTEGER_WEIGHTS[integer], gguf)
        quantized.keep_embedding_stored(model)  # the output layer no longer shares it: its own int8 copy
    if pack:
        invariant.pack_linears(model, torch_dtype)
    model.to(device=torch_device, dtype=torch_dtype).eval()
    if isinstance(model, decoder.Decoder) and kv_cache == "float16":
        model.cache_dtype = torch.float16
    loaded = LoadedModel(model, tokenizer, torch_device, torch_dtype, name_or_path, kept_weights=kept_weights)
    if target:
        loaded.exactness = exactness.settle(loaded, verdicts)
    # transformers' loading leaves cycles that hold the weights as stored (the 0.5B model on int8 weights:
    # 1.26 GB resident before the collection, 0.71 GB after); specedit's own leaves none, and the collection
    # of torch's 180,000 objects costs 60 ms of its start.
    release_freed_memory(collect=own is None)
    log.info("loaded %s on %s as %s", name_or_path, torch_device, torch_dtype)
    return loaded


def auto_integer(source: str) -> str:
    """`--weights auto`'s integer weights for the model folder `source`: the model's own
    (`store.auto_weights`), but int8 for int5 unless the kernels are AVX2's without VNNI and the GGUF the
    folder was converted from is in place (`store.source_gguf`): int5's gain is vpmaddubsw's one multiply-add
    where int8 takes two (prefill and verification 0.87-0.92x int8's time, steered to AVX2); with VNNI its
    groups of 32 cost 1.03-1.12x int8's groups of 128, without AVX2's 16 registers 1.05x at 4 rows
    (docs/kernels.md)."""
    integer = auto_weights(source)
    if integer == "int5" and (kernels.variant() != "avx2" or source_gguf(source) is None):
        return "int8"
    return integer


def load_tokenizer(source: str, kwargs: dict[str, str], kept_folder: Path | None = None) -> Tokenizer:
    """The tokenizer of a model folder (or a GGUF, a hub id: `kwargs`), as `AutoTokenizer` builds it.

    That takes 0.75-1.0 s for the default model at every start, and 0.5 s more to import transformers: it
    parses the 11 MB `tokenizer.json` in Python and builds the tokenizer again from its vocabulary, in its
    class's own way (Qwen2's adds the NFC normalization that the saved file lacks, and a padding token). In
    `kept_folder`, the tokenizer so built is kept (its `tokenizers` pipeline whole, its merges written
    compactly: `compact_pipeline`; and its special tokens and chat template) and read back as a
    `KeptTokenizer` in 0.4 s, with no transformers; it is kept only if, read back, it tokenizes, decodes and
    renders probes as the built one does.
    """
    kept = None if kwargs or kept_folder is None else kept_files(source, kept_folder)
    if kept is None:
        from transformers import AutoTokenizer

        # (its `apply_chat_template` returns text when asked for text, which its declared type does not say)
        return cast(Tokenizer, AutoTokenizer.from_pretrained(source, **kwargs))
    pipeline, settings = kept

    def read_kept() -> KeptTokenizer:
        return KeptTokenizer.read(pipeline, settings)

    if is_sealed(pipeline) and is_sealed(settings):  # else (none kept, or without a seal): built again
        with contextlib.suppress(Exception):  # kept whole, and yet it does not read: built again below
            return read_kept()
    from transformers import AutoTokenizer

    built = AutoTokenizer.from_pretrained(source)
    if is_sealed(settings) and not pipeline.is_file():  # found not to read back alike: not tried again
        return cast(Tokenizer, built)
    try:
        write_atomically(settings, lambda path: path.write_text(json.dumps(_tokenizer_settings(built))))
        pipeline_text = compact_pipeline(built.backend_tokenizer.to_str())
        write_atomically(pipeline, lambda path: path.write_text(pipeline_text, encoding="utf-8"))
        if not _tokenize_alike(read_kept(), built):
            pipeline.unlink()
            log.info("the tokenizer of %s is not kept: read back, it tokenizes otherwise", source)
    except Exception as error:  # not a `tokenizers` one (no backend), no room, a template it cannot render
        with contextlib.suppress(OSError):
            pipeline.unlink(missing_ok=True)
        log.info("the tokenizer of %s is not kept: %s", source, error)
    return cast(Tokenizer, built)


def _quantize(
    model: torch.nn.Module, weights_files: list[Path], kept_folder: Path | None, bits: int = 8, gguf: Path | None = None
) -> Path | None:
    """The model's linear layers on integer weights of `bits` (`quantized`), quantized once: kept in
    `kept_folder`, mapped into memory at the next load (509 MB for the 0.5B model at 8 bits; 0.8 s of
    quantizing saved). At 5 bits, `gguf`: the GGUF the model was converted from, whose Q5_0 layers are taken
    as they are (`quantized.gguf_packed`; 2-3 s for the 0.5B model's, once). Returns the file they are kept
    in, sealed (None where they are not)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file

    kept = None
    if kept_folder and weights_files:  # named after `specedit::q8_quantize`'s source too
        sources = [*weights_files, *([gguf] if gguf else [])]
        kept = kept_file(kept_folder, f"int{bits}", sources, "safetensors", kernels.source_bytes())
    stored: dict[str, torch.Tensor] = {}
    if kept is not None and is_sealed(kept):
        try:
            stored = load_file(kept)
        except (OSError, SafetensorError) as error:  # kept whole, and yet it does not read: quantized again
            log.info("int%d weights in %s not read (%s): quantizing", bits, kept, error)
    given = quantized.gguf_packed(model, gguf) if gguf is not None and not stored else None
    if quantized.quantize_linears(model, stored, bits, given) and kept is not None:
        try:
            write_atomically(kept, lambda path: save_file(quantized.packed_layers(model), path))
        except (OSError, SafetensorError) as error:  # no room, no right to write: quantized next time too
            log.info("int%d weights not kept in %s: %s", bits, kept, error)
            return None  # (what is kept there is not what the model now holds)
    return kept if kept is not None and is_sealed(kept) else None


def _tokenizer_settings(tokenizer: PreTrainedTokenizerBase) -> dict[str, object]:
    """What a tokenizer's class sets beside its pipeline: special tokens, chat template, maximum length."""
    tokens = {name: str(token) for name, token in tokenizer.special_tokens_map.items() if isinstance(token, str)}
    return {**tokens, "chat_template": tokenizer.chat_template, "model_max_length": tokenizer.model_max_length}


PROBES = (
    "def f(x):\n    return x  # \u00e9 e\u0301 \ufb01\n",
    "<|endoftext|>\r\n\t\u2028 A\uff21",
    "a , b . c 's d n't ?",  # what transformers' clean-up of spaces would change
)
PROBE_CHAT = [{"role": "system", "content": 'Be "brief" <b>.'}, {"role": "user", "content": PROBES[0]}]


def _tokenize_alike(kept: KeptTokenizer, reference: PreTrainedTokenizerBase) -> bool:
    """Whether a kept tokenizer gives the reference's ids, text (special tokens kept or skipped), vocabulary,
    end and padding tokens, and chat prompt on `PROBES` and `PROBE_CHAT`."""
    same = all(kept.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False)
               for text in PROBES)  # fmt: skip
    ids = reference.encode("".join(PROBES))
    for skip in (False, True):
        same = same and kept.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)
    same = same and len(kept) == len(reference) and kept.get_vocab() == reference.get_vocab()
    same = same and (kept.eos_token_id, kept.pad_token_id) == (reference.eos_token_id, reference.pad_token_id)
    if reference.chat_template is None:
        return same and kept.chat_template is None
    prompts = [t.apply_chat_template(PROBE_CHAT, tokenize=False, add_generation_prompt=True) for t in (kept, reference)]
    return same and prompts[0] == prompts[1]


def forward_costs(
    loaded: LoadedModel, sizes: Sequence[int], context: int = 100, repeats: int = 3, logits_to_keep: int = 0
) -> dict[int, float]:
    """Median seconds of one forward of k tokens after `context` tokens, for each k in `sizes`. Every row's
    logits are kept, as a verification keeps them; `logits_to_keep` 1 keeps the last's, as a prefill does."""
    ids = exactness.probe_ids(loaded.config.vocab_size, context + max(sizes))
    cache = loaded.new_cache()
    costs = {}
    with torch.inference_mode():
        if context:
            loaded.forward(ids[:context], cache, logits_to_keep=1)
        for size in sizes:
            seconds = []
            for _ in range(repeats):
                start = time.perf_counter()
                loaded.forward(ids[context : context + size], cache, logits_to_keep=logits_to_keep)
                seconds.append(time.perf_counter() - start)
                kv_cache.rollback(cache, context)
            costs[size] = sorted(seconds)[len(seconds) // 2]
    return costs


def weight_files(name_or_path: str) -> list[Path]:
    """The safetensors files of a model folder, which what is kept of it is named after (`store.kept`); none
    for a GGUF file or a hub id."""
    source, kwargs = _source(name_or_path)
    return [] if kwargs else sorted(Path(source).glob("*.safetensors"))


def _source(name_or_path: str) -> tuple[str, dict[str, str]]:
    path = Path(name_or_path).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        return str(path.parent), {"gguf_file": path.name}
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is not a model folder (no config.json)")
        return str(path), {}
    if (os.sep in name_or_path and name_or_path.count("/") != 1) or name_or_path.startswith("."):
        raise ModelLoadError(f"model folder not found: {path}")
    return name_or_path, {}  # a hub id: works where the machine has a network or a hub cache
