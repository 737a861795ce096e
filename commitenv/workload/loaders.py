"""Readers for LLM request traces: a plain ``arrival_s,prompt_tokens,output_tokens`` CSV and the public Azure LLM
inference (2023/2024), Mooncake JSONL and BurstGPT formats.

Every loader returns a :class:`RequestTable` in file order with ``arrival_s`` = seconds since the first
request. The time origin: no loader keeps the trace's own origin; each shifts its time axis so that the first
request arrives at 0 s and records the first request's time, on the file's own clock, in
``table.meta["time_origin"]`` (Azure: the UTC date and time as an ISO string; Mooncake and BurstGPT: seconds on
the file's relative clock, ``meta["time_origin_unit"]`` says which). A scenario's ``workload.start_hour`` (and a
`time_window`) therefore counts hours from the first request, not from the file's zero or from midnight. The
trace must already be sorted by time: time going backwards is an error, not something silently
re-sorted. Token rules, shared by all formats: a prompt must be a whole number >= 1; an output of 0 tokens
(present in the 2024 Azure releases and BurstGPT failures, absent from the 2023 Azure files) is read as 1
token, counted in ``table.meta["zero_outputs_raised"]``. Malformed input raises :class:`WorkloadError`
naming the file, the 1-based line and the problem (a byte that is not UTF-8 is named with its line and
column). ``*.gz`` files are read transparently; a truncated or corrupt gzip stream raises
:class:`WorkloadError` naming the last complete line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._csvio import (
    check_time, check_tokens, check_utf8, csv_chunks, fail, open_text, parse_iso_ns, parse_numbers,
)
from .table import RequestTable

PLAIN_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")


def _ns_iso(ns: int) -> str:
    return str(np.datetime64(int(ns), "ns")).replace("T", " ")


def _finish(
    path: Path, times: np.ndarray, prompt: np.ndarray, output: np.ndarray, n_zero: int, *, unit: float,
    tenant: np.ndarray | None = None, tenant_names: tuple[str, ...] = ("default",),
    prefix_offsets: np.ndarray | None = None, prefix_hashes: np.ndarray | None = None, meta: dict | None = None,
) -> RequestTable:
    """The table, times shifted so the first request is at 0 s (``times`` in units of ``unit`` seconds); ``meta``
    records that shift as ``time_origin`` (see the module docstring)."""
    n = len(times)
    t0 = times[0]
    arrival = (times - t0).astype(np.float64) * unit
    return RequestTable(
        arrival_s=arrival,
        prompt_tokens=prompt,
        output_tokens=output,
        tenant=np.zeros(n, dtype=np.int32) if tenant is None else tenant.astype(np.int32),
        request_id=np.arange(n, dtype=np.int64),
        tenant_names=tenant_names,
        prefix_offsets=prefix_offsets,
        prefix_hashes=prefix_hashes,
        source=str(path),
        meta={"zero_outputs_raised": n_zero, **(meta or {})},
    )


def _no_rows(path: Path, last_line: int, what: str = "the file has only a header") -> None:
    raise fail(path, last_line, f"empty file: no data rows ({what})")


@dataclass(frozen=True)
class _CsvRequests:
    """The request columns of a CSV trace, as read (times on the file's clock, tokens checked)."""

    times: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    lines: np.ndarray  # 1-based file line of each row
    zero_outputs: int  # outputs of 0 tokens, read as 1
    extra: np.ndarray | None = None  # the raw strings of the ``extra`` column, when one was asked for


def _read_csv_requests(path: Path, columns: tuple[str, str, str], parse_time, extra: str | None = None) -> _CsvRequests:
    """Read the ``(time, prompt, output)`` columns of a CSV trace chunk by chunk (and the raw ``extra`` column);
    ``parse_time(values, lines, path, column)`` turns a chunk's time strings into numbers. Bad rows raise naming the
    file, line and column."""
    time_col, prompt_col, output_col = columns
    ts, prompts, outputs, lines, extras = [], [], [], [], []
    n_zero = 0
    for cols, ln in csv_chunks(path, columns if extra is None else (*columns, extra)):
        if extra is not None:
            extras.append(np.asarray(cols[extra]))
        ts.append(parse_time(cols[time_col], ln, path, time_col))
        p, _ = check_tokens(parse_numbers(cols[prompt_col], ln, path, prompt_col), ln, path, prompt_col, minimum=1)
        o, z = check_tokens(parse_numbers(cols[output_col], ln, path, output_col), ln, path, output_col, minimum=0)
        prompts.append(p)
        outputs.append(o)
        lines.append(ln)
        n_zero += z
    if not ts:
        _no_rows(path, 1)
    return _CsvRequests(np.concatenate(ts), np.concatenate(prompts), np.concatenate(outputs), np.concatenate(lines),
                        n_zero, np.concatenate(extras) if extra is not None else None)


def load_plain_csv(path: str | Path) -> RequestTable:
    """A plain CSV of one's own (``arrival_s,prompt_tokens,output_tokens``; other columns are ignored).

    Time origin: shifted. ``arrival_s`` is seconds on any clock (sorted, >= 0); the table counts from the first
    request, whose ``arrival_s`` ``meta["time_origin"]`` holds.
    """
    path = Path(path)
    r = _read_csv_requests(path, PLAIN_COLUMNS, parse_numbers)
    check_time(r.times, r.lines, path, "arrival_s", show=lambda v: f"{v:g}")
    return _finish(path, r.times, r.prompt, r.output, r.zero_outputs, unit=1.0,
                   meta={"format": "plain", "time_origin": float(r.times[0]), "time_origin_unit": "s"})


def load_azure_csv(path: str | Path) -> RequestTable:
    """Azure LLM inference trace (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    2023 files carry naive timestamps with 7 fractional digits (``2023-11-16 18:15:46.6805900``), 2024
    files carry ``+00:00``; both (and any other UTC offset) are read, naive as UTC.

    Time origin: shifted. The timestamps are absolute dates; ``arrival_s`` counts seconds from the first
    request's timestamp (not from midnight or the hour), which ``meta["time_origin"]`` (and, as before,
    ``meta["start_time"]``) holds as a UTC ISO string to the nanosecond, e.g. ``2023-11-16 18:15:46.680590000+00:00``.
    """
    path = Path(path)
    r = _read_csv_requests(path, AZURE_COLUMNS, parse_iso_ns)
    times, ln = r.times, r.lines
    early = np.flatnonzero(times < 0)  # absolute dates: before 1970 is a corrupt or mis-formatted file
    if len(early):
        k = int(early[0])
        raise fail(path, int(ln[k]), f"column 'TIMESTAMP': {_ns_iso(times[k])} is before 1970-01-01 (the Unix epoch); "
                                     "expected the trace's own dates, e.g. '2023-11-16 18:15:46.6805900'")
    check_time(times, ln, path, "TIMESTAMP", show=_ns_iso, allow_negative=True)  # absolute dates
    return _finish(path, times, r.prompt, r.output, r.zero_outputs, unit=1e-9,
                   meta={"format": "azure", "start_time": _ns_iso(times[0]) + "+00:00",
                         "time_origin": _ns_iso(times[0]) + "+00:00", "time_origin_unit": "UTC datetime"})


def load_burstgpt_csv(path: str | Path) -> RequestTable:
    """BurstGPT trace (``Timestamp`` seconds, ``Model``, ``Request tokens``, ``Response tokens``, ...).

    Model names become tenants (``tenant_names`` sorted alphabetically); the other columns (``Total tokens``,
    ``Log Type``) are ignored.

    Time origin: shifted. ``Timestamp`` is seconds on the file's relative clock, whose zero need not be the
    first request; ``arrival_s`` counts seconds from the first request, and ``meta["time_origin"]`` (and
    ``meta["start_time"]``) holds the first ``Timestamp`` in seconds: add it back to map ``arrival_s`` to the
    file's clock.
    """
    path = Path(path)
    r = _read_csv_requests(path, ("Timestamp", "Request tokens", "Response tokens"), parse_numbers, extra="Model")
    models = np.char.strip(r.extra)
    empty = np.flatnonzero(np.char.str_len(models) == 0)
    if len(empty):
        raise fail(path, int(r.lines[empty[0]]), "column 'Model': empty model name")
    times = r.times
    check_time(times, r.lines, path, "Timestamp", show=lambda v: f"{v:g}")
    names, tenant = np.unique(models, return_inverse=True)
    return _finish(path, times, r.prompt, r.output, r.zero_outputs, unit=1.0,
                   tenant=tenant, tenant_names=tuple(str(x) for x in names),
                   meta={"format": "burstgpt", "start_time": float(times[0]), "time_origin": float(times[0]),
                         "time_origin_unit": "s"})


def _json_int(path: Path, line: int, obj: dict, key: str, *, minimum: int) -> float:
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
        raise fail(path, line, f"field {key!r}: expected a number, found {v!r}")
    if key == "timestamp":
        return float(v)
    if v != int(v) or v < minimum:
        what = "not a whole number" if v != int(v) else ("negative" if v < 0 else "zero")
        raise fail(path, line, f"field {key!r}: token count {v!r} is {what}")
    return float(v)


def load_mooncake_jsonl(path: str | Path) -> RequestTable:
    """Mooncake trace: one JSON object per line with ``timestamp`` (ms), ``input_length``, ``output_length``
    and optional ``hash_ids`` (prefix-block ids, stored in CSR form as ``prefix_offsets/prefix_hashes``).

    Time origin: shifted. ``timestamp`` is milliseconds on the file's relative clock (a trace whose first
    request is at 0 ms is not moved); ``arrival_s`` counts seconds from the first request, and
    ``meta["time_origin"]`` holds the first ``timestamp`` converted to seconds (``meta["start_time"]`` keeps it in
    milliseconds, as in the file)."""
    path = Path(path)
    nums: list[tuple[float, float, float]] = []
    lines: list[int] = []
    hashes: list[int] = []
    offsets = [0]
    any_hash = False
    where: dict[int, tuple[int, int]] = {}  # hash id -> (block position, first line)
    lineno = 0
    with open_text(path) as f:
        for lineno, raw in enumerate(f, start=1):
            check_utf8(path, [raw], lineno)
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as e:
                raise fail(path, lineno, f"bad JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise fail(path, lineno, f"expected a JSON object, found {type(obj).__name__}")
            for key in MOONCAKE_FIELDS:
                if key not in obj:
                    raise fail(path, lineno, f"missing field {key!r} (fields found: {', '.join(obj) or 'none'})")
            nums.append((
                _json_int(path, lineno, obj, "timestamp", minimum=0),
                _json_int(path, lineno, obj, "input_length", minimum=1),
                _json_int(path, lineno, obj, "output_length", minimum=0),
            ))
            h = obj.get("hash_ids", [])
            if not isinstance(h, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in h):
                raise fail(path, lineno, "field 'hash_ids': expected a list of integers")
            any_hash = any_hash or "hash_ids" in obj
            for pos, hid in enumerate(h):  # an id names a whole prefix, so it has one block position
                seen = where.setdefault(hid, (pos, lineno))
                if seen[0] != pos:
                    raise fail(path, lineno, f"field 'hash_ids': id {hid} at block {pos}, but at block {seen[0]} "
                                             f"on line {seen[1]} (an id must name the same prefix everywhere)")
            hashes.extend(h)
            offsets.append(len(hashes))
            lines.append(lineno)
    if not nums:
        _no_rows(path, max(lineno, 1), "no JSON objects")
    arr = np.asarray(nums, dtype=np.float64)
    ln = np.asarray(lines, dtype=np.int64)
    check_time(arr[:, 0], ln, path, "timestamp", show=lambda v: f"{v:g}")
    output = arr[:, 2].astype(np.int64)
    n_zero = int((output == 0).sum())
    output[output == 0] = 1
    po = np.asarray(offsets, dtype=np.int64) if any_hash else None
    ph = np.asarray(hashes, dtype=np.int64) if any_hash else None
    return _finish(path, arr[:, 0], arr[:, 1].astype(np.int64), output, n_zero, unit=1e-3,
                   prefix_offsets=po, prefix_hashes=ph,
                   meta={"format": "mooncake", "start_time": float(arr[0, 0]), "time_origin": float(arr[0, 0]) / 1e3,
                         "time_origin_unit": "s"})


def load_trace(path: str | Path) -> RequestTable:
    """Load any supported trace, choosing the reader by suffix (``.jsonl``/``.json``: Mooncake) or, for CSV,
    by header (plain ``arrival_s,prompt_tokens,output_tokens``, Azure ``TIMESTAMP,ContextTokens,GeneratedTokens``
    or BurstGPT ``Timestamp,Model,...``)."""
    path = Path(path)
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    if name.endswith((".jsonl", ".json")):
        return load_mooncake_jsonl(path)
    with open_text(path) as f:
        first = f.readline()
    check_utf8(path, [first], 1)
    if not first.strip():
        raise fail(path, 1, "empty file: no header line and no data rows")
    if first.lstrip().startswith("{"):
        return load_mooncake_jsonl(path)
    cols = [c.strip() for c in first.strip().split(",")]
    if "arrival_s" in cols:
        return load_plain_csv(path)
    if "ContextTokens" in cols or "TIMESTAMP" in cols:
        return load_azure_csv(path)
    if "Request tokens" in cols or "Model" in cols:
        return load_burstgpt_csv(path)
    raise fail(path, 1, f"unrecognised trace format (columns found: {', '.join(cols) or 'none'}); expected plain "
               f"({', '.join(PLAIN_COLUMNS)}), Azure "
               f"({', '.join(AZURE_COLUMNS)}), BurstGPT ({', '.join(BURSTGPT_COLUMNS)}) or Mooncake JSON lines")
