"""The target model without torch's Python: `model.decoder`'s forward on specedit's kernels, called through
their C ABI (`kernels.cpp`) on numpy's buffers, for a process that has not imported torch.

A one-off `specedit rewrite` would spend most of its cold start importing torch, though its forward runs
wholly on specedit's own kernels. So a load on torch that runs the model wholly on them keeps a
description of it beside its kept weights (`keep`): the kernels' library, the integer weights, the cos and
sin tables, the self-check's verdict, and the conditions it holds under (the options, the CPU, the
steering variables). The next one-off rewrite with the same options finds it (`find`) and runs the same
ops on the same inputs in the same order (`torchless_model.TorchlessModel`), so the logits are the torch
path's, bit for bit (tests/test_torchless.py). Where anything differs or is missing, `find` returns None
and the rewrite imports torch. This module imports neither torch nor numpy: a one-off rewrite asks it first.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from specedit.engine.model.cpu import cpu_flags, cpu_model
from specedit.engine.store.integrity import is_sealed
from specedit.engine.store.kept import kept_file, write_atomically

if TYPE_CHECKING:
    from specedit.engine.model.loading import LoadedModel
    from specedit.engine.model.protocols import Tokenizer
    from specedit.engine.model.torchless_model import Description, TorchlessModel
    from specedit.engine.records.options import EngineOptions

log = logging.getLogger(__name__)

# The sources whose change changes what a kept description stands for: it is named after them.
SOURCES = (
    "torchless.py", "torchless_model.py", "decoder.py", "quantized.py", "kv_cache.py", "loading.py", "exactness.py",
    "kernels.cpp", "kernels.h", "kernels_linears.cpp", "kernels_packing.cpp", "kernels_attention.cpp",
    "kernels_layer.cpp", "kernels_c_abi.cpp", "kernels_peak.cpp",
)  # fmt: skip
# The variables that choose the kernels, or the decoder, as a load reads them (`exactness.KERNEL_ENV`, and
# `loading.DECODER_VARIABLE`): a description holds where they are as they were when it was kept.
STEERING = (
    "ONEDNN_MAX_CPU_ISA",
    "ATEN_CPU_CAPABILITY",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_CBWR",
    "SPECEDIT_KERNELS",
    "SPECEDIT_DECODER",
)


def described_conditions(options: EngineOptions) -> dict[str, object]:
    """What a kept description must have been kept under to hold for `options` on this machine now."""
    return {
        "options": {
            "dtype": options.dtype,
            "weights": options.weights,
            "kv_cache": options.kv_cache,
            "device": options.device,
            "threads": options.threads,
        },
        "cpu": [cpu_model(), sorted(cpu_flags())],
        "steering": {name: os.environ.get(name) for name in STEERING},
    }


def description_file(folder: Path, weight_files: list[Path]) -> Path:
    """Where the description of the model whose weights are `weight_files` is kept in `folder`."""
    here = Path(__file__).parent
    derived_by = b"\0".join((here / name).read_bytes() for name in SOURCES)
    return kept_file(folder, "torchless", weight_files, "json", derived_by)


def keep(
    loaded: LoadedModel, options: EngineOptions, folder: Path, head: tuple[Sequence[int], Path] | None = None
) -> bool:
    """Keep a description of `loaded` (loaded for `options`; `head`: the ids of the start every prompt shares
    and the file its cache is kept in, `PrefixCache.keep_head`) in `folder` for `load`, where its forward runs
    wholly on specedit's kernels (a `model.decoder` model in float32 on the CPU, its linear layers all on
    integer weights, each layer one `specedit::decoder_layer`, the self-check's verdict bitwise on 1-row
    steps) and its integer weights are kept (`loaded.kept_weights`). Returns whether it is kept (written
    again only where it changed)."""
    import torch
    from safetensors.torch import save_file

    from specedit.engine.model import decoder, kernels, quantized
    from specedit.engine.model.invariant import KV_BUCKET
    from specedit.engine.model.kv_cache import SPARE_POSITIONS
    from specedit.engine.model.loading import weight_files

    model, verdict, files = loaded.model, loaded.exactness, weight_files(loaded.name)
    library = kernels.loaded_library()  # (a process without torch loads the same file: `_Kernels`)
    if not isinstance(model, decoder.Decoder) or verdict is None or library is None or not files:
        return False
    embedding = model.model.embed_tokens
    on_kernels = (
        loaded.dtype == torch.float32
        and model._on_own_kernels(torch.float32)
        and all(isinstance(layer, decoder.Layer) and layer._whole_layer() is not None for layer in model.model.layers)
        and isinstance(model.lm_head, quantized.QuantizedLinear)
        # its rows are the stored ones widened, as `TorchlessModel._embedded` widens them
        and (isinstance(embedding, quantized.StoredEmbedding) or embedding.weight.dtype == torch.float32)
    )
    kept = loaded.kept_weights
    if not (on_kernels and verdict.bitwise and verdict.step_rows == 1 and kept is not None and is_sealed(kept)):
        return False
    config = model.config
    named_by = json.dumps([config.head_dim, config.rope_theta]).encode()
    tables = kept_file(folder, "rotary", files, "safetensors", named_by)
    if not is_sealed(tables):
        write_atomically(tables, lambda file: save_file({"cos": model.cos, "sin": model.sin}, file))
    description = json.dumps({
        "conditions": described_conditions(options),
        "name": loaded.name,
        "folder": str(Path(files[0]).parent),
        "library": str(library),
        "weights": str(kept),
        "tables": str(tables),
        "cache": "float16" if model.cache_dtype == torch.float16 else "float32",
        "bucket": KV_BUCKET,
        "spare": SPARE_POSITIONS,
        "exactness": verdict.to_dict(),
        "head": {"ids": list(head[0]), "file": str(head[1])} if head is not None else None,
        "eos_token_id": model.generation_config.eos_token_id,
        "config": {
            "hidden": config.hidden_size,
            "layers": config.num_hidden_layers,
            "heads": config.num_attention_heads,
            "kv_heads": config.num_key_value_heads,
            "head_dim": config.head_dim,
            "vocab": config.vocab_size,
            "eps": config.rms_norm_eps,
            "max_positions": config.max_position_embeddings,
        },
    })  # fmt: skip
    path = description_file(folder, files)
    if not is_sealed(path) or path.read_text(encoding="utf-8") != description:
        write_atomically(path, lambda file: file.write_text(description, encoding="utf-8"))
    return True


def find(options: EngineOptions, folder: Path, source: str) -> Description | None:
    """The description `keep` kept in `folder` of the model `source`, where it holds for `options` here now;
    else None (never kept, kept under other conditions, or a file it names changed or gone: the torch path
    then loads the model, and keeps it again)."""
    files = sorted(Path(source).glob("*.safetensors"))
    path = description_file(folder, files) if files else None
    if path is None or not is_sealed(path):
        return None
    try:
        description: Description = json.loads(path.read_text(encoding="utf-8"))
        if description["conditions"] != json.loads(json.dumps(described_conditions(options))):
            return None
        named = [Path(description[key]) for key in ("library", "weights", "tables")]
    except (OSError, ValueError, KeyError, TypeError) as error:  # unreadable: the torch path instead
        log.info("the torchless description %s not used: %s", path, error)
        return None
    return description if all(is_sealed(file) for file in named) else None


def load(options: EngineOptions, folder: Path, source: str, tokenizer: Tokenizer) -> TorchlessModel | None:
    """The model `find` finds, loaded with `tokenizer` (`torchless_model.TorchlessModel`); None where it
    finds none."""
    from specedit.engine.model.torchless_model import TorchlessModel

    description = find(options, folder, source)
    return TorchlessModel(description, tokenizer) if description is not None else None
