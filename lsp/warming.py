"""Open documents offered to the engine before the user asks (`Session.warm`), so that a rewrite's prompt is
read already when it is requested: the engine prefills the system prompt and the file into its prefix cache
while it has nothing else to do, and gives way at once to a real request (`model.prefix_cache`).

A document is offered `WARM_DELAY` seconds after it was opened or last changed (typing pushes it back), and
only when its text differs from what was offered last. Offering is cheap (one message to the daemon; an
in-process engine warms on a thread of its own); it never loads a model or starts a daemon. The server
starts the engine with the editor (`loadOnStart`) and offers every open document again once it answers:
an offer no engine took is made again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from urllib.parse import unquote, urlparse

from specedit.engine.records.prompts import language_for_path
from specedit.engine.records.requests import WarmRequest
from specedit.engine.session.session import Session
from specedit.lsp.delivery import DocumentState

log = logging.getLogger(__name__)

WARM_DELAY = 1.0  # seconds after the last change: a pause in typing, not every keystroke


class Warmer:
    def __init__(
        self,
        documents: dict[str, DocumentState],
        session: Callable[[], Session],
        enabled: Callable[[], bool],
        delay: float = WARM_DELAY,
    ) -> None:
        self._documents = documents
        self._session = session
        self._enabled = enabled
        self._delay = delay
        self._timers: dict[str, threading.Timer] = {}
        self._offered: dict[str, str] = {}  # uri -> the text offered last
        self.offers = 0  # how many offers were sent (for tests and the log)

    def touch(self, uri: str) -> None:
        """The document was opened or changed: offer it once it has been quiet for `delay` seconds."""
        if not self._enabled():
            return
        timer = self._timers.pop(uri, None)
        if timer is not None:
            timer.cancel()
        timer = self._timers[uri] = threading.Timer(self._delay, self._offer, (uri, self._session()))
        timer.daemon = True
        timer.start()

    def touch_all(self) -> None:
        """The engine has just started: every open document it has not taken is offered once quiet."""
        for uri, doc in list(self._documents.items()):
            if self._offered.get(uri) != doc.text:
                self.touch(uri)

    def forget(self, uri: str) -> None:
        timer = self._timers.pop(uri, None)
        if timer is not None:
            timer.cancel()
        self._offered.pop(uri, None)

    def _offer(self, uri: str, session: Session) -> None:
        """On the timer's thread: a document's text is a str, replaced whole by each change."""
        doc = self._documents.get(uri)
        if doc is None or not self._enabled() or self._offered.get(uri) == doc.text:
            return
        text = doc.text
        try:
            request = WarmRequest(text, language_for_path(unquote(urlparse(uri).path)), uri)
        except ValueError:
            return  # too large to rewrite at all
        self._offered[uri] = text
        self.offers += 1
        try:
            taken = session.warm(request)
        except Exception:  # an offer is a hint: nothing may fail because of it
            log.debug("offering %s to warm failed", uri, exc_info=True)
            taken = False
        if not taken:  # no engine answered yet: offered again when it starts, or when the text changes
            self._offered.pop(uri, None)
