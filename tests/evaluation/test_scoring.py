"""The one scoring function (`commitenv.scoring`): gates and scores by hand, the objective a scenario declares, and
`compare` and `submit` giving the same score for the same episode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from commitenv.cli import main
from commitenv.leaderboard import load_submission, submit
from commitenv.scenarios import load_scenario
from commitenv.scoring import gate_outcome, normalised_score, score
from helpers.scenarios import toy_three_hour
from helpers.leaderboard import HALF, LIMITS, write_submission as _write_sub


def _summary(cost: float, arrivals: list[int], misses: list[int], gate: dict | None = None, eps: float = 0.01):
    return {"controller": "c", "scenario": "s", "cost_kwh_eq": cost, "slo_arrivals_by_hour": arrivals,
            "slo_misses_by_hour": misses,
            "objective": {"gate": gate or {"kind": "absolute", "tolerance_pp": None}, "epsilon": eps}}


def test_absolute_gate_by_hand():
    # 1 % of 100 = 1 miss allowed (met), 1 % of 200 = 2 allowed but 3 missed (98.5 % vs 99 %: 0.5 pp short)
    g = gate_outcome(_summary(0.0, [100, 200, 0], [1, 3, 0]))
    assert not g.passed and g.failed_hours == (1,)
    assert g.allowed_misses == pytest.approx((1.0, 2.0, 0.0))
    assert g.threshold_pct == pytest.approx((99.0, 99.0, 100.0))
    assert g.shortfall_pct == pytest.approx(0.5)
    assert gate_outcome(_summary(0.0, [100, 200, 0], [1, 2, 0])).passed  # exactly on the boundary passes


def test_relative_gate_by_hand():
    gate = {"kind": "relative", "tolerance_pp": 1.0}
    ref = _summary(9.0, [100, 200], [3, 5], gate)
    # allowed: 3 + 1 = 4 and 5 + 2 = 7; the episode misses 4 and 8: hour 1 fails, 96.0 % against 96.5 %
    g = gate_outcome(_summary(0.0, [100, 200], [4, 8], gate), ref)
    assert g.allowed_misses == pytest.approx((4.0, 7.0)) and g.failed_hours == (1,)
    assert g.threshold_pct == pytest.approx((96.0, 96.5)) and g.shortfall_pct == pytest.approx(0.5)
    assert gate_outcome(ref, ref).passed  # the reference always passes its own relative gate
    with pytest.raises(ValueError, match="reference run"):
        gate_outcome(_summary(0.0, [100, 200], [4, 8], gate))
    with pytest.raises(ValueError, match="not a run of the same episode"):
        gate_outcome(_summary(0.0, [100, 201], [4, 8], gate), ref)


def test_score_by_hand_and_its_errors():
    lo, up = _summary(2.0, [100], [1]), _summary(0.0, [100], [0])
    assert score(_summary(0.5, [100], [1]), lo, up).score == pytest.approx(75.0)
    failed = score(_summary(0.5, [100], [3]), lo, up)  # 97 % against 99 %: 2 pp short, capped at 0 first
    assert failed.score == pytest.approx(-2.0) and not failed.gate.passed
    assert score(_summary(0.5, [100], [1])).score is None  # no references: no score, the gate still judged
    assert normalised_score(2.5, 2.0, 0.0, True) == pytest.approx(-25.0)
    with pytest.raises(ValueError, match="must cost less"):
        score(_summary(0.5, [100], [1]), lo, lo)
    with pytest.raises(ValueError, match="records no objective"):
        score({"cost_kwh_eq": 1.0})
    with pytest.raises(ValueError, match="unknown gate kind 'loose'"):
        gate_outcome(_summary(0.0, [10], [0], {"kind": "loose"}))


@pytest.mark.parametrize("gate, says", [
    ({"kind": "lenient"}, "objective.gate.kind"),
    ({"kind": "relative", "tolerance_pp": -1}, "objective.gate.tolerance_pp"),
    ({"kind": "relative"}, "objective.gate.tolerance_pp"),
    ({"kind": "absolute", "tolerance_pp": 1.0}, "objective.gate.tolerance_pp"),
])
def test_bad_objective_names_the_field(tmp_path, gate, says):
    p = toy_three_hour(tmp_path, objective={"gate": gate})
    with pytest.raises(ValueError) as e:
        load_scenario(p)
    assert says in str(e.value).replace("\n", " ") or says.rsplit(".", 1)[-1] in str(e.value)


def test_shipped_h20_scenarios_declare_a_relative_gate_with_a_reason():
    for name in ("bench-h20-hour-fixed-a30", "bench-h20-day", "epact-h20-hour-decreasing-a25"):
        g = load_scenario(name).objective.gate
        assert g.kind == "relative" and g.tolerance_pp == 1.0 and "ePACT" in g.reason
    assert load_scenario("bench-h200-hour-fixed-a30").objective.gate.kind == "absolute"


def test_compare_and_submit_score_the_same_episode_identically(tmp_path, capsys):
    sc = toy_three_hour(tmp_path / "sc", horizon_hours=1, commitment={"mj": [0.2]}, name="toy-score")
    board = tmp_path / "board"
    (board / "suites").mkdir(parents=True)
    (board / "suites" / "dev.yaml").write_text(yaml.safe_dump({
        "name": "dev", "episodes": [{"scenario": str(sc), "seeds": [0, 1]}], "limits": LIMITS}))
    folder = _write_sub(tmp_path / "half", "half", HALF, "Half")
    rec = submit(load_submission(folder), "dev", board=board, render=False).record
    out = tmp_path / "cmp"
    assert main(["compare", str(sc), "--controllers", f"{folder / 'ctl.py'}:Half", "--seeds", "0,1", "--out", str(out),
                 "--quiet"]) == 0
    assert "score" in capsys.readouterr().out
    for row in rec["episodes"]:
        s = json.loads((out / "Half" / f"seed-{row['seed']}" / "summary.json").read_text())
        assert s["cost_kwh_eq"] == row["cost_kwh_eq"]
        assert s["score"] == row["score"] and s["slo_gate_pass"] == row["slo_gate_pass"]
        assert s["lower_cost_kwh_eq"] == row["lower_cost_kwh_eq"]
        assert s["upper_cost_kwh_eq"] == row["upper_cost_kwh_eq"]
