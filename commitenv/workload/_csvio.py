"""Low-level, chunked and mostly vectorised parsing shared by the trace loaders.

Every helper raises :class:`WorkloadError` with ``"<file>: line <n>: <problem>"``; a broken gzip stream
raises ``"<file>: gzip stream is truncated or corrupt after line <n> ..."`` (see :func:`open_text`). The fast
paths parse a whole chunk at once with numpy; only when a chunk fails do the slow paths walk it row by row to
find and name the first bad line, so a clean multi-million-row file never pays the per-row cost.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
import warnings
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from itertools import islice
from pathlib import Path

import numpy as np

from .table import WorkloadError

CHUNK_LINES = 200_000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ESCAPED = re.compile("[\udc80-\udcff]")  # a byte that is not UTF-8, as decoded with errors="surrogateescape"
_GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)
_ISO_RE = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9})\d*)?\s*(Z|[+-]\d{2}:?\d{2})?$"
)


def fail(path: str | Path, line: int, problem: str) -> WorkloadError:
    """The error every loader raises: file, 1-based line number, problem."""
    return WorkloadError(f"{path}: line {line}: {problem}")


def _open(path: Path) -> io.TextIOBase:
    """The raw text stream: undecodable bytes become surrogate escapes so `check_utf8` can name them."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig", errors="surrogateescape", newline="")
    return open(path, encoding="utf-8-sig", errors="surrogateescape", newline="")


def complete_lines(path: Path) -> int:
    """How many whole lines a broken gzip file yields before it fails (re-read on the error path only)."""
    n = 0
    try:
        with _open(path) as f:
            for line in f:
                n += line.endswith(("\n", "\r"))
    except _GZIP_ERRORS:
        pass
    return n


@contextmanager
def open_text(path: str | Path) -> Iterator[io.TextIOBase]:
    """Open a text trace, transparently decompressing ``*.gz``; a truncated or corrupt gzip stream, however
    deep in the file, raises :class:`WorkloadError` naming the file and the last complete line."""
    p = Path(path)
    try:
        with _open(p) as f:
            yield f
    except _GZIP_ERRORS as e:
        if p.suffix != ".gz":
            raise
        n = complete_lines(p)
        where = f"after line {n} (the last complete line)" if n else "before the first complete line"
        raise WorkloadError(f"{p}: gzip stream is truncated or corrupt {where}: {e}; "
                            "re-download or re-compress the file") from None


def check_utf8(path: str | Path, lines: Sequence[str], first: int) -> None:
    """Raise naming the line, column and value of the first byte that is not UTF-8 (``lines`` start at line
    ``first``); a clean chunk costs one C-level encode."""
    try:
        "".join(lines).encode("utf-8")
        return
    except UnicodeEncodeError:
        pass
    for k, line in enumerate(lines):
        m = _ESCAPED.search(line)
        if m:
            byte = ord(m.group()) - 0xDC00
            raise fail(path, first + k, f"not valid UTF-8 (byte 0x{byte:02x} at column {m.start() + 1}); "
                                        "traces must be UTF-8 text")


def _split_fast(chunk: list[str], ncols: int) -> list[str] | None:
    """All fields of a chunk of plain CSV lines, flat; None if any line is blank, quoted or miscounted."""
    text = "".join(chunk)
    if '"' in text:
        return None
    if "\r" in text:
        text = text.replace("\r", "")
    if not text.endswith("\n"):
        text += "\n"
    raw = np.frombuffer(text.encode(), dtype=np.uint8)
    newlines = np.flatnonzero(raw == 10)
    commas_before = np.searchsorted(np.flatnonzero(raw == 44), newlines)
    per_line = np.diff(commas_before, prepend=0)
    if len(newlines) != len(chunk) or np.any(per_line != ncols - 1) or np.any(np.diff(newlines, prepend=-1) == 1):
        return None
    return text[:-1].replace("\n", ",").split(",")


def csv_chunks(path: str | Path, required: Sequence[str]) -> Iterator[tuple[dict[str, list[str]], np.ndarray]]:
    """Yield ``({column: [str, ...]}, line_numbers)`` per chunk of data rows; blank lines are skipped.

    The header (line 1) must hold every ``required`` column; a row must have as many fields as the header.
    Quoted fields are allowed but may not contain line breaks.
    """
    with open_text(path) as f:
        header_line = f.readline()
        check_utf8(path, [header_line], 1)
        if not header_line.strip():
            raise fail(path, 1, "empty file: expected a header line with columns " + ", ".join(required))
        cols = [c.strip() for c in next(csv.reader([header_line]))]
        missing = [c for c in required if c not in cols]
        if missing:
            raise fail(path, 1, f"missing column {missing[0]!r} (columns found: {', '.join(cols)})")
        ncols = len(cols)
        idx = {c: cols.index(c) for c in required}
        lineno = 1
        while True:
            chunk = list(islice(f, CHUNK_LINES))
            if not chunk:
                break
            first = lineno + 1
            lineno += len(chunk)
            check_utf8(path, chunk, first)
            flat = _split_fast(chunk, ncols)
            if flat is not None:
                yield {c: flat[j::ncols] for c, j in idx.items()}, np.arange(first, first + len(chunk))
                continue
            rows: dict[str, list[str]] = {c: [] for c in required}
            lines: list[int] = []
            for k, line in enumerate(chunk):
                if not line.strip():
                    continue
                fields = next(csv.reader([line]))
                if len(fields) != ncols:
                    raise fail(path, first + k, f"expected {ncols} fields ({', '.join(cols)}), found {len(fields)}")
                for c, j in idx.items():
                    rows[c].append(fields[j])
                lines.append(first + k)
            if lines:
                yield rows, np.asarray(lines, dtype=np.int64)


def parse_numbers(values: list[str], lines: np.ndarray, path: str | Path, column: str) -> np.ndarray:
    """Finite float64 values of a column; names the first non-numeric line."""
    try:
        out = np.asarray(values).astype(np.float64) if values else np.empty(0)
    except ValueError:
        out = None
    if out is not None and np.all(np.isfinite(out)):
        return out
    for k, s in enumerate(values):
        try:
            v = float(s)
        except ValueError:
            raise fail(path, int(lines[k]), f"column {column!r}: non-numeric value {s!r}") from None
        if not np.isfinite(v):
            raise fail(path, int(lines[k]), f"column {column!r}: non-finite value {s!r}")
    raise fail(path, int(lines[0]), f"column {column!r}: unparsable numbers")  # pragma: no cover


def check_tokens(
    values: np.ndarray, lines: np.ndarray, path: str | Path, column: str, *, minimum: int
) -> tuple[np.ndarray, int]:
    """Whole-number token counts as int64. Values below ``minimum`` are an error, except that an output
    count of 0 (``minimum == 0``) is raised to 1 token; returns ``(counts, how_many_raised)``."""
    bad = np.flatnonzero((values != np.floor(values)) | (values < minimum))
    if len(bad):
        k = int(bad[0])
        v = values[k]
        what = "not a whole number" if v != np.floor(v) else ("negative" if v < 0 else "zero")
        rule = "a whole number >= 1" if minimum >= 1 else "a whole number >= 0 (0 is read as 1)"
        raise fail(path, int(lines[k]), f"column {column!r}: token count {v:g} is {what} (must be {rule})")
    out = values.astype(np.int64)
    zeros = out == 0
    n_zero = int(zeros.sum())
    if n_zero:
        out[zeros] = 1
    return out, n_zero


def _iso_to_ns(s: str) -> int | None:
    """Nanoseconds since the Unix epoch (UTC) of one ISO timestamp; None if unparsable. Naive means UTC."""
    m = _ISO_RE.match(s.strip())
    if not m:
        return None
    date, clock, frac, tz = m.groups()
    try:
        dt = datetime.fromisoformat(f"{date}T{clock}").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    if tz and tz != "Z":
        sign = -1 if tz[0] == "-" else 1
        hh, mm = int(tz[1:3]), int(tz[-2:])
        dt -= sign * timedelta(hours=hh, minutes=mm)
    secs = (dt - _EPOCH) // timedelta(seconds=1)
    return secs * 1_000_000_000 + (int(frac.ljust(9, "0")) if frac else 0)


def parse_iso_ns(values: list[str], lines: np.ndarray, path: str | Path, column: str) -> np.ndarray:
    """int64 nanoseconds since the epoch (UTC) for ISO timestamps such as ``2023-11-16 18:15:46.6805900``
    (naive, taken as UTC) or ``2024-05-10 00:00:00.123456+00:00``; names the first unparsable line."""
    if not values:
        return np.empty(0, dtype=np.int64)
    a = np.char.strip(np.asarray(values))
    for suffix in ("+00:00", "Z"):
        if np.all(np.char.endswith(a, suffix)):
            a = np.char.replace(a, suffix, "") if suffix != "Z" else np.char.rstrip(a, "Z")
            break
    fast = None
    width = a.dtype.itemsize // 4
    if width >= 19:
        c = a.view(np.uint32).reshape(len(a), width)
        shape_ok = (
            (np.char.str_len(a) >= 19)
            & (c[:, 4] == 45) & (c[:, 7] == 45) & ((c[:, 10] == 32) | (c[:, 10] == 84))
            & (c[:, 13] == 58) & (c[:, 16] == 58)
        )
        if shape_ok.all():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    fast = a.astype("datetime64[ns]").astype(np.int64)
            except (ValueError, Warning):
                fast = None
    if fast is not None:
        return fast
    out = np.empty(len(values), dtype=np.int64)
    for k, s in enumerate(values):
        ns = _iso_to_ns(s)
        if ns is None:
            raise fail(path, int(lines[k]), f"column {column!r}: unparsable timestamp {s!r} "
                       "(expected e.g. '2023-11-16 18:15:46.6805900' or '2024-05-10 00:00:00.123+00:00')")
        out[k] = ns
    return out


def check_time(
    times: np.ndarray, lines: np.ndarray, path: str | Path, column: str, *, show=str, allow_negative: bool = False
) -> None:
    """Times must be non-decreasing (a trace must already be sorted by time) and, unless ``allow_negative``
    (absolute dates), >= 0."""
    neg = np.flatnonzero(times < 0) if not allow_negative else np.empty(0, dtype=np.int64)
    if len(neg):
        k = int(neg[0])
        raise fail(path, int(lines[k]), f"column {column!r}: negative time {show(times[k])}")
    back = np.flatnonzero(np.diff(times) < 0)
    if len(back):
        k = int(back[0]) + 1
        raise fail(
            path, int(lines[k]),
            f"column {column!r}: time goes backwards ({show(times[k])} after {show(times[k - 1])} on line "
            f"{int(lines[k - 1])}); the trace must be sorted by time",
        )
