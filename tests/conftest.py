"""Shared fixtures: tiny randomly initialised models (several architectures) and a tiny tokenizer.

Nothing is downloaded: the tokenizer is a byte-level BPE trained here on a few lines of text, the models
are random. Exactness tests run them in float64.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch

from specedit.engine.loop.generate import Engine
from specedit.engine.model.loading import LoadedModel
from specedit.engine.records.events import Event, Phase, Step, Text
from specedit.engine.records.prompts import SYSTEM_PROMPT
from specedit.engine.records.requests import RewriteOutcome, RewriteRequest, WarmRequest
from specedit.engine.records.stats import Stats
from specedit.engine.sketch.sketch import Sketch
from specedit.engine.store.store import cache_dir

T = TypeVar("T")

ARCHITECTURES = ("gpt2", "qwen2", "llama")

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "const f = (x) => x * 2;\nfunction g(y) { return f(y) + 1; }\n",
    "# héllo wörld 🙂 — naïve café\n",
    "if (x == null) { throw new Error('bad'); }\n\treturn 0;\r\n",
]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def build_tokenizer(*, chat: bool = True, eos: bool = True) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The prompt's fixed text is in the corpus too, so prompts take few tokens (tests stay fast).
    tokenizer.train_from_iterator([*CORPUS, SYSTEM_PROMPT, CHAT_TEMPLATE] * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>" if eos else None)
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(
    architecture: str,
    vocab_size: int,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    layers: int = 2,
    positions: int = 2048,
) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    # A wide initialisation, so that the random model's greedy choices are far from ties.
    if architecture == "gpt2":
        config: Any = GPT2Config(
            vocab_size=vocab_size,
            n_positions=positions,
            n_embd=32,
            n_layer=layers,
            n_head=4,
            initializer_range=0.3,
            bos_token_id=None,
            eos_token_id=None,
        )
        model: Any = GPT2LMHeadModel(config)
    elif architecture == "qwen2":
        config = Qwen2Config(
            vocab_size=vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=positions,
            initializer_range=0.3,
        )
        model = Qwen2ForCausalLM(config)
    elif architecture == "llama":
        config = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=positions,
            initializer_range=0.3,
        )
        model = LlamaForCausalLM(config)
    else:
        raise ValueError(architecture)
    model.generation_config.eos_token_id = None
    return model.to(dtype).eval()


class CharTokenizer:
    """A stand-in tokenizer for id-level tests: token i decodes to one letter."""

    eos_token_id = None
    chat_template = None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("A") + i % 26) for i in ids)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) - ord("A") for c in text]


def tiny_engine(architecture: str, *, seed: int = 0, vocab_size: int | None = None, layers: int = 2) -> Engine:
    """An engine over a tiny random float64 model, without EOS; with `vocab_size`, a stand-in tokenizer."""
    tokenizer: Any = CharTokenizer() if vocab_size else build_tokenizer()
    model = build_model(architecture, vocab_size or len(tokenizer), seed=seed, layers=layers)
    engine = Engine(LoadedModel(model, tokenizer, torch.device("cpu"), torch.float64, f"tiny-{architecture}"))
    engine.eos_token_ids = frozenset()  # a random model: only the budget ends generation, unless a test says
    return engine


def save_random_model(folder: Path, positions: int = 2048) -> Path:
    """A tiny random float32 Qwen2 model and its tokenizer, without EOS, saved in `folder`. Its heads are 16
    wide (two of them, one for keys and values: the same weights' shapes), so that on integer weights its
    layers run as the default model's do, one call each (`specedit::decoder_layer`)."""
    tokenizer = build_tokenizer(eos=False)
    model = build_model("qwen2", len(tokenizer), dtype=torch.float32, positions=positions)
    model.config.num_attention_heads, model.config.num_key_value_heads, model.config.head_dim = 2, 1, 16
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 model and tokenizer saved as a folder, loadable with `--model PATH`.

    It has no EOS token, so it never finishes an answer: only its token budget (or the context) ends it.
    """
    return save_random_model(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture(scope="session")
def endless_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_model_dir` with a context of 32,768 positions, for an editor's test that cancels a running
    rewrite: the tiny model writes 1,000-2,000 tokens a second, so 2,048 positions run out within a second or
    two, sooner than an editor's cancel may arrive (CI saw it); this one runs for a minute unless stopped."""
    return save_random_model(tmp_path_factory.mktemp("endless-qwen2"), positions=32768)


# --- A tiny model that has memorised a few rewrites --------------------------------------------------
# End-to-end tests of the command line need a real model that finishes its answer (closing fence, EOS).
# A random model never does; this one is trained here, in seconds, to write these answers exactly.

MEMORISED_REWRITES = [
    # (original, instruction, answer)
    ("def add(a, b):\n    return a + b\n", "Rename add to plus.", "def plus(a, b):\n    return a + b\n"),
    ("x = 1\ny = 2\n", "Make y three.", "x = 1\ny = 3\n"),
    ("print('héllo 🙂')\r\nz = 0\r\n", "Set z to 5.", "print('héllo 🙂')\nz = 5\n"),
    ("x = 1\ny = 3\n", "Make y three.", "x = 1\ny = 3\n"),  # nothing to change
]


# An edit sketch the model answers by echoing it, elision markers and all: what the merge checks catch.
# Its lines cannot say where it goes (none is in the original), so the model is asked. (original, sketch,
# answer)
def handlers(count: int) -> str:
    """A file of `count` functions alike (10 lines each), whose lines but two repeat in every one."""
    return "".join(
        f'def handler_{n}(request, items):\n    """Handle request {n}."""\n    total = 0\n    for item in items:\n'
        f"        total += item.price * {n % 7 + 1}\n    if total > 100:\n        log.info('big order %s', {n})\n"
        "    return total\n\n\n"
        for n in range(count)
    )


class AnsweringBackend:
    """A test double of a `session.Backend`: answers every rewrite with `answer`, and records each request
    (`asked`) and the sketch the session read for it (`sketches`). A subclass may script `run`."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.asked: list[RewriteRequest] = []
        self.sketches: list[Sketch | None] = []

    def run(
        self,
        request: RewriteRequest,
        emit: Callable[[Event], None],
        cancel: threading.Event,
        client: str,
        sketch: Sketch | None = None,
    ) -> RewriteOutcome:
        self.asked.append(request)
        self.sketches.append(sketch)
        emit(Text(self.answer))
        return RewriteOutcome.finished(self.answer, "stop", Stats())

    def in_turn(self, work: Callable[[], T], emit: Callable[[Event], None], cancel: threading.Event, client: str) -> T:
        return work()

    def warm(self, request: WarmRequest) -> bool:
        return False

    def keep_alive(self, wanted: bool) -> None:
        pass

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass


ECHOED_SKETCH = (
    "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\n",
    "# ... existing code ...\n\ndef sub(a, b):\n    return a - b\n\n# ... existing code ...\n",
    "# ... existing code ...\n\ndef sub(a, b):\n    return a - b\n\n# ... existing code ...\n",
)
# A rewrite the model answers with nothing at all (its code block closed at once): what a damaged model
# does, and what must never empty a file. (original, instruction, answer)
EMPTY_ANSWER = ("total = 0\nfor x in xs:\n    total += x\n", "Explain this code.", "")
# A live rewrite the language server's guard stops (lsp/guard.py): its answer removes 7 of the region's 8
# lines, on an instruction that asks for no removal. (original, instruction, answer); memorised by the
# editors' own model (`train_memorising_model(extra=...)`), whose tests carry copies.
GUARDED_REWRITE = ("a = 1\nb = 2\nc = 3\nd = 4\ne = 5\nf = 6\ng = 7\nh = 8\n", "Rename a to first.", "first = 1\n")
# An edit sketch its lines merge (`engine.merge`), with no model: (original, sketch, merged).
LINES_SKETCH = (
    ECHOED_SKETCH[0],
    "def add(a, b):\n    return a - b\n\n# ... existing code ...\n",
    "def add(a, b):\n    return a - b\n\n\nprint(add(1, 2))\n",
)


def train_memorising_model(tokenizer: Any, *, steps: int = 200, extra: Sequence[tuple[str, str, str]] = ()) -> Any:
    """A tiny GPT-2 that writes MEMORISED_REWRITES' answers (and `extra`'s) exactly. `extra` changes the
    weights, and a near-tie may fall the other way on another case: the shared model stays without it."""
    from specedit.engine.records.prompts import RewritePrompt, build_prompt

    sequences = []
    prompts = [
        (RewritePrompt(original.replace("\r\n", "\n"), instruction, None, "python"), answer)
        for original, instruction, answer in [*MEMORISED_REWRITES, EMPTY_ANSWER, *extra]
    ]
    original, sketch, answer = ECHOED_SKETCH
    prompts.append((RewritePrompt(original, None, sketch, "python"), answer))
    for rewrite_prompt, answer in prompts:
        prompt = build_prompt(tokenizer, rewrite_prompt)
        ids = [*tokenizer.encode(prompt + answer + "```\n", add_special_tokens=False), tokenizer.eos_token_id]
        sequences.append(torch.tensor(ids))
    batch = torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=0)  # (B, T)
    labels = torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=-100)
    model = build_model("gpt2", len(tokenizer), seed=0, dtype=torch.float32)
    model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.train()
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        model(input_ids=batch, labels=labels).loss.backward()
        optimiser.step()
        optimiser.zero_grad()
    return model.eval()


@pytest.fixture(scope="session")
def memorising_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("memorising-gpt2")
    tokenizer = build_tokenizer()
    train_memorising_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def events_to(
    *,
    text: Callable[[str], object] | None = None,
    step: Callable[[Step], object] | None = None,
    phase: Callable[[Phase], object] | None = None,
) -> Callable[[Event], None]:
    """An event callback (`Session.run`, `EngineClient.rewrite`) that hands each kind to its own."""

    def route(event: Event) -> None:
        if isinstance(event, Text) and text is not None:
            text(event.delta)
        elif isinstance(event, Step) and step is not None:
            step(event)
        elif isinstance(event, Phase) and phase is not None:
            phase(event)

    return route


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fast tests first, the real model last: a failure shows up early, before the slow tier runs."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is not None)


@pytest.fixture(autouse=True, scope="session")
def _machine_temp_folder_left_as_it_was() -> Iterator[None]:
    """No test changes the mode of the machine's temporary folder: a test that once made /tmp 0755 (to let
    another user reach a socket folder in it) left it closed to every other user, and the next apt-get
    update on that machine (as the user _apt) failed."""
    before = stat.S_IMODE(os.stat("/tmp").st_mode)
    yield
    after = stat.S_IMODE(os.stat("/tmp").st_mode)
    assert after == before, f"the tests changed /tmp's mode from {before:o} to {after:o}"


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> None:
    # Tiny models: a second thread only adds synchronisation (measured ~30x slower on 2 busy cores).
    torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _kept_files_of_this_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """What loads keep of the tests' models (`store.kept`: tokenizers, int8 weights, prompt starts, named
    after the temporary folders the models are saved in) goes to a cache of this run's own, not the user's;
    its models, compiled kernels and self-check verdicts are the user's (linked), for the real model's tier.
    Processes the tests start inherit it."""
    user, ours = cache_dir(), tmp_path_factory.mktemp("cache")
    for shared in ("models", "kernels", "exactness"):
        (user / shared).mkdir(parents=True, exist_ok=True)
        (ours / shared).symlink_to(user / shared, target_is_directory=True)
    before = os.environ.get("SPECEDIT_CACHE_DIR")
    os.environ["SPECEDIT_CACHE_DIR"] = str(ours)
    yield
    if before is None:
        del os.environ["SPECEDIT_CACHE_DIR"]
    else:
        os.environ["SPECEDIT_CACHE_DIR"] = before
