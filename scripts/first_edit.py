"""How long a user waits for the first edit: the language server, a live rewrite, an edit near the top.

    .venv/bin/python scripts/first_edit.py [--sizes 50,200,1000] [--json bench-results/first-edit.json]

Starts the language server as an editor does (`python -m specedit.lsp`, the shared engine daemon with the
default model, in a private runtime folder), and plays the editor with the end-to-end tests' client
(`tests/test_lsp_e2e.py`: it applies the server's edits and reports the changes back, as VS Code and
Neovim do). For the first 50, 200 and 1,000 lines of a real file (psf/requests, from
`../shared/data/edits/git_history.jsonl`) it asks for a live rewrite whose edit is on the first line:

- cold: the request comes right after the document is opened (the engine loaded, the file never seen);
- warm: the document has been open long enough for the daemon to prefill it (`lsp.warming`).

and reports the time to the first edit applied in the editor (from sending the request), the prefill's
share, and the tokens reused; then cancels the rewrite. Last, two command-line rewrites of the 200-line
file through the same daemon: the second's prefill against the first's. Run nothing else meanwhile.

    .venv/bin/python scripts/first_edit.py --example [--json bench-results/first-visible.json]

instead rewrites examples/sample.py to its end, live, once per instruction of EXAMPLE_INSTRUCTIONS, and
reports when the editor first showed something (the text being written, marked pending), when the first
hunk settled (all an editor showed before), and, from the stats, when the model wrote the answer's first
text and how long one speculative step took.

    .venv/bin/python scripts/first_edit.py --fresh [--sizes 200,1000] [--open-seconds 60]

instead plays a freshly started editor, once per size: a new language server and no daemon running (a
private runtime folder each time), the file opened at once, left open `--open-seconds`, then the live
rewrite; the time to its first edit, and when the engine had loaded and read the file (from the
editor's start). With `loadOnStart` (the default) the engine starts with the editor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lsprotocol import types
from pytest_lsp import ClientServerConfig, client_capabilities

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_lsp_e2e import (  # noqa: E402
    EditorClient,
    command,
    daemon_status,
    loaded_and_read,
    lsp_with_a_private_daemon,
    private_socket,
    send_rewrite,
    stop_with_its_daemon,
)

from specedit.engine.records.errors import EngineUnavailableError  # noqa: E402
from specedit.lsp import protocol  # noqa: E402

SOURCE_CASE = "git/psf/requests/dfe46c1b7f55"  # 1,094 lines of requests' Python
INSTRUCTION = "Add the comment line `# Reviewed.` at the very top of the file. Change nothing else."
CLI_INSTRUCTIONS = ("Add a comment `# checked` at the top of the file.", "Add a comment `# seen` at the top.")
EXAMPLE = ROOT / "examples" / "sample.py"
EXAMPLE_INSTRUCTIONS = ("Add type hints and a docstring to every function.", "Rename merge to merge_configs.")


def source_lines() -> list[str]:
    with (ROOT.parent / "shared" / "data" / "edits" / "git_history.jsonl").open(encoding="utf-8") as cases:
        for line in cases:
            case = json.loads(line)
            if case["id"] == SOURCE_CASE:
                return list(case["before"].splitlines(keepends=True))
    raise SystemExit(f"{SOURCE_CASE} is not in git_history.jsonl")


async def wait_warmed(socket: Path, timeout: float = 900.0) -> float:
    """Seconds until the daemon has nothing left to warm."""
    started = time.monotonic()
    await asyncio.sleep(1.5)  # the server offers a document a second after it opened
    while True:
        info = daemon_status(socket)
        if info["warming"] is None and not info["to_warm"] and info["running"] is None:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise SystemExit("warming did not finish")
        await asyncio.sleep(0.1)


async def first_edit(client: EditorClient, uri: str, text: str) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    params = {"textDocument": {"uri": uri, "version": 1}, "instruction": INSTRUCTION, "delivery": "live"}
    pending = asyncio.ensure_future(send_rewrite(client, params))
    while client.documents[uri].text == text and not pending.done():
        await asyncio.sleep(0.005)
    seconds = loop.time() - started
    await command(client, protocol.COMMAND_CANCEL, {"uri": uri})
    result = await pending
    stats = result.get("stats", {})
    return {
        "first_edit_seconds": round(seconds, 2),
        "edited": client.documents[uri].text != text,
        "status": result["status"],
        "prefill_seconds": stats.get("prefill_seconds"),
        "prompt_tokens": stats.get("prompt_tokens"),
        "reused_tokens": stats.get("reused_tokens"),
        "prefill_tokens": stats.get("prefill_tokens"),
        "queue_seconds": stats.get("queue_seconds"),
        "first_text_seconds": stats.get("first_text_seconds"),
        "target_forwards": stats.get("target_forwards"),
        "generated_tokens": stats.get("generated_tokens"),
    }


async def first_visible(client: EditorClient, uri: str, text: str, instruction: str) -> dict[str, Any]:
    """A live rewrite to its end: when the document first changed, when the first hunk settled."""
    loop = asyncio.get_running_loop()
    token = f"visible-{uri}"
    client.partials[token] = []
    started = loop.time()
    params = {"textDocument": {"uri": uri, "version": 1}, "instruction": instruction, "delivery": "live"}
    pending = asyncio.ensure_future(send_rewrite(client, {**params, "partialResultToken": token}))
    visible = settled = None
    while not pending.done():
        if visible is None and client.documents[uri].text != text:
            visible = loop.time() - started
        if settled is None and any(partial["hunks"] for partial in client.partials[token]):
            settled = loop.time() - started
        await asyncio.sleep(0.005)
    ended = loop.time() - started
    result = await pending
    stats = result.get("stats", {})
    forwards = max(stats.get("target_forwards", 0), 1)
    return {
        "instruction": instruction,
        "status": result["status"],
        "first_visible_seconds": round(visible, 3) if visible is not None else None,
        "first_hunk_seconds": round(settled, 3) if settled is not None else None,
        "end_seconds": round(ended, 3),
        "queue_seconds": stats.get("queue_seconds"),
        "prefill_seconds": stats.get("prefill_seconds"),
        "first_text_seconds": stats.get("first_text_seconds"),
        "step_seconds": round(stats.get("decode_seconds", 0.0) / forwards, 4),
        "generated_tokens": stats.get("generated_tokens"),
        "target_forwards": stats.get("target_forwards"),
    }


def cli_prefills(socket: Path, path: Path) -> list[float]:
    seconds = []
    for number, instruction in enumerate(CLI_INSTRUCTIONS):
        stats = path.with_suffix(f".stats{number}.json")
        command = [
            str(Path(sys.executable).parent / "specedit"),
            "rewrite",
            str(path),
            "-i",
            instruction,
            "--engine",
            str(socket),
        ]
        command += ["--max-new-tokens", "8", "--stats", str(stats), "--no-progress", "-o", os.devnull]
        subprocess.run(command, check=False, capture_output=True)
        seconds.append(json.loads(stats.read_text())["prefill_seconds"])
    return seconds


def private_server() -> tuple[ClientServerConfig, Path]:
    """The language server as an editor starts it, with the shared daemon in a runtime folder of its own."""
    runtime = Path(tempfile.mkdtemp(prefix="se-"))
    return lsp_with_a_private_daemon(runtime, "--threads", "2"), private_socket(runtime)


async def fresh(size: int, open_seconds: float) -> dict[str, Any]:
    """A freshly started editor on the first `size` lines, open `open_seconds`, then the live rewrite."""
    config, socket = private_server()
    loop = asyncio.get_running_loop()
    started = loop.time()
    client = await config.start()
    assert isinstance(client, EditorClient)
    text = f"# fresh {size}\n" + "".join(source_lines()[:size])  # as the other runs' texts begin
    uri = f"file:///work/fresh-{size}.py"
    run: dict[str, Any] = {"lines": size, "mode": f"fresh, open {open_seconds:.0f} s", "load_average": os.getloadavg()}
    try:
        result = await client.initialize_session(
            types.InitializeParams(
                capabilities=client_capabilities("neovim"), initialization_options={"specedit": {"delivery": "live"}}
            )
        )
        client.encoding = str(result.capabilities.position_encoding or "utf-16")
        client.open(uri, text)
        loaded = read = None
        while loop.time() - started < open_seconds:
            if read is None and socket.exists():
                info = None
                with contextlib.suppress(EngineUnavailableError):  # (the socket made, not yet listened on)
                    info = daemon_status(socket)
                if info is not None and info["state"] == "ready":
                    loaded = loaded or round(loop.time() - started, 2)
                    if loaded_and_read(info, 1):
                        read = round(loop.time() - started, 2)
            await asyncio.sleep(0.1)
        run.update(engine_loaded_seconds=loaded, file_read_seconds=read, **await first_edit(client, uri, text))
    finally:
        await stop_with_its_daemon(client, socket)
    return run


async def measure_fresh(sizes: list[int], open_seconds: float) -> dict[str, Any]:
    report: dict[str, Any] = {"load_average_before": os.getloadavg(), "runs": []}
    for size in sizes:
        run = await fresh(size, open_seconds)
        report["runs"].append(run)
        print(json.dumps(run), file=sys.stderr)
    report["load_average_after"] = os.getloadavg()
    return report


async def measure(sizes: list[int], example: bool) -> dict[str, Any]:
    lines = source_lines()
    config, socket = private_server()
    runtime = socket.parent.parent
    client = await config.start()
    assert isinstance(client, EditorClient)
    report: dict[str, Any] = {"load_average_before": os.getloadavg(), "runs": []}
    try:
        result = await client.initialize_session(
            types.InitializeParams(
                capabilities=client_capabilities("neovim"), initialization_options={"specedit": {"delivery": "live"}}
            )
        )
        client.encoding = str(result.capabilities.position_encoding or "utf-16")
        # Load the model first: its load is not what is measured here.
        client.open("file:///work/load.py", "x = 1\n")
        await first_edit(client, "file:///work/load.py", "x = 1\n")
        info = daemon_status(socket)
        report["exactness"] = info["exactness"]
        print(f"CPU class {info['exactness']['cpu_class']}, {info['dtype']}, load {os.getloadavg()}", file=sys.stderr)
        if example:
            text = EXAMPLE.read_text(encoding="utf-8")
            for number, instruction in enumerate(EXAMPLE_INSTRUCTIONS):
                uri = f"file:///work/example-{number}.py"
                client.open(uri, text)
                await wait_warmed(socket)  # as in an editor where the file has been open a while
                run = await first_visible(client, uri, text, instruction)
                report["runs"].append(run)
                print(json.dumps(run), file=sys.stderr)
                client.close(uri)
            return report
        for size in sizes:
            for mode in ("cold", "warm"):
                text = f"# {mode} {size}\n" + "".join(lines[:size])  # shares nothing with the others
                uri = f"file:///work/{mode}-{size}.py"
                if mode == "warm":
                    await wait_warmed(socket)  # what is left from the cold run
                client.open(uri, text)
                warm_seconds = await wait_warmed(socket) if mode == "warm" else None
                run = {"lines": size, "mode": mode, "warm_seconds": warm_seconds, **await first_edit(client, uri, text)}
                cache = daemon_status(socket)["prefix_cache"]
                run["prefix_cache"] = cache
                report["runs"].append(run)
                print(json.dumps(run), file=sys.stderr)
                client.close(uri)
        await wait_warmed(socket)
        path = runtime / "requests_200.py"
        path.write_text("".join(lines[:200]), encoding="utf-8")
        report["cli_prefill_seconds"] = cli_prefills(socket, path)
        print(f"command line, the same file twice: prefill {report['cli_prefill_seconds']} s", file=sys.stderr)
    finally:
        report["load_average_after"] = os.getloadavg()
        await stop_with_its_daemon(client, socket)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,200,1000")
    parser.add_argument("--example", action="store_true", help="rewrite examples/sample.py to its end instead")
    parser.add_argument("--fresh", action="store_true", help="a freshly started editor, once per size")
    parser.add_argument("--open-seconds", type=float, default=60.0, help="--fresh: how long the file is open")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    if args.fresh:
        report = asyncio.run(measure_fresh(sizes, args.open_seconds))
    else:
        report = asyncio.run(measure(sizes, args.example))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    for run in report["runs"]:
        if "instruction" in run:
            print(
                f"{run['instruction']!r}: first visible {run['first_visible_seconds']} s, first hunk "
                f"{run['first_hunk_seconds']} s, end {run['end_seconds']} s; the model's first text at "
                f"{run['first_text_seconds']} s of its run (queued {run['queue_seconds']} s), a step "
                f"{run['step_seconds']} s"
            )
            continue
        print(
            f"{run['lines']:>5} lines {run['mode']}: first edit {run['first_edit_seconds']} s "
            f"(prefill {run['prefill_seconds']} s of {run['prefill_tokens']} tokens, {run['reused_tokens']} reused)"
            + (
                f"; the engine loaded {run['engine_loaded_seconds']} s, the file read {run['file_read_seconds']} s "
                "after the editor started"
                if "engine_loaded_seconds" in run
                else ""
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
