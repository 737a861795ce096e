"""festina-h100-shared-day: the day variant of festina-h100-shared.

Its pool, placement, tenant mix, SLO and scoring settings are the hour scenario's; its traffic is the hour's
generator on azure-code-day's hourly shape with the peak hour at the hour's volume; its 24 absolute commitments
are 85 % of full-capacity vLLM's hourly energy on workload seed 0. The commitments are checked against things
computed independently of the file: the built-in day's hourly counts, the hour scenario's commitment (the day's
peak hour has the hour's volume) and fresh one-hour vLLM runs of three hours (~3 s in all).
"""

from __future__ import annotations

import numpy as np
import pytest

from commitenv.evaluation import run_episode
from commitenv.scenarios import commitments_mj, load_scenario, scenario_workload
from commitenv.workload.builtin import (
    AZURE_CODE_DAY_HOURLY_COUNTS,
    AZURE_CONV_HOUR_COUNT,
    AZURE_CONV_HOUR_CV,
    CONTEXT_LIMIT,
)
from commitenv_controllers import make

DAY = "festina-h100-shared-day"
HOUR = "festina-h100-shared"
FRACTION = 0.85


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMITENV_CACHE", str(tmp_path / "cache"))


def test_the_day_loads_with_24_absolute_commitments():
    sc = load_scenario(DAY)
    assert sc.name == DAY and sc.env_id == f"commitenv/{DAY}-v0"
    assert sc.horizon_hours == 24 and sc.interval_s == 60
    assert sc.commitment.fractions is None and len(sc.commitment.mj) == 24
    got = commitments_mj(sc)
    np.testing.assert_array_equal(got, sc.commitment.mj)
    assert np.all(got > 0) and np.all(np.round(got, 2) == got)
    assert sc.realism.level == "paper" and sc.workload.seed is None and sc.workload.rate_spread == 0.1
    assert sc.seeds is not None
    for key in ("pool", "workload", "horizon", "commitment", "slo", "realism", "seeds"):
        assert sc.paper.get(key), f"paper.{key} missing"


def test_the_day_shares_the_hour_scenarios_pool_mix_and_scoring():
    day, hour = load_scenario(DAY), load_scenario(HOUR)
    assert day.pool.model_dump() == hour.pool.model_dump()  # models, profiles, tenants, placement and shares
    assert day.workload.tenant_mix == hour.workload.tenant_mix
    assert day.workload.rate_spread == hour.workload.rate_spread
    for f in ("interval_s", "alpha", "epsilon", "lambda_plus", "lambda_minus", "miss_penalty_kwh", "seeds",
              "observation", "engine", "initial"):
        assert getattr(day, f) == getattr(hour, f), f
    assert day.realism.resolved() == hour.realism.resolved()


def test_the_day_traffic_is_the_hour_generator_on_the_builtin_days_shape():
    syn = load_scenario(DAY).workload.synthetic
    scale = AZURE_CONV_HOUR_COUNT / max(AZURE_CODE_DAY_HOURLY_COUNTS)
    assert syn.hourly_counts == [round(c * scale) for c in AZURE_CODE_DAY_HOURLY_COUNTS]
    assert max(syn.hourly_counts) == AZURE_CONV_HOUR_COUNT
    assert syn.lengths == "azure_conv" and syn.burstiness_cv == AZURE_CONV_HOUR_CV
    assert syn.context_limit == CONTEXT_LIMIT and syn.smooth


def test_commitments_follow_the_days_hourly_counts():
    """Energy above the pool's floor grows with arrivals: the commitments must rise and fall with the built-in
    day's hourly counts (a shuffled, shifted or constant list fails)."""
    c = np.asarray(load_scenario(DAY).commitment.mj)
    n = np.asarray(AZURE_CODE_DAY_HOURLY_COUNTS, dtype=float)
    assert np.corrcoef(c, n)[0, 1] > 0.98
    assert int(np.argmin(c)) == int(np.argmin(n)) == 10
    assert c.max() / c.min() > 1.8  # the idle floor keeps it well under the counts' 5.5x, but not flat
    # the peak hour serves the hour scenario's volume: its commitment is the hour's within a few per cent
    peak = int(np.argmax(n))
    assert c[peak] == pytest.approx(load_scenario(HOUR).commitment.mj[0], rel=0.03)
    assert np.all(c <= 1.03 * load_scenario(HOUR).commitment.mj[0])


@pytest.mark.parametrize("h", [4, 10, 19])
def test_commitment_is_85_percent_of_a_fresh_vllm_hour(h):
    """A one-hour window at hour h (workload seed 0, no rate spread; drawn afresh, not cut from the day) served
    by full-capacity vLLM uses about commitment_h / 0.85."""
    sc = load_scenario(DAY)
    one = sc.model_copy(update={
        "name": f"{DAY}-h{h}", "horizon_hours": 1, "seeds": None,
        "commitment": sc.commitment.model_copy(update={"mj": [sc.commitment.mj[h]]}),
        "workload": sc.workload.model_copy(update={"seed": 0, "rate_spread": 0.0, "start_hour": float(h)}),
    })
    assert len(scenario_workload(one, 0)) == sc.workload.synthetic.hourly_counts[h]
    _, res = run_episode(make("vllm"), one, 0)
    assert FRACTION * res.summary["energy_mj"] == pytest.approx(sc.commitment.mj[h], rel=0.03)
    s = res.summary  # the pool keeps up at full capacity: its misses are the context-limit rejections
    assert s["late"] + s["unfinished"] <= 0.001 * s["requests"]
    assert s["rejected"] <= 0.015 * s["requests"]
