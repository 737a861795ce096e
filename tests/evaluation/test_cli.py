"""The ``commitenv`` command line: run, compare and scenarios write what they say, accept the Gymnasium id
form, and every bad input prints one ``error:`` line to stderr and returns non-zero."""

from __future__ import annotations

import csv
import json

import pytest

from commitenv.cli import main
from helpers.scenarios import HOUR_SCENARIO, toy_three_hour

FILES = ["decisions.csv", "hourly.csv", "overview.png", "requests.csv", "summary.json"]


def _last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def _assert_one_error_line(capsys, rc: int, *fragments: str) -> str:
    out, err = capsys.readouterr()
    assert rc != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error:")
    for f in fragments:
        assert f in lines[0], lines[0]
    assert "Traceback" not in err and "Traceback" not in out
    return lines[0]


# ------------------------------------------------------------------------------------------ run
def test_run_writes_results(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["run", HOUR_SCENARIO, "--controller", "vllm", "--out", str(out), "--quiet"])
    stdout, err = capsys.readouterr()
    assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == FILES
    summary = json.loads((out / "summary.json").read_text())
    assert summary == _last_json(stdout)
    assert summary["controller"] == "vllm" and summary["scenario"] == HOUR_SCENARIO
    assert summary["mean_abs_dev_pct"] == pytest.approx(100 * (1 / 0.85 - 1), abs=1e-6)
    with open(out / "requests.csv", newline="") as fh:
        assert sum(1 for _ in csv.DictReader(fh)) == summary["requests"]
    assert "vllm" in stdout and "attain_%" in stdout


def test_run_accepts_gymnasium_id_and_scenario_file(tmp_path, capsys):
    rc = main(["run", f"commitenv/{HOUR_SCENARIO}-v0", "--controller", "fixed_config", "--quiet"])
    stdout, err = capsys.readouterr()
    assert rc == 0, err
    s = _last_json(stdout)
    assert s["scenario"] == HOUR_SCENARIO and s["controller"] == "fixed_config"
    path = toy_three_hour(tmp_path / "sc")
    rc = main(["run", str(path), "--controller", "vllm", "--seed", "2", "--out", str(tmp_path / "toy"), "--quiet"])
    stdout, err = capsys.readouterr()
    assert rc == 0, err
    s = json.loads((tmp_path / "toy" / "summary.json").read_text())
    assert s["scenario"] == "toy-three" and s["seed"] == 2
    with open(tmp_path / "toy" / "hourly.csv", newline="") as fh:
        assert [r["hour"] for r in csv.DictReader(fh)] == ["0", "1", "2"]


# ------------------------------------------------------------------------------------------ compare
def test_compare_writes_both_controllers(tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(["compare", HOUR_SCENARIO, "--controllers", "vllm,fixed_config", "--out", str(out), "--quiet"])
    stdout, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads((out / "compare.json").read_text())
    assert doc["scenario"] == HOUR_SCENARIO and doc["seed"] == 0
    assert [r["controller"] for r in doc["results"]] == ["vllm", "fixed_config"]
    for r in doc["results"]:
        sub = out / r["controller"]
        assert sorted(p.name for p in sub.iterdir()) == ["decisions.csv", "hourly.csv", "overview.png", "summary.json"]
        assert json.loads((sub / "summary.json").read_text()) == r
    vllm, fixed = doc["results"]
    assert fixed["energy_mj"] < vllm["energy_mj"]  # 28 of 32 replicas
    assert not list(out.glob("*.tmp"))
    assert "vllm" in stdout and "fixed_config" in stdout


# ------------------------------------------------------------------------------------------ scenarios
def test_scenarios_lists_the_reproduction_and_benchmark_ids(capsys):
    assert main(["scenarios"]) == 0
    stdout, _ = capsys.readouterr()
    ids = [ln.split()[0] for ln in stdout.splitlines() if ln.strip()]
    # 14 ePACT reproductions (ideal), 14 bench twins (paper), 6 held-out benchmark hours, festina-h100-shared(-day,
    # -energy), festina-h100-serverless-valley and -day
    assert len(ids) == 39
    assert sum(i.startswith("commitenv/festina-") for i in ids) == 5
    assert sum(i.startswith("commitenv/bench-") for i in ids) == 14
    assert sum(i.startswith("commitenv/heldout-") for i in ids) == 6
    assert all(i.startswith("commitenv/") and i.endswith("-v0") for i in ids)
    assert f"commitenv/{HOUR_SCENARIO}-v0" in ids
    assert "INVALID" not in stdout


# ------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["run", "nope", "--quiet"], ["unknown scenario 'nope'", HOUR_SCENARIO]),
        (["run", "commitenv/nope-v0", "--quiet"], ["unknown scenario 'nope'"]),
        (["run", f"commitenv/{HOUR_SCENARIO}-v7", "--quiet"], ["v7"]),
        (["run", HOUR_SCENARIO, "--controller", "nope", "--quiet"],
         ["unknown controller 'nope'", "fixed_config", "vllm"]),
        (["compare", HOUR_SCENARIO, "--controllers", "vllm,nope", "--quiet"], ["unknown controller 'nope'"]),
        (["compare", "nope", "--controllers", "vllm", "--quiet"], ["unknown scenario 'nope'"]),
        (["run", "missing.yaml", "--quiet"], ["missing.yaml"]),
    ],
)
def test_bad_names_print_one_error_line(argv, fragments, capsys):
    _assert_one_error_line(capsys, main(argv), *fragments)


@pytest.mark.parametrize("cmd", ["run", "compare"])
def test_unwritable_out_is_an_error_before_any_run(cmd, tmp_path, capsys, monkeypatch):
    import commitenv.evaluation as ev

    def no_run(*a, **k):
        raise AssertionError("evaluate must not run when --out is unusable")

    monkeypatch.setattr(ev, "evaluate", no_run)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    argv = [cmd, HOUR_SCENARIO, "--out", str(blocker / "sub"), "--quiet"]
    if cmd == "compare":
        argv[2:2] = ["--controllers", "vllm"]
    _assert_one_error_line(capsys, main(argv), "--out", "cannot create folder")
    _assert_one_error_line(capsys, main([cmd, HOUR_SCENARIO, "--out", str(blocker), "--quiet"]), "--out")


def test_unknown_controller_creates_no_out_folder(tmp_path, capsys):
    out = tmp_path / "never"
    _assert_one_error_line(capsys, main(["run", HOUR_SCENARIO, "--controller", "nope", "--out", str(out)]))
    assert not out.exists()


def test_invalid_scenario_file_is_an_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndescription: x\n")
    line = _assert_one_error_line(capsys, main(["run", str(bad), "--quiet"]), str(bad))
    assert "required field is missing" in line


def test_controller_that_does_not_fit_the_pool_is_an_error(tmp_path, capsys):
    path = toy_three_hour(tmp_path)  # 2 GPUs: 28 replicas do not fit
    _assert_one_error_line(capsys, main(["run", str(path), "--controller", "fixed_config", "--controller-arg",
                                         "active=28", "--quiet"]), "fixed_config", "1..2")


def test_compare_out_subfolder_blocked_by_a_file_is_an_error(tmp_path, capsys):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "vllm").write_text("not a folder")
    try:
        rc = main(["compare", HOUR_SCENARIO, "--controllers", "vllm", "--out", str(out), "--quiet"])
    except OSError:
        pytest.fail("OSError escaped main()")
    _assert_one_error_line(capsys, rc, "vllm")


# ------------------------------------------------------------------------------------------ python -m commitenv
def test_python_dash_m_runs_the_same_command_line(tmp_path):
    """``python -m commitenv`` is the ``commitenv`` command: the same parser's help, and a subcommand's output."""
    import os
    import subprocess
    import sys

    from commitenv.cli import build_parser

    env = {**os.environ, "COLUMNS": "100"}
    got = subprocess.run([sys.executable, "-m", "commitenv", "--help"], capture_output=True, text=True, env=env,
                         cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert got.stdout.startswith("usage: commitenv ")
    assert "simulate,run,compare,reproduce,attribute" in got.stdout
    listed = subprocess.run([sys.executable, "-m", "commitenv", "workloads"], capture_output=True, text=True,
                            env=env, cwd=tmp_path)
    from commitenv.workload import list_builtin

    assert listed.returncode == 0 and listed.stdout.split() == list(list_builtin())
    assert build_parser().prog == "commitenv"
    bad = subprocess.run([sys.executable, "-m", "commitenv", "run", "no-such-scenario"], capture_output=True,
                         text=True, env=env, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("error:")
