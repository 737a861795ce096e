"""Where the command line's messages go: the package's log records on stderr, above any progress bar, for the
length of one command."""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from typing import Iterator

# the command's own loggers: their records (progress such as "resuming: ...", failed episodes) always show
_OWN = ("commitenv.cli", "commitenv.runner", "commitenv.comparison")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (not the stream of the moment the handler was
    made), above any progress bar: progress (INFO) as the bare message, warnings and errors as ``level: message``."""

    @property
    def stream(self):  # noqa: D102
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        return msg if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {msg}"

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        with tqdm.external_write_mode(file=sys.stderr):
            super().emit(record)


def _console_configured() -> bool:
    """Whether the root logger writes to the terminal already (a program that set up logging calls `main`)."""
    consoles = (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)
    return any(isinstance(h, logging.StreamHandler) and h.stream in consoles for h in logging.getLogger().handlers)


def _own(record: logging.LogRecord) -> bool:
    """Whether ``record`` is the command's own message (not a library warning the caller's handlers route)."""
    name = record.name
    return name in _OWN or name.startswith("commitenv.cli.") or name.startswith("commitenv.leaderboard")


@contextmanager
def cli_logging() -> Iterator[None]:
    """For one command, the package's messages (logger ``commitenv`` and its children) from INFO up on stderr:
    the command's own (progress such as "resuming: ...", failed episodes) always, the library's warnings (such
    as rejected requests) unless the root logger has handlers (the caller routes them). A root logger that
    writes to the terminal already gets them all instead, so nothing shows twice. Undone afterwards, so a
    program that calls `main` keeps its logging as it was."""
    lg = logging.getLogger("commitenv")
    level = lg.level
    h = None if _console_configured() else _StderrHandler()
    if h is not None:
        if logging.getLogger().handlers:
            h.addFilter(_own)
        lg.addHandler(h)
    if lg.getEffectiveLevel() > logging.INFO:
        lg.setLevel(logging.INFO)
    try:
        yield
    finally:
        lg.setLevel(level)
        if h is not None:
            lg.removeHandler(h)
