"""A one-off rewrite's tokenizer, read in a second process while this one imports torch.

`specedit rewrite` without a daemon is waited for from its start: torch's import (1.0-1.3 s), the kept
tokenizer's reading (0.25-0.33 s for the default model's, in `tokenizers`, holding the GIL: a thread does
not help), the model, the first forward. `read_aside` starts a second Python process that reads the kept
tokenizer as soon as the model is resolved, before torch is imported here, and answers this process's
tokenizer calls over a socket (60-90 microseconds each, 40-60 times a plain call's). Decoding, two calls a
committed token (`loop.detokenizer`), soon stops crossing it: where the tokenizer is byte-level, the second
process hands over each token's bytes (`tokenizer.ByteTable`, checked there on every token), and text is
decoded here from then on. A long-lived engine (the daemon, the language server) reads its own tokenizer:
its start is not waited for, and its calls would cross the socket for its whole life.

Where the second process fails to start, to read the tokenizer, or at any call later, the tokenizer is read
here and answers that call and every one after: the same answers, only the start's time lost (a call the
tokenizer itself refuses raises here as it would have).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from specedit.engine.model.tokenizer import ByteTable, KeptTokenizer, kept_files
from specedit.engine.store.integrity import is_sealed

log = logging.getLogger(__name__)

_SERVE = "import sys; from specedit.engine.model.aside import serve; serve(*sys.argv[1:])"
READ_SECONDS = 30.0  # the longest the tokenizer's reading is waited for there, before it is read here


def read_aside(source: str, kept_folder: Path, *, byte_table: bool = True) -> AsideTokenizer | None:
    """The tokenizer of the model folder `source`, being read in a second process from `kept_folder`; None
    where none is kept whole there (the load builds and keeps it, as ever) or no process starts.
    `byte_table`: whether that process makes the tokens' bytes for decoding here (`ByteTable`: 0.3 s of a
    core while the first forwards run, which a start without torch's import has no spare core for; without
    it each committed token's text crosses the socket, 0.1-0.2 ms)."""
    kept = kept_files(source, kept_folder)
    if kept is None or not all(is_sealed(file) for file in kept):
        return None
    try:
        return AsideTokenizer(*kept, byte_table=byte_table)
    except OSError as error:
        log.info("the tokenizer is read here: no second process started (%s)", error)
        return None


class AsideTokenizer:
    """A `KeptTokenizer` in a second process: the same calls, the same answers."""

    def __init__(self, pipeline: Path, settings: Path, *, byte_table: bool = True) -> None:
        self._files = (pipeline, settings)
        self._local: KeptTokenizer | None = None  # read here, once the second process failed
        self._settings: dict[str, Any] | None = None  # what it says when ready
        self._table: ByteTable | None = None  # each token's bytes, once it sends them: decoded here
        self._lock = threading.Lock()  # one call at a time on the socket
        ours, theirs = socket.socketpair()
        with theirs:
            arguments = [str(theirs.fileno()), str(pipeline), str(settings), str(int(byte_table))]
            self._process = subprocess.Popen(
                [sys.executable, "-c", _SERVE, *arguments],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # stdout is the rewrite's
                stderr=subprocess.DEVNULL,  # a failure is said here, and answered by the tokenizer read here
            )
        self._connection = Connection(ours.detach())
        self._closed = weakref.finalize(self, _stop, self._connection, self._process)

    def close(self) -> None:
        """Stop the second process (calls after it are answered here)."""
        self._closed()

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self._process

    @property
    def decodes_here(self) -> bool:
        """Whether text is decoded here, from each token's bytes (once sent: see the module)."""
        return self._table is not None

    # The tokenizer's calls (`KeptTokenizer`'s), answered there

    @property
    def special_tokens_map(self) -> dict[str, str]:
        return dict(self._setting("special_tokens_map"))

    @property
    def chat_template(self) -> str | None:
        return self._setting("chat_template")  # type: ignore[no-any-return]

    @property
    def model_max_length(self) -> Any:
        return self._setting("model_max_length")

    @property
    def eos_token_id(self) -> int | None:
        return self._call("eos_token_id")  # type: ignore[no-any-return]

    @property
    def pad_token_id(self) -> int | None:
        return self._call("pad_token_id")  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return int(self._call("__len__"))

    def get_vocab(self) -> dict[str, int]:
        return dict(self._call("get_vocab"))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._call("encode", text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        if self._table is not None:
            return self._table.decode(ids, skip_special_tokens)
        return str(self._call("decode", list(ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, messages: list[dict[str, str]], *, tokenize: bool = False, add_generation_prompt: bool = False
    ) -> str:
        return str(
            self._call("apply_chat_template", messages, tokenize=tokenize, add_generation_prompt=add_generation_prompt)
        )

    # How

    def _setting(self, name: str) -> Any:
        with self._lock:
            if self._local is None and self._ready():
                assert self._settings is not None
                return self._settings[name]
        return getattr(self._here(), name)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._local is None and self._ready():
                try:
                    self._connection.send((name, args, kwargs))
                    answer, value = self._connection.recv()
                    if answer == "table":  # sent once, before an answer
                        self._table = value
                        answer, value = self._connection.recv()
                except (OSError, EOFError) as error:
                    self._fail(f"it went away ({error!r})")
                else:
                    if answer == "ok":
                        return value
                    self._fail(f"it could not answer {name} ({value})")  # answered here: raises as it would
        value = getattr(self._here(), name)
        return value(*args, **kwargs) if callable(value) else value

    def _ready(self) -> bool:
        """Whether the second process read the tokenizer (waiting for it the first time)."""
        if self._settings is None:
            try:
                if not self._connection.poll(READ_SECONDS):
                    raise TimeoutError(f"not read in {READ_SECONDS:.0f} s")
                answer, value = self._connection.recv()
            except (OSError, EOFError) as error:
                answer, value = "failed", repr(error)
            if answer != "ready":
                self._fail(f"it could not read it ({value})")
                return False
            self._settings = value
        return True

    def _fail(self, why: str) -> None:
        log.info("the tokenizer is read here: the second process failed: %s", why)
        self._here()
        self.close()

    def _here(self) -> KeptTokenizer:
        if self._local is None:
            self._local = KeptTokenizer.read(*self._files)
        return self._local


def _stop(connection: Connection, process: subprocess.Popen[bytes]) -> None:
    connection.close()  # the second process reads the end, and exits
    try:
        process.wait(timeout=2)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def serve(fd: str, pipeline: str, settings: str, byte_table: str = "1") -> None:
    """The second process: read the tokenizer, say so (or why not), then answer calls until the socket
    closes; meanwhile, in a thread (where `byte_table` is "1"), make its `ByteTable`, sent before the first
    answer after it is made.
    Every message is `(what, value)`: ("ready", its settings), ("failed", why), ("table", the table or
    None), ("ok", a call's result), ("error", why)."""
    connection = Connection(int(fd))
    try:
        tokenizer = KeptTokenizer.read(Path(pipeline), Path(settings))
    except Exception as error:  # whatever stops it: the caller reads it itself, and meets the error there
        connection.send(("failed", f"{type(error).__name__}: {error}"))
        return
    if tokenizer.chat_template is not None:  # its template compiled before the first prompt asks
        with contextlib.suppress(Exception):  # one that refuses this message still renders real ones
            tokenizer.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True)
    names = ("special_tokens_map", "chat_template", "model_max_length")
    connection.send(("ready", {name: getattr(tokenizer, name) for name in names}))
    table: list[ByteTable | None] = []  # the thread's, once made
    if byte_table == "1":
        threading.Thread(target=lambda: table.append(_table_or_none(tokenizer)), daemon=True).start()
    while True:
        try:
            name, args, kwargs = connection.recv()
        except (OSError, EOFError):
            return
        if table:
            connection.send(("table", table.pop()))  # once
        try:
            value = getattr(tokenizer, name)
            connection.send(("ok", value(*args, **kwargs) if callable(value) else value))
        except Exception as error:
            connection.send(("error", f"{type(error).__name__}: {error}"))


def _table_or_none(tokenizer: KeptTokenizer) -> ByteTable | None:
    try:
        return tokenizer.byte_table()
    except Exception:  # whatever stops it: text is decoded there, as before
        return None
