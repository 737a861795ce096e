"""Evaluation: the Table 1 summary, vLLM's exact deviation on the fixed single-hour scenario, determinism,
the score from engine records versus the rewards, and atomic output writing."""

from __future__ import annotations

import csv
import json
import math
import os

import numpy as np
import pytest

import commitenv
import commitenv.plots as plots_mod
from commitenv.evaluation import EvalResult, evaluate
from commitenv.metrics import deviation_cost_kwh
from helpers.controllers import LowAndSlow
from helpers.scenarios import HOUR_SCENARIO, toy_miss, toy_three_hour

SUMMARY_KEYS = {"scenario", "controller", "seed", "attainment_pct", "mean_abs_dev_pct", "hours_within_5pct",
                "cost_kwh_eq", "energy_mj", "commitment_mj", "wall_s"}


@pytest.fixture(scope="module")
def vllm_hour() -> EvalResult:
    return evaluate("vllm", HOUR_SCENARIO, seed=0)


# ------------------------------------------------------------------------------------------ summary
def test_summary_keys_and_vllm_deviation(vllm_hour):
    s = vllm_hour.summary
    assert SUMMARY_KEYS <= set(s)
    assert s["scenario"] == HOUR_SCENARIO and s["controller"] == "vllm" and s["seed"] == 0
    # the commitment is 0.85 x the reference run, which is this very engine run: deviation = 1/0.85 - 1
    expected = 100.0 * (1 / 0.85 - 1)
    assert s["mean_abs_dev_pct"] == pytest.approx(expected, abs=1e-6)
    assert vllm_hour.hourly[0]["deviation_pct"] == pytest.approx(expected, abs=1e-6)
    assert s["commitment_mj"] == pytest.approx(0.85 * s["energy_mj"], rel=1e-9)
    assert s["hours_within_5pct"] == 0
    assert s["hours_cost_kwh_eq"] == pytest.approx(2.0 * (s["energy_mj"] - s["commitment_mj"]) / 3.6, rel=1e-9)
    # the completion tail after the hour is all overuse: 2 x its kWh on top
    assert s["cost_kwh_eq"] == pytest.approx(2.0 * (s["energy_mj"] - s["commitment_mj"] + s["tail_energy_mj"]) / 3.6,
                                             rel=1e-9)
    assert 0.0 <= s["attainment_pct"] <= 100.0
    assert s["wall_s"] >= 0.0
    assert s["requests"] == len(vllm_hour.requests["arrival_s"]) > 1000
    assert s["episode_return"] == pytest.approx(-(s["cost_kwh_eq"]) + s["reward_offset_kwh"], rel=1e-9)
    assert json.loads(json.dumps(s)) == s  # plain JSON types


def test_package_level_evaluate_is_the_same(vllm_hour):
    s = commitenv.evaluate("vllm", HOUR_SCENARIO, seed=0).summary
    ref = vllm_hour.summary
    assert {k: v for k, v in s.items() if k != "wall_s"} == {k: v for k, v in ref.items() if k != "wall_s"}


def test_evaluation_is_deterministic(tmp_path):
    path = toy_three_hour(tmp_path)
    a, b = evaluate(LowAndSlow(), str(path), seed=3), evaluate(LowAndSlow(), str(path), seed=3)
    drop = lambda s: {k: v for k, v in s.items() if k != "wall_s"}  # noqa: E731
    assert drop(a.summary) == drop(b.summary)
    assert a.hourly == b.hourly
    assert a.history == b.history
    for k in a.requests:
        np.testing.assert_array_equal(a.requests[k], b.requests[k])
    c = evaluate(LowAndSlow(), str(path), seed=4)
    assert c.summary["energy_mj"] != a.summary["energy_mj"]


def test_score_from_records_matches_rewards_with_misses(tmp_path):
    res = evaluate(LowAndSlow(), str(toy_miss(tmp_path)), seed=0)
    s = res.summary
    assert s["controller"] == "low-and-slow"
    assert s["misses"] > 0
    req = res.requests
    assert s["misses"] == int(np.count_nonzero(~req["met"]))
    e = np.array([h["energy_mj"] for h in res.hourly]) * 1e6
    c = np.array([h["commitment_mj"] for h in res.hourly]) * 1e6
    tail = 2.0 * s["tail_energy_mj"] / 3.6  # the completion tail, at the overuse rate
    assert s["cost_kwh_eq"] == pytest.approx(float(np.sum(deviation_cost_kwh(e, c, 2.0, 1.0))) + tail, rel=1e-12)
    assert s["episode_return"] == pytest.approx(-s["cost_kwh_eq"] + s["reward_offset_kwh"], rel=1e-9, abs=1e-9)
    assert s["penalised_return"] == pytest.approx(-(s["cost_kwh_eq"] + 0.01 * s["misses"]) + s["reward_offset_kwh"],
                                                  rel=1e-9, abs=1e-9)
    # hourly attainment by arrival hour from the request table
    hour = np.minimum(req["arrival_s"] // 3600, 1).astype(int)
    for h in range(2):
        sel = hour == h
        assert res.hourly[h]["arrivals"] == int(sel.sum())
        assert res.hourly[h]["attainment_pct"] == pytest.approx(100.0 * req["met"][sel].mean())


def test_custom_controller_kwargs_and_unknown_name():
    with pytest.raises(ValueError, match="unknown controller 'nope'; available: .*fixed_config.*vllm"):
        evaluate("nope", HOUR_SCENARIO)
    res = evaluate("fixed_config", HOUR_SCENARIO, controller_kwargs={"active": 30, "clock_mhz": 1380})
    assert {h["active"] for h in res.history} == {30} and {h["clock_mhz"] for h in res.history} == {1380}


# ------------------------------------------------------------------------------------------ writing
def _read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_write_produces_consistent_files(vllm_hour, tmp_path):
    out = tmp_path / "run"
    assert vllm_hour.write(out) == out
    names = sorted(p.name for p in out.iterdir())
    assert names == ["decisions.csv", "hourly.csv", "overview.png", "requests.csv", "summary.json"]  # no temp folder
    assert json.loads((out / "summary.json").read_text()) == vllm_hour.summary
    hourly = _read_csv(out / "hourly.csv")
    assert len(hourly) == 1
    assert float(hourly[0]["deviation_pct"]) == pytest.approx(100 * (1 / 0.85 - 1), rel=1e-5)
    rows = _read_csv(out / "requests.csv")
    assert len(rows) == vllm_hour.summary["requests"]
    assert set(rows[0]) == set(vllm_hour.requests)
    met = sum(int(r["met"]) for r in rows)
    assert met == pytest.approx(vllm_hour.summary["attainment_pct"] / 100 * len(rows))
    assert (out / "overview.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_write_multi_hour_result_without_extras(tmp_path):
    res = evaluate(LowAndSlow(), str(toy_three_hour(tmp_path / "sc")), seed=0)
    out = tmp_path / "out"
    res.write(out, requests=False, figure=False)
    assert sorted(p.name for p in out.iterdir()) == ["decisions.csv", "hourly.csv", "summary.json"]
    assert [int(r["hour"]) for r in _read_csv(out / "hourly.csv")] == [0, 1, 2]
    res.write(out)  # and the figure of a multi-hour run
    assert (out / "overview.png").stat().st_size > 0
    rows = _read_csv(out / "requests.csv")
    assert len(rows) == res.summary["requests"] == 301
    # the rejected request has no first token and never finishes
    rej = [r for r in rows if int(r["prompt_tokens"]) == 70]
    assert len(rej) == 1 and rej[0]["finish_s"] == "inf" and rej[0]["met"] == "0"


def test_write_into_unwritable_location_raises_and_writes_nothing(vllm_hour, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(OSError):
        vllm_hour.write(blocker / "out")
    assert blocker.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores folder permissions")
def test_write_into_read_only_folder_raises(vllm_hour, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(PermissionError):
            vllm_hour.write(ro)
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)


def test_failure_mid_write_leaves_nothing_half_written(vllm_hour, tmp_path, monkeypatch):
    def broken(path, **records):
        raise RuntimeError("figure failed")

    monkeypatch.setattr(plots_mod, "overview_figure", broken)
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="figure failed"):
        vllm_hour.write(out)
    assert not out.exists() or list(out.iterdir()) == []  # neither files written before the failure nor a temp folder
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith('.')] == []
    # an earlier complete result in the folder is left untouched
    monkeypatch.undo()
    vllm_hour.write(out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(plots_mod, "overview_figure", broken)
    with pytest.raises(RuntimeError):
        vllm_hour.write(out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_history_records_each_interval(vllm_hour):
    h = vllm_hour.history
    assert len(h) == 60
    assert [x["t"] for x in h] == pytest.approx([60.0 * (k + 1) for k in range(60)])
    assert {x["active"] for x in h} == {32} and {x["clock_mhz"] for x in h} == {1710}
    total = math.fsum(x["interval_j"] for x in h)
    assert total / 1e6 == pytest.approx(vllm_hour.summary["energy_mj"], rel=1e-12)
