"""`CommitServeEnv`: hourly settlement by hand, the return identity, causality of everything a controller can
reach, determinism, Gymnasium / stable-baselines3 checkers, action validation and actuation delay.

Most cases run on small scenarios written into a temporary folder (the toy profile of ``conftest.py``, a
hand-made Azure-format trace, absolute commitments, 600 s intervals so an hour is 6 steps), written by
``helpers.scenarios``.
"""

from __future__ import annotations

import collections
import math
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from pydantic import BaseModel

import commitenv  # noqa: F401  (registers the scenario ids)
from commitenv.envs import OBS_FEATURES, CommitServeEnv, FlatActionWrapper
from commitenv.metrics import J_PER_KWH
from helpers.reference.gpu import GPU
from commitenv.sim.noise import NoiseSource
from commitenv.sim.pool import Pool
from helpers.reference.replica import Replica
from commitenv.sim.request import Req
from commitenv.sim.truth import TruthSource
from commitenv.workload.table import RequestTable
from helpers.episodes import hand_cost_kwh, run_episode, varied_policy
from helpers.scenarios import HOUR_SCENARIO, toy_miss, toy_three_hour, write_scenario, write_trace

# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def scen_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("scenarios")


@pytest.fixture(scope="module")
def three(scen_dir) -> Path:
    return toy_three_hour(scen_dir)


# ------------------------------------------------------------------------------------------ 1. settlement
def test_settlement_matches_hand_formula_each_hour(three):
    env = CommitServeEnv(str(three))
    assert env.K == 6 and env.H == 3
    rewards, infos, _ = run_episode(env, lambda k: {"active": 2, "clock": 1})
    settled = [i["settlement"] for i in infos[1:] if "settlement" in i]
    assert [s["hour"] for s in settled] == [0, 1, 2]
    # settlement is reported exactly at the last interval of each hour
    assert [k for k, i in enumerate(infos[1:], start=1) if "settlement" in i] == [6, 12, 18]
    commit = [0.2e6, 0.5e6, 0.3e6]
    for s, c in zip(settled, commit):
        assert s["commitment_j"] == pytest.approx(c, rel=1e-12)
        e = s["energy_j"]
        assert s["cost_kwh_eq"] == pytest.approx(hand_cost_kwh(e, c, 3.0, 0.5), rel=1e-12, abs=1e-15)
        assert s["deviation_pct"] == pytest.approx(100.0 * (e - c) / c, rel=1e-12)
    e = [s["energy_j"] for s in settled]
    # the scenario is built so that both weights are exercised
    assert e[0] > commit[0] and e[1] < commit[1] and e[2] > commit[2]
    assert settled[0]["cost_kwh_eq"] == pytest.approx(3.0 * (e[0] - commit[0]) / J_PER_KWH, rel=1e-12)
    assert settled[1]["cost_kwh_eq"] == pytest.approx(0.5 * (commit[1] - e[1]) / J_PER_KWH, rel=1e-12)
    np.testing.assert_allclose(env.hour_energy_j, e, rtol=0, atol=0)
    np.testing.assert_allclose(env.hour_cost_kwh, [s["cost_kwh_eq"] for s in settled], rtol=0, atol=0)


def test_no_netting_across_hours(three):
    env = CommitServeEnv(str(three))
    run_episode(env, lambda k: {"active": 2, "clock": 1})
    e = env.hour_energy_j
    c = np.array([0.2e6, 0.5e6, 0.3e6])
    per_hour = [hand_cost_kwh(ei, ci, 3.0, 0.5) for ei, ci in zip(e, c)]
    total = float(np.sum(env.hour_cost_kwh))
    assert total == pytest.approx(sum(per_hour), rel=1e-12)
    netted = hand_cost_kwh(float(e.sum()), float(c.sum()), 3.0, 0.5)
    # overuse in hours 0 and 2 is not offset by the underuse of hour 1
    assert total > netted + 0.01
    # two hours: one over, one under -> the sum of both, not the net
    assert per_hour[0] + per_hour[1] > hand_cost_kwh(e[0] + e[1], c[0] + c[1], 3.0, 0.5) + 0.01


def test_energy_settles_in_the_hour_it_is_consumed(three):
    env = CommitServeEnv(str(three))
    obs, info = env.reset(seed=3)
    interval = []
    hour_of = []
    terminated = False
    k = 0
    while not terminated:
        obs, r, terminated, _, info = env.step(varied_policy(k))
        assert info["t"] == pytest.approx((k + 1) * 600.0) or terminated
        interval.append(info["interval_energy_j"])
        hour_of.append(k // 6)
        if not terminated:
            # the pool meter at the interval boundary equals the summed interval energies
            assert env.pool.energy_j() == pytest.approx(sum(interval), rel=1e-12)
            assert info["hour_energy_j"] == pytest.approx(sum(interval[6 * (k // 6) :]) if (k + 1) % 6 else 0.0,
                                                         rel=1e-12, abs=1e-6)
        if "settlement" in info:
            h = info["settlement"]["hour"]
            assert h == k // 6
            assert info["settlement"]["energy_j"] == pytest.approx(sum(interval[6 * h : 6 * h + 6]), rel=1e-12)
        k += 1
    assert k == 18
    # across hours the interval energies add up to the pool meter at the horizon (tail excluded)
    assert sum(interval) == pytest.approx(env.pool.energy_j() - info["tail_energy_j"], rel=1e-12)
    assert float(env.hour_energy_j.sum()) == pytest.approx(sum(interval), rel=1e-12)
    assert info["tail_energy_j"] >= 0.0
    # history mirrors the interval energies
    assert [h["interval_j"] for h in env.history] == interval


def test_slo_counts_in_arrival_hour_in_env(three):
    """The request arriving at 3599.99 s finishes in hour 1 but is counted with hour 0's arrivals."""
    env = CommitServeEnv(str(three))
    _, infos, _ = run_episode(env, lambda k: {"active": 2, "clock": 1})
    pool, table = env.pool, env.table
    late = int(np.flatnonzero(np.isclose(table.arrival_s, 3599.99))[0])
    assert pool.finish_t[late] > 3600.0
    hour = np.minimum(table.arrival_s // 3600, 2).astype(int)
    expected_arrivals = np.bincount(hour, minlength=3)
    final = infos[-1]["slo_by_hour"]
    assert final["arrivals"] == expected_arrivals.tolist()
    met = pool.finish_t <= pool.deadline
    assert final["met_so_far"] == np.bincount(hour, weights=met, minlength=3).astype(int).tolist()
    # the rejected request (prompt 70 >= toy context limit 64) never finishes: inf, a miss
    rej = int(np.flatnonzero(table.prompt_tokens == 70)[0])
    assert math.isinf(pool.finish_t[rej]) and not met[rej]


# ------------------------------------------------------------------------------------------ 2. return identity
def test_return_identity_with_miss_penalty(scen_dir):
    """The reward is minus the cost (hours, then the tail at the overuse rate); the misses are the separate
    constraint signal info["cost"]; LagrangianReward at the scenario's miss penalty gives the penalised return."""
    from commitenv.envs import LagrangianReward

    path = toy_miss(scen_dir)
    env = CommitServeEnv(str(path))
    rewards, infos, _ = run_episode(env, lambda k: {"active": 1, "clock": 0})
    assert env.misses > 0, "the scenario must produce deadline misses"
    assert sum(i["new_misses"] for i in infos[1:]) == env.misses == infos[-1]["misses"]
    assert [i["cost"] for i in infos[1:]] == [float(i["new_misses"]) for i in infos[1:]]
    costs = [i["settlement"]["cost_kwh_eq"] for i in infos if "settlement" in i]
    assert len(costs) == 2
    offset = infos[-1]["reward_offset_kwh"]
    assert offset == pytest.approx(0.5 * 0 + 1.0 * 2 * 0.2e6 / J_PER_KWH, rel=1e-12)
    tail_j = env.pool.energy_j() - env.settlement.energy_j.sum()  # drawn after the horizon (ideal: one meter)
    assert infos[-1]["tail_energy_j"] == pytest.approx(tail_j, rel=1e-9, abs=1e-6)
    tail = 2.0 * tail_j / J_PER_KWH  # priced at lambda_plus (the toy's 2.0)
    assert infos[-1]["tail_cost_kwh_eq"] == pytest.approx(tail, rel=1e-9, abs=1e-15)
    assert math.fsum(rewards) == pytest.approx(-(sum(costs) + tail) + offset, rel=1e-9, abs=1e-9)
    # today's penalised return, exactly, from the wrapper at the scenario's multiplier
    wrapped = LagrangianReward(CommitServeEnv(str(path)))
    assert wrapped.multiplier == 0.01
    penalised, _, _ = run_episode(wrapped, lambda k: {"active": 1, "clock": 0})
    expected = -(sum(costs) + tail + 0.01 * env.misses) + offset
    assert math.fsum(penalised) == pytest.approx(expected, rel=1e-9, abs=1e-9)
    per_hour = np.bincount(np.minimum(env.table.arrival_s // 3600, 1).astype(int),
                           weights=~(env.pool.finish_t <= env.pool.deadline), minlength=2)
    arrivals = np.bincount(np.minimum(env.table.arrival_s // 3600, 1).astype(int), minlength=2)
    assert infos[-1]["miss_fraction_by_hour"] == pytest.approx((per_hour / arrivals).tolist())
    # the misses the env counted are the engine's deadline outcomes
    assert env.misses == int(np.count_nonzero(~(env.pool.finish_t <= env.pool.deadline)))
    # the score from engine records (evaluation) equals the same numbers
    from commitenv.evaluation import score_episode

    res = score_episode(env, "hand", 0, 0.0, math.fsum(rewards))
    s = res.summary
    assert s["cost_kwh_eq"] == pytest.approx(sum(costs) + tail, rel=1e-12)
    assert s["tail_cost_kwh_eq"] == pytest.approx(tail, rel=1e-12, abs=1e-15)
    assert s["misses"] == env.misses
    assert s["episode_return"] == pytest.approx(-s["cost_kwh_eq"] + s["reward_offset_kwh"], rel=1e-9, abs=1e-9)
    assert s["penalised_return"] == pytest.approx(math.fsum(penalised), rel=1e-9, abs=1e-9)
    assert s["attainment_pct"] == pytest.approx(100.0 * (len(env.table) - env.misses) / len(env.table))


# ------------------------------------------------------------------------------------------ 3. causality
def _walk(root):
    """Every object reachable from ``root`` through attributes, slots and containers (pydantic profiles,
    classes and scalars are leaves)."""
    seen: set[int] = set()
    stack = [root]
    found = collections.defaultdict(list)
    while stack:
        o = stack.pop()
        if o is None or isinstance(o, (bool, int, float, str, bytes, BaseModel, type)) or id(o) in seen:
            continue
        seen.add(id(o))
        found[type(o)].append(o)
        if isinstance(o, np.ndarray):
            continue
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
            continue
        if isinstance(o, (list, tuple, set, frozenset, collections.deque)):
            stack.extend(o)
            continue
        if hasattr(o, "__dict__"):
            stack.extend(vars(o).values())
        for cls in type(o).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if hasattr(o, slot):
                    stack.append(getattr(o, slot))
    return found


@pytest.fixture(scope="module")
def busy_env():
    """The shipped hour after 10 minutes with only 4 replicas at the lowest clock (long queues)."""
    env = CommitServeEnv(HOUR_SCENARIO)
    env.reset(seed=0)
    for _ in range(10):
        obs, r, term, trunc, info = env.step({"active": 4, "clock": 0})
        assert env.observation_space.contains(obs)
    env._last = (obs, info)
    return env


def test_snapshot_holds_only_arrived_requests_with_predicted_lengths(busy_env):
    """The snapshot's engine copy is made on the compiled loop from the pool's arrays: nothing reachable from it is a
    request object, a replica or GPU of the pool, the truth, the noise, the trace or an array as long as the trace;
    the copy itself holds the arrived requests with predicted lengths and visible deadlines."""
    env = busy_env
    pool = env.pool
    snap = env.snapshot()
    assert snap.t == pool.now == pytest.approx(600.0)
    assert snap.n_requests > 100, "expected a loaded pool"
    found = _walk(snap)
    for leak in (Req, RequestTable, TruthSource, NoiseSource, Replica, GPU):
        assert not found[leak], leak.__name__
    assert all(p is not pool for p in found[Pool])
    lengths = [a.shape[0] if a.ndim else 1 for a in found[np.ndarray]]
    assert max(lengths) < len(env.table) // 10, "an array near the trace's length is reachable"
    assert all(len(x) < len(env.table) // 10 for x in found[list])
    assert snap._engine.table is None
    req = snap.requests
    assert np.all(req.arrival_s <= pool.now) and np.all((0 <= req.slot) & (req.slot < pool.arrived))
    # hidden lengths: the prediction (at least one more token than generated), never the truth
    hidden = np.maximum(pool.pred_out[req.slot], req.generated_tokens + 1)
    assert np.array_equal(req.output_tokens, hidden)
    assert np.count_nonzero(hidden != pool.out_tokens[req.slot]) > len(req) // 2
    assert np.array_equal(req.deadline_s, pool.visible_deadline[req.slot])
    rows = snap._engine._ks.view_rows()  # (what the copy runs to: the same)
    assert np.array_equal(rows["slot"], req.slot) and np.array_equal(rows["output_tokens"], hidden)
    assert np.array_equal(rows["deadline_s"], req.deadline_s)


def test_recent_arrivals_are_causal_and_predicted(busy_env):
    env = busy_env
    pool = env.pool
    now = pool.now
    window = 120.0
    rec = env.recent_arrivals(window)
    assert len(rec) > 10
    assert np.all(rec.arrival_s <= now + window + 1e-9)
    assert np.all(rec.arrival_s >= now - 1e-9)  # shifted to replay from now on
    # request ids are the source's; map them to engine slots (rows of the served table)
    assert np.all(np.diff(env.table.request_id) > 0)
    ids = np.searchsorted(env.table.request_id, rec.request_id)
    np.testing.assert_array_equal(env.table.request_id[ids], rec.request_id)
    assert np.all(ids < pool.arrived)
    orig = env.table.arrival_s[ids]
    assert np.all(orig <= now) and np.all(orig >= now - window - 1e-9)
    np.testing.assert_array_equal(rec.output_tokens, pool.pred_out[ids])
    assert np.count_nonzero(rec.output_tokens != pool.out_tokens[ids]) > len(rec) // 2
    assert np.all(rec.arrival_s - orig == pytest.approx(window))


def _burst_at_boundary(scen_dir: Path, name: str, lengths: str) -> Path:
    """20 requests arrive 1 s before the first boundary: one replica cannot have finished them at 600 s."""
    t = [0.0] + [599.0] * 20 + [3500.0]
    trace = write_trace(scen_dir / "burst.csv", t, [8] * len(t), [30] * len(t))
    return write_scenario(scen_dir, name, workload={"trace": str(trace)}, horizon_hours=1, commitment={"mj": [0.2]},
                          observation={"lengths": lengths, "length_error_sigma": 0.5})


@pytest.mark.parametrize("lengths", ["predicted", "oracle"])
def test_snapshot_lengths_follow_observation_setting(scen_dir, lengths):
    env = CommitServeEnv(str(_burst_at_boundary(scen_dir, f"toy-burst-{lengths}", lengths)))
    env.reset(seed=0)
    env.step({"active": 1, "clock": 0})
    snap = env.snapshot()
    rows = snap._engine._ks.view_rows()  # (the lengths the engine copy runs to)
    slot, out, gen = rows["slot"], rows["output_tokens"], rows["generated_tokens"]
    assert len(slot) >= 10 and snap.n_requests == len(slot) and np.array_equal(snap.requests.output_tokens, out)
    pool = env.pool
    assert np.all(rows["arrival_s"] <= pool.now) and np.all(slot < pool.arrived)
    if lengths == "oracle":
        assert np.all(out == pool.out_tokens[slot]) and np.all(out == 30)
    else:
        assert np.array_equal(out, np.maximum(pool.pred_out[slot], gen + 1))
        assert np.any(out != 30)
    rec = env.recent_arrivals(600.0)
    np.testing.assert_array_equal(rec.request_id, np.arange(pool.arrived))  # a trace file: ids are rows
    truth = pool.out_tokens[rec.request_id]
    if lengths == "oracle":
        np.testing.assert_array_equal(rec.output_tokens, truth)
    else:
        assert np.any(rec.output_tokens != truth)


def test_info_is_scalars_and_hourly_lists(busy_env):
    _, info = busy_env._last
    for k, v in info.items():
        if k == "settlement":
            assert all(isinstance(x, (int, float)) for x in v.values())
        elif k == "slo_by_hour":
            assert all(len(x) == busy_env.H for x in v.values())
        elif k == "miss_fraction_by_hour":
            assert len(v) == busy_env.H and all(isinstance(x, float) and 0.0 <= x <= 1.0 for x in v)
        else:
            assert isinstance(v, (int, float, np.integer, np.floating)), (k, type(v))


def test_observations_stay_in_space(three, scen_dir):
    assert len(OBS_FEATURES) == 16
    for path, policy in ((three, varied_policy), (toy_miss(scen_dir), lambda k: {"active": 1, "clock": 0})):
        env = CommitServeEnv(str(path))
        _, _, observations = run_episode(env, policy)
        for obs in observations:
            assert obs.dtype == np.float32 and obs.shape == (16,)
            assert env.observation_space.contains(obs), obs
            assert np.all(np.isfinite(obs))


# ------------------------------------------------------------------------------------------ 4. determinism
def test_same_seed_same_numbers_bit_for_bit(three):
    a = run_episode(CommitServeEnv(str(three)), varied_policy, seed=5)
    b = run_episode(CommitServeEnv(str(three)), varied_policy, seed=5)
    assert a[0] == b[0]
    assert a[1] == b[1]
    assert all(np.array_equal(x, y) for x, y in zip(a[2], b[2]))


def test_reset_twice_on_same_env_reproduces(three):
    env = CommitServeEnv(str(three))
    a = run_episode(env, varied_policy, seed=11)
    hist_a = list(env.history)
    b = run_episode(env, varied_policy, seed=11)
    assert a[0] == b[0] and a[1] == b[1]
    assert all(np.array_equal(x, y) for x, y in zip(a[2], b[2]))
    assert env.history == hist_a


def test_different_seed_different_energies(three):
    env = CommitServeEnv(str(three))
    run_episode(env, varied_policy, seed=1)
    e1 = env.hour_energy_j.copy()
    run_episode(env, varied_policy, seed=2)
    e2 = env.hour_energy_j.copy()
    assert not np.array_equal(e1, e2)


# ------------------------------------------------------------------------------------------ 5. checkers
def test_gymnasium_check_env_without_warnings():
    """On the unwrapped env of ``gym.make`` (which carries a spec; a directly constructed env has none, and
    gymnasium then warns that it cannot test the other render modes)."""
    from gymnasium.utils.env_checker import check_env

    env = gym.make(f"commitenv/{HOUR_SCENARIO}-v0", render_mode="rgb_array")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env.close()


def test_gymnasium_check_env_on_toy_scenario(three):
    """Any scenario file can be made through a registered id by overriding the ``scenario`` kwarg."""
    from gymnasium.utils.env_checker import check_env

    env = gym.make(f"commitenv/{HOUR_SCENARIO}-v0", scenario=str(three))
    assert env.unwrapped.H == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


def test_stable_baselines3_check_env_with_flat_actions():
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_checker import check_env

    env = FlatActionWrapper(CommitServeEnv(HOUR_SCENARIO))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env, warn=True)


def test_flat_action_mapping(three):
    env = FlatActionWrapper(CommitServeEnv(str(three)))
    assert env.action_space == gym.spaces.MultiDiscrete([2, 2])
    assert env.action(np.array([0, 0])) == {"active": 1, "clock": 0}
    assert env.action(np.array([1, 1])) == {"active": 2, "clock": 1}
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.array([0, 0]))
    assert info["active"] == 1 and info["clock_mhz"] == 500
    with pytest.raises(ValueError, match="flat action"):
        env.action(np.array([0, 0, 0]))
    with pytest.raises(TypeError, match="Dict"):
        FlatActionWrapper(gym.make("CartPole-v1"))


def test_render_rgb_array(three):
    env = gym.make(f"commitenv/{HOUR_SCENARIO}-v0", render_mode="rgb_array")
    env.reset(seed=0)
    env.step({"active": 32, "clock": 3})
    img = env.render()
    assert isinstance(img, np.ndarray) and img.ndim == 3 and img.shape[2] == 3 and img.dtype == np.uint8
    assert img.shape[0] > 10 and img.shape[1] > 10
    env.close()
    # multi-hour toy env renders too, and render_mode None renders nothing
    toy = CommitServeEnv(str(three), render_mode="rgb_array")
    run_episode(toy, varied_policy)
    img = toy.render()
    assert img.dtype == np.uint8 and img.shape[2] == 3
    assert CommitServeEnv(str(three)).render() is None
    with pytest.raises(ValueError, match="render_mode"):
        CommitServeEnv(str(three), render_mode="human")


# ------------------------------------------------------------------------------------------ 6. invalid actions
@pytest.mark.parametrize(
    "action, match",
    [
        ({"active": 0, "clock": 0}, r"active.*1\.\.2.*got 0"),
        ({"active": 3, "clock": 0}, r"active.*1\.\.2.*got 3"),
        ({"active": 1, "clock": -1}, r"clock.*0\.\.1.*got -1"),
        ({"active": 1, "clock": 2}, r"clock.*0\.\.1.*got 2"),
        ({"active": 1}, r"keys 'active' and 'clock'"),
        ({"clock": 1}, r"keys 'active' and 'clock'"),
        ([1, 1], r"expected a dict"),
        (np.array([1, 1]), r"expected a dict"),
        (None, r"expected a dict"),
        ({"active": "two", "clock": 0}, r"must be integers"),
        ({"active": [1, 2], "clock": 0}, r"must be integers"),
    ],
)
def test_invalid_actions_raise_value_error(three, action, match):
    env = CommitServeEnv(str(three))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=match):
        env.step(action)
    # the rejected action changed nothing: the episode continues from the same interval
    assert env.k == 0
    env.step({"active": 2, "clock": 1})
    assert env.k == 1


def test_non_integral_action_is_rejected(three):
    env = CommitServeEnv(str(three))
    env.reset(seed=0)
    for bad in (1.5, 2.0, np.float64(1.0), True):  # a whole float is not in the Discrete space either
        with pytest.raises(ValueError, match="integers"):
            env.step({"active": bad, "clock": 0})
    assert env.k == 0  # nothing moved


def test_numpy_integer_actions_are_accepted(three):
    env = CommitServeEnv(str(three))
    env.reset(seed=0)
    _, _, _, _, info = env.step({"active": np.int64(1), "clock": np.array(0)})
    assert info["active"] == 1 and info["clock_mhz"] == 500


def test_step_before_reset_and_after_termination_raise(three):
    env = CommitServeEnv(str(three))
    with pytest.raises(RuntimeError, match="before reset"):
        env.step({"active": 1, "clock": 0})
    with pytest.raises(RuntimeError, match="before reset"):
        env.snapshot()
    with pytest.raises(RuntimeError, match="before reset"):
        env.recent_arrivals(60.0)
    run_episode(env, varied_policy)
    with pytest.raises(RuntimeError, match="episode ended"):
        env.step({"active": 1, "clock": 0})
    env.reset(seed=0)
    env.step({"active": 1, "clock": 0})


def test_initial_configuration_from_scenario(scen_dir):
    path = toy_three_hour(scen_dir, name="toy-initial", initial={"active": 1, "clock_mhz": 500})
    env = CommitServeEnv(str(path))
    _, info = env.reset(seed=0)
    assert info["active"] == 1 and info["clock_mhz"] == 500
    assert env.pool.active_count() == 1


# ------------------------------------------------------------------------------------------ 7. actuation delay
def _quiet(scen_dir: Path, delay: float) -> Path:
    """One hour, noise off, a tiny request at 0 and the next at 3000 s: the pool idles during 0..1200 s."""
    trace = write_trace(scen_dir / "quiet.csv", [0.0, 3000.0, 3500.0], [5, 5, 5], [3, 3, 3])
    return write_scenario(scen_dir, f"toy-delay-{int(delay)}", workload={"trace": str(trace)}, horizon_hours=1,
                          commitment={"mj": [0.2]}, actuation_delay_s=delay,
                          noise={"time_sigma": 0.0, "energy_sigma": 0.0})


def test_actuation_delay_applies_change_at_t0_plus_delay(scen_dir, monkeypatch):
    calls: list[tuple[str, float]] = []
    real_active, real_clock = Pool.set_active, Pool.set_clock

    def spy_active(self, t, count, model=0):
        calls.append(("active", t))
        return real_active(self, t, count, model)

    def spy_clock(self, t, mhz, gpus=None):
        calls.append(("clock", t))
        return real_clock(self, t, mhz, gpus)

    monkeypatch.setattr(Pool, "set_active", spy_active)
    monkeypatch.setattr(Pool, "set_clock", spy_clock)
    energy = {}
    for d in (0.0, 100.0, 300.0):
        env = CommitServeEnv(str(_quiet(scen_dir, d)))
        env.reset(seed=0)
        calls.clear()
        _, _, _, _, i0 = env.step({"active": 2, "clock": 1})  # the initial configuration: nothing to apply
        assert calls == []
        _, _, _, _, i1 = env.step({"active": 1, "clock": 0})  # second interval [600, 1200)
        assert calls == [("active", 600.0 + d), ("clock", 600.0 + d)]
        energy[d] = i1["interval_energy_j"]
        assert i1["active"] == 1 and i1["clock_mhz"] == 500
    # idle power: 2 x 50 W before, 40 W (low-clock active idle) + 20 W (standby) after the change
    assert energy[0.0] == pytest.approx(600 * 60.0, rel=1e-9)
    assert energy[100.0] - energy[0.0] == pytest.approx(100 * 40.0, rel=1e-9)
    assert energy[300.0] - energy[0.0] == pytest.approx(300 * 40.0, rel=1e-9)


def test_actuation_delay_in_context_and_schema(scen_dir):
    from commitenv.scenarios import ScenarioError, load_scenario

    from commitenv_controllers import ControllerContext

    env = CommitServeEnv(str(_quiet(scen_dir, 100.0)))
    assert ControllerContext.from_env(env).actuation_delay_s == 100.0
    bad = _quiet(scen_dir, 600.0)
    with pytest.raises(ScenarioError, match="actuation_delay_s"):
        load_scenario(str(bad))
