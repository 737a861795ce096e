"""Argument types for the command lines: each refuses a malformed value with argparse's message, which names the
option (``argument --seed: expected a whole number >= 0, got -1``), instead of letting it fail later without one."""

from __future__ import annotations

import argparse
import math


def seed(text: str) -> int:
    """A run or learner seed: a whole number >= 0 (gymnasium and numpy refuse negative seeds deep inside a run)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value}")
    return value


def clock_levels(text: str) -> list[int]:
    """Clock levels in MHz separated by commas (``1980,1410``): each a whole number > 0, none twice."""
    items = [x.strip() for x in text.split(",")]
    if not text.strip() or any(not x for x in items):
        raise argparse.ArgumentTypeError(f"expected clock levels in MHz separated by commas (e.g. 1980,1410), got "
                                         f"{text!r}")
    out = []
    for x in items:
        if not x.isdigit() or int(x) <= 0:
            raise argparse.ArgumentTypeError(f"{x!r} is not a clock level in MHz (a whole number > 0; e.g. 1980,1410)")
        out.append(int(x))
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"a clock level given twice in {text!r}")
    return out


def bounded_float(low: float, high: float, what: str):
    """A finite number in [low, high] (NaN and infinities refused)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} in [{low:g}, {high:g}], got {text!r}") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {what} in [{low:g}, {high:g}], got {text}")
        return value

    return parse
