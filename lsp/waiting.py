"""Waiting on the event loop for a condition on the server's state (an edit's echo, a document's pending
edits), re-checked whenever something changes: a `didChange`, an edit resolved."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Waiting:
    def __init__(self) -> None:
        self._pulse: asyncio.Event | None = None

    def notify(self) -> None:
        """Something changed: wake everyone waiting for a condition."""
        pulse, self._pulse = self._pulse, None
        if pulse is not None:
            pulse.set()

    async def until(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Wait until `predicate()` holds (checked on every notification); False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not predicate():
            if self._pulse is None:
                self._pulse = asyncio.Event()
            pulse = self._pulse
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            try:
                async with asyncio.timeout(remaining):  # not wait_for: on 3.11 it can swallow a cancel
                    await pulse.wait()
            except asyncio.TimeoutError:
                return predicate()
        return True
