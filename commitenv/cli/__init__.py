"""The ``commitenv`` command line: run and compare controllers on scenarios, simulate a fixed configuration,
bill the requests of a finished run, list scenarios, profiles and workloads."""

from __future__ import annotations

import sys

from commitenv.cli.console import cli_logging
from commitenv.cli.parser import build_parser

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the subcommand; a bad input (ValueError, OSError) prints one ``error:`` line, rc 2."""
    args = build_parser().parse_args(argv)
    with cli_logging():
        try:
            return args.func(args)
        except (ValueError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
