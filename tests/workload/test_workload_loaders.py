"""Trace loaders: formats, the real 2023 Azure files (when present) and every malformed-input error."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from commitenv.workload import (
    WorkloadError,
    load_azure_csv,
    load_burstgpt_csv,
    load_mooncake_jsonl,
    load_plain_csv,
    load_trace,
)
from commitenv.workload import _csvio
from helpers.paths import SHARED

TRACES = SHARED / "data" / "traces"
AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
PLAIN_HEADER = "arrival_s,prompt_tokens,output_tokens\n"
BG_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_azure_2023_naive_timestamps(tmp_path):
    p = write(tmp_path, "az23.csv", AZ_HEADER + "2023-11-16 18:15:46.6805900,374,44\n"
              "2023-11-16 18:15:46.7325900,396,109\n2023-11-16 18:15:48.0000001,5,0\n")
    t = load_azure_csv(p)
    assert len(t) == 3
    np.testing.assert_allclose(t.arrival_s, [0.0, 0.052, 1.3194101], atol=1e-9)
    assert t.prompt_tokens.tolist() == [374, 396, 5]
    assert t.output_tokens.tolist() == [44, 109, 1]  # output 0 is read as 1 token
    assert t.meta["zero_outputs_raised"] == 1
    assert t.meta["start_time"].startswith("2023-11-16 18:15:46.68059")
    assert t.request_id.tolist() == [0, 1, 2] and t.tenant_names == ("default",)


def test_azure_2024_utc_suffix_matches_naive(tmp_path):
    naive = write(tmp_path, "a.csv", AZ_HEADER + "2024-05-10 00:00:00.0100000,10,2\n2024-05-10 00:00:02.5100000,20,3\n")
    aware = write(tmp_path, "b.csv",
                  AZ_HEADER + "2024-05-10 00:00:00.01+00:00,10,2\n2024-05-10 00:00:02.51+00:00,20,3\n")
    np.testing.assert_allclose(load_azure_csv(aware).arrival_s, [0.0, 2.5])
    np.testing.assert_array_equal(load_azure_csv(aware).arrival_s, load_azure_csv(naive).arrival_s)


def test_azure_other_offsets_are_converted_to_utc(tmp_path):
    p = write(tmp_path, "tz.csv", AZ_HEADER + "2024-05-10 00:00:00+00:00,1,1\n2024-05-10 01:00:30+01:00,1,1\n"
              "2024-05-09T19:01:00-05:00,1,1\n")
    np.testing.assert_allclose(load_azure_csv(p).arrival_s, [0.0, 30.0, 60.0])


def test_azure_crlf_blank_lines_and_gzip(tmp_path):
    body = AZ_HEADER + "2024-05-10 00:00:00,1,1\n\n2024-05-10 00:00:01,2,2\n"
    p = write(tmp_path, "crlf.csv", body.replace("\n", "\r\n"))
    assert load_azure_csv(p).prompt_tokens.tolist() == [1, 2]
    gz = tmp_path / "z.csv.gz"
    with gzip.open(gz, "wt") as f:
        f.write(body)
    np.testing.assert_allclose(load_trace(gz).arrival_s, [0.0, 1.0])


def test_line_numbers_survive_chunking(tmp_path, monkeypatch):
    monkeypatch.setattr(_csvio, "CHUNK_LINES", 2)
    rows = [f"2024-05-10 00:00:{i:02d},{i + 1},1" for i in range(7)]
    rows[5] = "2024-05-10 00:00:05,x,1"  # line 7 (header is line 1)
    p = write(tmp_path, "chunks.csv", AZ_HEADER + "\n".join(rows[:2]) + "\n\n" + "\n".join(rows[2:]) + "\n")
    with pytest.raises(WorkloadError) as e:
        load_azure_csv(p)
    assert "chunks.csv: line 8:" in str(e.value)  # one blank line shifts it to 8
    rows[5] = "2024-05-10 00:00:05,6,1"
    p.write_text(AZ_HEADER + "\n".join(rows) + "\n")
    t = load_azure_csv(p)
    assert t.prompt_tokens.tolist() == [1, 2, 3, 4, 5, 6, 7]
    np.testing.assert_allclose(t.arrival_s, np.arange(7.0))


def test_plain_csv_shifts_to_the_first_request_and_raises_zero_outputs(tmp_path):
    p = write(tmp_path, "mine.csv", "arrival_s,prompt_tokens,output_tokens,note\n"
              "12.5,100,20,x\n12.5,7,0,y\n3612.5,300,1,z\n")
    t = load_trace(p)
    assert t.meta["format"] == "plain" and t.meta["time_origin"] == 12.5
    np.testing.assert_array_equal(t.arrival_s, [0.0, 0.0, 3600.0])
    np.testing.assert_array_equal(t.prompt_tokens, [100, 7, 300])
    np.testing.assert_array_equal(t.output_tokens, [20, 1, 1])  # 0 is read as 1 token
    assert t.meta["zero_outputs_raised"] == 1
    np.testing.assert_array_equal(load_plain_csv(p).arrival_s, t.arrival_s)


def test_mooncake_jsonl_with_hash_ids(tmp_path):
    lines = [
        {"timestamp": 1000, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]},
        {"timestamp": 1500, "input_length": 30, "output_length": 0, "hash_ids": []},
        {"timestamp": 4000, "input_length": 900, "output_length": 7, "hash_ids": [1, 2, 9]},
    ]
    p = write(tmp_path, "m.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")
    t = load_trace(p)
    np.testing.assert_allclose(t.arrival_s, [0.0, 0.5, 3.0])
    assert t.prompt_tokens.tolist() == [600, 30, 900] and t.output_tokens.tolist() == [10, 1, 7]
    assert t.prefix_offsets.tolist() == [0, 2, 2, 5]
    assert t.prefix_of(2).tolist() == [1, 2, 9] and t.prefix_of(1).tolist() == []


def test_mooncake_without_hash_ids_has_no_prefixes(tmp_path):
    p = write(tmp_path, "m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 2}\n')
    t = load_mooncake_jsonl(p)
    assert t.prefix_offsets is None and t.prefix_of(0).size == 0


def test_burstgpt_models_become_tenants(tmp_path):
    p = write(tmp_path, "bg.csv", BG_HEADER + "5,ChatGPT,472,18,490,Conversation log\n"
              "45,GPT-4,1087,0,1087,Conversation log\n118.5,ChatGPT,417,276,693,API log\n")
    t = load_trace(p)
    assert t.tenant_names == ("ChatGPT", "GPT-4")
    assert t.tenant.tolist() == [0, 1, 0]
    np.testing.assert_allclose(t.arrival_s, [0.0, 40.0, 113.5])
    assert t.output_tokens.tolist() == [18, 1, 276] and t.meta["zero_outputs_raised"] == 1
    assert load_burstgpt_csv(p).prompt_tokens.tolist() == [472, 1087, 417]


@pytest.mark.skipif(not TRACES.is_dir(), reason="shared traces not present")
@pytest.mark.parametrize(
    "name, n, p_mean, p_med, p99, o_mean, o_med",
    [
        ("AzureLLMInferenceTrace_code_2023.csv", 8819, 2047.85, 1469, 7436, 27.88, 13),
        ("AzureLLMInferenceTrace_conv_2023.csv", 19366, 1154.70, 1020, 4142, 211.13, 129),
    ],
)
def test_real_azure_2023_files(name, n, p_mean, p_med, p99, o_mean, o_med):
    t = load_trace(TRACES / name)
    assert len(t) == n
    assert t.prompt_tokens.mean() == pytest.approx(p_mean, abs=0.01)
    assert np.median(t.prompt_tokens) == p_med and np.quantile(t.prompt_tokens, 0.99) == pytest.approx(p99, abs=1)
    assert t.output_tokens.mean() == pytest.approx(o_mean, abs=0.01) and np.median(t.output_tokens) == o_med
    assert t.arrival_s[0] == 0.0 and 3400 < t.duration_s < 3600  # 57-58 minutes
    assert t.meta["zero_outputs_raised"] == 0  # the 2023 files have no zero-token outputs
    assert np.all(np.diff(t.arrival_s) >= 0)


@pytest.mark.skipif(not TRACES.is_dir(), reason="shared traces not present")
def test_real_code_file_first_gaps():
    t = load_azure_csv(TRACES / "AzureLLMInferenceTrace_code_2023.csv")
    # 18:17:03.9799600 -> 18:17:04.0319600
    assert t.arrival_s[1] == pytest.approx(0.052, abs=1e-9)
    assert t.meta["start_time"].startswith("2023-11-16 18:17:03.97996")


# --- malformed input: (file name, text, line, words the message must contain) ---------------------------------
ERROR_CASES = [
    ("nocol.csv", "TIMESTAMP,ContextTokens\n2024-05-10 00:00:00,5\n", 1,
     ["missing column 'GeneratedTokens'", "columns found: TIMESTAMP, ContextTokens"]),
    ("nonnum.csv", AZ_HEADER + "2024-05-10 00:00:00,5,1\n2024-05-10 00:00:01,abc,1\n", 3, ["non-numeric", "abc"]),
    ("emptytok.csv", AZ_HEADER + "2024-05-10 00:00:00,5,\n", 2, ["non-numeric", "GeneratedTokens"]),
    ("negprompt.csv", AZ_HEADER + "2024-05-10 00:00:00,5,1\n2024-05-10 00:00:01,-3,1\n", 3,
     ["negative", "ContextTokens"]),
    ("zeroprompt.csv", AZ_HEADER + "2024-05-10 00:00:00,0,1\n", 2, ["zero", ">= 1"]),
    ("negout.csv", AZ_HEADER + "2024-05-10 00:00:00,5,1\n2024-05-10 00:00:01,5,1\n2024-05-10 00:00:02,5,-1\n", 4,
     ["negative", "GeneratedTokens"]),
    ("frac.csv", AZ_HEADER + "2024-05-10 00:00:00,5.5,1\n", 2, ["not a whole number"]),
    ("back.csv", AZ_HEADER + "2024-05-10 00:00:05,5,1\n2024-05-10 00:00:04,5,1\n", 3,
     ["time goes backwards", "sorted"]),
    ("header_only.csv", AZ_HEADER, 1, ["no data rows"]),
    ("blank.csv", "", 1, ["empty file"]),
    ("badts.csv", AZ_HEADER + "2024-05-10 00:00:00,5,1\n2024-13-10 00:00:01,5,1\n", 3, ["unparsable timestamp"]),
    ("numts.csv", AZ_HEADER + "4808,5,1\n", 2, ["unparsable timestamp", "4808"]),
    ("fields.csv", AZ_HEADER + "2024-05-10 00:00:00,5,1\n2024-05-10 00:00:01,5\n", 3, ["expected 3 fields", "found 2"]),
    ("bgneg.csv", BG_HEADER + "-1,ChatGPT,5,5,10,API log\n", 2, ["negative time"]),
    ("bgback.csv", BG_HEADER + "3,ChatGPT,5,5,10,API log\n2.5,ChatGPT,5,5,10,API log\n", 3, ["time goes backwards"]),
    ("bgmodel.csv", BG_HEADER + "3, ,5,5,10,API log\n", 2, ["empty model name"]),
    ("bgcol.csv", "Timestamp,Model,Request tokens\n1,a,2\n", 1, ["missing column 'Response tokens'"]),
    ("badjson.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"timestamp": 1, \n', 2, ["bad JSON"]),
    ("notobj.jsonl", "[1, 2]\n", 1, ["expected a JSON object"]),
    ("mcfield.jsonl", '{"timestamp": 0, "input_length": 5}\n', 1, ["missing field 'output_length'", "input_length"]),
    ("mcneg.jsonl", '{"timestamp": -5, "input_length": 5, "output_length": 1}\n', 1, ["negative time"]),
    ("mcback.jsonl", '{"timestamp": 9, "input_length": 5, "output_length": 1}\n'
     '{"timestamp": 3, "input_length": 5, "output_length": 1}\n', 2, ["time goes backwards"]),
    ("mczero.jsonl", '{"timestamp": 0, "input_length": 0, "output_length": 1}\n', 1, ["zero"]),
    ("mcstr.jsonl", '{"timestamp": 0, "input_length": "5", "output_length": 1}\n', 1, ["expected a number"]),
    ("mchash.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, "a"]}\n', 1,
     ["hash_ids"]),
    ("mcempty.jsonl", "\n\n", 2, ["no data rows"]),
    ("plainneg.csv", PLAIN_HEADER + "-1,5,1\n", 2, ["negative time", "arrival_s"]),
    ("plainback.csv", PLAIN_HEADER + "5,5,1\n4,5,1\n", 3, ["time goes backwards", "sorted"]),
    ("plainfrac.csv", PLAIN_HEADER + "0,5,1.5\n", 2, ["output_tokens", "not a whole number"]),
    ("plaincol.csv", "arrival_s,prompt_tokens\n0,5\n", 1, ["missing column 'output_tokens'"]),
    ("weird.csv", "a,b,c\n1,2,3\n", 1, ["unrecognised trace format", "columns found: a, b, c", "arrival_s"]),
]


@pytest.mark.parametrize("name, text, line, words", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_malformed_input_errors(tmp_path, name, text, line, words):
    p = write(tmp_path, name, text)
    with pytest.raises(WorkloadError) as e:
        load_trace(p)
    msg = str(e.value)
    assert name in msg and f"line {line}:" in msg, msg
    for w in words:
        assert w in msg, msg


def test_format_specific_loader_on_empty_file(tmp_path):
    p = write(tmp_path, "nothing.csv", "")
    with pytest.raises(WorkloadError, match=r"nothing\.csv: line 1: empty file"):
        load_azure_csv(p)


def test_error_in_later_chunk_of_fast_path(tmp_path, monkeypatch):
    monkeypatch.setattr(_csvio, "CHUNK_LINES", 3)
    rows = [f"2024-05-10 00:00:{i:02d},5,1" for i in range(9)]
    rows[7] = "2024-05-10 00:00:00,5,1"  # backwards across a chunk boundary, on line 9
    p = write(tmp_path, "late.csv", AZ_HEADER + "\n".join(rows) + "\n")
    with pytest.raises(WorkloadError, match=r"late\.csv: line 9: .*time goes backwards"):
        load_azure_csv(p)
