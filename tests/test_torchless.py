"""The target run without torch's Python (`model.torchless`): kept by a load on torch, read back by a process
that never imports torch, and the same logits, bit for bit, as the torch path's forward."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_kernels import needs_kernel

from specedit.engine.backends.local import load_target
from specedit.engine.model import kv_positions, torchless
from specedit.engine.records.options import EngineOptions
from specedit.engine.store.store import kept_dir

from conftest import MEMORISED_REWRITES, build_model, build_tokenizer

pytestmark = needs_kernel


def _saved(folder: Path, architecture: str, kv_heads: int) -> Path:
    """A tiny random model whose layers run as one call each on integer weights (heads 16 wide)."""
    model = build_model(architecture, 300, seed=5, layers=3, dtype=torch.bfloat16)
    model.config.num_attention_heads, model.config.num_key_value_heads, model.config.head_dim = 2, kv_heads, 16
    model.save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    return folder


def _kept(folder: Path, options: EngineOptions) -> Any:
    """The model loaded on torch for `options` (its verdict settled) and its description kept."""
    loaded = load_target(options)
    assert torchless.keep(loaded, options, kept_dir())
    return loaded


@pytest.mark.parametrize(
    ("architecture", "kv_heads", "weights", "kv"),
    [("qwen2", 1, "int8", "float32"), ("llama", 2, "int4", "float16")],
)
def test_the_forward_without_torch_is_the_torch_forward_bit_for_bit(
    architecture: str, kv_heads: int, weights: str, kv: str, tmp_path: Path
) -> None:
    """Across a prompt, one token, many, a few, the cache's growth past its spare room and a rollback; the
    embedding stored in bfloat16 (widened as looked up), q, k and v with and without biases."""
    options = EngineOptions(model=str(_saved(tmp_path, architecture, kv_heads)), weights=weights, kv_cache=kv)
    loaded = _kept(tmp_path, options)
    bare = torchless.load(options, kept_dir(), str(tmp_path), loaded.tokenizer)
    assert bare is not None and bare.exactness.bitwise
    ids = torch.randint(0, 300, (700,), generator=torch.Generator().manual_seed(4)).tolist()
    caches = (loaded.new_cache(), bare.new_cache())
    pieces = ((0, 100, 0), (100, 101, 0), (101, 420, 0), (420, 437, 3), ("rollback", 405, 0), (405, 700, 1))
    with torch.inference_mode():
        for start, stop, keep in pieces:
            if start == "rollback":
                for cache in caches:
                    kv_positions.rollback(cache, stop)
                continue
            expected = loaded.forward(ids[start:stop], caches[0], logits_to_keep=keep).numpy()
            found = bare.forward(ids[start:stop], caches[1], logits_to_keep=keep)
            assert found.dtype == np.float32 and np.array_equal(found, expected), (start, stop)
    for ours, theirs in zip(caches[1].layers, caches[0].layers, strict=True):
        held = ours.length()
        assert held == theirs.length() == 700 and ours.keys.dtype == np.dtype(kv)
        assert np.array_equal(ours.keys[:, :held], theirs.keys[0].float().numpy().astype(kv))
        assert np.array_equal(ours.values[:, :held], theirs.values[0].float().numpy().astype(kv))


def test_the_loop_on_it_writes_what_it_writes_on_torch_greedy_and_sampling(tmp_path: Path) -> None:
    """The whole loop (copy drafts, verification, rollbacks) on the model without torch's Python writes the
    tokens it writes on the torch path: greedy, and sampling with a seed (numpy's logits drawn from by torch's
    generators, the same values)."""
    from typing import cast

    from specedit.engine.loop.drafting import generate_drafted
    from specedit.engine.loop.generate import Engine
    from specedit.engine.records.requests import SamplingConfig

    options = EngineOptions(model=str(_saved(tmp_path, "qwen2", 1)), weights="int8")
    loaded = _kept(tmp_path, options)
    bare = torchless.load(options, kept_dir(), str(tmp_path), loaded.tokenizer)
    engines = [Engine(loaded), Engine(cast(Any, bare))]
    for engine in engines:
        engine.eos_token_ids = frozenset()  # a random model: the budget ends it
    ids = torch.randint(0, 300, (90,), generator=torch.Generator().manual_seed(7)).tolist()
    source = ids[40:90] * 2  # the copy drafter's source: drafts that are sometimes right
    for sampling in (SamplingConfig(), SamplingConfig(temperature=0.8, seed=3)):
        written = [
            generate_drafted(engine, ids, method="auto", source_ids=source, max_new_tokens=80, sampling=sampling)
            for engine in engines
        ]
        assert written[0].tokens == written[1].tokens, sampling
        assert written[1].stats.accepted_tokens > 0 or not sampling.greedy  # (verified drafts, and rollbacks)


def test_a_description_holds_only_where_it_was_kept_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Other options, a steering variable set, or a file it names gone: None, and the torch path loads."""
    options = EngineOptions(model=str(_saved(tmp_path, "qwen2", 1)), weights="int8")
    loaded = _kept(tmp_path, options)
    assert torchless.load(options, kept_dir(), str(tmp_path), loaded.tokenizer) is not None
    for other in (EngineOptions(model=options.model, weights="int4"), EngineOptions(model=options.model, threads=1)):
        assert torchless.load(other, kept_dir(), str(tmp_path), loaded.tokenizer) is None
    with monkeypatch.context() as steered:
        steered.setenv("ATEN_CPU_CAPABILITY", "default")
        assert torchless.load(options, kept_dir(), str(tmp_path), loaded.tokenizer) is None
    path = torchless.description_file(kept_dir(), sorted(tmp_path.glob("*.safetensors")))
    tables = Path(json.loads(path.read_text())["tables"])
    tables.unlink()
    assert torchless.load(options, kept_dir(), str(tmp_path), loaded.tokenizer) is None


def test_a_model_not_wholly_on_the_kernels_is_not_kept(tmp_path: Path) -> None:
    """float32 weights (torch's own linear kernels): nothing to run without torch."""
    options = EngineOptions(model=str(_saved(tmp_path, "qwen2", 1)), weights="float")
    assert not torchless.keep(load_target(options), options, kept_dir())
    assert torchless.load(options, kept_dir(), str(tmp_path), None) is None


def test_a_one_off_engine_runs_without_torch_once_a_load_kept_it(tiny_model_dir: Path) -> None:
    """A one-off process's engine (`open_engine(one_off=True)`, as `specedit rewrite` opens it), twice: the
    first imports torch (and keeps the model so), the second never imports it, prefills after the kept start
    of the prompts, and writes the same tokens."""
    code = f"""if True:
        import json, sys
        from specedit.engine.loop.rewrite import prepare_rewrite
        from specedit.engine.records.options import EngineOptions
        from specedit.engine.records.requests import RewriteRequest
        from specedit.engine.backends.local import open_engine
        engine = open_engine(EngineOptions(model={str(tiny_model_dir)!r}), one_off=True)
        prepared = prepare_rewrite(engine, RewriteRequest(original="def add(a, b):\\n    return a + b\\n",
                                                          instruction="Rename add."))
        cache = engine.prefix_cache.take(prepared.prompt_ids)[0]
        done = engine.generate(prepared.prompt_ids, max_new_tokens=60, cache=cache)
        said = {{"tokens": done.tokens, "reused": done.stats.reused_tokens, "torch": "torch" in sys.modules}}
        print(json.dumps(said))
    """
    # steered, as no other test runs it: the first finds no description kept under these conditions
    env = {**os.environ, "SPECEDIT_KERNELS": "avx2"}
    command = [sys.executable, "-c", code]
    runs = [subprocess.run(command, capture_output=True, text=True, timeout=300, env=env) for _ in range(2)]
    first, second = (json.loads(run.stdout) for run in runs)
    assert first["torch"] is True and second["torch"] is False, runs[1].stderr
    assert second["tokens"] == first["tokens"] and second["reused"] == first["reused"] > 0


def test_a_one_off_rewrite_runs_without_torch_once_a_load_kept_it(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`specedit rewrite` without a daemon, twice (the first keeps the model, where no test did yet): the
    second never imports torch and ends as the first did (a random model never closes its code: its budget
    ends it, and the file is left as it was)."""
    source = tmp_path / "add.py"
    source.write_text(MEMORISED_REWRITES[0][0])
    code = """if True:
        import json, sys
        from specedit.cli.main import main
        code = main(sys.argv[1:])
        print(json.dumps({"code": code, "torch": "torch" in sys.modules}), file=sys.stderr)
    """
    command = [sys.executable, "-c", code, "rewrite", str(source), "-i", "Rename add.", "--max-new-tokens", "40"]
    command += ["--model", str(tiny_model_dir), "--engine", "inprocess", "--no-progress", "--in-place"]
    runs = [subprocess.run(command, capture_output=True, text=True, timeout=300) for _ in range(2)]
    said = [run.stderr.strip().splitlines() for run in runs]
    reports = [json.loads(lines[-1]) for lines in said]
    assert [report["code"] for report in reports] == [8, 8] and reports[1]["torch"] is False, runs[1].stderr
    assert said[0][-2] == said[1][-2] and "used all 40 tokens of its budget" in said[1][-2]
    assert source.read_text() == MEMORISED_REWRITES[0][0]


def test_the_conditions_name_every_variable_that_steers_a_load() -> None:
    """A description holds where the variables a load on torch reads are as they were: the same list."""
    from specedit.engine.model.exactness import KERNEL_ENV
    from specedit.engine.model.loading import DECODER_VARIABLE

    assert set(torchless.STEERING) == {*KERNEL_ENV, DECODER_VARIABLE}


def test_asking_whether_a_model_was_kept_imports_neither_torch_nor_numpy() -> None:
    """A one-off rewrite asks first, and starts its tokenizer's second process before numpy's import."""
    code = "import sys; import specedit.engine.model.torchless; print('torch' in sys.modules, 'numpy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "False False\n"
