#!/usr/bin/env python3
"""How long a good client's rewrite waits beside four 1 MB requests (issue 39): one `specedit serve`
daemon (started here; no prefix cache, so each rewrite reads its prompt), the example rewritten alone and
then while four requests of 1 MB (two instructions, two sketches) arrive from other connections, which the
daemon refuses before their turn. Three rounds; prints both times and what the four got.

    .venv/bin/python scripts/stall_beside.py

The four are sent from this process, so its own work building and sending 4 MB is part of the figure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from specedit.engine.errors import SpeceditError
from specedit.engine.requests import RewriteRequest
from specedit.engine.serving.client import EngineClient

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    folder = Path(tempfile.mkdtemp(prefix="stall-", dir="/tmp"))
    sock = folder / "engine.sock"
    command = [str(REPO / ".venv" / "bin" / "specedit"), "serve", "--socket", str(sock), "--threads", "2"]
    daemon = subprocess.Popen([*command, "--prefix-cache-mb", "0"], stdout=subprocess.DEVNULL)
    try:
        while not sock.exists():
            if daemon.poll() is not None:
                raise SystemExit("the daemon did not start")
            time.sleep(0.2)
        good = RewriteRequest((REPO / "examples" / "sample.py").read_text(), "Rename merge to merge_configs.")
        client = EngineClient.connect(sock)
        client.rewrite(good)  # the model loads

        def timed() -> float:
            started = time.perf_counter()
            client.rewrite(good)
            return time.perf_counter() - started

        big = "x = 1\n" * (1_000_000 // 6)
        outsized = [RewriteRequest("y = 2\n", big), RewriteRequest("y = 2\n", None, sketch=big)] * 2
        print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        for _ in range(3):
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
        client.close()
    finally:
        daemon.terminate()
        daemon.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
