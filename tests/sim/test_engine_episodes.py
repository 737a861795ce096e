"""The engine over whole episodes: the environment on the compiled loop equals the environment on the reference engine
(tests/helpers/reference) bit for bit, step by step, with random actions, snapshots and the legacy noise; compaction,
the closed form switched mid-run, hindsight forks (exact copies that leave the original untouched, with their own
policies) and step-log batches."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from helpers.reference import step_by_step, use_engine

from commitenv.envs import CommitServeEnv
from commitenv.scenarios.build import engine_options
from commitenv.sim import kernel
from commitenv.sim.kernel import KernelState
from commitenv.sim.local import FcfsLocal
from commitenv.sim.pool import EngineOptions, Pool, PoolLayout


def _episode(scenario: str, seed: int, snapshot_at: int | None = None, steps: int | None = None):
    """Observations, rewards and misses of each step of an episode with random actions (the engine the caller chose),
    and its settlement; with ``snapshot_at`` a controller's snapshot at that step (-1: at every step)."""
    env = CommitServeEnv(scenario)
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    out, done, k = [], False, 0
    while not done and (steps is None or k < steps):
        if k == snapshot_at or snapshot_at == -1:
            env.snapshot()
        a = {"active": int(rng.integers(1, env.n_replicas + 1)), "clock": int(rng.integers(len(env.clocks_mhz)))}
        obs, r, done, _, info = env.step(a)
        out.append((obs.copy(), r, info["new_misses"]))
        k += 1
    return out, info.get("settlement"), env


@pytest.mark.parametrize("snapshot_at", [None, -1], ids=["no-snapshot", "snapshot-every-step"])
@pytest.mark.parametrize("scenario", ["bench-h200-hour-fixed-a30", "epact-h200-hour-fixed-a30"], ids=["paper", "ideal"])
def test_the_environment_equals_the_environment_on_the_reference(monkeypatch, scenario, snapshot_at):
    """Every observation, reward, miss count and the settlement of a full episode with random actions, on the compiled
    loop and on the reference (both step by step), bit for bit; at ``ideal`` under the legacy per-segment noise."""
    step_by_step(monkeypatch)
    use_engine(monkeypatch, reference=True)
    ref, settle_ref, env_ref = _episode(scenario, 100003, snapshot_at)
    use_engine(monkeypatch, reference=False)
    got, settle_got, env = _episode(scenario, 100003, snapshot_at)
    assert type(env_ref.pool).__name__ == "ReferencePool" and type(env.pool) is Pool
    assert len(ref) == len(got) > 10
    for k, ((o1, r1, m1), (o2, r2, m2)) in enumerate(zip(ref, got)):
        assert np.array_equal(o1, o2) and r1 == r2 and m1 == m2, f"step {k}"
    assert settle_ref == settle_got
    assert env.pool.completed > 1000


def test_the_closed_form_episode_agrees_with_the_reference_to_rounding(monkeypatch):
    """With the closed form (the default), the compiled loop's episode matches the step-by-step reference's to
    rounding: the same miss counts, rewards within 1e-9 relative."""
    use_engine(monkeypatch, reference=True)
    ref, settle_ref, _ = _episode("bench-h200-hour-fixed-a30", 100001, steps=20)
    use_engine(monkeypatch, reference=False)
    got, settle_got, _ = _episode("bench-h200-hour-fixed-a30", 100001, steps=20)
    for (o1, r1, m1), (o2, r2, m2) in zip(ref, got):
        assert m1 == m2 and r1 == pytest.approx(r2, rel=1e-9, abs=1e-12)
        assert o1 == pytest.approx(o2, rel=1e-6, abs=1e-9)


def test_rows_loaded_as_the_clock_nears_them_and_finished_ones_dropped(monkeypatch):
    """With rows loaded only 20 s ahead, the state is compacted again and again (finished requests dropped, the
    live ones re-indexed mid-segment and mid-queue) and grows as queues build: the episode still equals one with the
    default look-ahead bit for bit, the state stays a fraction of the workload, and `counts` and `live_state` agree
    throughout."""
    ref, settle_ref, _ = _episode("bench-h200-hour-fixed-a30", 100001)
    monkeypatch.setattr(KernelState, "LOOKAHEAD_S", 20.0)
    env = CommitServeEnv("bench-h200-hour-fixed-a30")
    env.reset(seed=100001)
    rng = np.random.default_rng(100001)
    compactions, largest, done, k = set(), 0, False, 0
    while not done:
        a = {"active": int(rng.integers(1, env.n_replicas + 1)), "clock": int(rng.integers(len(env.clocks_mhz)))}
        obs, r, done, _, info = env.step(a)
        ks = env.pool._ks
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


def _pool(seed: int = 100002, gpus: int = 3) -> Pool:
    env = CommitServeEnv("bench-h200-hour-fixed-a30")
    env.reset(seed=seed)
    pool = Pool(env.profiles, PoolLayout.single(gpus), engine_options(env.scenario, seed), clock_mhz=env.clocks_mhz[0])
    pool.attach(env.table)
    return pool


def test_closed_form_changed_after_attach_applies_from_then_on():
    """`EngineOptions.closed_form` switched off and on again mid-run: the segments started from then on follow it
    (single steps only while off, decode runs again after), and the results stay within rounding of a pool that
    kept the closed form throughout."""
    a, b = _pool(gpus=16), _pool(gpus=16)
    b.log = []
    events, logged = [], []
    for k in range(45):
        t = 60.0 * k
        if k in (15, 30):
            b.opt.closed_form = k == 30
        for p in (a, b):
            p.run_until(t + 60.0)
            p.settle(t + 60.0)
        assert a.energy_j() == pytest.approx(b.energy_j(), rel=1e-9), f"meters at {t + 60}"
        events.append((a.events, b.events))
        logged.append(len(b.log))
    per = np.diff(np.array(events), axis=0)
    assert (per[16:29, 1] > 1.3 * per[16:29, 0]).all()  # step by step: every decode step its own event
    off = b.log[logged[15]:logged[29]]
    assert off and all(e.n_steps == 1 for e in off)
    assert any(e.n_steps > 1 for e in b.log[logged[31]:])
    for p in (a, b):
        p.run_until(math.inf)
    assert a.finish_t.tolist() == pytest.approx(b.finish_t.tolist(), abs=1e-6, nan_ok=True)


@pytest.mark.parametrize("scenario", ["bench-h200-hour-fixed-a30", "epact-h200-hour-fixed-a30"], ids=["paper", "ideal"])
def test_a_hindsight_fork_is_an_exact_copy_and_leaves_the_original_untouched(scenario):
    """A fork of the environment's pool, stepped with the environment's calls, equals the original stepped the same
    way after the fork, and `stop_arrivals` (the oracle's optimistic estimate) stops the fork's arrivals only; at
    ``ideal`` the fork draws the legacy noise from its own copy of the source."""
    from commitenv.hindsight import fork_pool
    from commitenv.sim.interval import run_interval

    env = CommitServeEnv(scenario)
    env.reset(seed=100004)
    rng = np.random.default_rng(4)
    for _ in range(10):
        env.step({"active": int(rng.integers(1, env.n_replicas + 1)), "clock": int(rng.integers(len(env.clocks_mhz)))})
    pool = env.pool
    fork, stopped = fork_pool(pool), fork_pool(pool)
    assert fork._ks is not pool._ks and fork._ks.ri is not pool._ks.ri
    cfg = {id(p): (env.cfg[0], env.cfg[1]) for p in (fork, pool, stopped)}
    stopped.stop_arrivals()
    for k in range(10, 40):
        new = (int(rng.integers(1, env.n_replicas + 1)), int(rng.integers(len(env.clocks_mhz))))
        for p in (pool, fork, stopped):
            cfg[id(p)], _ = run_interval(p, cfg[id(p)], new, 60.0 * k + 0.5, 60.0 * (k + 1), env.clocks_mhz)
        assert fork.energy_j() == pool.energy_j(), f"interval {k}"
    for p in (pool, fork, stopped):
        p.run_until(math.inf)
    assert fork.events == pool.events and fork.now == pool.now
    assert np.array_equal(np.nan_to_num(fork.finish_t, nan=-1.0), np.nan_to_num(pool.finish_t, nan=-1.0))
    assert stopped.arrived < pool.arrived and np.isnan(stopped.finish_t[stopped.arrived:]).all()


@pytest.mark.parametrize("scenario", ["bench-h200-hour-fixed-a30", "epact-h200-hour-fixed-a30"], ids=["paper", "ideal"])
def test_forking_leaves_the_original_run_unchanged(monkeypatch, scenario):
    """An environment whose pool is forked (and the forks stepped) every interval continues exactly as one never
    forked: a fork writes nothing into the original's state, nor draws from its legacy noise source."""
    from commitenv.hindsight import fork_pool

    monkeypatch.setattr(KernelState, "LOOKAHEAD_S", 30.0)
    envs = [CommitServeEnv(scenario) for _ in range(2)]
    for e in envs:
        e.reset(seed=100002)
    rng = np.random.default_rng(2)
    for k in range(25):
        e0 = envs[0]
        a = {"active": int(rng.integers(1, e0.n_replicas + 1)), "clock": int(rng.integers(len(e0.clocks_mhz)))}
        f = fork_pool(envs[0].pool)
        f.set_active(f.now, 1)
        f.run_until(f.now + 120.0)
        outs = [e.step(a) for e in envs]
        assert np.array_equal(outs[0][0], outs[1][0]) and outs[0][1:3] == outs[1][1:3], f"step {k}"
    p, q = envs[0].pool, envs[1].pool
    assert (p.events, p.completed, p.live, p.energy_j()) == (q.events, q.completed, q.live, q.energy_j())
    assert np.array_equal(np.nan_to_num(p.finish_t, nan=-1.0), np.nan_to_num(q.finish_t, nan=-1.0))


class _CountingFcfs(FcfsLocal):
    """A local policy with state: the plans it made."""

    def __init__(self) -> None:
        self.plans = 0

    def plan(self, view):
        self.plans += 1
        return super().plan(view)


def test_a_pool_with_policies_forks_with_its_own_policies():
    """A pool with a dispatch and a local policy forks: the fork's policies are copies (its plans leave the original's
    count alone; one policy on every replica stays one copy), and the fork stepped on equals the original stepped
    the same way."""
    from commitenv import hindsight
    from commitenv.sim.dispatch import LeastUnfinished

    pool = _pool()
    pool.dispatch = LeastUnfinished()
    pool.set_local_policy(_CountingFcfs())
    pool.run_until(30.0)
    policy = pool.local_policies[0]
    made = policy.plans
    fork = hindsight.fork_pool(pool)
    assert fork.dispatch is not pool.dispatch and fork.local_policies[0] is not policy
    assert all(p is fork.local_policies[0] for p in fork.local_policies)
    fork.run_until(90.0)
    assert policy.plans == made and fork.local_policies[0].plans > made
    pool.run_until(90.0)
    assert (fork.events, fork.completed, fork.energy_j(90.0)) == (pool.events, pool.completed, pool.energy_j(90.0))
    assert np.array_equal(fork.finish_t, pool.finish_t, equal_nan=True)


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
