"""Framing between the scoring host and a sandboxed submission: length-prefixed messages on two pipes.

The host sends pickles (its own data: context, observations, snapshots); the submission answers in JSON only, and the
host reads at most `MAX_REPLY` bytes of it, nested at most `MAX_DEPTH` deep (checked before parsing, so a depth bomb
is the submission's malformed message, not the host's RecursionError), so nothing the submission writes is ever
unpickled or grows unbounded.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import struct
from typing import Any

_HEADER = struct.Struct(">I")
MAX_REPLY = 1 << 20  # bytes of one JSON message from a submission
MAX_DEPTH = 32  # nesting of arrays and objects in one JSON message from a submission
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(rb"[\[\]{}]")


class WireError(Exception):
    """The other side closed the pipe (``closed``), or sent a malformed or oversized message."""

    def __init__(self, message: str, closed: bool = False) -> None:
        super().__init__(message)
        self.closed = closed


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        b = os.read(fd, min(left, 1 << 16))
        if not b:
            raise WireError("the pipe closed", closed=True)
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def send_pickle(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    _write_all(fd, _HEADER.pack(len(data)) + data)


def recv_pickle(fd: int) -> Any:
    (n,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    return pickle.loads(_read_exact(fd, n))


def send_json(fd: int, obj: dict[str, Any]) -> None:
    data = json.dumps(obj, allow_nan=False).encode()
    _write_all(fd, _HEADER.pack(len(data)) + data)


def json_depth(data: bytes, stop: int | None = None) -> int:
    """How deep arrays and objects nest in the JSON text ``data`` (brackets inside strings do not count); the
    count stops once it passes ``stop``."""
    depth = deepest = 0
    for m in _BRACKETS.finditer(_STRINGS.sub(b'""', data)):
        depth += 1 if m.group() in b"[{" else -1
        if depth > deepest:
            deepest = depth
            if stop is not None and deepest > stop:
                break
    return deepest


def recv_json(fd: int) -> dict[str, Any]:
    (n,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    if n > MAX_REPLY:
        raise WireError(f"a message of {n} bytes (at most {MAX_REPLY})")
    data = _read_exact(fd, n)
    if json_depth(data, MAX_DEPTH) > MAX_DEPTH:
        raise WireError(f"a message nested more than {MAX_DEPTH} deep")
    try:
        msg = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise WireError(f"not JSON ({str(e)[:200]})") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        raise WireError("expected a JSON object with an 'op'")
    return msg
