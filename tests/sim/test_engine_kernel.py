"""The compiled event loop (`commitenv.sim.kernel`) against the Python loop of `Pool` on the same requests, exactly:
the same events, completion times, states and GPU meters at every interval boundary on benchmark hours and stressed
pools (long queues, KV pressure with thousands of recompute preemptions), under random active counts and clocks;
the hand-over to the Python loop (`export_to`), the environment with the kernel on and off, and hindsight forks."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from commitenv.envs import CommitServeEnv
from commitenv.scenarios.build import engine_options
from commitenv.sim import kernel
from commitenv.sim.kernel import KernelState
from commitenv.sim.local import FcfsLocal
from commitenv.sim.pool import EngineOptions, Pool, PoolLayout


@pytest.fixture(autouse=True)
def python_pools(monkeypatch):
    """The pools here run the Python loop (the reference); each test drives its own `KernelState` beside them."""
    monkeypatch.setattr(kernel, "ENABLED", False)


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


@pytest.mark.parametrize("heap", ["heap", "tiny-heap"])
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_kernel_equals_the_pool(case, heap):
    """(``tiny-heap``: the event heap starts at its minimum and is grown between events, many times.)"""
    scenario, seed, gpus, clock, kv_extra, min_preempt = CASES[case]
    pool = _pool(scenario, seed, gpus, clock, kv_extra)
    ks = KernelState(pool, heap_size=1 if heap == "tiny-heap" else 0)
    size0 = ks.ht.shape[0]
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
    if heap == "tiny-heap":
        assert ks.ht.shape[0] > size0


@pytest.mark.parametrize("case", ["h200-hour", "h200-hour-3gpu-kv-pressure"])
def test_kernel_equals_the_pool_under_clock_changes(case):
    """A random clock every interval (some repeated, some changed back before they apply): the same events, the same
    completions and meters as the pool's `set_clock` and clock events."""
    scenario, seed, gpus, clock, kv_extra, _ = CASES[case]
    pool = _pool(scenario, seed, gpus, clock, kv_extra)
    ks = KernelState(pool)
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


@pytest.mark.parametrize("mode", ["", "settled", "step-by-step"])
@pytest.mark.parametrize("case", ["h200-hour", "h20-hour-8gpu-lowest-clock", "h200-hour-3gpu-kv-pressure"])
def test_kernel_equals_the_pool_under_lifecycle_and_clock_changes(case, mode):
    """A random active count and clock every interval, sometimes twice (a wake cancelled before it ends, a drain
    undone): the same events, states, completions and meters as the pool's `set_active` (draining, standby, wakes
    after the activation latency, re-routing of queued requests) and `set_clock`; settled at every boundary as the
    environment does, or not; or step by step (`EngineOptions.closed_form` off: every decode step its own event)."""
    scenario, seed, gpus, clock, kv_extra, _ = CASES[case]
    pool = _pool(scenario, seed, gpus, clock, kv_extra)
    settle = mode != ""
    pool.opt.closed_form = mode != "step-by-step"
    ks = KernelState(pool)
    R = len(pool.replicas)
    mhz = [lvl.mhz for lvl in pool.profiles[0].clocks]
    rng = np.random.default_rng(seed + 1)
    states = set()
    for k in range(60):
        t = 60.0 * k
        for dt in ((0.0, 1.5) if k % 3 == 0 else (0.0,)):
            count = int(rng.integers(1, R + 1))
            pool.set_active(t + dt, count)
            ks.set_active(t + dt, count)
            f = int(mhz[rng.integers(len(mhz))])
            pool.set_clock(t + dt, f)
            ks.set_clock(t + dt, f)
            if dt == 0.0:
                pool.run_until(t + 1.5)
                ks.advance(t + 1.5)
                assert [r.state for r in pool.replicas] == ks.ri[:, 10].tolist(), f"states at {t + 1.5}"
                states.update(r.state for r in pool.replicas)
        pool.run_until(t + 60.0)
        ks.advance(t + 60.0)
        if settle:
            pool.settle(t + 60.0)
            ks.settle(t + 60.0)
        assert [r.state for r in pool.replicas] == ks.ri[:, 10].tolist(), f"states at {t + 60}"
        states.update(r.state for r in pool.replicas)
        assert [r.unf for r in pool.replicas] == ks.ri[:, 0].tolist()
        assert np.array_equal(np.array([g.meter(t + 60.0) for g in pool.gpus]), ks.meter(t + 60.0)), f"meters at {t + 60}"
    pool.run_until(math.inf)
    ks.advance(math.inf)
    assert ks.events == pool.events
    assert np.array_equal(np.nan_to_num(pool.finish_t, nan=-1.0), np.nan_to_num(ks.finish_t, nan=-1.0))
    assert {0, 1, 2, 3} <= states  # active, draining, standby and waking were all visited


@pytest.mark.parametrize("case", ["h200-hour", "h200-hour-3gpu-kv-pressure"])
def test_export_hands_the_state_back_to_the_python_engine(case):
    """Kernel for the first 30 intervals, then exported into its pool and continued by `Pool`: every result equals
    a pool that ran the Python engine throughout (random active counts and clocks, settled at every boundary)."""
    scenario, seed, gpus, clock, kv_extra, _ = CASES[case]
    a = _pool(scenario, seed, gpus, clock, kv_extra)
    b = _pool(scenario, seed, gpus, clock, kv_extra)
    ks = KernelState(b)
    R = len(a.replicas)
    mhz = [lvl.mhz for lvl in a.profiles[0].clocks]
    rng = np.random.default_rng(seed + 2)
    for k in range(60):
        t = 60.0 * k
        count, f = int(rng.integers(1, R + 1)), int(mhz[rng.integers(len(mhz))])
        for p in (a, b if k >= 30 else ks):
            p.set_active(t + 0.5, count)
            p.set_clock(t + 0.5, f)
        a.run_until(t + 60.0)
        a.settle(t + 60.0)
        if k < 30:
            ks.advance(t + 60.0)
            ks.settle(t + 60.0)
            if k == 29:
                ks.export_to(b)
        else:
            b.run_until(t + 60.0)
            b.settle(t + 60.0)
    a.run_until(math.inf)
    b.run_until(math.inf)
    assert a.events == b.events and a.now == b.now
    for name in ("finish_t", "first_t", "replica_of", "preemptions"):
        assert np.array_equal(np.nan_to_num(getattr(a, name), nan=-1.0), np.nan_to_num(getattr(b, name), nan=-1.0)), name
    assert a.energy_j() == b.energy_j()


def test_kernel_refuses_what_it_does_not_cover():
    """A pool with a prefix cache (a tree of hash blocks the compiled loop does not hold) stays on the Python loop."""
    from commitenv.sim.prefix_cache import PrefixCache

    env = CommitServeEnv("bench-h200-hour-fixed-a30")
    env.reset(seed=100000)
    pool = Pool(env.profiles, PoolLayout.single(4), EngineOptions(seed=0))
    pool.attach(env.table)
    rep = pool.replicas[0]
    rep.pcache = PrefixCache(16, rep.bs, rep.free_blocks)
    assert not KernelState.covers(pool)
    with pytest.raises(ValueError, match="covered subset"):
        KernelState(pool)


@pytest.mark.parametrize("block", [4096, 7], ids=["block-4096", "block-7"])
def test_kernel_equals_the_pool_under_the_legacy_noise(monkeypatch, block):
    """The legacy per-segment noise (the ``ideal`` level): each replica's stream of draws is consumed in the
    Python loop's order, a segment at a time, so the kernel equals the pool bit for bit; with blocks of 7 draws the
    kernel runs out and refills between events thousands of times. A hand-back mid-run returns the unused draws
    to the source, and the Python loop continues with them."""
    from commitenv.sim.noise import NoiseSource

    monkeypatch.setattr(NoiseSource, "_BLOCK", block)
    env = CommitServeEnv("bench-h200-hour-fixed-a30")
    env.reset(seed=100001)
    pools = [Pool(env.profiles, PoolLayout.single(4), EngineOptions(seed=5)) for _ in range(3)]
    for p in pools:
        p.attach(env.table)
        assert isinstance(p.noise, NoiseSource) and p.truth is None
    a, b, c = pools
    for p in (a, b, c):  # (a minute on the Python loop: the kernel takes over part-used buffers)
        p.run_until(60.0)
    monkeypatch.setattr(kernel, "ENABLED", True)
    assert b.use_kernel() and c.use_kernel()
    refills = 0
    rng = np.random.default_rng(1)
    for k in range(2, 62):
        t = 60.0 * k
        _drive((a, b, c), rng, 4, [lvl.mhz for lvl in a.profiles[0].clocks], t - 59.5)
        ends = b._ks.ri[:, kernel.R_NEND].copy()
        for p in (a, b, c):
            p.run_until(t)
            p.settle(t)
        refills += int((b._ks.ri[:, kernel.R_NEND] != ends).any())
        if k == 30:
            c.replicas  # hands c back to the Python loop
            assert c._ks is None
        assert a.energy_j() == b.energy_j() == c.energy_j(), f"meters at t={t}"
    assert b._ks is not None
    for p in pools:
        p.run_until(math.inf)
    assert _results(a) == _results(b) == _results(c)
    assert refills >= (30 if block == 7 else 0)
    # the sources continue identically: the kernel took nothing it did not use or give back
    b.replicas
    assert [a.noise.draw(x) for x in range(4) for _ in range(3)] == [b.noise.draw(x) for x in range(4) for _ in range(3)]


def _drive(pools, rng, R, mhz, t):
    """The same random active count and clock on every pool at ``t``."""
    count, f = int(rng.integers(1, R + 1)), int(mhz[rng.integers(len(mhz))])
    for p in pools:
        p.set_active(t, count)
        p.set_clock(t, f)


def _twin_pools(case: str, rng_offset: int) -> tuple[Pool, Pool, int, list[int], np.random.Generator]:
    """Two equal pools of ``case`` on the Python loop, their replica count, clock levels (MHz) and the actions' rng."""
    scenario, seed, gpus, clock, kv_extra, _ = CASES[case]
    a = _pool(scenario, seed, gpus, clock, kv_extra)
    b = _pool(scenario, seed, gpus, clock, kv_extra)
    return a, b, len(a.replicas), [lvl.mhz for lvl in a.profiles[0].clocks], np.random.default_rng(seed + rng_offset)


def _results(p: Pool) -> tuple:
    return (p.events, p.now, p.completed, p.live, p.arrived, p.energy_j(),
            *(np.nan_to_num(getattr(p, name), nan=-1.0).tolist() for name in ("finish_t", "first_t", "replica_of",
                                                                               "preemptions")))


@pytest.mark.parametrize("leave_at", [None, 45], ids=["to-the-end", "handed-back"])
@pytest.mark.parametrize("case", ["h200-hour", "h20-hour-8gpu-lowest-clock", "h200-hour-3gpu-kv-pressure"])
def test_a_pool_mid_run_continues_on_the_kernel(monkeypatch, case, leave_at):
    """A pool that served 20 intervals on the Python loop is imported mid-interval (segments in flight, a wake and a
    clock change pending, queues full under KV pressure) and continues on the kernel through `Pool`'s calls: every
    meter reading, completion and result equals a pool that stayed on the Python loop; with ``leave_at`` the state
    is handed back to the Python loop there and the results still agree."""
    a, b, R, mhz, rng = _twin_pools(case, 3)
    monkeypatch.setattr(kernel, "ENABLED", True)
    in_flight = pending = 0
    for k in range(60):
        t = 60.0 * k
        _drive((a, b), rng, R, mhz, t + 0.5)
        for p in (a, b):
            p.run_until(t + 0.7)
        if k >= 20 and b._ks is None and b.live > 0 and leave_at != -1:  # (the first boundary with requests live)
            in_flight = sum(r.seg != 0 for r in b.replicas)
            pending = sum(g.pending_clock is not None for g in b.gpus) + sum(r.state == 3 for r in b.replicas)
            assert b.use_kernel() and b._ks.n_live == b.live
            leave_at = leave_at if leave_at is None else max(leave_at, k + 1)
        if k == leave_at:
            leave_at = -1
            b.replicas  # hands the kernel's state back to the Python loop
            assert b._ks is None
        for p in (a, b):
            p.run_until(t + 60.0)
            p.settle(t + 60.0)
        assert a.energy_j() == b.energy_j(), f"meters at {t + 60}"
        assert a.live == b.live and a.completed == b.completed
    assert (b._ks is not None) == (leave_at is None)  # (-1: handed back)
    assert in_flight > 0 and pending > 0  # the import carried segments and pending events
    for p in (a, b):
        p.run_until(math.inf)
    assert _results(a) == _results(b)


@pytest.mark.parametrize("case", ["h200-hour", "h200-hour-3gpu-kv-pressure"])
def test_what_if_copies_run_on_the_kernel_with_identical_predictions(monkeypatch, case):
    """`simulate` from snapshots of a truth pool (the what-if copy is nominal: energy scaled by the power bias,
    predicted lengths, visible deadlines) gives the same `WhatIf` with the kernel as on the Python loop, for every
    candidate, with and without replayed arrivals and with them tracked to completion."""
    from commitenv.sim import observed_arrivals, simulate, take_snapshot

    scenario, seed, gpus, clock, kv_extra, _ = CASES[case]
    pool = _pool(scenario, seed, gpus, clock, kv_extra)
    R = len(pool.replicas)
    mhz = [lvl.mhz for lvl in pool.profiles[0].clocks]
    rng = np.random.default_rng(seed + 5)
    used = []
    real_use = Pool.use_kernel
    monkeypatch.setattr(Pool, "use_kernel", lambda p: used.append(real_use(p)) or used[-1])
    checked = 0
    for k in range(40):
        _drive((pool,), rng, R, mhz, 60.0 * k + 0.5)
        pool.run_until(60.0 * (k + 1))
        pool.settle(60.0 * (k + 1))
        if k % 13 != 12:
            continue
        snap = take_snapshot(pool)
        replay = observed_arrivals(pool, 120.0)
        for active, f in [(1, mhz[0]), (R, mhz[-1]), ((R + 1) // 2, mhz[len(mhz) // 2])]:
            for arrivals, track in ((None, False), (replay, False), (replay, True)):
                out = {}
                for on in (False, True):
                    monkeypatch.setattr(kernel, "ENABLED", on)
                    used.clear()
                    out[on] = simulate(snap, active, f, 120.0, arrivals, track_arrivals=track)
                    assert used == [on]  # the copy ran where it was meant to
                assert out[True] == out[False]
                checked += 1
    assert checked == 27


def _episode(scenario: str, seed: int, enabled: bool, monkeypatch, snapshot_at: int | None = None):
    """Observations, rewards and the settled cost of one episode with random actions (the kernel on or off); with
    ``snapshot_at`` the controller's snapshot at that step (-1: at every step, as ePACT takes one) makes a kernel pool
    hand over to the Python loop, and the next step's interval takes it back."""
    monkeypatch.setattr(kernel, "ENABLED", enabled)
    env = CommitServeEnv(scenario)
    obs, info = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    out, modes, done, k = [], [], False, 0
    while not done:
        if k == snapshot_at or snapshot_at == -1:
            env.snapshot()
        a = {"active": int(rng.integers(1, env.n_replicas + 1)), "clock": int(rng.integers(len(env.clocks_mhz)))}
        obs, r, done, _, info = env.step(a)
        out.append((obs.copy(), r, info["new_misses"]))
        modes.append(env.pool._ks is not None)
        k += 1
    return out, info["settlement"], modes


@pytest.mark.parametrize("snapshot_at", [None, 20, -1], ids=["no-snapshot", "snapshot-at-20", "snapshot-every-step"])
@pytest.mark.parametrize("scenario", ["bench-h200-hour-fixed-a30", "epact-h200-hour-fixed-a30"], ids=["paper", "ideal"])
def test_the_environment_on_the_kernel_equals_the_python_loop(monkeypatch, scenario, snapshot_at):
    """The env's observations, rewards, misses and settlement with the kernel on equal those of the Python loop,
    bit for bit, with random actions every interval; a snapshot hands over to the Python loop, and the next interval
    imports the state back into the kernel (once, or at every step). At ``ideal`` (the legacy per-segment noise) each
    hand-over returns the unused noise draws to the source and each import takes them again."""
    ref, settle_ref, modes_ref = _episode(scenario, 100003, False, monkeypatch, snapshot_at)
    got, settle_got, modes = _episode(scenario, 100003, True, monkeypatch, snapshot_at)
    assert not any(modes_ref)
    assert all(modes)  # (a snapshot hands the pool over; the next step's interval takes it back)
    assert len(ref) == len(got)
    for (o1, r1, m1), (o2, r2, m2) in zip(ref, got):
        assert np.array_equal(o1, o2) and r1 == r2 and m1 == m2
    assert settle_ref == settle_got


def test_rows_loaded_as_the_clock_nears_them_and_finished_ones_dropped(monkeypatch):
    """With rows loaded only 20 s ahead, the state is compacted again and again (finished requests dropped, the
    live ones re-indexed mid-segment and mid-queue) and grows as queues build: the episode still equals the Python
    loop bit for bit, the state stays a fraction of the workload, and `counts` and `live_state` agree throughout."""
    monkeypatch.setattr(KernelState, "LOOKAHEAD_S", 20.0)
    ref, settle_ref, _ = _episode("bench-h200-hour-fixed-a30", 100001, False, monkeypatch)
    monkeypatch.setattr(kernel, "ENABLED", True)
    env = CommitServeEnv("bench-h200-hour-fixed-a30")
    env.reset(seed=100001)
    rng = np.random.default_rng(100001)
    compactions, largest, done, k = set(), 0, False, 0
    while not done:
        a = {"active": int(rng.integers(1, env.n_replicas + 1)), "clock": int(rng.integers(len(env.clocks_mhz)))}
        obs, r, done, _, info = env.step(a)
        ks = env.pool._ks
        assert ks is not None
        compactions.add(ks.row0)
        largest = max(largest, int(ks.si[kernel.I_N]))
        o, rr, m = ref[k]
        assert np.array_equal(obs, o) and r == rr and info["new_misses"] == m, f"step {k}"
        slots, left = env.pool.live_state()
        assert len(slots) == env.pool.live == env.pool.counts()["waiting"] + env.pool.counts()["running"]
        assert (np.diff(np.sort(slots)) > 0).all() and (left >= 0).all()
        k += 1
    assert info["settlement"] == settle_ref
    assert len(compactions) > 30  # compacted at most steps
    assert largest < len(env.table) // 4


@pytest.mark.parametrize("case", ["h200-hour", "h200-hour-3gpu-kv-pressure"])
def test_closed_form_changed_after_attach_applies_on_the_kernel(monkeypatch, case):
    """`EngineOptions.closed_form` switched off and on again while the kernel runs the pool: the segments started from
    then on follow it as on the Python loop, every meter reading and result agrees, and the pool stays on the
    kernel."""
    a, b, R, mhz, rng = _twin_pools(case, 5)
    monkeypatch.setattr(kernel, "ENABLED", True)
    assert b.use_kernel()
    events = []
    for k in range(45):
        t = 60.0 * k
        _drive((a, b), rng, R, mhz, t + 0.5)
        if k in (15, 30):
            for p in (a, b):
                p.opt.closed_form = k == 30
        for p in (a, b):
            p.run_until(t + 60.0)
            p.settle(t + 60.0)
        assert a.energy_j() == b.energy_j(), f"meters at {t + 60}"
        assert b._ks is not None and b._ks.closed_form == b.opt.closed_form
        events.append(a.events)
    for p in (a, b):
        p.run_until(math.inf)
    assert _results(a) == _results(b)
    per = np.diff(events)
    assert per[15:29].mean() > 1.3 * per[:14].mean()  # step by step: every decode step its own event


def test_the_pool_leaves_the_kernel_at_anything_it_does_not_hold(monkeypatch):
    monkeypatch.setattr(kernel, "ENABLED", True)
    # (a step hook set mid-run does not: tests/sim/test_engine_devices.py)
    for touch in (lambda p: p.replicas, lambda p: p.gpus, lambda p: p.heap, lambda p: p.live_requests()):
        env = CommitServeEnv("bench-h200-hour-fixed-a30")
        env.reset(seed=100000)
        pool = env.pool
        pool.run_until(120.0)
        assert pool._ks is not None
        touch(pool)
        assert pool._ks is None
        pool.run_until(240.0)  # the Python loop continues
        assert pool.now == 240.0


@pytest.mark.parametrize("scenario", ["bench-h200-hour-fixed-a30", "epact-h200-hour-fixed-a30"], ids=["paper", "ideal"])
def test_hindsight_forks_stay_on_the_kernel_and_equal_the_python_loop(monkeypatch, scenario):
    """A fork of a pool the kernel runs stays on the kernel; stepped with the environment's calls it equals a fork
    handed over to the Python loop, both leave the original untouched, and `stop_arrivals` (the oracle's optimistic
    estimate) acts alike on both. At ``ideal`` each fork draws the legacy noise from its own copy of the source."""
    from commitenv.hindsight import fork_pool
    from commitenv.sim.interval import run_interval

    monkeypatch.setattr(kernel, "ENABLED", True)
    env = CommitServeEnv(scenario)
    env.reset(seed=100004)
    rng = np.random.default_rng(4)
    for _ in range(10):
        env.step({"active": int(rng.integers(1, env.n_replicas + 1)), "clock": int(rng.integers(len(env.clocks_mhz)))})
    pool = env.pool
    assert pool._ks is not None
    before = (pool.events, pool.finish_t.copy(), pool.energy_j())
    on_kernel, on_python = fork_pool(pool), fork_pool(pool)
    on_python.replicas  # hands this copy over to the Python loop
    assert on_kernel._ks is not None and on_python._ks is None and pool._ks is not None
    cfg = {id(on_kernel): (env.cfg[0], env.cfg[1]), id(on_python): (env.cfg[0], env.cfg[1])}
    for k in range(10, 40):
        new = (int(rng.integers(1, env.n_replicas + 1)), int(rng.integers(len(env.clocks_mhz))))
        for p in (on_kernel, on_python):
            cfg[id(p)], _ = run_interval(p, cfg[id(p)], new, 60.0 * k + 0.5, 60.0 * (k + 1), env.clocks_mhz)
        assert on_kernel.energy_j() == on_python.energy_j()
    for p in (on_kernel, on_python):
        p.stop_arrivals()
        p.run_until(math.inf)
    assert on_kernel.events == on_python.events and on_kernel.now == on_python.now
    assert np.array_equal(np.nan_to_num(on_kernel.finish_t, nan=-1.0), np.nan_to_num(on_python.finish_t, nan=-1.0))
    assert np.isnan(on_kernel.finish_t[on_kernel.arrived:]).all()  # nothing arrived after the stop
    assert (pool.events, pool.energy_j()) == (before[0], before[2])
    assert np.array_equal(np.nan_to_num(pool.finish_t, nan=-1.0), np.nan_to_num(before[1], nan=-1.0))


@pytest.mark.parametrize("scenario", ["bench-h200-hour-fixed-a30", "epact-h200-hour-fixed-a30"], ids=["paper", "ideal"])
def test_forking_leaves_the_original_run_unchanged(monkeypatch, scenario):
    """An environment whose pool is forked (and the forks stepped, some handed over to the Python loop) every interval
    continues exactly as one never forked: a fork's copy writes nothing into the original's state (nor draws from its
    legacy noise source), and a fork that leaves the kernel gets its own replica and GPU objects."""
    from commitenv.hindsight import fork_pool

    monkeypatch.setattr(kernel, "ENABLED", True)
    monkeypatch.setattr(KernelState, "LOOKAHEAD_S", 30.0)
    envs = [CommitServeEnv(scenario) for _ in range(2)]
    for e in envs:
        e.reset(seed=100002)
    rng = np.random.default_rng(2)
    for k in range(25):
        e0 = envs[0]
        a = {"active": int(rng.integers(1, e0.n_replicas + 1)), "clock": int(rng.integers(len(e0.clocks_mhz)))}
        f = fork_pool(envs[0].pool)
        assert f._ks is not None
        if k % 5 == 4:
            f.replicas  # this fork leaves the kernel (taking copies of the replica and GPU objects it shared)
            assert f._ks is None and envs[0].pool._ks is not None
        f.set_active(f.now, 1)
        f.run_until(f.now + 120.0)
        outs = [e.step(a) for e in envs]
        assert np.array_equal(outs[0][0], outs[1][0]) and outs[0][1:3] == outs[1][1:3], f"step {k}"
    p, q = envs[0].pool, envs[1].pool
    assert (p.events, p.completed, p.live, p.energy_j()) == (q.events, q.completed, q.live, q.energy_j())
    assert np.array_equal(np.nan_to_num(p.finish_t, nan=-1.0), np.nan_to_num(q.finish_t, nan=-1.0))


def test_a_fork_on_the_python_loop_and_its_original_do_not_share_objects(monkeypatch):
    """A fork handed over to the Python loop, then its original handed over too: each runs on its own replica and GPU
    objects, so the fork still equals a twin fork that stayed on the kernel, and the original equals an environment
    never forked."""
    from commitenv.hindsight import fork_pool

    monkeypatch.setattr(kernel, "ENABLED", True)
    envs = [CommitServeEnv("bench-h200-hour-fixed-a30") for _ in range(2)]
    for e in envs:
        e.reset(seed=100004)
    for e in envs:
        e.step({"active": 20, "clock": 1})
    left, twin = fork_pool(envs[0].pool), fork_pool(envs[0].pool)
    left.replicas  # hands this fork over to the Python loop
    envs[0].pool.replicas  # and the original
    assert left._ks is None and twin._ks is not None and envs[0].pool._ks is None
    for k in range(2, 12):
        for p in (left, twin):
            p.set_active(60.0 * k, 10 + k)
            p.run_until(60.0 * (k + 1))
            p.settle(60.0 * (k + 1))
        assert left.energy_j() == twin.energy_j(), f"interval {k}"
        outs = [e.step({"active": 30 - k, "clock": 2}) for e in envs]
        assert outs[0][1:3] == outs[1][1:3]
    assert left.events == twin.events and left.completed == twin.completed


class _CountingFcfs(FcfsLocal):
    """A local policy with state: the plans it made."""

    def __init__(self) -> None:
        self.plans = 0

    def plan(self, view):
        self.plans += 1
        return super().plan(view)


def test_a_pool_with_policies_forks_on_the_kernel_with_its_own_policies(monkeypatch):
    """A pool with a dispatch and a local policy forks on the kernel: the fork's policies are copies (its plans leave
    the original's count alone), and the fork stepped on equals the original stepped the same way, as does a deep
    copy of the pool on the Python loop."""
    from commitenv import hindsight
    from commitenv.sim.dispatch import LeastUnfinished

    monkeypatch.setattr(kernel, "ENABLED", True)
    pool = _pool("bench-h200-hour-fixed-a30", 100002, 3, 0, None)
    pool.dispatch = LeastUnfinished()
    pool.set_local_policy(_CountingFcfs())
    assert pool.use_kernel()
    pool.run_until(30.0)
    policy = pool.local_policies[0]
    made = policy.plans
    fork = hindsight.fork_pool(pool)
    assert fork._ks is not None and pool._ks is not None  # (neither handed back)
    assert fork.dispatch is not pool.dispatch and fork.local_policies[0] is not policy
    assert all(p is fork.local_policies[0] for p in fork.local_policies)  # (one policy on every replica: one copy)
    fork.run_until(90.0)
    assert policy.plans == made and fork.local_policies[0].plans > made
    monkeypatch.setattr(kernel, "ENABLED", False)
    pool.replicas  # (the original handed back to the Python loop: its fork is a deep copy of its objects)
    ref = hindsight.fork_pool(pool)
    assert ref._ks is None and pool._ks is None
    ref.run_until(90.0)
    pool.run_until(90.0)
    for p in (fork, ref):
        assert (p.events, p.completed, p.energy_j(90.0)) == (pool.events, pool.completed, pool.energy_j(90.0))
        assert np.array_equal(p.finish_t, pool.finish_t, equal_nan=True)


@pytest.mark.parametrize("case", ["h20-hour-8gpu-lowest-clock", "h200-hour-3gpu-kv-pressure"])
def test_the_step_log_on_the_kernel_equals_the_python_loop(monkeypatch, case):
    """With a step log (StepSplit's input) and an `on_step` hook, the kernel books the same entries as the Python
    loop, field for field and in order: single steps, decode runs cut by clock changes, arrivals and `settle` (the
    finished part of a run booked alone), recompute preemptions; a pool handed back mid-run continues the log
    seamlessly (its segments in flight carry their entries, `Replica.seg_log`), and one that starts logging with
    segments in flight stays on the Python loop until they end."""
    scenario, seed, gpus, clock, kv_extra, _ = CASES[case]
    a, b, c = (_pool(scenario, seed, gpus, clock, kv_extra) for _ in range(3))
    hooked: list = []
    for p in (a, b, c):
        p.log = []
    b.on_step = hooked.append
    monkeypatch.setattr(kernel, "ENABLED", True)
    monkeypatch.setattr(KernelState, "LOG_ENTRIES", 64)  # (drained between events many times)
    assert b.use_kernel() and c.use_kernel()
    R = len(a.replicas)
    mhz = [lvl.mhz for lvl in a.profiles[0].clocks]
    rng = np.random.default_rng(seed + 5)
    for k in range(1, 61):
        t = 60.0 * k
        _drive((a, b, c), rng, R, mhz, t - 59.5)
        for p in (a, b, c):
            p.run_until(t - 30.0)
        for p in (a, b, c):  # (a second clock change mid-interval cuts the decode runs in flight)
            p.set_clock(t - 30.0, mhz[(k * 7) % len(mhz)])
            p.run_until(t)
            p.settle(t)
        if k == 30:
            c.replicas  # hands c back to the Python loop with segments in flight
            assert c._ks is None and any(r.seg != 0 for r in c.replicas)
        assert len(a.log) == len(b.log) == len(c.log), f"t={t}"
    assert b._ks is not None
    for p in (a, b, c):
        p.run_until(math.inf)
    assert _results(a) == _results(b) == _results(c)
    assert a.log == b.log == c.log == hooked
    runs = [e for e in a.log if e.n_steps > 1]
    assert len(runs) > 100 and len(a.log) - len(runs) > 100
    assert len({e.clock_mhz for e in a.log}) > 1 and any(not all(e.decode) for e in a.log)
    if case.endswith("kv-pressure"):
        assert int(a.preemptions.sum()) > 1000
    # sinks set and removed mid-run: a segment started while nothing records ends unlogged, on both loops (d goes back
    # to the kernel after each change, e stays on the Python loop)
    d, e = (_pool(scenario, seed, gpus, clock, kv_extra) for _ in range(2))
    d.use_kernel()
    sinks: dict[str, list] = {f"{p}{k}": [] for p in "de" for k in "12L"}
    for t, change in ((100.0, "hook 1"), (200.0, "no hook"), (300.0, "hook 2"), (400.0, "log"), (500.0, "no log")):
        for name, p in (("d", d), ("e", e)):
            p.run_until(t)
            if change.startswith("hook"):
                p.on_step = sinks[name + change[-1]].append
            elif change == "no hook":
                p.on_step = None
            else:
                p.log = sinks[name + "L"] if change == "log" else None
        assert d.use_kernel() and d._ks.logging == (change != "no hook")
    for p in (d, e):
        p.run_until(900.0)
    assert d._ks is not None and _results(d) == _results(e)
    assert all(sinks["d" + k] == sinks["e" + k] and len(sinks["d" + k]) > 100 for k in "12L")


def test_stepsplit_replays_run_on_the_kernel_and_equal_the_python_loop(monkeypatch):
    """The scheduler-replay game's coalition runs (StepSplit: fresh engines with a step log, a controller's clock
    and active-set changes replayed) run on the kernel and log the same steps as on the Python loop, so every
    coalition value is the same."""
    from commitenv.attribution import ReplayGame

    env = CommitServeEnv("bench-h200-hour-fixed-a30")
    env.reset(seed=100000)
    window = env.table.take(np.arange(2000, 2160))
    mhz = env.clocks_mhz
    game = ReplayGame(window, env.profiles, PoolLayout.single(3), clock_mhz=mhz[-1],
                      actions=[("clock", window.arrival_s[40], mhz[0]), ("active", window.arrival_s[90], 1),
                               ("active", window.arrival_s[120], 3)])
    rng = np.random.default_rng(0)
    coalitions = [np.arange(160)] + [np.flatnonzero(rng.random(160) < p) for p in (0.2, 0.5, 0.8)]
    for members in coalitions:
        monkeypatch.setattr(kernel, "ENABLED", False)
        ref = game.serve(members)
        monkeypatch.setattr(kernel, "ENABLED", True)
        got = game.serve(members)
        assert ref._ks is None and got._ks is not None
        assert got.log == ref.log and len(ref.log) > 50
        assert any(e.n_steps > 1 for e in ref.log) and len({e.clock_mhz for e in ref.log}) == 2


def test_an_environment_with_attribution_stays_on_the_kernel(monkeypatch):
    """With per-request attribution on (`PoolAttributor`: an `on_step` hook, and at each period's end the parts of
    the segments in flight, `Pool.in_flight`), the environment's pool stays on the kernel from the first interval on,
    and every step's attribution, the bills and the settlement equal those of the Python loop bit for bit."""
    def episode(enabled: bool):
        monkeypatch.setattr(kernel, "ENABLED", enabled)
        env = CommitServeEnv("bench-h200-hour-fixed-a30", attribution=True)
        env.reset(seed=100002)
        rng = np.random.default_rng(2)
        out, modes, done = [], [], False
        while not done:
            a = {"active": int(rng.integers(1, env.n_replicas + 1)), "clock": int(rng.integers(len(env.clocks_mhz)))}
            _, r, done, _, info = env.step(a)
            iv = info["attribution"]["interval"]
            out.append((r, iv["energy_j"], iv["busy_j"], tuple(iv["tenant_j"].values())))
            modes.append(env.pool._ks is not None)
        return out, info["settlement"], env.attributor.own_j.copy(), env.attributor.shared_j.copy(), modes

    ref = episode(False)
    got = episode(True)
    assert not any(ref[4]) and all(got[4])
    assert ref[0] == got[0] and ref[1] == got[1]
    assert np.array_equal(ref[2], got[2]) and np.array_equal(ref[3], got[3]) and ref[2].sum() > 0


def test_step_log_batches_hold_the_same_entries():
    """`StepLogBatch` (the kernel's columns) round-trips a real step log: built from the entries, built by joining
    batches and loose entries in order, the entries read back are the log."""
    from commitenv.sim.pool import StepLogBatch

    env = CommitServeEnv("bench-h200-hour-fixed-a30")
    env.reset(seed=100000)
    pool = Pool(env.profiles, PoolLayout.single(3), EngineOptions(seed=0, log_steps=True))
    pool.attach(env.table)
    pool.run_until(300.0)
    pool.settle(300.0)
    log = pool.log
    assert len(log) > 1000 and any(not all(e.decode) for e in log) and any(e.n_steps > 1 for e in log)
    assert StepLogBatch.of(log).entries() == log
    a, b = len(log) // 3, 2 * len(log) // 3
    joined = StepLogBatch.join([StepLogBatch.of(log[:a]), *log[a:b], StepLogBatch.of(log[b:])])
    assert len(joined) == len(log) and joined.entries() == log
    assert int(joined.count.sum()) == sum(len(e.slots) for e in log)
    with pytest.raises(ValueError, match="decode flags"):
        StepLogBatch.of([dataclasses.replace(log[0], decode=())])
