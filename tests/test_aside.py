"""A one-off rewrite's tokenizer read in a second process (`model.aside`): the same answers as the kept
tokenizer read here, whatever happens to that process, and started before torch is imported; its text
decoded here from each token's bytes (`tokenizer.ByteTable`) as the tokenizer decodes it."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from specedit.engine.model import aside as aside_module
from specedit.engine.model import loading
from specedit.engine.model.aside import AsideTokenizer, read_aside
from specedit.engine.model.tokenizer import KeptTokenizer, kept_files

from conftest import MEMORISED_REWRITES

TEXTS = ("def f(x):\n    return x  # \u00e9 \u4f60\u597d\n", "", "a , b . c 's")
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TEXTS[0]}]


@pytest.fixture
def kept(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A folder where the tiny model's tokenizer is kept (built and kept by a first load)."""
    loading.load_tokenizer(str(tiny_model_dir), {}, tmp_path)
    return tmp_path


@pytest.fixture
def aside(tiny_model_dir: Path, kept: Path) -> Iterator[AsideTokenizer]:
    tokenizer = read_aside(str(tiny_model_dir), kept)
    assert tokenizer is not None
    yield tokenizer
    tokenizer.close()


def answers(tokenizer: KeptTokenizer | AsideTokenizer) -> list[object]:
    ids = tokenizer.encode(TEXTS[0] + "<|endoftext|>")
    return [
        [tokenizer.encode(text, add_special_tokens=False) for text in TEXTS],
        ids,
        [tokenizer.decode(ids, skip_special_tokens=skip) for skip in (False, True)],
        tokenizer.apply_chat_template(CHAT, add_generation_prompt=True),
        (len(tokenizer), tokenizer.get_vocab(), tokenizer.eos_token_id, tokenizer.pad_token_id),
        (tokenizer.special_tokens_map, tokenizer.chat_template, tokenizer.model_max_length),
    ]


def test_it_answers_as_the_kept_tokenizer_read_here(
    aside: AsideTokenizer, tiny_model_dir: Path, kept: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = kept_files(str(tiny_model_dir), kept)
    assert files is not None
    expected = answers(KeptTokenizer.read(*files))

    def not_here(*_: object) -> KeptTokenizer:
        raise AssertionError("read here: the second process did not answer")

    monkeypatch.setattr(KeptTokenizer, "read", not_here)
    assert answers(aside) == expected
    assert aside.process.poll() is None  # still there for the next call


@pytest.mark.parametrize("when", ["before it is ready", "after an answer"])
def test_when_the_second_process_dies_the_tokenizer_is_read_here(
    aside: AsideTokenizer, tiny_model_dir: Path, kept: Path, when: str
) -> None:
    files = kept_files(str(tiny_model_dir), kept)
    assert files is not None
    if when == "after an answer":
        assert aside.encode(TEXTS[0]) == KeptTokenizer.read(*files).encode(TEXTS[0])
    aside.process.kill()
    aside.process.wait()
    assert answers(aside) == answers(KeptTokenizer.read(*files))


@pytest.mark.parametrize(
    "serve",
    [
        "import sys; sys.exit(3)",  # gone before it says anything
        "import sys; from multiprocessing.connection import Connection as C;C(int(sys.argv[1])).send(('failed', 'x'))",
    ],
)
def test_a_second_process_that_does_not_read_it_leaves_it_to_this_one(
    tiny_model_dir: Path, kept: Path, monkeypatch: pytest.MonkeyPatch, serve: str
) -> None:
    files = kept_files(str(tiny_model_dir), kept)
    assert files is not None
    monkeypatch.setattr(aside_module, "_SERVE", serve)
    tokenizer = read_aside(str(tiny_model_dir), kept)
    assert tokenizer is not None
    assert answers(tokenizer) == answers(KeptTokenizer.read(*files))
    tokenizer.close()


def test_a_call_the_tokenizer_refuses_raises_as_it_would_here(
    aside: AsideTokenizer, tiny_model_dir: Path, kept: Path
) -> None:
    files = kept_files(str(tiny_model_dir), kept)
    assert files is not None
    with pytest.raises(Exception) as here:
        KeptTokenizer.read(*files).decode(["not an id"])
    with pytest.raises(type(here.value)):
        aside.decode(["not an id"])


def test_decoding_moves_here_once_the_tokens_bytes_come(
    aside: AsideTokenizer, tiny_model_dir: Path, kept: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = kept_files(str(tiny_model_dir), kept)
    assert files is not None
    here = KeptTokenizer.read(*files)
    deadline = time.monotonic() + 60
    while not aside.decodes_here:  # the bytes come with an answer, once made
        assert time.monotonic() < deadline, "no table came"
        aside.encode(TEXTS[0])
    aside.process.kill()
    monkeypatch.setattr(KeptTokenizer, "read", lambda *_: pytest.fail("read here: decoded there"))
    for ids in random_ids(here):
        for skip in (False, True):
            assert aside.decode(ids, skip) == here.decode(ids, skip_special_tokens=skip)


def random_ids(tokenizer: KeptTokenizer) -> list[list[int]]:
    """Runs of ids, some cutting characters (any id may be a byte), with special tokens and ids the
    vocabulary lacks; and every start of a text's ids."""
    draw = random.Random(0)
    size = len(tokenizer)
    runs = [[draw.randrange(0, size + 3) for _ in range(draw.randrange(0, 9))] for _ in range(300)]
    ids = tokenizer.encode(TEXTS[0] + "<|endoftext|>\U0001f642")
    return [ids[:end] for end in range(len(ids) + 1)] + runs


def test_a_byte_table_decodes_as_its_tokenizer(tiny_model_dir: Path, kept: Path) -> None:
    files = kept_files(str(tiny_model_dir), kept)
    assert files is not None
    tokenizer = KeptTokenizer.read(*files)
    table = tokenizer.byte_table()
    assert table is not None
    for ids in random_ids(tokenizer):
        for skip in (False, True):
            assert table.decode(ids, skip) == tokenizer.decode(ids, skip_special_tokens=skip)


def test_no_byte_table_for_a_tokenizer_that_decodes_otherwise(tiny_model_dir: Path, kept: Path, tmp_path: Path) -> None:
    files = kept_files(str(tiny_model_dir), kept)
    assert files is not None
    pipeline = json.loads(files[0].read_text(encoding="utf-8"))
    pipeline["decoder"] = {"type": "WordPiece", "prefix": "##", "cleanup": True}
    other = tmp_path / "wordpiece.json"
    other.write_text(json.dumps(pipeline), encoding="utf-8")
    assert KeptTokenizer.read(other, files[1]).byte_table() is None


def test_none_where_no_tokenizer_is_kept(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert read_aside(str(tiny_model_dir), tmp_path / "empty") is None
    assert read_aside(str(tmp_path), tmp_path) is None  # a folder with no tokenizer files


def test_the_second_process_imports_no_torch() -> None:
    """What it imports is what it spends its time on, beside torch's import here."""
    code = "import sys; import specedit.engine.model.aside; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_a_one_off_rewrite_starts_it_before_it_imports_torch(tmp_path: Path, memorising_model_dir: Path) -> None:
    """`specedit rewrite` without a daemon, in a fresh process whose tokenizer is kept: the second process
    starts before torch is imported, and the rewrite is what it would be (as `test_cli` checks it)."""
    original, instruction, answer = MEMORISED_REWRITES[0]
    source = tmp_path / "add.py"
    source.write_text(original)
    code = """if True:
        import json, sys
        from specedit.engine.model import aside
        started = []
        start = aside.AsideTokenizer.__init__
        def watched(self, *args, **kwargs):
            started.append("torch" in sys.modules)
            start(self, *args, **kwargs)
        aside.AsideTokenizer.__init__ = watched
        from specedit.cli.main import main
        code = main(sys.argv[1:])
        print(json.dumps({"code": code, "torch before": started}), file=sys.stderr)
    """
    command = [sys.executable, "-c", code, "rewrite", str(source), "-i", instruction]
    command += ["--model", str(memorising_model_dir), "--engine", "inprocess", "--no-progress"]
    for _ in range(2):  # the first run of this test's process may have to keep the tokenizer
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        report = json.loads(done.stderr.strip().splitlines()[-1])
        assert report["code"] == 0 and done.stdout == answer, done.stderr
    assert report["torch before"] == [False]
