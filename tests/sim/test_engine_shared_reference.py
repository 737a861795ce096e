"""Shared pools (several models, several instances per GPU, SM shares, per-GPU clocks) on the compiled loop against
the reference engine (tests/helpers/reference), both step by step, exactly: the environment under random shared
actions, with attribution, with a dispatch and a local policy answered through the kernel's hand-backs, and
Festina."""

from __future__ import annotations


import numpy as np
import pytest

from helpers.reference import step_by_step, use_engine

from commitenv.envs import CommitServeEnv
from commitenv.sim.dispatch import DispatchPolicy
from commitenv.sim.local import LocalPolicy, StepPlan

SCENARIO = "festina-h100-shared"


def _shared_pool(seed: int):
    env = CommitServeEnv(SCENARIO)
    env.reset(seed=seed)
    return env.pool


def _entries(log) -> list[tuple]:
    return [(e.gpu, e.replica, e.t0, e.t1, e.n_steps, e.energy_j, e.clock_mhz, e.share, e.floor_j) for e in log]


def _shared_episode(monkeypatch, reference: bool, steps: int):
    """Observations, rewards and misses of ``steps`` intervals of festina-h100-shared under random per-model active
    counts, per-GPU clocks and legal SM shares (on the reference engine or the compiled loop)."""
    step_by_step(monkeypatch)
    use_engine(monkeypatch, reference)
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


def test_a_shared_environment_is_the_same_on_either_engine(monkeypatch):
    """The environment on festina-h100-shared with random shared actions, on the compiled loop and on the reference:
    identical observations, rewards and misses."""
    got = _shared_episode(monkeypatch, False, 25)
    ref = _shared_episode(monkeypatch, True, 25)
    assert got == ref and len(got) == 25


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
def test_policies_answered_by_the_kernels_hand_backs_equal_the_reference(monkeypatch, scenario):
    """A dispatch policy with token loads and an EDF local policy with clock requests and vLLM fallbacks, under
    changing active counts (re-routing through the policy): on the compiled loop (each arrival and each planned step
    handed back to the host) the same events, completions, meters, policy calls and step log as on the reference."""
    step_by_step(monkeypatch)
    out = []
    for reference in (False, True):
        use_engine(monkeypatch, reference)
        env = CommitServeEnv(scenario)
        env.reset(seed=100000)
        pool = env.pool
        pool.log = []
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
        out.append((pool.events, pool.completed, pool.dispatch_calls, pool.local_calls, pool.energy_j(),
                    np.nan_to_num(pool.finish_t, nan=-1.0).tolist(), pool.replica_of.tolist(),
                    [g for g in pool.gpu_energy_j().tolist()], _entries(pool.log)))
    assert out[0] == out[1]
    assert out[0][2] > 1000 and out[0][3] > 1000  # both policies were asked often


def test_a_shared_environment_with_attribution_equals_the_reference(monkeypatch):
    """Per-request attribution on a shared pool (co-located instances: the step log's GPU and SM share decide whose
    energy is whose): every interval's attribution equals the reference engine's bit for bit."""
    step_by_step(monkeypatch)

    def episode(reference: bool):
        use_engine(monkeypatch, reference)
        env = CommitServeEnv(SCENARIO, attribution=True)
        env.reset(seed=100001)
        rng = np.random.default_rng(5)
        out = []
        for _ in range(20):
            shares = list(env.shared_cfg.shares)
            for r, x in _legal_shares_of(rng, env).items():
                shares[r] = x
            a = {"active": [int(rng.integers(1, n + 1)) for n in env.replicas_per_model],
                 "clock": int(rng.integers(len(env.clocks_mhz))), "shares": shares}
            _, r, done, _, info = env.step(a)
            iv = info["attribution"]["interval"]
            out.append((r, iv["energy_j"], iv["busy_j"], tuple(iv["tenant_j"].values())))
        return out, env.attributor.own_j.copy(), env.attributor.shared_j.copy()

    ref = episode(True)
    got = episode(False)
    assert ref[0] == got[0] and len(ref[0]) == 20
    assert np.array_equal(ref[1], got[1]) and np.array_equal(ref[2], got[2]) and ref[1].sum() > 0


def test_festina_on_the_compiled_loop_equals_the_reference(monkeypatch):
    """Festina (its dispatch, its local scheduler planning every step with a clock vote, its SM-share scaling) on the
    shared hour's first 15 intervals: the compiled loop (every plan made in it by the policy's compiled plan) and the
    reference (every plan through `FestinaLocal.plan`) give the same observations, rewards, misses and meters."""
    step_by_step(monkeypatch)
    from commitenv.control import ControllerContext
    from commitenv.registry import resolve

    def episode(reference: bool):
        use_engine(monkeypatch, reference)
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
        return out, env.pool.local_calls + env.pool.compiled_plans

    ref, got = episode(True), episode(False)
    assert ref[0] == got[0] and ref[1] == got[1] > 1000
