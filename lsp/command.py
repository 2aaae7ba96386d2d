"""`specedit lsp`: the command-line entry of the language server (wired into `specedit` by the CLI)."""

from __future__ import annotations

import argparse
from typing import Any

from specedit.engine.requests import DRAFT_METHODS, DTYPE_CHOICES


def add_lsp_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `specedit lsp`; each overrides the editor's `specedit.*` setting of the same name."""
    parser.add_argument(
        "--engine",
        metavar="ADDR|inprocess",
        help="where rewrites run: 'inprocess' (load the model in this process), a daemon address, or "
        "(default) the shared daemon, started when none runs",
    )
    parser.add_argument("--engine-token-file", metavar="FILE", help="the daemon's token file, for a tcp:// --engine")
    parser.add_argument("--model", help="a model folder, a .gguf file, a hub id, or a known name")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, help="model dtype (default: auto)")
    parser.add_argument(
        "--draft",
        choices=DRAFT_METHODS,
        help="auto (default): copy from the original, then the fallback; copy; fallback; none",
    )
    parser.add_argument(
        "--draft-model",
        metavar="MODEL",
        help="a small model with the target's tokenizer, drafting where the copy has nothing",
    )
    parser.add_argument(
        "--draft-layers",
        metavar="LIST",
        help="draft where the copy has nothing with these layers of the target (or auto)",
    )
    parser.add_argument("--p-min", type=float, help="the fallback's confidence threshold (default 0.5)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: CUDA when available)")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (in-process engine)")
    # Clients pass --stdio by convention (vscode-languageclient's stdio transport does); it is the only one.
    parser.add_argument("--stdio", action="store_true", help=argparse.SUPPRESS)


def add_lsp_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `lsp` to the `specedit` command's subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "lsp",
        help="run the language server on stdio (for editors)",
        description="The specedit language server, on stdin/stdout. Logs go to stderr.",
    )
    add_lsp_arguments(parser)
    return parser


def lsp_command(args: argparse.Namespace) -> int:
    from specedit.lsp.server import run_lsp

    return int(run_lsp(args))
