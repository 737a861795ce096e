"""The compiled event loop on shared pools (several models, several instances per GPU, SM shares, per-GPU clocks)
against the Python loop of `Pool` on the same requests, exactly: the same events, completion times, replica states,
step log (GPU, share and clock of every booked segment) and per-GPU meters at every interval boundary, under random
per-model active counts, per-GPU clocks and SM shares that stay legal on every GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

from commitenv.envs import CommitServeEnv
from commitenv.sim import kernel
from commitenv.sim.dispatch import DispatchPolicy
from commitenv.sim.kernel import KernelState
from commitenv.sim.local import LocalPolicy, StepPlan

SCENARIO = "festina-h100-shared"


@pytest.fixture
def python_pools(monkeypatch):
    """Pools built here run the Python loop (the reference); each test drives its own `KernelState` beside them."""
    monkeypatch.setattr(kernel, "ENABLED", False)


def _shared_pool(seed: int):
    env = CommitServeEnv(SCENARIO)
    env.reset(seed=seed)
    return env.pool


def _entries(log) -> list[tuple]:
    return [(e.gpu, e.replica, e.t0, e.t1, e.n_steps, e.energy_j, e.clock_mhz, e.share, e.floor_j) for e in log]


@pytest.mark.parametrize("settle", [False, True], ids=["unsettled", "settled"])
def test_a_shared_pool_on_the_kernel_equals_the_python_loop(python_pools, settle):
    pool = _shared_pool(100000)
    pool.log = []
    ks = KernelState(pool)
    assert ks.G == len(pool.gpus) < ks.R == len(pool.replicas) and len(ks.n_per_model) == pool.n_models == 3
    mhz = list(ks.clock_mhz)
    n_per_model = [len(pool.replicas_of(m)) for m in range(pool.n_models)]
    rng = np.random.default_rng(7)
    states, kinds, booked_shares = set(), set(), set()
    for k in range(40):
        t = 30.0 * k
        for m, n in enumerate(n_per_model):
            if rng.random() < 0.5:
                c = int(rng.integers(1, n + 1))
                pool.set_active(t, c, model=m)
                ks.set_active(t, c, m)
                kinds.add("active")
        gpus = [int(g) for g in np.flatnonzero(rng.random(len(pool.gpus)) < 0.4)]
        if gpus:
            f = int(mhz[rng.integers(len(mhz))])
            pool.set_clock(t, f, gpus)
            ks.set_clock(t, f, gpus)
            kinds.add("clock")
        new = _legal_shares_of(rng, pool)
        for r in sorted(new, key=lambda r: new[r] - pool.replicas[r].share):  # shrinking first: every GPU <= 1
            pool.set_share(t, r, new[r])
            ks.set_share(t, r, new[r], pool.replicas[r].profile)
            kinds.add("share")
        pool.run_until(t + 0.5)
        ks.advance(t + 0.5)
        assert [r.state for r in pool.replicas] == ks.states().tolist(), f"states at {t + 0.5}"
        states.update(r.state for r in pool.replicas)
        pool.run_until(t + 30.0)
        ks.advance(t + 30.0)
        if settle:
            pool.settle(t + 30.0)
            ks.settle(t + 30.0)
        assert [r.state for r in pool.replicas] == ks.states().tolist(), f"states at {t + 30}"
        states.update(r.state for r in pool.replicas)
        assert [r.unf for r in pool.replicas] == ks.ri[:, 0].tolist(), f"queues at {t + 30}"
        assert np.array_equal(np.array([g.meter(t + 30.0) for g in pool.gpus]), ks.meter(t + 30.0)), f"meters at {t + 30}"
        assert [r.share for r in pool.replicas] == ks.shares().tolist()
        batch = ks.take_log()
        assert _entries(pool.log) == (_entries(batch.entries()) if batch is not None else []), f"step log to {t + 30}"
        booked_shares.update(e.share for e in pool.log)
        pool.log.clear()
    pool.run_until(math.inf)
    ks.advance(math.inf)
    assert ks.events == pool.events
    assert np.array_equal(np.nan_to_num(pool.finish_t, nan=-1.0), np.nan_to_num(ks.finish_t, nan=-1.0))
    assert np.isfinite(pool.finish_t[~pool.rejected]).all()
    assert kinds == {"active", "clock", "share"} and {0, 1, 2, 3} <= states  # active, draining, standby, waking
    assert len(booked_shares) > 10  # segments booked at many shares


def test_export_hands_a_shared_pool_back_to_the_python_loop(python_pools):
    """Half an hour on the kernel, handed back (`export_to`), then on the Python loop to the end: the same as the
    Python loop throughout."""
    ref = _shared_pool(100001)
    pool = _shared_pool(100001)
    ks = KernelState(pool, compact=False)
    ref.set_share(0.0, 2, 0.3)
    ks.set_share(0.0, 2, 0.3, pool.replicas[2].profile)
    ref.set_active(0.0, 2, model=0)
    ks.set_active(0.0, 2, 0)
    ref.set_clock(0.0, int(ks.clock_mhz[0]), [3, 5])
    ks.set_clock(0.0, int(ks.clock_mhz[0]), [3, 5])
    ref.run_until(1800.0)
    ks.advance(1800.0)
    ks.export_to(pool)
    assert [r.share for r in pool.replicas] == [r.share for r in ref.replicas]
    for p in (ref, pool):
        p.set_active(1800.0, 6, model=0)
        p.set_clock(1800.0, int(ks.clock_mhz[-1]))
        p.run_until(math.inf)
    assert pool.events == ref.events
    assert np.array_equal(np.nan_to_num(pool.finish_t, nan=-1.0), np.nan_to_num(ref.finish_t, nan=-1.0))
    assert np.array_equal(np.array([g.meter(pool.now) for g in pool.gpus]), np.array([g.meter(ref.now) for g in ref.gpus]))


def _shared_episode(monkeypatch, enabled: bool, steps: int):
    """Observations, rewards, misses and modes of ``steps`` intervals of festina-h100-shared under random per-model
    active counts, per-GPU clocks and legal SM shares (the kernel on or off)."""
    monkeypatch.setattr(kernel, "ENABLED", enabled)
    env = CommitServeEnv(SCENARIO)
    env.reset(seed=100002)
    rng = np.random.default_rng(3)
    out = []
    for _ in range(steps):
        shares = list(env.shared_cfg.shares)
        for r, x in _legal_shares_of(rng, env).items():
            shares[r] = x
        a = {"active": [int(rng.integers(1, n + 1)) for n in env.replicas_per_model],
             "clock": int(rng.integers(len(env.clocks_mhz))),
             "clocks": [int(rng.integers(len(env.clocks_mhz))) for _ in range(env.n_gpus)],
             "shares": shares}
        obs, r, done, _, info = env.step(a)
        out.append((obs.tolist() if hasattr(obs, "tolist") else repr(obs), r, info["new_misses"],
                    info["energy_j"] if "energy_j" in info else None))
        out.append(env.pool._ks is not None)
        if done:
            break
    return out


def _legal_shares_of(rng, env) -> dict[int, float]:
    """Random SM shares for some GPUs of ``env``'s layout (an env or a pool: its ``layout`` and ``profiles``), each at
    least its profile's minimum and every GPU's summing to <= 1."""
    out = {}
    r0 = 0
    for insts in env.layout.gpus:
        idx = list(range(r0, r0 + len(insts)))
        r0 += len(insts)
        if rng.random() < 0.5:
            continue
        mins = [env.profiles[i.model].sm_share.min_share for i in insts]
        w = rng.dirichlet(np.ones(len(insts))) * (1.0 - sum(mins)) * rng.uniform(0.5, 1.0)
        for r, m, x in zip(idx, mins, w):
            out[r] = round(float(m + x), 4)
    return out


def test_a_shared_environment_is_the_same_on_either_loop(monkeypatch):
    """The environment on festina-h100-shared with random shared actions, the kernel on and off: identical
    observations, rewards and misses; with the kernel on, the pool stays on it throughout."""
    on = _shared_episode(monkeypatch, True, 25)
    off = _shared_episode(monkeypatch, False, 25)
    assert [x for x in on if not isinstance(x, bool)] == [x for x in off if not isinstance(x, bool)]
    assert all(x for x in on if isinstance(x, bool)) and not any(x for x in off if isinstance(x, bool))


class _LeastWork(DispatchPolicy):
    """Route by token loads (prefill tokens to compute plus decoding context), ties to the lowest index."""

    name = "least_work"
    wants_load = True

    def choose(self, req, replicas):
        return min(replicas, key=lambda c: (c.queued_prefill_tokens + c.decode_context_tokens // 64, c.index)).index


class _EarliestDeadline(LocalPolicy):
    """Earliest visible deadline first over the replica's tasks, and every few plans a clock for the GPU."""

    name = "edf"

    def __init__(self) -> None:
        self.calls = 0

    def plan(self, view):
        self.calls += 1
        if self.calls % 11 == 0:
            return None  # the vLLM scheduler, this step
        order = tuple(t.slot for t in sorted(view.tasks, key=lambda t: (t.visible_deadline_s, t.slot)))
        mhz = view.clocks_mhz[self.calls % len(view.clocks_mhz)] if self.calls % 7 == 0 else None
        return StepPlan(order, mhz)


@pytest.mark.parametrize("scenario", [SCENARIO, "bench-h200-hour-fixed-a30"], ids=["shared", "one-model"])
def test_policies_answered_by_the_kernels_hand_backs_equal_the_python_loop(monkeypatch, scenario):
    """A dispatch policy with token loads and an EDF local policy with clock requests and vLLM fallbacks, under
    changing active counts (re-routing through the policy): on the compiled loop (each arrival and each planned step
    handed back to the host) the same events, completions, meters, policy calls and step log as on the Python loop."""
    from commitenv.sim.kernel import state

    monkeypatch.setattr(state, "LOCAL_ON_KERNEL", True)  # (the hand-backs to a local policy, tested here)
    out = []
    for on in (True, False):
        monkeypatch.setattr(kernel, "ENABLED", on)
        env = CommitServeEnv(scenario)
        env.reset(seed=100000)
        pool = env.pool
        pool.log = []  # (hands a kernel pool to the Python loop: taken back below, the log kept)
        pool.use_kernel()
        pool.dispatch = _LeastWork()
        pool.set_local_policy(_EarliestDeadline())
        rng = np.random.default_rng(11)
        n_per_model = [int(n) for n in np.bincount([i.model for g in env.layout.gpus for i in g])]
        for k in range(20):
            t = 30.0 * k
            for m, n in enumerate(n_per_model):
                pool.set_active(t, int(rng.integers(1, n + 1)), model=m)
            pool.run_until(t + 30.0)
            pool.settle(t + 30.0)
        assert (pool._ks is not None) == on
        out.append((pool.events, pool.completed, pool.dispatch_calls, pool.local_calls, pool.energy_j(),
                    np.nan_to_num(pool.finish_t, nan=-1.0).tolist(), pool.replica_of.tolist(),
                    [g for g in pool.gpu_energy_j().tolist()], _entries(pool.log)))
    assert out[0] == out[1]
    assert out[0][2] > 1000 and out[0][3] > 1000  # both policies were asked often


def test_a_shared_environment_with_attribution_equals_the_python_loop(monkeypatch):
    """Per-request attribution on a shared pool (co-located instances: the step log's GPU and SM share decide whose
    energy is whose): every interval's attribution and the settlement equal the Python loop's bit for bit, and the
    pool stays on the kernel from the first interval on."""
    def episode(enabled: bool):
        monkeypatch.setattr(kernel, "ENABLED", enabled)
        env = CommitServeEnv(SCENARIO, attribution=True)
        env.reset(seed=100001)
        rng = np.random.default_rng(5)
        out, modes = [], []
        for _ in range(20):
            shares = list(env.shared_cfg.shares)
            for r, x in _legal_shares_of(rng, env).items():
                shares[r] = x
            a = {"active": [int(rng.integers(1, n + 1)) for n in env.replicas_per_model],
                 "clock": int(rng.integers(len(env.clocks_mhz))), "shares": shares}
            _, r, done, _, info = env.step(a)
            iv = info["attribution"]["interval"]
            out.append((r, iv["energy_j"], iv["busy_j"], tuple(iv["tenant_j"].values())))
            modes.append(env.pool._ks is not None)
        return out, env.attributor.own_j.copy(), env.attributor.shared_j.copy(), modes

    ref = episode(False)
    got = episode(True)
    assert not any(ref[3]) and all(got[3])
    assert ref[0] == got[0] and len(ref[0]) == 20
    assert np.array_equal(ref[1], got[1]) and np.array_equal(ref[2], got[2]) and ref[1].sum() > 0


def test_festina_on_the_kernel_equals_the_python_loop(monkeypatch):
    """Festina (its dispatch, its local scheduler planning every step with a clock vote, its SM-share scaling) on the
    shared hour's first 15 intervals: the kernel (every plan called back to the host) and the Python loop give the same
    observations, rewards, misses and meters."""
    from commitenv.control import ControllerContext
    from commitenv.registry import resolve

    def episode(on: bool):
        monkeypatch.setattr(kernel, "ENABLED", on)
        env = CommitServeEnv(SCENARIO)
        obs, info = env.reset(seed=100000)
        ctrl = resolve("festina").make()
        ctrl.reset(ControllerContext.from_env(env), 0)
        env.set_dispatch(ctrl.dispatch_policy())
        env.set_local_policy(ctrl.local_policy())
        out = []
        for _ in range(15):
            a = ctrl.act(obs, info)
            obs, r, done, _, info = env.step(a)
            out.append((np.asarray(obs).tolist(), r, info["new_misses"], env.pool.energy_j()))
        return out, env.pool.local_calls, env.pool._ks is not None

    py, kern = episode(False), episode(True)
    assert py[0] == kern[0] and py[1] == kern[1] > 1000
    assert kern[2] and not py[2]
