"""`specedit serve`: run the engine daemon, or tell (`--status`) and end (`--stop`) a running one."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from specedit.engine.backends.client import EngineClient
from specedit.engine.backends.config import DaemonConfig
from specedit.engine.backends.protocol import DEFAULT_MAX_FRAME_SIZE
from specedit.engine.doors.daemon import serve
from specedit.engine.records.errors import EngineUnavailableError
from specedit.engine.records.options import EngineOptions, add_engine_arguments


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `serve` to the `specedit` subcommands."""
    serve_parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run the engine daemon: one model in memory, shared by editors and `specedit rewrite --engine`",
        description="Serve rewrites over a unix socket (default: $XDG_RUNTIME_DIR/specedit/engine.sock) "
        "or, with a token, over TCP; with --http, OpenAI's API on the same engine too.",
    )
    where = serve_parser.add_argument_group("where")
    where.add_argument("--socket", type=Path, metavar="PATH", help="the unix socket (mode 0600)")
    where.add_argument("--host", help="TCP: the address to bind (default 127.0.0.1; needs --port and --token-file)")
    where.add_argument("--port", type=int, help="TCP: the port (0: any free port)")
    where.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="TCP and --http: a file whose first line is the token (mode 600); OpenAI clients send it as the API key",
    )
    where.add_argument(
        "--http",
        metavar="[HOST:]PORT",
        help="also serve OpenAI's API (/v1/chat/completions with Predicted Outputs, /v1/completions, /v1/models, "
        "the specedit-apply model) on this address (default host 127.0.0.1), beside the socket; needs --token-file",
    )
    where.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a --host or --http address other machines reach (the code crosses the network in clear, and "
        "over HTTP the token too: put TLS in front)",
    )
    add_engine_arguments(serve_parser.add_argument_group("engine"))
    serve_parser.add_argument(
        "--idle-timeout",
        type=float,
        metavar="SECONDS",
        help="exit after this long without a client or a request through any door (default: never)",
    )
    serve_parser.add_argument(
        "--max-frame-size", type=int, default=DEFAULT_MAX_FRAME_SIZE, metavar="BYTES", help=argparse.SUPPRESS
    )
    action = serve_parser.add_mutually_exclusive_group()
    action.add_argument("--status", action="store_true", help="print the running daemon's state as JSON and exit")
    action.add_argument("--stop", action="store_true", help="stop the running daemon")
    serve_parser.set_defaults(serve_parser=serve_parser)
    return serve_parser


def config_from_args(args: argparse.Namespace) -> DaemonConfig:
    """The daemon config the flags describe; a usage error (exit 2) when they do not fit together."""
    tcp = args.host is not None or args.port is not None or (args.token_file is not None and args.http is None)
    try:
        if tcp and args.socket is not None:
            raise ValueError("--socket and --host/--port/--token-file exclude each other")
        if tcp and (args.port is None or args.token_file is None):
            raise ValueError("TCP needs both --port and --token-file")
        return DaemonConfig(
            socket_path=args.socket,
            host=args.host,
            port=args.port,
            token_file=args.token_file,
            options=EngineOptions.from_args(args),
            allow_remote=args.allow_remote,
            idle_timeout=args.idle_timeout,
            max_frame_size=args.max_frame_size,
            http=args.http,
        )
    except ValueError as error:
        parser: argparse.ArgumentParser = args.serve_parser
        parser.error(str(error))  # exits 2


def serve_command(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.status:
        with EngineClient.connect(config.address, token_file=config.token_file) as client:
            info = client.status()
        sys.stdout.write(json.dumps(info, indent=2) + "\n")
        return 0
    if args.stop:
        try:
            client = EngineClient.connect(config.address, token_file=config.token_file)
        except EngineUnavailableError:
            print(f"specedit: no engine daemon running at {config.address}", file=sys.stderr)
            return 0
        pid = client.daemon_pid
        client.stop(wait=60.0)
        print(f"specedit: stopped the engine daemon at {config.address} (pid {pid})", file=sys.stderr)
        return 0
    # The daemon's log is its only voice: say what it does (to stderr, or the log file it was given).
    package_logger = logging.getLogger("specedit")
    if package_logger.getEffectiveLevel() > logging.INFO:
        package_logger.setLevel(logging.INFO)
    return serve(config)
