"""Broken trace files: a truncated or corrupt ``.gz`` stream and a byte that is not UTF-8 raise
``WorkloadError`` naming the file and where (last complete line; line, column and byte), for every loader
that reads CSV or JSON lines, plain and gzipped."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from commitenv.workload import WorkloadError, load_azure_csv, load_burstgpt_csv, load_mooncake_jsonl, load_trace
from commitenv.workload import _csvio

N_ROWS = 400


def azure_lines() -> list[str]:
    return ["TIMESTAMP,ContextTokens,GeneratedTokens\n"] + [
        f"2024-05-10 00:{i // 60:02d}:{i % 60:02d}.5000000,{10 + i % 97},{3 + i % 13}\n" for i in range(N_ROWS)
    ]


def burstgpt_lines() -> list[str]:
    return ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"] + [
        f"{i * 1.5},ChatGPT,{10 + i % 97},{3 + i % 13},{13 + i % 97 + i % 13},Conversation log\n"
        for i in range(N_ROWS)
    ]


def mooncake_lines() -> list[str]:
    return [f'{{"timestamp": {i * 100}, "input_length": {10 + i % 97}, "output_length": {3 + i % 13}, '
            f'"hash_ids": [{i % 5}]}}\n' for i in range(N_ROWS)]


FORMATS: dict[str, tuple[Callable[[], list[str]], str, Callable]] = {
    "azure": (azure_lines, "csv", load_azure_csv),
    "burstgpt": (burstgpt_lines, "csv", load_burstgpt_csv),
    "mooncake": (mooncake_lines, "jsonl", load_mooncake_jsonl),
}
CASES = [(fmt, loader) for fmt in FORMATS for loader in ("own", "load_trace")]


def loader_of(fmt: str, which: str) -> Callable:
    return FORMATS[fmt][2] if which == "own" else load_trace


def gz_file(tmp_path: Path, fmt: str) -> tuple[Path, bytes]:
    """A valid gzipped trace of ``fmt``: (its path, its compressed bytes)."""
    lines, ext, _ = FORMATS[fmt]
    data = gzip.compress("".join(lines()).encode(), mtime=0)
    return tmp_path / f"trace.{ext}.gz", data


def complete_lines_in(prefix: bytes) -> int:
    """Whole lines (newline-terminated) that zlib can recover from a cut gzip stream: the independent oracle."""
    return zlib.decompressobj(wbits=31).decompress(prefix).count(b"\n")


# ------------------------------------------------------------------------------------------ gzip
@pytest.mark.parametrize("fmt, which", CASES)
@pytest.mark.parametrize("keep", [0.5, 0.8])
def test_truncated_gzip_names_file_and_last_complete_line(tmp_path, fmt, which, keep):
    path, data = gz_file(tmp_path, fmt)
    path.write_bytes(data)
    assert len(loader_of(fmt, which)(path)) == N_ROWS  # the whole file is valid
    cut = data[: int(len(data) * keep)]
    path.write_bytes(cut)
    expected = complete_lines_in(cut)
    assert 1 < expected < N_ROWS
    with pytest.raises(WorkloadError) as e:
        loader_of(fmt, which)(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: gzip stream is truncated or corrupt after line {expected} (the last complete line)")
    assert "Compressed file ended" in msg


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncated_gzip_in_a_later_chunk(tmp_path, monkeypatch, fmt):
    monkeypatch.setattr(_csvio, "CHUNK_LINES", 7)
    path, data = gz_file(tmp_path, fmt)
    cut = data[: int(len(data) * 0.7)]
    path.write_bytes(cut)
    with pytest.raises(WorkloadError, match=rf"after line {complete_lines_in(cut)} \(the last complete line\)"):
        FORMATS[fmt][2](path)


@pytest.mark.parametrize("fmt, which", CASES)
def test_gzip_without_its_trailer_or_with_a_bad_crc(tmp_path, fmt, which):
    path, data = gz_file(tmp_path, fmt)
    total = len(FORMATS[fmt][0]())  # every line decompresses; only the 8-byte trailer is missing / wrong
    path.write_bytes(data[:-8])
    with pytest.raises(WorkloadError, match=rf"gzip stream is truncated or corrupt after line {total} "):
        loader_of(fmt, which)(path)
    bad_crc = data[:-8] + bytes(b ^ 0xFF for b in data[-8:-4]) + data[-4:]
    path.write_bytes(bad_crc)
    with pytest.raises(WorkloadError, match=rf"{path.name}: gzip stream is truncated or corrupt after line {total} "
                                            r".*CRC check failed"):
        loader_of(fmt, which)(path)


def test_plain_text_named_gz_is_reported_as_corrupt(tmp_path):
    path = tmp_path / "trace.csv.gz"
    path.write_text("".join(azure_lines()))
    with pytest.raises(WorkloadError, match=r"trace.csv.gz: gzip stream is truncated or corrupt before the first "
                                            r"complete line: Not a gzipped file"):
        load_trace(path)


# ------------------------------------------------------------------------------------------ UTF-8
def with_bad_byte(fmt: str, line_no: int, column: int, byte: bytes = b"\xff") -> bytes:
    """The trace's bytes with ``byte`` replacing the character at 1-based ``line_no``/``column``."""
    lines = [s.encode() for s in FORMATS[fmt][0]()]
    raw = lines[line_no - 1]
    lines[line_no - 1] = raw[: column - 1] + byte + raw[column:]
    return b"".join(lines)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
@pytest.mark.parametrize("fmt, which", CASES)
def test_non_utf8_byte_names_file_line_column_and_byte(tmp_path, fmt, which, gz):
    body = with_bad_byte(fmt, 57, 12)
    path = tmp_path / f"trace.{FORMATS[fmt][1]}{'.gz' if gz else ''}"
    path.write_bytes(gzip.compress(body) if gz else body)
    with pytest.raises(WorkloadError) as e:
        loader_of(fmt, which)(path)
    assert str(e.value).startswith(f"{path}: line 57: not valid UTF-8 (byte 0xff at column 12)")


@pytest.mark.parametrize("fmt", FORMATS)
def test_non_utf8_byte_in_a_later_chunk(tmp_path, monkeypatch, fmt):
    monkeypatch.setattr(_csvio, "CHUNK_LINES", 10)
    path = tmp_path / f"t.{FORMATS[fmt][1]}"
    path.write_bytes(with_bad_byte(fmt, 333, 3, b"\xc3"))  # a lead byte without its continuation
    with pytest.raises(WorkloadError, match=r"t\.\w+: line 333: not valid UTF-8 \(byte 0xc3 at column 3\)"):
        FORMATS[fmt][2](path)


def test_column_counts_characters_after_valid_multibyte_text(tmp_path):
    lines = burstgpt_lines()
    lines[4] = "6.0,GPT-é,1,1,2,Conversation log\n"  # 'é' is two bytes, one column
    body = "".join(lines).encode().replace(b"GPT-\xc3\xa9,1", b"GPT-\xc3\xa9,\xfe")
    path = tmp_path / "b.csv"
    path.write_bytes(body)
    with pytest.raises(WorkloadError, match=r"b\.csv: line 5: not valid UTF-8 \(byte 0xfe at column 11\)"):
        load_burstgpt_csv(path)


@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"], ids=["no-bom", "bom"])
def test_non_utf8_byte_in_the_header(tmp_path, bom):
    path = tmp_path / "h.csv"
    path.write_bytes(bom + "".join(azure_lines()).encode().replace(b"TIMESTAMP", b"TIME\x80STAMP", 1))
    for load in (load_azure_csv, load_trace):
        with pytest.raises(WorkloadError, match=r"h\.csv: line 1: not valid UTF-8 \(byte 0x80 at column 5\)"):
            load(path)


def test_valid_gzip_and_utf8_traces_still_load(tmp_path):
    for fmt, (lines, ext, load) in FORMATS.items():
        path = tmp_path / f"ok-{fmt}.{ext}.gz"
        path.write_bytes(gzip.compress("".join(lines()).encode()))
        assert len(load(path)) == len(load_trace(path)) == N_ROWS
