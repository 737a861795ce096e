"""One hourly settlement for the environment, the fixed-configuration runner and scoring."""

from __future__ import annotations

import numpy as np
import pytest

from commitenv.envs import CommitServeEnv
from commitenv.evaluation import score_episode
from commitenv.metrics import J_PER_KWH
from commitenv.scenarios import engine_options, scenario_profile, scenario_workload
from commitenv.settlement import HourlySettlement
from commitenv.sim.fixed import run_fixed
from helpers.scenarios import HOUR_SCENARIO


def test_hand_computed_two_hour_stream():
    # commitments 1 and 2 kWh; intervals of half an hour; meter readings in kWh
    s = HourlySettlement(np.array([1.0, 2.0]) * J_PER_KWH, 2.0, 1.0, intervals_per_hour=2)
    steps = [s.record(x * J_PER_KWH) for x in (0.7, 1.5, 2.0, 3.0)]
    # hour 0: 1.5 kWh against 1 -> overuse 0.5 x 2 = 1.0; hour 1: 1.5 kWh against 2 -> underuse 0.5 x 1 = 0.5
    assert steps[1].closed.energy_j == pytest.approx(1.5 * J_PER_KWH)
    assert steps[1].closed.cost_kwh_eq == pytest.approx(1.0)
    assert steps[1].closed.deviation_pct == pytest.approx(50.0)
    assert steps[3].closed.cost_kwh_eq == pytest.approx(0.5)
    assert steps[0].closed is None and steps[2].closed is None
    assert [st.interval_j / J_PER_KWH for st in steps] == pytest.approx([0.7, 0.8, 0.5, 1.0])
    # the cost changes telescope: sum = -(sum C_h) + lambda_minus sum E*_h, as the env's reward does
    assert -sum(st.cost_change_kwh for st in steps) == pytest.approx(-(1.0 + 0.5) + 3.0)
    assert s.reward_offset_kwh == pytest.approx(3.0)
    with pytest.raises(RuntimeError, match="already closed"):
        s.record(4.0 * J_PER_KWH)


def test_bad_commitments_are_refused():
    with pytest.raises(ValueError, match="commitments"):
        HourlySettlement(np.array([1.0, -1.0]))


def test_env_runner_and_scoring_settle_the_same_energy():
    """vLLM through the env (no action ever changes the configuration) and the fixed-configuration runner at
    full capacity drive the same engine: their hourly energies are equal bit for bit, and the score's cost is the
    settlement's."""
    env = CommitServeEnv(HOUR_SCENARIO)
    env.reset(seed=0)
    ret = 0.0
    done = False
    while not done:
        _, r, done, _, _ = env.step({"active": env.n_replicas, "clock": env.profile.reference_clock_index})
        ret += r
    sc = env.scenario
    fixed = run_fixed(scenario_profile(sc), scenario_workload(sc, 0), n_gpus=sc.pool.gpus, options=engine_options(sc, 0),
                      hours=sc.horizon_hours, interval_s=sc.interval_s)
    np.testing.assert_array_equal(env.settlement.energy_j, fixed.hourly_energy_j)
    res = score_episode(env, "vllm", 0, 0.0, ret)
    assert res.summary["hours_cost_kwh_eq"] == pytest.approx(float(env.settlement.cost_kwh.sum()), rel=1e-15)
    tail = env.scenario.lambda_plus * env.tail_energy_j / 3.6e6  # after the hour: all overuse
    assert res.summary["cost_kwh_eq"] == pytest.approx(float(env.settlement.cost_kwh.sum()) + tail, rel=1e-15)
    assert ret == pytest.approx(-res.summary["cost_kwh_eq"] + env.reward_offset_kwh, rel=1e-12)
    assert res.summary["energy_mj"] == pytest.approx(float(env.settlement.energy_j.sum()) / 1e6, rel=1e-15)


# ------------------------------------------------------------------------------------------ the tail is not free
def test_starving_the_pool_at_the_end_pays_for_the_backlog_at_the_overuse_rate(tmp_path):
    """A burst in the hour's last interval; one policy serves it at full capacity, the other starves the pool (one
    replica, lowest clock) in that interval and leaves a backlog. Starving lowers the hour's metered energy, but the
    backlog's energy after the hour is settled at lambda_plus, so it is billed, not free."""
    from helpers.scenarios import write_scenario, write_trace

    rng = np.random.default_rng(3)
    t = np.concatenate([[0.0], np.sort(rng.uniform(1, 3000, 20)), np.full(300, 3590.0)])
    trace = write_trace(tmp_path / "burst.csv", t, rng.integers(4, 20, len(t)), np.full(len(t), 40))
    sc = write_scenario(tmp_path, "toy-burst", workload={"trace": str(trace)}, horizon_hours=1,
                        commitment={"mj": [0.05]}, lambda_plus=2.0, lambda_minus=1.0, alpha=50.0)
    tails, costs = {}, {}
    for name, last in (("serve", {"active": 2, "clock": 1}), ("starve", {"active": 1, "clock": 0})):
        env = CommitServeEnv(str(sc))
        env.reset(seed=0)
        ret, done, k = 0.0, False, 0
        while not done:
            _, r, done, _, info = env.step(last if k == env.K - 1 else {"active": 2, "clock": 1})
            ret += r
            k += 1
        s = score_episode(env, name, 0, 0.0, ret).summary
        tail_kwh = env.tail_energy_j / J_PER_KWH
        # energy is conserved: the settled hour and the tail make up everything the pool drew (ideal: one meter)
        assert env.settlement.energy_j.sum() + env.tail_energy_j == pytest.approx(env.pool.energy_j(), rel=1e-12)
        # the tail is all overuse (the hour bought for it is 0): the cost and the return both carry it
        assert s["tail_cost_kwh_eq"] == pytest.approx(2.0 * tail_kwh, rel=1e-12)
        assert s["cost_kwh_eq"] == pytest.approx(s["hours_cost_kwh_eq"] + 2.0 * tail_kwh, rel=1e-12)
        assert ret == pytest.approx(-s["cost_kwh_eq"] + env.reward_offset_kwh, rel=1e-9, abs=1e-12)
        tails[name], costs[name] = tail_kwh, s
    assert tails["starve"] > tails["serve"] > 0  # starving left a larger backlog after the hour
    assert costs["starve"]["hours_cost_kwh_eq"] != costs["serve"]["hours_cost_kwh_eq"]
