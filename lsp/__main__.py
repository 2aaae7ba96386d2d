"""`python -m specedit.lsp [flags]`: the language server on stdio, as `specedit lsp [flags]`."""

from __future__ import annotations

import argparse
import sys

from specedit.lsp.command import add_lsp_arguments, lsp_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specedit.lsp", description=__doc__)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (to stderr)")
    add_lsp_arguments(parser)
    return int(lsp_command(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
