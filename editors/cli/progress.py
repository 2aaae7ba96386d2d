"""A live status line on stderr while the model loads and a rewrite runs, only when stderr is a terminal.

The line is drawn again several times a second, so the seconds it shows move on while nothing else does
(the model loading, a long prefill).
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any

from specedit.engine.requests import DecodingRate, Phase, StepInfo


class StatusLine:
    """`with StatusLine(label) as line: ...`; the text is `describe(elapsed seconds)`, redrawn 8 times a second."""

    def __init__(self, label: str, *, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._label = label
        self._start = time.perf_counter()
        self._live: Any = None

    def describe(self, elapsed: float) -> str:
        return f"{elapsed:.0f} s"

    def __rich__(self) -> str:
        return f"[bold]{self._label}[/bold]: {self.describe(time.perf_counter() - self._start)}"

    def __enter__(self) -> StatusLine:
        if self.enabled:
            from rich.console import Console
            from rich.live import Live

            # stdout is the rewrite's (a pipe, a file): never redirected into the status line.
            self._live = Live(
                self, console=Console(stderr=True), refresh_per_second=8, transient=True, redirect_stdout=False
            )
            self._live.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.__exit__(kind, value, traceback)


class LoadingLine(StatusLine):
    """While the model loads (torch's import, the weights, the kernels' self-check)."""

    def describe(self, elapsed: float) -> str:
        return f"loading the model · {elapsed:.0f} s"


class RewriteProgress(StatusLine):
    """`with RewriteProgress(label) as progress: session.run(..., on_step=progress.step, on_phase=progress.phase)`.

    Before the first step it says where the rewrite is (the model loading, the queue, the prompt being
    read); then tokens, the decoding rate (tokens since the first step over the time since: the load and
    the prefill are not in it) and the draft acceptance.
    """

    def __init__(self, label: str, *, enabled: bool | None = None) -> None:
        super().__init__(label, enabled=enabled)
        self._phase: Phase | None = None
        self._last: StepInfo | None = None
        self._decoding = DecodingRate()

    def phase(self, phase: Phase) -> None:
        self._phase = phase

    def step(self, info: StepInfo) -> None:
        self._decoding.step(info)
        self._last = info

    def describe(self, elapsed: float) -> str:
        info = self._last
        if info is None:
            if self._phase is None or self._phase.name == "started":
                return f"reading the file · {elapsed:.1f} s"
            if self._phase.name == "loading":
                return f"loading the model · {elapsed:.0f} s"
            return f"waiting for {self._phase.ahead} other rewrite(s) · {elapsed:.0f} s"
        decoding = self._decoding.rate(info.generated_tokens)
        rate = "… tok/s" if decoding is None else f"{decoding:.1f} tok/s"
        return f"{info.generated_tokens} tokens, {rate}, draft acceptance {info.acceptance_rate:.0%}, {elapsed:.1f} s"
