"""Energy-only settlement (``commitment: {energy_only: true}``, issue 12): no hourly commitment, E*_h = 0, every
hour's energy billed at lambda_plus.

Expectations are computed here from the documented formulas (docs/objective.md, `commitenv.envs.commit_serve`'s
docstring, `commitenv_controllers.epact.planner`), never copied from the implementation's output. The end-to-end
cases run on a small toy pool (conftest's toy profile, a hand-made trace, 600-s intervals).
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from pydantic import ValidationError

import commitenv  # noqa: F401  (registers the scenario ids)
import commitenv.scenarios.commitments as commitments_mod
import commitenv.sim.fixed as fixed_mod
from commitenv.attribution.cost_split import hour_cost_shares
from commitenv.envs import CommitServeEnv
from commitenv.evaluation import run_episode
from commitenv.metrics import deviation_cost_kwh, signed_deviation_pct, slo_outcome, summarize
from commitenv.scenarios import commitments_mj, load_scenario
from commitenv.scenarios.loader import ScenarioError
from commitenv.scenarios.schema import CommitmentSpec
from commitenv.settlement import HourlySettlement
from commitenv_controllers.epact.planner import check_allocation, equal_allocation, interval_target
from commitenv_controllers.epact.plus import forecast_allocation
from commitenv_controllers.epact.selection import Evaluation, select
from commitenv_controllers.mpc.forecast import commitment_shape
from commitenv_controllers.oracle import PlanTerms, plan_table
from helpers.scenarios import toy_miss, write_scenario, write_trace

J_KWH = 3.6e6
ENERGY_ONLY = {"energy_only": True}
TOY_TDP_W = 100.0  # conftest.toy_profile's gpu.tdp_w


def soft(x: float) -> float:
    return x if x <= 1.0 else 1.0 + math.log(x)


def slog(x: float) -> float:
    return math.copysign(math.log1p(abs(x)), x)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """One hour of 600-s intervals (K = 6) on a 4-GPU toy pool, ~120 small requests, no commitment."""
    folder = tmp_path_factory.mktemp("energy_only")
    rng = np.random.default_rng(12)
    t = np.sort(np.concatenate([[0.0], rng.uniform(1.0, 3590.0, 119)]))
    trace = write_trace(folder / "small.csv", t, rng.integers(4, 24, len(t)), rng.integers(1, 24, len(t)))
    return write_scenario(folder, "toy-energy", pool={"profile": str(folder / "toy-profile.yaml"), "gpus": 4},
                          workload={"trace": str(trace)}, horizon_hours=1, commitment=ENERGY_ONLY,
                          lambda_plus=1.0, lambda_minus=1.0, miss_penalty_kwh=0.01)


# ================================================================================================ settlement
def test_an_energy_only_hour_settles_at_lambda_plus_times_its_energy():
    s = HourlySettlement(np.zeros(2), lambda_plus=1.5, lambda_minus=0.7, intervals_per_hour=3)
    assert s.reward_offset_kwh == 0.0
    readings = [1.0e6, 2.5e6, 4.0e6, 5.0e6, 5.0e6, 7.2e6]
    prev, changes, closed = 0.0, [], []
    for r in readings:
        b = s.record(r)
        assert b.interval_j == pytest.approx(r - prev)
        changes.append(b.cost_change_kwh)
        prev = r
        if b.closed is not None:
            closed.append(b.closed)
    # every joule costs lambda_plus, interval by interval (the telescoping reward pays exactly that)
    assert changes == pytest.approx([1.5 * d / J_KWH for d in (1.0e6, 1.5e6, 1.5e6, 1.0e6, 0.0, 2.2e6)], rel=1e-12)
    assert [c.hour for c in closed] == [0, 1]
    assert [c.energy_j for c in closed] == pytest.approx([4.0e6, 3.2e6])
    assert [c.cost_kwh_eq for c in closed] == pytest.approx([1.5 * 4.0e6 / 3.6e6, 1.5 * 3.2e6 / 3.6e6], rel=1e-12)
    assert all(c.commitment_j == 0.0 and c.deviation_pct is None for c in closed)
    d = closed[0].as_dict()
    assert d["deviation_pct"] is None and json.loads(json.dumps(d)) == d  # plain JSON: null, never NaN
    np.testing.assert_allclose(s.cost_kwh, [1.5 * 4.0e6 / 3.6e6, 1.5 * 3.2e6 / 3.6e6], rtol=1e-12)


@pytest.mark.parametrize("bad", [[-1.0], [0.0, -1e-9], [math.nan], [math.inf, 1.0]])
def test_negative_or_non_finite_commitments_still_raise(bad):
    with pytest.raises(ValueError, match="commitments"):
        HourlySettlement(np.array(bad))


def test_metrics_of_an_energy_only_hour():
    assert float(deviation_cost_kwh(7.2e6, 0.0, 2.5, 1.0)) == pytest.approx(2.5 * 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no division warning
        dev = signed_deviation_pct(np.array([1.0e6, 3.6e6]), np.array([0.0, 1.8e6]))
    assert math.isnan(dev[0]) and dev[1] == pytest.approx(100.0)
    slo = slo_outcome(np.array([0.0, 4000.0]), np.array([1.0, 4001.0]), np.array([2.0, 4010.0]), hours=2)
    s = summarize(np.array([3.6e6, 1.8e6]), np.zeros(2), 1.0, 1.0, slo)
    assert s["mean_abs_dev_pct"] is None and s["hours_within_5pct"] is None
    assert s["cost_kwh_eq"] == pytest.approx(1.5) and s["energy_mj"] == pytest.approx(5.4)
    assert s["commitment_mj"] == 0.0 and s["attainment_pct"] == 100.0


# ================================================================================================ scenario schema
@pytest.mark.parametrize("other,field", [({"mj": [1.0]}, "commitment.mj"),
                                         ({"fractions": [0.85]}, "commitment.fractions"),
                                         ({"reference": {"workload_seed": 0}}, "commitment.reference"),
                                         ({"fractions": [0.85], "reference": {"workload_seed": 0}},
                                          "commitment.fractions")])
def test_energy_only_is_exclusive_with_mj_fractions_and_reference(other, field):
    with pytest.raises(ValidationError) as e:
        CommitmentSpec.model_validate({"energy_only": True, **other})
    assert field in str(e.value) and "energy_only" in str(e.value)


def test_a_scenario_file_mixing_energy_only_with_mj_names_the_file_and_field(tmp_path):
    path = write_scenario(tmp_path, "toy-mixed", workload={"builtin": "azure-code-day"}, horizon_hours=1,
                          commitment={"energy_only": True, "mj": [0.2]})
    with pytest.raises(ScenarioError) as e:
        load_scenario(path)
    assert str(path) in str(e.value) and "commitment.mj" in str(e.value)


def test_neither_form_is_still_refused():
    with pytest.raises(ValidationError, match="energy_only"):
        CommitmentSpec.model_validate({})
    assert CommitmentSpec.model_validate({"energy_only": False, "mj": [1.0]}).mj == [1.0]


def test_commitments_are_read_only_zeros_without_a_reference_run(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("an energy-only scenario must never make a reference run")

    monkeypatch.setattr(fixed_mod, "run_fixed", boom)
    monkeypatch.setattr(commitments_mod, "reference_hourly_energy_j", boom)
    monkeypatch.setattr(commitments_mod, "compute_reference", boom)
    path = write_scenario(tmp_path, "toy-three-energy", workload={"builtin": "azure-code-day"}, horizon_hours=3,
                          commitment=ENERGY_ONLY)
    sc = load_scenario(path)
    assert sc.commitment.energy_only and sc.commitment.mj is None and sc.commitment.fractions is None
    c = commitments_mj(sc)
    assert c.shape == (3,) and c.dtype == np.float64 and np.all(c == 0.0)
    assert not c.flags.writeable
    with pytest.raises(ValueError):
        c[0] = 1.0


def test_the_shipped_energy_only_scenario_is_festina_shared_without_commitment():
    sc = load_scenario("festina-h100-shared-energy")
    base = load_scenario("festina-h100-shared")
    assert sc.env_id == "commitenv/festina-h100-shared-energy-v0"
    assert sc.commitment.energy_only and (sc.lambda_plus, sc.lambda_minus) == (1.0, 1.0)
    for f in ("pool", "workload", "horizon_hours", "interval_s", "alpha", "epsilon", "miss_penalty_kwh", "realism",
              "seeds", "observation", "engine"):
        assert getattr(sc, f) == getattr(base, f), f
    assert "energy" in sc.description.lower() and sc.paper.get("commitment") and sc.paper.get("setting")
    assert np.all(commitments_mj(sc) == 0.0)


def test_gymnasium_checker_on_the_shipped_energy_only_scenario():
    """gym.make by id, then gymnasium's checker on the raw env (its Dict has no invalid points: share weights mapped
    onto each GPU's simplex, GPU requests granted as far as memory allows) and on the shared pool's flat action
    (`SharedFlatActionWrapper`, with the share weights)."""
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    from commitenv.envs import SharedFlatActionWrapper

    raw = gym.make("commitenv/festina-h100-shared-energy-v0", render_mode="rgb_array").unwrapped
    env = SharedFlatActionWrapper(raw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*different from the unwrapped version")  # the checker wraps it
        check_env(raw)
        check_env(env)
    obs, info = env.reset(seed=100000)
    assert info["commitment_j"] == 0.0 and info["reward_offset_kwh"] == 0.0
    assert obs[2] == 0.0 and np.all(np.isfinite(obs))


# ================================================================================================ environment
def test_observation_features_2_to_5_use_the_full_power_hour(small):
    env = CommitServeEnv(str(small))
    obs, info = env.reset(seed=0)
    K = 6
    D = 4 * TOY_TDP_W * 3600.0  # D_h = N x TDP x 1 h
    # at the start nothing is metered: feature 3 = 0, feature 4 = slog(0 - 1), feature 5 = slog(D/K / (D/K) - 1)
    assert obs[2] == 0.0
    assert obs[3] == 0.0
    assert obs[4] == pytest.approx(slog(-1.0), rel=1e-6)
    assert obs[5] == pytest.approx(0.0, abs=1e-7)
    assert info["commitment_j"] == 0.0 and info["target_j"] == 0.0
    # a hand-set state: 30 % of D metered in the hour, the last interval drew a quarter of D/K, interval k = 2
    env.k = 2
    env.meter_prev = env.meter_hour_start + 0.3 * D
    env.last_interval_j = 0.25 * D / K
    x = env._obs()
    assert x[2] == 0.0
    assert x[3] == pytest.approx(0.3, rel=1e-6)
    assert x[4] == pytest.approx(-math.log(1.75), rel=1e-6)  # slog(0.25 - 1)
    assert x[5] == pytest.approx(math.log(1.05), rel=1e-5)  # slog(((D - 0.3 D) / 4) / (D / 6) - 1) = slog(0.05)


def test_observations_follow_the_documented_formulas_along_an_episode(small):
    env = CommitServeEnv(str(small))
    env.reset(seed=0)
    K, D = 6, 4 * TOY_TDP_W * 3600.0
    terminated, k = False, 0
    while not terminated:
        obs, r, terminated, _, info = env.step({"active": 1 + k % 4, "clock": k % 2})
        k += 1
        assert np.all(np.isfinite(obs)) and env.observation_space.contains(obs)
        kin, m, last = info["interval"], info["hour_energy_j"], info["interval_energy_j"]
        target = (D - m) / (K - kin) if kin < K else 0.0
        want = [0.0, soft(m / D), slog(last / (D / K) - 1.0), slog(target / (D / K) - 1.0)]
        np.testing.assert_allclose(obs[2:6], want, rtol=1e-5, atol=1e-6)
        assert info["commitment_j"] == 0.0
        assert info["target_j"] == pytest.approx((0.0 - m) / (K - kin) if kin < K else 0.0)
        assert math.isfinite(r) and r <= 0.0


def test_episode_return_is_minus_lambda_plus_energy(tmp_path):
    """Two hours with bursts and one slow replica (misses), lambda_plus 1.5: the return telescopes to
    -(lambda_plus x (settled + tail) kWh), with offset 0 (the misses go to info["cost"])."""
    path = toy_miss(tmp_path, commitment=ENERGY_ONLY, lambda_plus=1.5, lambda_minus=1.0)
    env = CommitServeEnv(str(path))
    _, info = env.reset(seed=0)
    assert info["reward_offset_kwh"] == 0.0
    ret, settled, terminated = 0.0, [], False
    while not terminated:
        _, r, terminated, _, info = env.step({"active": 1, "clock": 0})
        ret += r
        if "settlement" in info:
            settled.append(info["settlement"])
    assert [s["hour"] for s in settled] == [0, 1]
    assert all(s["commitment_j"] == 0.0 and s["deviation_pct"] is None for s in settled)
    e_j = math.fsum(s["energy_j"] for s in settled)
    assert e_j == pytest.approx(env.pool.energy_j(2 * 3600.0), rel=1e-12)  # the settlement meter (ideal: the pool)
    for s in settled:
        assert s["cost_kwh_eq"] == pytest.approx(1.5 * s["energy_j"] / J_KWH, rel=1e-12)
    assert env.misses > 0 and info["cost"] >= 0  # the misses are the separate constraint signal
    e_j += info["tail_energy_j"]  # the tail is billed as overuse too: with no commitment, every joule
    expected = -(1.5 * e_j / J_KWH)
    assert ret == pytest.approx(expected, rel=1e-9, abs=1e-12)


# ================================================================================================ attribution
def test_cost_shares_of_an_energy_only_hour_are_proportional_to_energy():
    tenants = {"a": 2.0e6, "b": 1.0e6, "c": 0.5e6}
    for idle in (0.4e6, -1e-9):  # a period's idle may round to -1e-9 J
        split = hour_cost_shares(tenants, idle, 0.0, 2.0, 1.0)
        assert split.method == "linear" and split.exact
        shares = split.tenant_kwh_eq
        assert shares["a"] == pytest.approx(2 * shares["b"], rel=1e-12)
        assert shares["b"] == pytest.approx(2 * shares["c"], rel=1e-12)
        if idle > 0:
            assert shares["a"] == pytest.approx(2.0 * 2.0e6 / J_KWH, rel=1e-12)
            assert split.idle_kwh_eq == pytest.approx(2.0 * 0.4e6 / J_KWH, rel=1e-12)
        total = sum(shares.values()) + split.idle_kwh_eq
        assert total == pytest.approx(split.cost_kwh_eq, rel=1e-12)


# ================================================================================================ controllers
def test_epact_planner_with_no_commitment():
    K = 6
    b = equal_allocation(0.0, K)
    assert b == [0.0] * K
    check_allocation(0.0, b)  # zeros are the energy-only allocation (no positive last mass needed)
    with pytest.raises(ValueError, match="sums to"):
        check_allocation(0.0, [0.0, 0.0, 1.0])
    with pytest.raises(ValueError):
        check_allocation(-1.0, b)
    for k, m in [(0, 0.0), (3, 2.0e5), (5, 9.9e5)]:
        assert interval_target(0.0, m, b, k) == 0.0
        assert interval_target(0.0, m, b, k, static=True) == 0.0
    # epact_plus: a forecast shape splits nothing, and the result still checks
    f = forecast_allocation(0.0, K, 2, [1.0, 2.0, 3.0, 4.0])
    assert f == [0.0] * K
    check_allocation(0.0, f)
    # mpc's shape prior from the commitments: none to take, a flat shape
    np.testing.assert_array_equal(commitment_shape([0.0, 0.0], 0, 1, K, 5), np.ones(5))


def test_epact_selection_with_target_zero_minimises_energy_among_admitted():
    evals = [Evaluation(4, 1000, 9.0e4, 0, 30.0), Evaluation(2, 1000, 5.0e4, 1, 10.0),
             Evaluation(1, 500, 2.0e4, 9, -50.0), Evaluation(3, 500, 6.0e4, 0, 40.0)]
    # 100 captured requests, epsilon 0.01: at most 1 predicted miss is admitted; the 9-miss candidate is not
    chosen = select(evals, 0.0, 1.0, 1.0, 100, 0.01)
    assert chosen.config == (2, 1000)


def test_oracle_plans_the_least_energy_within_the_miss_budget():
    # two intervals of one hour, three configurations: (energy J, misses)
    e = [[3.0e5, 2.0e5, 1.0e5], [3.0e5, 2.0e5, 1.0e5]]
    m = [[0, 1, 5], [0, 0, 2]]
    terms = PlanTerms(2, (0.0,), 1.0, 1.0, 0.0, max_misses=3)
    plan = plan_table(e, m, terms)
    # feasible schedules (misses <= 3) by energy: (1, 2) = 3e5 J with 3 misses is the least
    assert plan.schedule == (1, 2) and plan.misses == 3 and plan.feasible
    assert plan.cost_kwh == pytest.approx(3.0e5 / J_KWH, rel=1e-12)
    with pytest.raises(ValueError):
        PlanTerms(2, (-1.0,))


@pytest.fixture(scope="module")
def runs(small):
    out = {}
    for name in ("vllm", "epact"):
        out[name] = run_episode(name, str(small), 0, controller_kwargs={"workers": 0} if name == "epact" else None)
    return out


def test_epact_uses_no_more_energy_than_vllm_end_to_end(runs):
    (_, v), (env, e) = runs["vllm"], runs["epact"]
    for res in (v, e):
        s = res.summary
        assert s["settlement"] == "energy_only"
        assert s["mean_abs_dev_pct"] is None and s["hours_within_5pct"] is None
        assert s["commitment_mj"] == 0.0 and s["reward_offset_kwh"] == 0.0
        assert s["cost_kwh_eq"] == pytest.approx(s["energy_mj"] / 3.6, rel=1e-9)  # lambda_plus 1: the kWh
        assert s["episode_return"] == pytest.approx(-(s["cost_kwh_eq"] + 0.01 * s["misses"]), rel=1e-9)
        assert res.hourly[0]["deviation_pct"] is None
        assert json.loads(json.dumps(s)) == s
    assert e.summary["energy_mj"] <= v.summary["energy_mj"]
    assert len(e.decisions) == 6 and env.k == 6


def test_epact_targets_are_zero(small):
    from commitenv_controllers.epact import EPACT

    ctrl = EPACT(workers=0)
    run_episode(ctrl, str(small), 0)
    assert len(ctrl.decisions) == 6 and all(d["target_j"] == 0.0 for d in ctrl.decisions)
    assert all(d["band_j"] == 0.0 for d in ctrl.decisions)


@pytest.mark.parametrize("name,kwargs", [
    ("fixed_config", None), ("dynamollm", None), ("static_target", {"workers": 0}), ("epact_plus", {"workers": 0}),
    ("mpc", {"workers": 0}), ("festina", None), ("oracle", {"workers": 0}),
])
def test_every_controller_runs_on_an_energy_only_scenario(small, runs, name, kwargs):
    _, res = run_episode(name, str(small), 0, controller_kwargs=kwargs)
    s = res.summary
    assert s["settlement"] == "energy_only" and s["mean_abs_dev_pct"] is None
    assert math.isfinite(s["cost_kwh_eq"]) and s["cost_kwh_eq"] == pytest.approx(s["energy_mj"] / 3.6, rel=1e-9)
    assert s["requests"] == runs["vllm"][1].summary["requests"]
    if name in ("static_target", "epact_plus", "mpc", "oracle", "festina", "dynamollm"):
        assert s["energy_mj"] <= runs["vllm"][1].summary["energy_mj"]  # nobody is paid to burn energy


# ================================================================================================ CLI and outputs
def test_cli_run_prints_energy_only_and_writes_null_deviations(small, tmp_path, capsys):
    from commitenv.cli import main

    out = tmp_path / "run"
    assert main(["run", str(small), "--controller", "vllm", "--out", str(out), "--quiet"]) == 0
    stdout = capsys.readouterr().out
    table = stdout.splitlines()
    assert "|dev|_%" in table[0] and "energy-only" in table[1]

    def no_constant(c):
        raise AssertionError(f"{c} in the printed summary")

    printed = json.loads(table[-1], parse_constant=no_constant)  # the summary line: plain JSON, no NaN / Infinity
    assert printed["mean_abs_dev_pct"] is None
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settlement"] == "energy_only" and summary["mean_abs_dev_pct"] is None
    hourly = (out / "hourly.csv").read_text().splitlines()
    cols = hourly[0].split(",")
    assert hourly[1].split(",")[cols.index("deviation_pct")] == ""
    assert (out / "overview.png").stat().st_size > 0


def test_cli_compare_prints_energy_only(small, tmp_path, capsys):
    from commitenv.cli import main

    assert main(["compare", str(small), "--controllers", "vllm,fixed_config", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [ln for ln in lines if ln.split() and ln.split()[0] in ("vllm", "fixed_config")]
    assert len(rows) == 2 and all("energy-only" in r for r in rows)
    assert any(ln.startswith("energy-only:") for ln in lines)


def test_aggregates_leave_the_undefined_deviation_out():
    from commitenv.leaderboard.score import suite_summary
    from commitenv.runner import aggregate

    base = {"cost_kwh_eq": 1.0, "attainment_pct": 99.5, "misses": 3, "energy_mj": 3.6, "slo_gate_pass": True,
            "settlement": "energy_only", "mean_abs_dev_pct": None, "hours_within_5pct": None}
    eps = {"vllm": {0: dict(base), 1: {**base, "cost_kwh_eq": 2.0, "energy_mj": 7.2}}}
    doc = aggregate("toy", [0, 1], [{"controller": "vllm"}], eps, [])
    assert doc["settlement"] == "energy_only"
    m = doc["controllers"][0]["metrics"]
    assert "mean_abs_dev_pct" not in m and m["cost_kwh_eq"]["mean"] == pytest.approx(1.5)
    rows = [{"score": 10.0, "status": "ok", "slo_gate_pass": True, **{k: base[k] for k in
             ("cost_kwh_eq", "attainment_pct", "misses", "energy_mj", "mean_abs_dev_pct")}},
            {"score": 20.0, "status": "ok", "slo_gate_pass": True, "cost_kwh_eq": 0.5, "attainment_pct": 99.0,
             "misses": 1, "energy_mj": 1.0, "mean_abs_dev_pct": 4.0}]
    _, metrics = suite_summary(rows)
    assert metrics["mean_abs_dev_pct"] == pytest.approx(4.0)  # over the episode that has a commitment
    assert metrics["cost_kwh_eq"] == pytest.approx(0.75)
    _, only = suite_summary(rows[:1])
    assert only["mean_abs_dev_pct"] is None


def test_a_leaderboard_episode_cannot_scale_a_commitment_that_does_not_exist():
    from commitenv.leaderboard.sandbox import episode_scenario
    from commitenv.leaderboard.suite import Episode

    sc = episode_scenario(Episode("festina-h100-shared-energy", 100000))
    assert sc.commitment.energy_only
    with pytest.raises(ValueError, match="energy-only scenario has no commitment to scale"):
        episode_scenario(Episode("festina-h100-shared-energy", 100000, commitment_scale=1.1))
