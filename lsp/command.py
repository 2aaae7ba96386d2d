"""`specedit lsp`: the command-line entry of the language server (wired into `specedit` by the CLI)."""

from __future__ import annotations

import argparse

from specedit.engine.records.options import add_engine_arguments
from specedit.engine.records.requests import DRAFT_METHODS


def add_lsp_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `specedit lsp`; each overrides the editor's `specedit.*` setting of the same name."""
    parser.add_argument(
        "--engine",
        metavar="ADDR|inprocess",
        help="where rewrites run: 'inprocess' (load the model in this process), a daemon address, or "
        "(default) the shared daemon, started when none runs",
    )
    parser.add_argument(
        "--engine-token-file", metavar="FILE", help="the token file, for a tcp:// or http(s):// --engine"
    )
    parser.add_argument(
        "--draft",
        choices=DRAFT_METHODS,
        help="auto (default): copy from the original, then the fallback; copy; fallback; none",
    )
    add_engine_arguments(parser.add_argument_group("engine (in process, or a daemon this server starts)"))
    # Clients pass --stdio by convention (vscode-languageclient's stdio transport does); it is the only one.
    parser.add_argument("--stdio", action="store_true", help=argparse.SUPPRESS)


def add_lsp_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add `lsp` to the `specedit` command's subparsers."""
    parser = subparsers.add_parser(
        "lsp",
        help="run the language server on stdio (for editors)",
        description="The specedit language server, on stdin/stdout. Logs go to stderr.",
    )
    add_lsp_arguments(parser)
    return parser


def lsp_command(args: argparse.Namespace) -> int:
    from specedit.lsp.server import run_lsp

    return int(run_lsp(args))
