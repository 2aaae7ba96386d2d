"""A live status line on stderr while a rewrite runs, only when stderr is a terminal."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any

from specedit.engine.requests import StepInfo


class RewriteProgress:
    """`with RewriteProgress(label) as progress: ... on_step=progress.step`."""

    def __init__(self, label: str, *, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._label = label
        self._start = time.perf_counter()
        self._live: Any = None

    def __enter__(self) -> RewriteProgress:
        if self.enabled:
            from rich.console import Console
            from rich.live import Live

            self._live = Live("", console=Console(stderr=True), refresh_per_second=8, transient=True)
            self._live.__enter__()
            self._live.update(f"[bold]{self._label}[/bold]: prefill…")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.__exit__(kind, value, traceback)

    def step(self, info: StepInfo) -> None:
        if self._live is None:
            return
        tokens = info.generated_tokens
        elapsed = time.perf_counter() - self._start
        self._live.update(
            f"[bold]{self._label}[/bold]: {tokens} tokens, {tokens / elapsed:.1f} tok/s, "
            f"draft acceptance {info.acceptance_rate:.0%}, {elapsed:.1f} s"
        )
