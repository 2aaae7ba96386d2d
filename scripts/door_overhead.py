#!/usr/bin/env python3
"""What the HTTP door costs, as its users meet it: one engine daemon with its HTTP door (started here as
the editors start it), and each case asked twice, side by side, alternating which goes first: as
`specedit rewrite --engine SOCKET` asks it (`EngineClient.rewrite` over the daemon's socket) and as an
OpenAI client asks it (the `openai` package, streamed `/v1/chat/completions` with the rewrite's prompt as
messages, the opening fence as the assistant's started answer, the file as the `prediction`). Prints each
case's wall seconds both ways, whether the answers are the same text, and the median ratio.

    .venv/bin/python scripts/door_overhead.py --cases bench-results/wholefile30.jsonl [--limit N] [--threads 2]

Needs `openai` (the dev extra). Run it with nothing else busy: the figures are ratios taken case by case.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from specedit.engine.backends.client import EngineClient
from specedit.engine.backends.config import DaemonConfig
from specedit.engine.backends.remote import ensure_daemon
from specedit.engine.doors.bench.bench import load_cases
from specedit.engine.records.options import EngineOptions
from specedit.engine.records.prompts import SYSTEM_PROMPT
from specedit.engine.records.requests import RewriteRequest


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def through_socket(client: EngineClient, request: RewriteRequest) -> tuple[float, str]:
    started = time.perf_counter()
    outcome = client.rewrite(request)
    return time.perf_counter() - started, outcome.text


def through_door(openai_client: object, request: RewriteRequest) -> tuple[float, str, dict[str, int]]:
    prompt = request.prompt()
    started = time.perf_counter()
    stream = openai_client.chat.completions.create(  # type: ignore[attr-defined]
        model="specedit",
        messages=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": prompt.user_message()},
            {"role": "assistant", "content": prompt.answer_prefix()},
        ],
        prediction={"type": "content", "content": prompt.original},
        temperature=0,
        stop=[f"\n{prompt.fence}"],
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], {}
    for chunk in stream:
        if chunk.usage is not None:
            details = chunk.usage.completion_tokens_details
            usage = {"accepted": details.accepted_prediction_tokens, "rejected": details.rejected_prediction_tokens}
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
    return time.perf_counter() - started, "".join(pieces), usage


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=Path, required=True)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from openai import OpenAI

    cases = load_cases(args.cases, limit=args.limit)
    folder = Path(tempfile.mkdtemp(prefix="door-", dir="/tmp"))
    token_file = folder / "token"
    token_file.write_text(secrets.token_hex(16) + "\n")
    token_file.chmod(0o600)
    port = free_port()
    config = DaemonConfig(
        socket_path=folder / "engine.sock",
        http=f"127.0.0.1:{port}",
        token_file=token_file,
        # No prefix cache: of the two asking the same case, the second would reuse the first's prompt.
        options=EngineOptions(threads=args.threads, prefix_cache_mb=0),
    )
    client = ensure_daemon(config)  # started as the editors start it; the model loads on the first request
    try:
        door = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=token_file.read_text().strip(), max_retries=0)
        warm = RewriteRequest("x = 1\n", "Rename x to y.", language="python")
        through_socket(client, warm)  # the model loads and its kernels warm up
        through_door(door, warm)
        print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; {len(cases)} cases")
        print(f"{'case':<34} {'socket s':>9} {'door s':>8} {'ratio':>6} same  accepted/rejected")
        ratios, added, differ = [], [], 0
        for index, case in enumerate(cases):
            request = RewriteRequest(case.before, case.instruction, language=case.language)
            if index % 2:
                door_s, door_text, usage = through_door(door, request)
                socket_s, socket_text = through_socket(client, request)
            else:
                socket_s, socket_text = through_socket(client, request)
                door_s, door_text, usage = through_door(door, request)
            ratios.append(door_s / socket_s)
            added.append(door_s - socket_s)
            # A rewrite ends the file as the original did; the answer before the closing fence has no newline.
            same = door_text.rstrip("\n") == socket_text.rstrip("\n")
            if not same:
                differ += 1
                for name, text in (("socket", socket_text), ("door", door_text)):
                    (folder / f"{index}.{name}").write_text(text)
            print(
                f"{case.id[:34]:<34} {socket_s:>9.2f} {door_s:>8.2f} {ratios[-1]:>6.3f} {'yes' if same else 'NO':<5} "
                f"{usage.get('accepted')}/{usage.get('rejected')}",
                flush=True,
            )
        if differ:
            print(f"{differ} answers differ: {folder}/N.socket and N.door")
        print(
            f"the door beside the socket: median {statistics.median(ratios):.3f}x its time, "
            f"{statistics.median(added):+.3f} s a request (median); "
            f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}"
        )
    finally:
        client.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
