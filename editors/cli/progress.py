"""A live status line on stderr while the model loads and a rewrite runs, only when stderr is a terminal.

The line is drawn again several times a second, so the seconds it shows move on while nothing else does
(the model loading, a long prefill).
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TYPE_CHECKING

from specedit.engine.records.events import DecodingRate, Event, Phase, Step

if TYPE_CHECKING:
    from rich.live import Live


class StatusLine:
    """`with StatusLine(label) as line: ...`; the text is `describe(elapsed seconds)`, redrawn 8 times a second."""

    def __init__(self, label: str, *, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._label = label
        self._start = time.perf_counter()
        self._live: Live | None = None

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
    """`with RewriteProgress(label) as progress: session.run(request, progress.show)`.

    Before the first step it says where the rewrite is (the model being fetched or loading, the queue, the
    prompt being read); then tokens, the decoding rate (tokens since the first step over the time since:
    the load and the prefill are not in it) and the draft acceptance.
    """

    def __init__(self, label: str, *, enabled: bool | None = None) -> None:
        super().__init__(label, enabled=enabled)
        self._phase: Phase | None = None
        self._last: Step | None = None
        self._decoding = DecodingRate()
        self._fetching: tuple[str, int, int | None] | None = None

    def show(self, event: Event) -> None:
        if isinstance(event, Phase):
            self._phase = event
        elif isinstance(event, Step):
            self._decoding.step(event)
            self._last = event

    def fetching(self, stage: str, done: int, total: int | None) -> None:
        """Provisioning's progress (the first use of a model fetches it)."""
        self._fetching = (stage, done, total)

    def describe(self, elapsed: float) -> str:
        info = self._last
        if info is None:
            if self._phase is None or self._phase.name == "started":
                return f"reading the file · {elapsed:.1f} s"
            if self._phase.name == "loading" and self._fetching is not None:
                stage, done, total = self._fetching
                of = f" of {total / 1e6:.0f}" if total else ""
                return f"{stage}: {done / 1e6:.0f}{of} MB · {elapsed:.0f} s"
            if self._phase.name == "loading":
                return f"loading the model · {elapsed:.0f} s"
            if self._phase.ahead == 0:
                return f"starting · {elapsed:.1f} s"
            return f"waiting for {self._phase.ahead} other rewrite(s) · {elapsed:.0f} s"
        decoding = self._decoding.rate(info.generated_tokens)
        rate = "… tok/s" if decoding is None else f"{decoding:.1f} tok/s"
        return f"{info.generated_tokens} tokens, {rate}, draft acceptance {info.acceptance_rate:.0%}, {elapsed:.1f} s"


class Provisioning:
    """Provisioning's progress callback (`ProgressCallback`), shown on the status line of the rewrite that
    waits for the model (`line`)."""

    def __init__(self) -> None:
        self.line: RewriteProgress | None = None

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        if self.line is not None:
            self.line.fetching(stage, done, total)
