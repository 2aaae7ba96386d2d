"""What the command line accepts: the usage error (exit 2) a bad combination of flags raises, and the
engine's flags, which every command that runs a model shares."""

from __future__ import annotations

import argparse

from specedit.engine.records.errors import SpeceditError
from specedit.engine.records.options import EngineOptions, add_engine_arguments

EXIT_USAGE = 2


class UsageError(SpeceditError):
    exit_code = EXIT_USAGE


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser.add_argument_group("engine"))


def engine_options(args: argparse.Namespace) -> EngineOptions:
    """The engine the flags describe; a bad combination is a usage error (exit 2), before anything loads."""
    try:
        return EngineOptions.from_args(args)
    except ValueError as error:
        raise UsageError(str(error)) from None
