"""A time limit that the work on a sketch keeps by itself: its loops check it, and stop past it.

A heavy sketch's merge holds a turn while other clients wait (`session.Session`), so a case the merge
handles badly must not hold it for long. The merge's loops call `Deadline.check` between two pieces of
work (a chunk placed, a hunk applied, a chunk's span checked): past the deadline it raises the clear
`InputError` it was given, and once the request is cancelled it raises `Cancelled`. The merge then stops
within one piece of work, on its own thread, with nothing left running.

>>> Deadline(0.0, late="the sketch took too long").check()
Traceback (most recent call last):
...
specedit.engine.records.errors.InputError: the sketch took too long
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from specedit.engine.records.errors import InputError


class Cancelled(Exception):
    """The request was cancelled while its sketch was read. The session answers with a cancelled outcome:
    this never reaches a front end."""


class Deadline:
    """When the work on a sketch stops: `seconds` after it was made (`late` says why), or once `cancel` is
    set. `clock` is `time.monotonic`, or a test's own."""

    def __init__(
        self,
        seconds: float = math.inf,
        cancel: threading.Event | None = None,
        *,
        late: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._at = clock() + seconds
        self._cancel = cancel
        self._late = late

    def check(self) -> None:
        """Raise `Cancelled` once the request is cancelled, or `InputError` at or past the deadline."""
        if self._cancel is not None and self._cancel.is_set():
            raise Cancelled
        if self._at != math.inf and self._clock() >= self._at:
            raise InputError(self._late)


NO_DEADLINE = Deadline()  # the work runs to its end: a short sketch, a caller without a turn to keep
