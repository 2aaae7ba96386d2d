"""The bench's `openai-prediction` method: the same cases through the HTTP door (OpenAI's API, `http.door`)
as a client calls it, the original as the prediction (Predicted Outputs), on the engine the bench loaded.

The door runs in this process, served by uvicorn on a thread of its own, on a session over the bench's
engine; each case goes as a streamed `/v1/chat/completions` request over a loopback connection: the
rewrite's prompt as messages (the system prompt, the user's message), the opening code fence as the
assistant's started answer, the closing fence as the stop string. So the answer is the rewrite's, token
for token, and the difference in time is the HTTP path's (`specedit bench` reports it per request and per
token). CPU seconds are the process's: the door's and the engine's together, as `specedit`'s are.
"""

from __future__ import annotations

import http.client
import json
import secrets
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from specedit.engine.doors.bench.method_run import MethodRun, Timer
from specedit.engine.doors.http.openai import Usage
from specedit.engine.loop.generate import Engine
from specedit.engine.loop.rewrite import PreparedRewrite
from specedit.engine.records.prompts import SYSTEM_PROMPT

METHOD = "openai-prediction"


class OpenAIDoor:
    """The HTTP door on `engine`, on a free loopback port, while inside `running`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.token = secrets.token_hex(16)
        self.port = 0

    @contextmanager
    def running(self) -> Iterator[OpenAIDoor]:
        import uvicorn

        from specedit.engine.backends.local import LocalBackend
        from specedit.engine.doors.http.door import Door
        from specedit.engine.session.session import Session

        door = Door(Session(LocalBackend(engine=self.engine)), token=self.token, model=self.engine.loaded.name)
        listener = socket.create_server(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(door.app, log_level="warning", lifespan="off", access_log=False))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, name="specedit-door", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            server.should_exit = True
            thread.join(30)
            listener.close()

    def run(self, prepared: PreparedRewrite) -> MethodRun:
        """One case through the door, streamed; the code of its answer, timed."""
        prompt = prepared.prompt
        body = {
            "model": "specedit",
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": prompt.user_message()},
                {"role": "assistant", "content": prompt.answer_prefix()},
            ],
            "prediction": {"type": "content", "content": prompt.original},
            "temperature": 0,
            "max_tokens": prepared.max_new_tokens,
            "stop": [f"\n{prepared.fence}"],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
        timer = Timer()
        pieces: list[str] = []
        usage: Usage | None = None
        try:
            connection.request(
                "POST",
                "/v1/chat/completions",
                json.dumps(body),
                {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
            )
            response = connection.getresponse()
            if response.status != 200:
                raise RuntimeError(f"the door answered {response.status}: {response.read()[:500]!r}")
            for line in response:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices", []):
                    if content := choice["delta"].get("content"):
                        timer.mark_first()
                        pieces.append(content)
        finally:
            connection.close()
        wall, cpu, prefill, decode = timer.finish()
        # The model's text ends with the newline before the closing fence; the region is the rewrite's.
        code = "".join(pieces) + "\n"
        details = usage.get("completion_tokens_details") if usage else None
        return MethodRun(
            self.engine.tokenize(code),  # (the API gives text: its tokens again, for the counts)
            prepared.region_text(code),
            wall,
            cpu,
            prefill,
            decode,
            target_forwards=0,
            extra={
                "accepted_prediction_tokens": details.get("accepted_prediction_tokens") if details else None,
                "rejected_prediction_tokens": details.get("rejected_prediction_tokens") if details else None,
                "completion_tokens": usage.get("completion_tokens") if usage else None,
            },
        )
