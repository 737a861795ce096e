"""The compiled event loop (`commitenv.sim.kernel`, spike) against `Pool.run_until` on the same requests: the same
events, bit-identical completion times and bit-identical GPU meters at every interval boundary, on benchmark hours
and on stressed pools (long queues, KV pressure with thousands of recompute preemptions)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from commitenv.envs import CommitServeEnv
from commitenv.scenarios.build import engine_options
from commitenv.sim.kernel import KernelState
from commitenv.sim.pool import Pool, PoolLayout


def _pool(scenario: str, seed: int, gpus: int | None, clock: int | None, kv_extra: int | None) -> Pool:
    env = CommitServeEnv(scenario)
    env.reset(seed=seed)
    if gpus is None:
        return env.pool
    pool = Pool(env.profiles, PoolLayout.single(gpus), engine_options(env.scenario, seed),
                clock_mhz=env.clocks_mhz[env._init_clock if clock is None else clock])
    pool.attach(env.table)
    if kv_extra is not None:  # blocks for one request at the context limit plus ``kv_extra``
        sch = pool.profiles[0].scheduler
        for rep in pool.replicas:
            rep.cap_blocks = rep.free_blocks = -(-sch.context_limit // sch.block_size) + kv_extra
    return pool


CASES = {
    "h200-hour": ("bench-h200-hour-fixed-a30", 100000, None, None, None, 0),
    "h20-hour-8gpu-lowest-clock": ("bench-h20-hour-fixed-a30", 100003, 8, 0, None, 0),
    "h200-hour-3gpu-kv-pressure": ("bench-h200-hour-fixed-a30", 100002, 3, 0, 0, 1000),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_kernel_equals_the_pool(case):
    scenario, seed, gpus, clock, kv_extra, min_preempt = CASES[case]
    pool = _pool(scenario, seed, gpus, clock, kv_extra)
    ks = KernelState(pool, horizon_s=400 * 3600)
    for k in range(1, 61):
        t = 60.0 * k
        pool.run_until(t)
        ks.advance(t)
        assert np.array_equal(np.array([g.meter(t) for g in pool.gpus]), ks.meter(t)), f"meters at t={t}"
    pool.run_until(math.inf)
    ks.advance(math.inf)
    assert ks.events == pool.events
    assert np.array_equal(np.nan_to_num(pool.finish_t, nan=-1.0), np.nan_to_num(ks.finish_t, nan=-1.0))
    assert np.isfinite(pool.finish_t[~pool.rejected]).all()
    assert int(ks.qi[:, 6].sum()) == int(pool.preemptions.sum()) >= min_preempt


@pytest.mark.parametrize("case", ["h200-hour", "h200-hour-3gpu-kv-pressure"])
def test_kernel_equals_the_pool_under_clock_changes(case):
    """A random clock every interval (some repeated, some changed back before they apply): the same events, the same
    completions and meters as the pool's `set_clock` and clock events."""
    scenario, seed, gpus, clock, kv_extra, _ = CASES[case]
    pool = _pool(scenario, seed, gpus, clock, kv_extra)
    ks = KernelState(pool, horizon_s=400 * 3600)
    mhz = [lvl.mhz for lvl in pool.profiles[0].clocks]
    rng = np.random.default_rng(seed)
    changes = 0
    for k in range(60):
        t = 60.0 * k
        for dt in (0.0, 0.01):  # a second request soon after the first, often before it applies
            f = int(mhz[rng.integers(len(mhz))])
            pool.set_clock(t + dt, f)
            ks.set_clock(t + dt, f)
            changes += 1
        pool.run_until(t + 60.0)
        ks.advance(t + 60.0)
        assert np.array_equal(np.array([g.meter(t + 60.0) for g in pool.gpus]), ks.meter(t + 60.0)), f"meters at {t + 60}"
        assert [g.clock_idx for g in pool.gpus] == ks.gi[:, 0].tolist()
    pool.run_until(math.inf)
    ks.advance(math.inf)
    assert ks.events == pool.events
    assert np.array_equal(np.nan_to_num(pool.finish_t, nan=-1.0), np.nan_to_num(ks.finish_t, nan=-1.0))


def test_kernel_refuses_what_it_does_not_cover():
    env = CommitServeEnv("bench-h200-hour-fixed-a30")
    env.reset(seed=100000)
    pool = env.pool
    pool.run_until(1.0)
    with pytest.raises(ValueError, match="covered subset"):
        KernelState(pool, horizon_s=3600)
