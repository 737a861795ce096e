"""A trace whose timestamps are negative or out of order is one clear error naming the file and the line, in
every format (Azure, BurstGPT, Mooncake, plain ``arrival_s`` CSV), from `load_trace` and from `commitenv run`."""

from __future__ import annotations

import pytest

from commitenv.workload import WorkloadError, load_trace
from helpers.scenarios import write_scenario

AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BG = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
PLAIN = "arrival_s,prompt_tokens,output_tokens\n"

CASES = [  # file name, text, the line named, words of the message
    ("az_unsorted.csv", AZ + "2023-11-16 18:00:30.0000000,5,5\n2023-11-16 18:00:31.0000000,5,5\n"
                             "2023-11-16 18:00:29.5000000,5,5\n", 4, "time goes backwards"),
    ("bg_negative.csv", BG + "0,ChatGPT,5,5,10,API log\n-2,ChatGPT,5,5,10,API log\n", 3, "negative time -2"),
    ("bg_unsorted.csv", BG + "5,ChatGPT,5,5,10,API log\n3,ChatGPT,5,5,10,API log\n", 3, "time goes backwards"),
    ("mc_negative.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
                          '{"timestamp": -5, "input_length": 5, "output_length": 1}\n', 2, "negative time -5"),
    ("mc_unsorted.jsonl", '{"timestamp": 5, "input_length": 5, "output_length": 1}\n'
                          '{"timestamp": 2, "input_length": 5, "output_length": 1}\n', 2, "time goes backwards"),
    ("plain_negative.csv", PLAIN + "0.5,5,5\n-1,5,5\n", 3, "negative time -1"),
    ("plain_unsorted.csv", PLAIN + "0.5,5,5\n2.0,6,6\n1.5,7,7\n", 4, "time goes backwards (1.5 after 2 on line 3)"),
]


@pytest.mark.parametrize("name, text, line, words", CASES, ids=[c[0] for c in CASES])
def test_bad_timestamps_name_file_and_line(tmp_path, name, text, line, words):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(WorkloadError) as e:
        load_trace(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: line {line}: ") and words in msg, msg


@pytest.mark.parametrize("name, text, line, words", CASES[-2:], ids=[c[0] for c in CASES[-2:]])
def test_run_on_a_scenario_with_a_bad_trace_is_one_error_line(tmp_path, capsys, name, text, line, words):
    from commitenv.cli import main

    trace = tmp_path / name
    trace.write_text(text)
    sc = write_scenario(tmp_path / "sc", "bad-trace", workload={"trace": str(trace)}, horizon_hours=1,
                        commitment={"mj": [0.2]})
    assert main(["run", str(sc), "--quiet", "--no-score"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and f"{trace}: line {line}: " in lines[0], err
    assert words in lines[0] and "Traceback" not in out + err
