#!/usr/bin/env python3
"""How long a good client's rewrite waits beside four 1 MB requests (issue 39): one engine daemon
(started here as the editors start it; no prefix cache, so each rewrite reads its prompt), the example
rewritten alone and then while four requests of 1 MB (two instructions, two sketches) arrive from other
connections, which the daemon refuses before their turn. Three rounds; prints both times and what the four got.

    .venv/bin/python scripts/stall_beside.py

The four are sent from this process, so its own work building and sending 4 MB is part of the figure.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from specedit.engine.backends.client import EngineClient
from specedit.engine.backends.config import DaemonConfig
from specedit.engine.backends.remote import ensure_daemon
from specedit.engine.records.errors import SpeceditError
from specedit.engine.records.options import EngineOptions
from specedit.engine.records.requests import RewriteRequest

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    sock = Path(tempfile.mkdtemp(prefix="stall-", dir="/tmp")) / "engine.sock"
    client = ensure_daemon(DaemonConfig(socket_path=sock, options=EngineOptions(threads=2, prefix_cache_mb=0)))
    try:
        good = RewriteRequest((REPO / "examples" / "sample.py").read_text(), "Rename merge to merge_configs.")
        client.rewrite(good)  # the model loads

        def timed() -> float:
            started = time.perf_counter()
            client.rewrite(good)
            return time.perf_counter() - started

        print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        for number in range(3):
            # New texts each round and each request: the daemon keeps the last few merges.
            big = [f"# {number} {n}\n" + "x = 1\n" * (1_000_000 // 6 - 2) for n in range(4)]
            outsized = [RewriteRequest("y = 2\n", big[0]), RewriteRequest("y = 2\n", big[1])] + [
                RewriteRequest("y = 2\n", None, sketch=text) for text in big[2:]
            ]
            alone, answers = timed(), []

            def send(request: RewriteRequest, answers: list[str]) -> None:
                try:
                    with EngineClient.connect(sock) as other:
                        other.rewrite(request)
                        answers.append("complete")
                except SpeceditError as error:
                    answers.append(type(error).__name__)

            senders = [threading.Thread(target=send, args=(request, answers)) for request in outsized]
            for sender in senders:
                sender.start()
            time.sleep(0.05)
            beside = timed()
            for sender in senders:
                sender.join()
            print(f"alone {alone:.2f} s, beside four 1 MB requests {beside:.2f} s (+{beside - alone:.2f} s): {answers}")
        print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    finally:
        client.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
