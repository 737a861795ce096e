"""A pool that takes its requests as they come (`CommitServeEnv.extend_workload` after ``reset(options={"stream":
True})``) serves them exactly as the same workload attached whole: the random terms continue their draws, the
kernel loads the added rows as the clock nears them, misses are found as deadlines pass; bad additions are refused."""

from __future__ import annotations

import numpy as np
import pytest

from commitenv.envs import CommitServeEnv
from commitenv.scenarios import load_scenario
from commitenv.workload import select_rows
from helpers.scenarios import toy_three_hour


def run(scenario, seed: int, streamed: bool, schedule):
    """Every step's reward, the misses, each request's finish and the pool's energy; a streamed run is given each
    interval's arrivals just before the interval (the last interval: the rest)."""
    env = CommitServeEnv(scenario)
    env.reset(seed=seed)
    whole = env.table
    if streamed:
        env.reset(seed=seed, options={"stream": True})
        assert len(env.table) == 0
    rewards, done, k = [], False, 0
    n = env.H * env.K
    while not done:
        if streamed:
            t0, t1 = k * env.dt, ((k + 1) * env.dt if k + 1 < n else np.inf)
            lo, hi = np.searchsorted(whole.arrival_s, [t0, t1], side="left")
            env.extend_workload(select_rows(whole, np.arange(lo, hi)))
        _, r, done, _, _ = env.step(schedule(k, env))
        rewards.append(r)
        k += 1
    return rewards, env.misses, list(env.misses_by_hour), env.pool.finish_t.copy(), env.pool.energy_j()


def same(a, b) -> bool:
    return a[:3] == b[:3] and np.array_equal(a[3], b[3], equal_nan=True) and a[4] == b[4]


def test_a_streamed_paper_hour_equals_the_hour_attached_whole():
    # realism paper: predicted lengths and truth overheads drawn per request, misses known at completion
    sc = load_scenario("bench-h200-hour-fixed-a30")
    schedule = lambda k, env: {"active": 8 + (k % 5) * 4, "clock": k % 3}  # noqa: E731
    whole, streamed = run(sc, 3, False, schedule), run(sc, 3, True, schedule)
    assert whole[1] > 0 and same(whole, streamed)


def test_a_streamed_ideal_run_finds_misses_as_deadlines_pass(tmp_path):
    # realism ideal: misses found as deadlines pass, from rows merged into the deadline order as they come
    sc = load_scenario(toy_three_hour(tmp_path, alpha=1.2, interval_s=300))
    schedule = lambda k, env: {"active": 1, "clock": k % 2}  # noqa: E731
    whole, streamed = run(sc, 0, False, schedule), run(sc, 0, True, schedule)
    assert whole[1] > 0 and same(whole, streamed)


def test_rows_that_arrive_too_early_are_refused(tmp_path):
    env = CommitServeEnv(load_scenario(toy_three_hour(tmp_path)))
    env.reset(seed=0)
    whole = env.table
    env.reset(seed=0, options={"stream": True})
    env.extend_workload(select_rows(whole, np.arange(10, 20)))
    with pytest.raises(ValueError, match="before the pool's last request"):
        env.extend_workload(select_rows(whole, np.arange(5, 8)))
    env.step({"active": 1, "clock": 0})
    late = np.flatnonzero(whole.arrival_s < env.pool.now)[-1]
    with pytest.raises(ValueError, match="before the pool's last request .* or its clock"):
        env.extend_workload(select_rows(whole, np.arange(late, late + 1)))
    assert len(env.table) == 10
