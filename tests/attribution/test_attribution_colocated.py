"""Shares on co-located instances (issue 14): steps of two instances overlap on one GPU and each step's energy
includes the whole GPU's idle floor; the bills split that floor among the steps running at each moment (the
Shapley value of the GPU-level game of the steps, checked here by enumerating coalitions), so they add up to the
meter with a non-negative idle."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from commitenv.attribution.online import PoolAttributor
from commitenv.profiles import load_profile
from commitenv.sim.noise import NoiseSpec
from commitenv.sim.pool import EngineOptions, Instance, Pool, PoolLayout
from commitenv.workload.table import RequestTable

HALVES = PoolLayout(((Instance(0, 0.5), Instance(0, 0.5)),))


def _table(arrivals, prompts, outputs) -> RequestTable:
    n = len(arrivals)
    return RequestTable(arrival_s=np.asarray(arrivals, float), prompt_tokens=np.asarray(prompts),
                        output_tokens=np.asarray(outputs), tenant=np.arange(n, dtype=np.int32) % 2,
                        request_id=np.arange(n), tenant_names=("a", "b"))


def test_bills_and_idle_add_up_to_the_meter_on_a_shared_gpu():
    """The issue's case: two 0.5-share instances on one H100, 5-s periods (idle was -580 J, bills over the meter)."""
    rng = np.random.default_rng(0)
    n = 200
    pool = Pool(load_profile("h100-qwen2.5-7b"), HALVES, EngineOptions(noise=NoiseSpec(0, 0)))
    pool.attach(_table(np.sort(rng.uniform(0, 30, n)), rng.integers(50, 2000, n), rng.integers(10, 300, n)))
    att = PoolAttributor(pool)
    metered = 0.0
    for k in range(1, 9):
        pool.run_until(5.0 * k)
        pool.settle(5.0 * k)
        p = att.close(5.0 * k)
        metered += p.metered_j
        assert p.idle_j >= -1e-9 * p.metered_j, (k, p.idle_j)
        assert p.busy_j + p.idle_j == pytest.approx(p.metered_j, rel=1e-12)
        assert p.tenant_j.sum() == pytest.approx(p.busy_j, rel=1e-12)
    assert att.bills_j.sum() <= metered * (1 + 1e-12)


def _coverage(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of intervals (independently of the attributor's sweep)."""
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def test_floor_split_equals_the_shapley_value_of_the_gpu_game():
    """Two overlapping requests, one per instance (each segment holds one request): a request's bill equals the sum
    over its segments of their Shapley values in v(S) = floor power x |union of S's times| + S's energy above the
    floor, computed by enumerating every coalition of segments."""
    prof = load_profile("h100-qwen2.5-7b")
    pool = Pool(prof, HALVES, EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(_table([0.0, 0.05], [1500, 300], [40, 90]))
    att = PoolAttributor(pool)
    pool.run_until(math.inf)
    pool.settle(pool.now)
    att.close(pool.now)
    log = pool.log
    assert all(len(e.slots) == 1 for e in log) and len({e.replica for e in log}) == 2
    floor_w = prof.clocks[prof.reference_clock_index].active_idle_w
    for e in log:  # both instances active the whole time: the floor power is constant
        assert e.floor_j == pytest.approx(floor_w * (e.t1 - e.t0), rel=1e-9)
    dyn = [e.energy_j - e.floor_j for e in log]
    n = len(log)
    assert n <= 16

    def v(members: tuple[int, ...]) -> float:
        return floor_w * _coverage([(log[k].t0, log[k].t1) for k in members]) + sum(dyn[k] for k in members)

    phi = np.zeros(n)
    for k in range(n):
        others = [j for j in range(n) if j != k]
        for size in range(n):
            w = math.factorial(size) * math.factorial(n - size - 1) / math.factorial(n)
            for c in itertools.combinations(others, size):
                phi[k] += w * (v(c + (k,)) - v(c))
    want = np.zeros(2)
    for k, e in enumerate(log):
        want[e.slots[0]] += phi[k]
    assert att.bills_j == pytest.approx(want, rel=1e-9, abs=1e-9)
    assert sum(want) == pytest.approx(v(tuple(range(n))), rel=1e-12)  # efficiency of the game
