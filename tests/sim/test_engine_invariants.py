"""Engine invariants on random small workloads (fixed seeds): energy conservation of the meter against the step
log, every request finishing exactly once, token conservation with recomputation read from the log, TTFT <=
finish, causality (nothing starts before its arrival; nothing finishes faster than its reference latency)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from helpers.reference import ReferencePool
from helpers.profiles import toy_profile

from commitenv.sim import EngineOptions, NoiseSpec, PoolLayout
from commitenv.workload.table import make_table

IDLE_W = 50.0


def random_pool(seed, n_rep, n, rate, closed_form=True, sched=None, noise=NoiseSpec(0, 0)):
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1.0 / rate, n))
    prompt = rng.integers(1, 50, n)
    out = rng.integers(1, 50, n)  # the engine clamps prompt + out to the context limit (64)
    pool = ReferencePool(
        toy_profile(scheduler=sched or {}),
        PoolLayout.single(n_rep),
        EngineOptions(noise=noise, log_steps=True, closed_form=closed_form, seed=seed),
    )
    pool.attach(make_table(arr, prompt, out))
    return pool, arr, prompt


SEEDS = [(11, 1, 30, 30.0), (12, 2, 50, 60.0), (13, 3, 60, 120.0), (14, 2, 40, 5.0)]


def per_slot_history(log):
    hist = defaultdict(list)
    for e in log:
        for s, k, c in zip(e.slots, e.new_tokens, e.computed_before):
            hist[s].append((e.t0, e.t1, k, c, e.n_steps))
    return hist


@pytest.mark.parametrize("closed_form", [True, False], ids=["closed", "step"])
@pytest.mark.parametrize("seed,n_rep,n,rate", SEEDS)
def test_invariants(seed, n_rep, n, rate, closed_form):
    pool, arr, prompt = random_pool(seed, n_rep, n, rate, closed_form)
    t_end = float(arr[-1]) + 20.0
    # advance in a few uneven chunks, with settles (the environment's boundaries)
    for t in np.linspace(0.0, t_end, 7)[1:]:
        pool.run_until(float(t))
        pool.settle(float(t))
    out = pool.out_tokens

    # every request finishes exactly once
    assert pool.completed == n and pool.live == 0
    assert np.all(np.isfinite(pool.finish_t))
    hist = per_slot_history(pool.log)
    assert sorted(hist) == list(range(n))
    for s, h in hist.items():
        # nothing of a request is scheduled after its completion, and its last step ends at its finish time
        assert max(t1 for _, t1, *_ in h) == pytest.approx(pool.finish_t[s], abs=1e-12)
        # causality: nothing runs before arrival; first token before (or at) finish
        assert min(t0 for t0, *_ in h) >= arr[s] - 1e-12
        assert arr[s] < pool.first_t[s] <= pool.finish_t[s]

    # token conservation, recomputation read from the log
    for s, h in hist.items():
        computed = 0
        recomputed = 0
        total = 0
        for t0, t1, k, c, m in h:
            if c != computed:
                assert c == 0, "computed tokens only ever drop to 0 (recompute preemption)"
                recomputed += computed
                computed = 0
            computed += k * m
            total += k * m
        assert total == prompt[s] + out[s] - 1 + recomputed
        assert (recomputed > 0) == (pool.preemptions[s] > 0)

    # energy: meter == sum of step energies + idle time x idle power, per GPU
    busy = np.zeros(n_rep)
    steps_e = np.zeros(n_rep)
    for e in pool.log:
        busy[e.gpu] += e.t1 - e.t0
        steps_e[e.gpu] += e.energy_j
    expected = steps_e + IDLE_W * (t_end - busy)
    assert pool.gpu_energy_j(t_end) == pytest.approx(expected, abs=1e-9)
    assert pool.energy_j(t_end) == pytest.approx(expected.sum(), abs=1e-9)

    # segments on a replica never overlap
    by_rep = defaultdict(list)
    for e in pool.log:
        by_rep[e.replica].append((e.t0, e.t1))
    for segs in by_rep.values():
        for (a0, a1), (b0, b1) in zip(segs, segs[1:]):
            assert a1 <= b0 + 1e-12 and a0 < a1

    # never faster than the standalone reference latency at the reference clock
    assert np.all(pool.finish_t - arr >= pool.lref - 1e-9)


def test_random_cases_preempt():
    pre = 0
    for seed, n_rep, n, rate in SEEDS:
        pool, arr, _ = random_pool(seed, n_rep, n, rate)
        pool.run_until(float(arr[-1]) + 20)
        pre += int(pool.preemptions.sum())
    assert pre > 0


def test_settle_changes_neither_outcome_nor_meter():
    a, arr, _ = random_pool(21, 2, 40, 80.0)
    b, _, _ = random_pool(21, 2, 40, 80.0)
    t_end = float(arr[-1]) + 20
    for t in np.arange(0.05, t_end, 0.0731):
        a.run_until(float(t))
        e_before = a.energy_j(float(t))
        a.settle(float(t))
        assert a.energy_j(float(t)) == pytest.approx(e_before, abs=1e-9)
        b.run_until(float(t))
        assert a.energy_j(float(t)) == pytest.approx(b.energy_j(float(t)), abs=1e-9)
    a.run_until(t_end)
    b.run_until(t_end)
    assert a.finish_t.tolist() == pytest.approx(b.finish_t.tolist(), abs=1e-9)
    assert a.energy_j(t_end) == pytest.approx(b.energy_j(t_end), abs=1e-9)


def test_meter_is_monotone_and_never_below_idle_floor():
    pool, arr, _ = random_pool(31, 2, 30, 50.0)
    prev = 0.0
    for t in np.linspace(0.001, float(arr[-1]) + 5, 300):
        pool.run_until(float(t))
        e = pool.energy_j(float(t))
        assert e >= prev - 1e-9
        assert e >= 2 * IDLE_W * float(t) - 1e-9
        prev = e


def test_noisy_run_keeps_energy_and_token_invariants():
    pool, arr, prompt = random_pool(41, 2, 40, 60.0, noise=NoiseSpec(0.05, 0.05))
    t_end = float(arr[-1]) + 20
    pool.run_until(t_end)
    assert pool.completed == 40
    busy = sum(e.t1 - e.t0 for e in pool.log)
    assert pool.energy_j(t_end) == pytest.approx(sum(e.energy_j for e in pool.log) + IDLE_W * (2 * t_end - busy), abs=1e-9)


def _drain_profile():
    """Toy profile with draining-idle power (30/25 W) different from active idle (50/40 W)."""
    clocks = [c.model_dump() for c in toy_profile().clocks]
    clocks[0]["draining_idle_w"] = 25.0
    clocks[1]["draining_idle_w"] = 30.0
    return toy_profile(clocks=clocks, latencies=dict(clock_change_s=0.0, activation_s=0.15))


@pytest.mark.parametrize("seed", [51, 52, 54, 55, 56, 57])
def test_meter_with_lifecycle_and_clock_changes(seed):
    """Per GPU (one replica each): meter == its step energies + idle gaps at the floor of the moment, where the
    floor is standby_w while the replica stands by and the active-idle power of the current clock otherwise
    (a draining replica never idles: it goes to standby as soon as its work is done)."""
    rng = np.random.default_rng(seed)
    prof = _drain_profile()
    n_rep, n = 3, 60
    arr = np.cumsum(rng.exponential(1.0 / 20.0, n))
    pool = ReferencePool(prof, PoolLayout.single(n_rep), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(make_table(arr, rng.integers(1, 40, n), rng.integers(1, 40, n)))
    idle_w = {0: 40.0, 1: 50.0}
    clock_changes = [(0.0, 1)]  # (time, clock index)
    standby = [[] for _ in range(n_rep)]  # per replica: [start, end) intervals
    open_since = [None] * n_rep
    pending_drain = [None] * n_rep  # time a drain started while work was running
    t = 0.0
    t_last = float(arr[-1]) + 0.2
    while t < t_last:
        t = round(t + 0.1, 9)
        pool.run_until(t)
        pool.settle(t)
        for i, r in enumerate(pool.replicas):
            if pending_drain[i] is not None and r.state == 2:
                ends = [e.t1 for e in pool.log if e.replica == i]
                open_since[i] = max([pending_drain[i]] + ends)
                pending_drain[i] = None
        u = rng.random()
        if u < 0.3:
            k = int(rng.integers(1, n_rep + 1))
            pool.set_active(t, k)
            for i, r in enumerate(pool.replicas):
                if r.state == 2 and open_since[i] is None and pending_drain[i] is None:
                    open_since[i] = t  # idle replica went to standby at once
                elif r.state == 1 and pending_drain[i] is None:
                    pending_drain[i] = t
                elif r.state == 3 and open_since[i] is not None:
                    standby[i].append((open_since[i], t))
                    open_since[i] = None
                elif r.state == 0:
                    pending_drain[i] = None  # a draining replica resumed
        elif u < 0.5:
            mhz = int(rng.choice([500, 1000]))
            pool.set_clock(t, mhz)
            clock_changes.append((t, prof.clock_index(mhz)))
    pool.set_active(t, n_rep)
    for i, r in enumerate(pool.replicas):
        if r.state == 3 and open_since[i] is not None:
            standby[i].append((open_since[i], t))
            open_since[i] = None
        elif r.state == 3 and pending_drain[i] is not None:
            ends = [e.t1 for e in pool.log if e.replica == i]
            standby[i].append((max([pending_drain[i]] + ends), t))
            pending_drain[i] = None
    T = t + 30.0
    pool.run_until(T)
    assert pool.completed == n
    assert any(standby), "the random actions should put some replica in standby"

    def floor_energy(i, a, b):
        """Integral of the floor power of replica i's GPU over an idle gap [a, b)."""
        pts = sorted({a, b} | {c for c, _ in clock_changes if a < c < b} | {x for iv in standby[i] for x in iv if a < x < b})
        e = 0.0
        for lo, hi in zip(pts, pts[1:]):
            mid = 0.5 * (lo + hi)
            if any(s0 <= mid < s1 for s0, s1 in standby[i]):
                p = prof.standby_w
            else:
                cidx = [c for tc, c in clock_changes if tc <= mid][-1]
                p = idle_w[cidx]
            e += p * (hi - lo)
        return e

    for i in range(n_rep):
        segs = sorted((e.t0, e.t1, e.energy_j) for e in pool.log if e.gpu == i)
        exp = sum(e for _, _, e in segs)
        cur = 0.0
        for a, b, _ in segs:
            exp += floor_energy(i, cur, a)
            cur = b
        exp += floor_energy(i, cur, T)
        assert pool.gpu_energy_j(T)[i] == pytest.approx(exp, abs=1e-9)


def test_router_counter_matches_queues_after_a_busy_run():
    """The router's cached unfinished count equals running + waiting on every replica, through arrivals,
    completions, preemptions and active-set changes."""
    import numpy as np

    from commitenv.sim import EngineOptions, NoiseSpec, PoolLayout
    from commitenv.workload.table import make_table

    rng = np.random.default_rng(11)
    n = 80
    arr = np.sort(rng.uniform(0, 2.0, n))
    pool = ReferencePool(toy_profile(scheduler=dict(kv_capacity_tokens=64)), PoolLayout.single(3),
                EngineOptions(noise=NoiseSpec(0, 0)))
    pool.attach(make_table(arr, rng.integers(1, 30, n), rng.integers(1, 20, n)))
    for k, t in enumerate(np.arange(0.1, 3.0, 0.1)):
        pool.run_until(t)
        pool.set_active(t, 1 + k % 3)
        for rep in pool.replicas:
            assert rep.unf == len(rep.running) + len(rep.waiting)
    pool.run_until(float("inf"))
    assert all(rep.unf == 0 for rep in pool.replicas)
    assert pool.preemptions.sum() > 0
