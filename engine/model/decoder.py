"""The Llama family's decoder (Qwen2, Qwen2.5, Llama) in plain torch: the target's forward on the CPU.

transformers' own model classes are slow to import and add glue to every forward (masks, an attention
registry, a cache copied at every step). specedit computes attention, rotary angles and linear layers its
own way anyway (`model.invariant`, `model.quantized`), so this module keeps the rest: the embedding, the
norms, the residual sums and the MLP's activation. In float32 on specedit's kernels each of those is one
call; on integer weights a whole layer is one call (`specedit::decoder_layer`), bit for bit the layer
called op by op. On a float64 model it computes in torch's operators and transformers' order, so the
logits are transformers' to rounding (tests/test_decoder.py). Each row's result is its own either way,
which is what speculation's exactness needs. The modules are named as transformers names them, so a model
folder's safetensors load by name and every tool that walks a model's layers finds them. A folder this
module does not cover (another architecture, RoPE scaling, sliding windows, a GGUF) loads with
transformers. Measurements: docs/kernels.md.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from specedit.engine.model import invariant, kernels, quantized
from specedit.engine.model.kv_cache import KVCache, KVLayer, TensorCache

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")


@dataclass
class DecoderConfig:
    """What the forward reads of a model's `config.json`; `to_dict()` is the file's own content."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    attention_bias: bool  # q, k and v projections with a bias (Qwen2's always have one)
    tie_word_embeddings: bool
    raw: dict[str, Any] = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.raw)

    @classmethod
    def covering(cls, raw: dict[str, Any]) -> DecoderConfig | None:
        """The config of a `config.json` this module computes as transformers does, else None."""
        architectures = raw.get("architectures") or []
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        theta = rope.get("rope_theta", raw.get("rope_theta"))
        layer_types = set(raw.get("layer_types") or ["full_attention"])
        if not architectures or architectures[0] not in ARCHITECTURES or rope_type != "default" or theta is None:
            return None
        if raw.get("use_sliding_window") or layer_types != {"full_attention"} or raw.get("mlp_bias"):
            return None
        if raw.get("hidden_act", "silu") != "silu" or raw.get("pretraining_tp", 1) != 1:
            return None
        heads = int(raw["num_attention_heads"])
        qwen2 = architectures[0] == "Qwen2ForCausalLM"
        return cls(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
            attention_bias=qwen2 or bool(raw.get("attention_bias")),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),  # both classes' default
            raw=raw,
        )


def covered(folder: Path) -> DecoderConfig | None:
    """The config of the model in `folder` where this module covers it (see `DecoderConfig.covering`)."""
    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or not list(folder.glob("*.safetensors")):
        return None
    try:
        return DecoderConfig.covering(raw)
    except (KeyError, TypeError, ValueError):
        return None


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, own: bool = False) -> torch.Tensor:
        if own:
            return kernels.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig, index: int) -> None:
        super().__init__()
        hidden, heads, kv_heads, width = (
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        self.index, self.width, self.scale = index, width, width**-0.5
        self.q_proj = nn.Linear(hidden, heads * width, bias=config.attention_bias)
        self.k_proj = nn.Linear(hidden, kv_heads * width, bias=config.attention_bias)
        self.v_proj = nn.Linear(hidden, kv_heads * width, bias=config.attention_bias)
        self.o_proj = nn.Linear(heads * width, hidden, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: TensorCache, first: int, own: bool = False
    ) -> torch.Tensor:
        """`first`: the position of x's first row (what the cache held before). `own`: on specedit's kernels
        (`Decoder.forward`), cos and sin (T, D)."""
        shape = (*x.shape[:-1], -1, self.width)  # (1, T, heads, width)
        if own:  # q, k and v in one call, each rotated in one
            projections = (self.q_proj, self.k_proj, self.v_proj)
            q, k, v = quantized.linears(x, projections) or [projection(x) for projection in projections]
            query = kernels.rotary(q, cos, sin, q.shape[-1] // self.width)[None]  # (1, heads, T, width)
            key = kernels.rotary(k, cos, sin, k.shape[-1] // self.width)[None]
        else:
            query = _rotated(self.q_proj(x).view(shape).transpose(1, 2), cos, sin)
            key = _rotated(self.k_proj(x).view(shape).transpose(1, 2), cos, sin)
            v = self.v_proj(x)
        value = v.view(shape).transpose(1, 2)
        key, value = cache.update(key, value, self.index)  # all it holds, and perhaps zeros after (`KVCache`)
        output = invariant.attention(query, key, value, first, self.scale)
        projected: torch.Tensor = self.o_proj(output.reshape(*x.shape[:-1], -1))
        return projected


def _rotated(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as transformers applies it: (1, H, T, D) states, (1, 1, T, D) cos and sin."""
    half = states.shape[-1] // 2
    turned = torch.cat((-states[..., half:], states[..., :half]), dim=-1)
    return (states * cos) + (turned * sin)


class MLP(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, own: bool = False) -> torch.Tensor:
        if own:  # gate and up in one call, SiLU and the product in one
            gate, up = quantized.linears(x, (self.gate_proj, self.up_proj)) or (self.gate_proj(x), self.up_proj(x))
            activated = kernels.silu_mul(gate, up)
        else:
            activated = F.silu(self.gate_proj(x)) * self.up_proj(x)
        output: torch.Tensor = self.down_proj(activated)
        return output


class Layer(nn.Module):
    def __init__(self, config: DecoderConfig, index: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, index)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.index, self.heads, self.kv_heads = index, config.num_attention_heads, config.num_key_value_heads
        self._whole: tuple[tuple[nn.Module | None, ...], _WholeLayer | None] = ((), None)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: TensorCache, first: int, own: bool = False
    ) -> torch.Tensor:
        if own and isinstance(cache, KVCache) and (whole := self._whole_layer()) is not None:
            # the whole layer in one call of specedit's kernels
            return whole.forward(x, cos, sin, cache.layer(self.index), first)
        x = x + self.self_attn(self.input_layernorm(x, own), cos, sin, cache, first, own)
        output: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x, own), own)
        return output

    def _whole_layer(self) -> _WholeLayer | None:
        """The layer as one call (`_WholeLayer`) where its linear layers are all integer ones of one kind,
        made again when any of them has been replaced since."""
        attention, mlp = self.self_attn._modules, self.mlp._modules
        modules = (
            attention["q_proj"], attention["k_proj"], attention["v_proj"], attention["o_proj"],
            mlp["gate_proj"], mlp["up_proj"], mlp["down_proj"], self.input_layernorm, self.post_attention_layernorm,
        )  # fmt: skip
        if modules != self._whole[0]:  # modules compare as themselves
            self._whole = (modules, _WholeLayer.of(self, modules))
        return self._whole[1]


@dataclass(frozen=True)
class _WholeLayer:
    """A `Layer` as one call of `specedit::decoder_layer` (model/kernels.cpp): the same ops on the same
    inputs in the same order as the layer's own forward on specedit's kernels, its output bit for bit,
    without the Python between them (module docstring)."""

    norms: tuple[RMSNorm, RMSNorm]  # their weights read at each call, as the layer's own forward reads them
    packed: tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor | None]]
    bits: list[int]  # each linear layer's width
    scale: float
    heads: int
    kv_heads: int
    keys_like: torch.Tensor  # (1, kv_heads, 0, D): what the cache's buffers are shaped as

    @classmethod
    def of(cls, layer: Layer, modules: tuple[nn.Module | None, ...]) -> _WholeLayer | None:
        *linears, first_norm, second_norm = modules
        integer = [module for module in linears if isinstance(module, quantized.QuantizedLinear)]
        width = layer.self_attn.width
        assert isinstance(first_norm, RMSNorm) and isinstance(second_norm, RMSNorm)
        if len(integer) != len(linears):
            return None  # some in float: layer by layer
        if width % kernels.HEAD_WIDTHS or first_norm.eps != second_norm.eps:
            return None  # heads the attention kernel would take widened, or the norms' epsilons differ
        packed = tuple([getattr(module, part) for module in integer] for part in ("q", "scales", "offsets", "bias"))
        return cls(
            norms=(first_norm, second_norm),
            packed=packed,  # type: ignore[arg-type]
            bits=[module.bits for module in integer],
            scale=layer.self_attn.scale,
            heads=layer.heads,
            kv_heads=layer.kv_heads,
            keys_like=torch.empty(1, layer.kv_heads, 0, width, device=first_norm.weight.device),
        )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kept: KVLayer, first: int) -> torch.Tensor:
        if kept.length() != first:
            raise ValueError(f"a cache layer holding {kept.length()} positions for a forward from {first}")
        keys, values = kept.reserve(x.shape[1], self.keys_like)
        first_norm, second_norm = self.norms
        output: torch.Tensor = torch.ops.specedit.decoder_layer(
            x, first_norm.weight, second_norm.weight, first_norm.eps, *self.packed, self.bits, cos, sin, keys,
            values, first, self.scale, self.heads, self.kv_heads,
        )  # fmt: skip
        return output


class Body(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        # from an empty table: `nn.Embedding`'s own random one would import torch's compiler (1 s) on "meta"
        table = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding.from_pretrained(table, freeze=True)  # type: ignore[no-untyped-call]
        self.layers = nn.ModuleList(Layer(config, index) for index in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


@dataclass
class Output:
    logits: torch.Tensor  # (1, T, V)


@dataclass
class GenerationConfig:
    eos_token_id: int | list[int] | None  # `generation_config.json`'s, else `config.json`'s


class Decoder(nn.Module):
    """A causal LM of the Llama family: `model(input_ids=(1, T), cache=..., logits_to_keep=k).logits`."""

    invariant_attention = True  # its attention is `invariant.attention`, always
    cache_dtype: torch.dtype | None = None  # what `new_cache` keeps on specedit's kernels (`--kv-cache`)

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Body(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.cos, self.sin = rotary_table(config, config.max_position_embeddings)
        self.generation_config = GenerationConfig(config.raw.get("eos_token_id"))

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    @property
    def base_model(self) -> Body:
        return self.model

    def new_cache(self) -> KVCache:
        """An empty cache: keys and values in `cache_dtype` where the forward runs on specedit's kernels
        (`own` below; float16, as llama.cpp keeps its cache, halves the bytes a step reads besides the
        weights: 57 KB a position for the 1.5B model in float32), else in the activations' dtype."""
        return KVCache(self.cache_dtype if self._on_own_kernels(self.model.norm.weight.dtype) else None)

    def _on_own_kernels(self, dtype: torch.dtype) -> bool:
        """Whether a forward on `dtype` activations runs on specedit's kernels: float32 on the CPU, where
        they built."""
        return dtype == self.model.norm.weight.dtype == torch.float32 and self.device.type == "cpu" and kernels.loaded()

    def transformers_twin(self) -> PreTrainedModel:
        return transformers_twin(self)

    def get_input_embeddings(self) -> nn.Module:
        embedding: nn.Module = self.model.embed_tokens
        return embedding

    def set_input_embeddings(self, embedding: nn.Module) -> None:
        self.model.embed_tokens = embedding

    @torch.inference_mode()  # a `KVCache`'s buffers are inference tensors, which autograd refuses as inputs
    def forward(
        self, input_ids: torch.Tensor, cache: TensorCache | None = None, logits_to_keep: int = 0, **_: object
    ) -> Output:
        """`cache` (a `KVCache`, or anything with its `update` and `get_seq_length`) grows by the forward's
        positions; without one, a new one is made and dropped. In inference mode, as every caller ran it."""
        cache = self.new_cache() if cache is None else cache
        start = int(cache.get_seq_length())
        positions = slice(start, start + input_ids.shape[1])
        x = self.model.embed_tokens(input_ids)
        # float32 on the CPU with specedit's kernels: the layers' glue on them too (`kernels.rms_norm`, ...):
        # 0.83-0.92x the time of a forward of 1-64 rows of the 0.5B model on int8 weights (docs/kernels.md)
        dtype = self.model.norm.weight.dtype
        own = self._on_own_kernels(x.dtype)
        if own:
            cos, sin = self.cos[positions], self.sin[positions]  # (T, D)
        else:
            cos, sin = (table[positions].to(dtype)[None, None] for table in (self.cos, self.sin))  # (1, 1, T, D)
        for layer in self.model.layers:
            x = layer(x, cos, sin, cache, start, own)
        x = self.model.norm(x, own)
        return Output(self.lm_head(x[:, -logits_to_keep:, :]))


def rotary_table(config: DecoderConfig, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every position's cos and sin, computed once and as transformers computes them, in float32: (L, D)."""
    width = config.head_dim
    even = torch.arange(0, width, 2, dtype=torch.int64, device="cpu").to(torch.float)
    inverse = 1.0 / (config.rope_theta ** (even / width))
    angles = torch.arange(length, dtype=torch.float, device="cpu")[:, None] * inverse[None, :]  # (L, D/2)
    both = torch.cat((angles, angles), dim=-1)
    return both.cos(), both.sin()


def load(folder: Path, config: DecoderConfig, dtype: torch.dtype | str) -> Decoder:
    """The model of `folder` (its safetensors, memory-mapped), its weights in `dtype` ("auto": as stored)."""
    from safetensors.torch import load_file

    with torch.device("meta"):
        model = Decoder(config)
    weights: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(file))
    if config.tie_word_embeddings or "lm_head.weight" not in weights:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    if dtype != "auto":
        weights = {name: tensor.to(dtype) for name, tensor in weights.items()}
    missing = {name for name, _ in model.named_parameters()} - set(weights)
    if missing:
        raise ValueError(f"the weights lack {', '.join(sorted(missing)[:3])}")
    model.load_state_dict(weights, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    with contextlib.suppress(OSError, ValueError, AttributeError):  # none, or unreadable: config.json's stays
        generation = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
        model.generation_config = GenerationConfig(generation.get("eos_token_id", model.generation_config.eos_token_id))
    return model.eval()


def transformers_twin(model: Decoder) -> PreTrainedModel:
    """A model of transformers' own class for `model`'s config, on `model`'s modules (its linear layers,
    in whatever form they are, and its embedding: shared, not copied) and its norms' weights: what a user
    of transformers runs, for a peer's baseline (`invariant.stock_kernels`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = model.config.to_dict()
    raw.setdefault("model_type", "qwen2" if raw["architectures"][0] == "Qwen2ForCausalLM" else "llama")
    config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    with torch.device("meta"):
        twin: Any = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    for name, module in model.named_modules():
        parent, _, child = name.rpartition(".")
        if isinstance(module, RMSNorm):
            twin.get_submodule(name).weight = module.weight
            twin.get_submodule(name).variance_epsilon = module.eps
        elif name and not list(module.children()):  # a linear layer (any kind), the embedding
            setattr(twin.get_submodule(parent), child, module)
    with torch.device(model.device):
        twin.model.rotary_emb = type(twin.model.rotary_emb)(config=config)  # its frequencies, off "meta"
    twin.generation_config.eos_token_id = model.generation_config.eos_token_id
    twin.set_attn_implementation("sdpa")
    evaluated: PreTrainedModel = twin.eval()
    return evaluated
