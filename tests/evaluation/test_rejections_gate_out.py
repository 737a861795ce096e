"""Rejected requests reported apart (summary, hourly table, CLI, one warning), the SLO gate (hand-built
`SloOutcome` values and whole runs on a toy scenario), and ``--out`` on an unusable location (an error naming the
user's path before any run, nothing left behind, and the late failure naming it too)."""

from __future__ import annotations

import csv
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

import commitenv.cli.run as cli_run
from commitenv.cli.args import check_out
import commitenv.evaluation as ev
from commitenv.cli import main
from commitenv.evaluation import evaluate
from commitenv.metrics import SloOutcome, slo_gate, slo_outcome
from helpers.scenarios import write_scenario, write_trace

PROC_OUT = "/proc/commitenv-test-out"
needs_procfs = pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs a Linux /proc")

# The toy profile's context limit is 64 tokens (tests/conftest.py): prompts of 64 and more are rejected.
# Hour 0: 20 requests, two of them rejected (prompt 64 exactly, 70); hour 1: 10 requests, one rejected (100).
# A request of 63 tokens (the largest admitted prompt) is served. Arrivals are 100 s apart and alpha is 20: a
# light load with generous deadlines, so every admitted request meets its deadline.
H0_TIMES = [100.0 * i for i in range(20)]
H1_TIMES = [3600.0 + 200.0 * i for i in range(10)]
H0_PROMPTS = [8] * 20
H0_PROMPTS[3], H0_PROMPTS[11], H0_PROMPTS[5] = 64, 70, 63
H1_PROMPTS = [10] * 10
H1_PROMPTS[6] = 100


def rejecting_scenario(folder: Path, name: str = "toy-reject", **fields) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    trace = write_trace(folder / f"{name}.csv", H0_TIMES + H1_TIMES, H0_PROMPTS + H1_PROMPTS, [6] * 30)
    base = dict(workload={"trace": str(trace)}, horizon_hours=2, commitment={"mj": [0.2, 0.2]}, alpha=20.0)
    base.update(fields)
    return write_scenario(folder, name, **base)


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _one_error_line(capsys, rc: int) -> str:
    out, err = capsys.readouterr()
    assert rc != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err + out
    return lines[0]


# ------------------------------------------------------------------------------------------ metrics: the split
def test_slo_outcome_splits_misses_into_late_unfinished_rejected():
    arrival = np.array([0.0, 10.0, 20.0, 30.0, 3700.0, 3800.0, 3900.0])
    finish = np.array([5.0, 50.0, np.nan, np.inf, 3710.0, 3900.0, np.inf])
    deadline = np.array([5.0, 40.0, 60.0, 90.0, 3720.0, 3850.0, 3990.0])
    rejected = np.array([False, False, False, True, False, False, True])
    out = slo_outcome(arrival, finish, deadline, 2, rejected=rejected)
    # hour 0: met exactly at the deadline, late (50 > 40), unfinished (NaN), rejected
    # hour 1: met, late (3900 > 3850), rejected
    np.testing.assert_array_equal(out.arrivals, [4, 3])
    np.testing.assert_array_equal(out.met, [1, 1])
    np.testing.assert_array_equal(out.late, [1, 1])
    np.testing.assert_array_equal(out.unfinished, [1, 0])
    np.testing.assert_array_equal(out.rejected, [1, 1])
    assert out.misses == 5
    np.testing.assert_array_equal(out.met + out.late + out.unfinished + out.rejected, out.arrivals)


def test_slo_outcome_reads_inf_finish_as_rejected_without_a_mask():
    out = slo_outcome(np.array([0.0, 1.0, 2.0]), np.array([np.inf, np.nan, 3.0]), np.array([9.0, 9.0, 2.5]), 1)
    assert (out.met[0], out.late[0], out.unfinished[0], out.rejected[0]) == (0, 1, 1, 1)


# ------------------------------------------------------------------------------------------ metrics: the gate
def test_slo_gate_boundary_passes_and_one_more_miss_fails():
    # hour 0: 99 of 100 (exactly 1 - epsilon), hour 1: no arrivals, hour 2: 50 of 50
    slo = SloOutcome(arrivals=np.array([100, 0, 50]), met=np.array([99, 0, 50]), pooled_pct=100 * 149 / 150)
    g = slo_gate(slo, 0.01)
    assert g.passed is True and g.failed_hours == ()
    assert g.worst_hour == 0 and g.worst_hour_pct == pytest.approx(99.0)
    assert g.epsilon == 0.01 and g.threshold_pct == pytest.approx(99.0)
    worse = SloOutcome(arrivals=np.array([100, 0, 50]), met=np.array([98, 0, 50]), pooled_pct=0.0)
    g = slo_gate(worse, 0.01)
    assert g.passed is False and g.failed_hours == (0,) and g.worst_hour_pct == pytest.approx(98.0)
    # epsilon 0: any miss fails; a perfect record passes
    assert slo_gate(slo, 0.0).passed is False
    perfect = SloOutcome(arrivals=np.array([3, 0]), met=np.array([3, 0]), pooled_pct=100.0)
    assert slo_gate(perfect, 0.0).passed is True


def test_slo_gate_boundary_survives_float_rounding():
    # 29 of 50 = 58 % = 100 (1 - 0.42) %; in floats 100 * 29 / 50 < 100 * (1 - 0.42), yet the hour is on the boundary
    assert 100.0 * 29 / 50 < 100.0 * (1 - 0.42)
    slo = SloOutcome(arrivals=np.array([50]), met=np.array([29]), pooled_pct=58.0)
    assert slo_gate(slo, 0.42).passed is True
    assert slo_gate(SloOutcome(np.array([50]), np.array([28]), 56.0), 0.42).passed is False


def test_slo_gate_worst_hour_and_empty_hours():
    slo = SloOutcome(arrivals=np.array([10, 4, 0, 8]), met=np.array([9, 3, 0, 8]), pooled_pct=0.0)
    g = slo_gate(slo, 0.2)  # hour 0 90 %, hour 1 75 % (< 80 %), hour 2 empty, hour 3 100 %
    assert g.passed is False and g.failed_hours == (1,)
    assert g.worst_hour == 1 and g.worst_hour_pct == pytest.approx(75.0)
    assert slo_gate(slo, 0.25).passed is True  # 75 % is exactly 1 - 0.25
    empty = SloOutcome(arrivals=np.zeros(3, dtype=np.int64), met=np.zeros(3, dtype=np.int64), pooled_pct=100.0)
    g = slo_gate(empty, 0.0)
    assert g.passed is True and g.worst_hour is None and g.worst_hour_pct == 100.0
    with pytest.raises(ValueError, match="epsilon"):
        slo_gate(slo, 1.5)


# ------------------------------------------------------------------------------------------ evaluation
def test_rejected_requests_reported_apart(tmp_path, caplog):
    path = rejecting_scenario(tmp_path / "sc", epsilon=0.1)
    with caplog.at_level(logging.WARNING, logger="commitenv"):
        res = evaluate("vllm", str(path), seed=0)
    s = res.summary
    assert s["requests"] == 30
    assert s["rejected"] == 3
    assert s["rejected_reason"] == "prompt >= context limit 64 tokens"
    # the light load serves every admitted request in time: the misses are the rejections
    assert s["late"] == 0 and s["unfinished"] == 0 and s["misses"] == 3
    assert [h["rejected"] for h in res.hourly] == [2, 1]
    assert [h["arrivals"] for h in res.hourly] == [20, 10]
    # the request table marks exactly the prompts >= 64 (63 is served)
    prompts = np.asarray(H0_PROMPTS + H1_PROMPTS)
    np.testing.assert_array_equal(res.requests["rejected"], prompts >= 64)
    assert not res.requests["met"][prompts >= 64].any() and res.requests["met"][prompts == 63].all()
    # one warning for the run, through the "commitenv" logger, saying how many and why
    recs = [r for r in caplog.records if r.name == "commitenv" and r.levelno == logging.WARNING]
    assert len(recs) == 1
    msg = recs[0].getMessage()
    assert "3 of 30 requests rejected" in msg and "context limit 64 tokens" in msg
    # the gate at epsilon 0.1: hour 0 18/20 = 90 %, hour 1 9/10 = 90 %, both exactly on the boundary
    assert s["slo_gate_epsilon"] == 0.1
    assert s["slo_gate_pass"] is True and s["slo_gate_pass_eps0"] is False
    assert s["slo_gate_worst_hour_pct"] == pytest.approx(90.0)
    # written out: summary.json, hourly.csv with the rejected column by arrival hour
    out = res.write(tmp_path / "run", figure=False)
    assert json.loads((out / "summary.json").read_text()) == s
    assert [int(r["rejected"]) for r in _read_csv(out / "hourly.csv")] == [2, 1]
    rows = _read_csv(out / "requests.csv")
    assert sum(int(r["rejected"]) for r in rows) == 3


def test_gate_fails_at_a_tighter_epsilon(tmp_path):
    s = evaluate("vllm", str(rejecting_scenario(tmp_path, epsilon=0.05)), seed=0).summary
    assert s["slo_gate_pass"] is False and s["slo_gate_epsilon"] == 0.05
    assert s["slo_gate_worst_hour_pct"] == pytest.approx(90.0)


def test_no_rejections_no_warning_and_late_misses_counted(tmp_path, caplog):
    from helpers.scenarios import toy_miss
    from helpers.controllers import LowAndSlow

    with caplog.at_level(logging.WARNING, logger="commitenv"):
        res = evaluate(LowAndSlow(), str(toy_miss(tmp_path)), seed=0)
    s = res.summary
    assert s["rejected"] == 0 and s["rejected_reason"] is None
    assert not [r for r in caplog.records if r.name == "commitenv"]
    req = res.requests
    late = np.isfinite(req["finish_s"]) & (req["finish_s"] > req["deadline_s"])
    assert s["late"] == int(late.sum()) > 0
    assert s["misses"] == s["late"] + s["unfinished"] + s["rejected"] == int((~req["met"]).sum())
    assert sum(h["late"] for h in res.hourly) == s["late"]


# ------------------------------------------------------------------------------------------ CLI
def test_cli_run_and_compare_show_rejections_and_gate(tmp_path, capsys):
    path = rejecting_scenario(tmp_path / "sc", epsilon=0.05)
    rc = main(["run", str(path), "--controller", "vllm", "--quiet"])
    stdout, err = capsys.readouterr()
    assert rc == 0, err
    header = stdout.splitlines()[0].split()
    assert {"misses", "rejected", "gate"} <= set(header)
    row = dict(zip(header, stdout.splitlines()[1].split()))
    assert row["rejected"] == "3" and row["misses"] == "3" and row["gate"] == "FAIL"
    assert "vllm: 3 of 30 requests rejected (prompt >= context limit 64 tokens), counted as misses" in stdout
    assert "gate: every arrival hour attains >= 95 % (epsilon 0.05)" in stdout

    out = tmp_path / "cmp"
    rc = main(["compare", str(path), "--controllers", "vllm", "--out", str(out), "--quiet"])
    stdout, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads((out / "compare.json").read_text())
    assert doc["gate"] == {"vllm": "FAIL"}
    r = doc["results"][0]
    assert r["rejected"] == 3 and r["slo_gate_pass"] is False and r["slo_gate_pass_eps0"] is False
    assert json.loads((out / "vllm" / "summary.json").read_text()) == r
    assert "FAIL" in stdout.splitlines()[1]


def test_cli_prints_the_rejection_warning_on_stderr(tmp_path, capsys, monkeypatch):
    path = rejecting_scenario(tmp_path)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as in a fresh process: logging not configured
    lg = logging.getLogger("commitenv")
    before = list(lg.handlers)
    try:
        rc = main(["run", str(path), "--controller", "vllm", "--quiet"])
        main(["run", str(path), "--controller", "vllm", "--quiet"])  # a second run: still one line per run
    finally:
        for h in lg.handlers[:]:
            if h not in before:
                lg.removeHandler(h)
    _, err = capsys.readouterr()
    assert rc == 0
    lines = [ln for ln in err.splitlines() if "rejected" in ln]  # (besides run's notice that nothing was written)
    assert len(lines) == 2
    assert all(ln.startswith("warning: toy-reject / vllm: 3 of 30 requests rejected (prompt >= context limit 64")
               for ln in lines)


# ------------------------------------------------------------------------------------------ --out
@needs_procfs
@pytest.mark.parametrize("cmd", ["run", "compare"])
def test_out_on_procfs_fails_before_any_run(cmd, tmp_path, capsys, monkeypatch):
    def no_run(*a, **k):
        raise AssertionError("no simulation may run when --out is unusable")

    monkeypatch.setattr(ev, "evaluate", no_run)
    monkeypatch.setattr(ev, "run_episode", no_run)
    path = rejecting_scenario(tmp_path)
    argv = [cmd, str(path), "--out", PROC_OUT, "--quiet"]
    argv[2:2] = ["--controller", "vllm"] if cmd == "run" else ["--controllers", "vllm"]
    line = _one_error_line(capsys, main(argv))
    assert f"--out {PROC_OUT}:" in line and "cannot create folder" in line
    assert ".commitenv" not in line and "tmp" not in line  # names the user's path, not a probe or temp path
    assert not Path(PROC_OUT).exists()


def test_out_check_creates_nothing_it_did_not_find(tmp_path, capsys, monkeypatch):
    seen = {}

    def stop(*a, **k):
        seen["left"] = sorted(p.name for p in tmp_path.iterdir())
        raise ValueError("stopped before the run")

    monkeypatch.setattr(ev, "evaluate", stop)
    path = rejecting_scenario(tmp_path / "sc")
    deep = tmp_path / "a" / "b" / "c"
    line = _one_error_line(capsys, main(["run", str(path), "--out", str(deep), "--quiet"]))
    assert "stopped before the run" in line
    assert seen["left"] == ["sc"]  # the probe's folders and files were removed before the run started
    # an existing folder keeps exactly what it had
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "x.txt").write_text("x")
    assert check_out(str(keep), beside=True) == keep
    assert sorted(p.name for p in keep.iterdir()) == ["x.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep", "sc"]


@needs_procfs
def test_late_write_failure_names_the_users_folder(tmp_path, capsys, monkeypatch):
    path = rejecting_scenario(tmp_path)
    res = evaluate("vllm", str(path), seed=0)
    with pytest.raises(OSError) as e:
        res.write(PROC_OUT, figure=False)
    assert PROC_OUT in str(e.value) and "/proc/." not in str(e.value)  # not the temporary folder beside it
    # the CLI's late failure (the early check bypassed) names --out too
    monkeypatch.setattr(cli_run, "check_out", lambda out, beside=False: None if out is None else Path(out))
    line = _one_error_line(capsys, main(["run", str(path), "--out", PROC_OUT, "--quiet"]))
    assert f"--out {PROC_OUT}" in line and "/proc/." not in line
    line = _one_error_line(capsys, main(["compare", str(path), "--controllers", "vllm", "--out", PROC_OUT,
                                         "--quiet"]))
    assert f"--out {PROC_OUT}" in line and "/proc/." not in line
    assert not Path(PROC_OUT).exists()
    assert math.isfinite(res.summary["cost_kwh_eq"])
