"""Instances moving between GPUs on the compiled loop (`Pool.move` on a pool the kernel runs: cold starts waiting for
memory and SMs, requests migrating with their KV in every mode, requests left unrouted while no instance of their model
serves) against the reference engine (tests/helpers/reference), both step by step, on the same requests, exactly:
states, queues, meters and counters at every action, the step log, and every request's completion."""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.profiles import toy_profile
from helpers.reference import ReferencePool

from commitenv.sim import EngineOptions, NoiseSpec, Pool
from commitenv.sim.dispatch import LeastUnfinished
from commitenv.sim.local import FcfsLocal, StepPlan
from commitenv.sim.pool import Instance, PoolLayout
from commitenv.sim.states import LOADING, MOVING
from commitenv.workload.table import make_table

SCHED = dict(token_budget=64, max_seqs=8, context_limit=1024, block_size=4, kv_capacity_tokens=8192)
MODES = ("none", "latency_aware", "all")
# two models on three GPUs; instances of model 0 on every GPU (GPU 2 holds one alone)
LAYOUT = ((Instance(0, 0.5), Instance(1, 0.5)), (Instance(0, 0.4), Instance(1, 0.4)), (Instance(0, 0.3),))


class _LoadAware(LeastUnfinished):
    wants_load = True

    def choose(self, req, cands):  # (the most free KV blocks, ties to the least unfinished: not the default's pick)
        return max(cands, key=lambda c: (c.free_kv_blocks - c.queued_prefill_tokens // 4, -c.unfinished, -c.index)).index


class _Clocked(FcfsLocal):
    def plan(self, view):
        return StepPlan(super().plan(view).order, view.clocks_mhz[len(view.tasks) % len(view.clocks_mhz)])


def _profile():
    return toy_profile(scheduler=SCHED, latencies=dict(clock_change_s=0.05, activation_s=1.0, load_s=5.0, load_w=70.0),
                       model=dict(name="toy-model", params_b=1, weight_gb=1, kv_bytes_per_token=1e5))


def _episode(monkeypatch, on_kernel: bool, seed: int, policies: bool, closed_form: bool) -> dict:
    """Random moves (every migration mode), SM shares shrinking, activations and clocks on two models sharing three
    GPUs, then every request served: what the pool shows at each action and at the end."""
    rng = np.random.default_rng(seed)
    pool = (Pool if on_kernel else ReferencePool)([_profile(), _profile()], PoolLayout(LAYOUT),
                EngineOptions(noise=NoiseSpec(0.03, 0.03), seed=seed, closed_form=closed_form, log_steps=True))
    if policies:
        pool.dispatch = _LoadAware()
        pool.set_local_policy(_Clocked())
    n = 400
    table = make_table(np.sort(rng.uniform(0, 120, n)), rng.integers(4, 200, n), rng.integers(1, 1500, n))
    table = table.__class__(**{**table.__dict__, "tenant": rng.integers(0, 2, n).astype(np.int32),
                               "tenant_names": ("a", "b")})
    pool.attach(table, {0: 0, 1: 1})
    shares = [inst.share for g in LAYOUT for inst in g]
    per_model = [sum(inst.model == m for g in LAYOUT for inst in g) for m in range(2)]
    mhz = [lvl.mhz for lvl in pool.profiles[0].clocks]
    seen, refused = [], 0
    t = 0.0
    while t < 120:
        t += float(rng.uniform(2, 12))
        pool.run_until(t)
        if rng.random() < 0.3:
            s = int(rng.integers(0, len(shares)))
            shares[s] = float(rng.uniform(0.1, shares[s]))
            pool.set_share(t, s, shares[s])
        moves = {int(rng.integers(0, len(shares))): int(rng.integers(0, 3)) for _ in range(int(rng.integers(1, 3)))}
        try:
            pool.move(t, moves, migrate=MODES[int(rng.integers(0, 3))])
        except ValueError:
            refused += 1
        if rng.random() < 0.3:
            m = int(rng.integers(0, 2))
            pool.set_active(t, int(rng.integers(1, per_model[m] + 1)), model=m)
        if rng.random() < 0.3:
            pool.set_clock(t, int(mhz[rng.integers(len(mhz))]), [int(rng.integers(0, 3))])
        states = pool._ks.states().tolist() if pool._ks is not None else [r.state for r in pool.replicas]
        seen.append((t, states, pool.counts(), pool.gpu_energy_j(t).tolist(), pool.active_count(0),
                     pool.active_count(1), pool.cold_starts, pool.migrated, pool.moves, refused))
    for m in range(2):
        pool.set_active(t, per_model[m], model=m)
    pool.run_until(math.inf)
    return {"seen": seen, "on_kernel": pool._ks is not None, "events": pool.events,
            "finish": np.nan_to_num(pool.finish_t, nan=-1.0).tolist(), "first": np.nan_to_num(pool.first_t).tolist(),
            "replica_of": pool.replica_of.tolist(), "preemptions": pool.preemptions.tolist(),
            "link": (pool.migration_bytes, pool.migration_j),
            "log": [(e.gpu, e.replica, e.t0, e.t1, e.n_steps, e.energy_j, e.clock_mhz, e.share, e.floor_j)
                    for e in pool.log],
            "meters": pool.gpu_energy_j(pool.now).tolist()}


@pytest.mark.parametrize("policies", [False, True], ids=["vllm", "dispatch+local"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_moves_on_the_compiled_loop_equal_the_reference(monkeypatch, seed, policies):
    ref = _episode(monkeypatch, False, seed, policies, closed_form=False)
    got = _episode(monkeypatch, True, seed, policies, closed_form=False)
    assert got.pop("on_kernel") and not ref.pop("on_kernel")
    for (a, b) in zip(ref["seen"], got["seen"]):
        assert a == b, f"at t={a[0]}"
    assert ref == got
    states = {s for x in ref["seen"] for s in x[1]}
    assert {MOVING, LOADING} <= states  # moves were under way at actions
    migrated, moves = ref["seen"][-1][7], ref["seen"][-1][8]
    assert moves > 3 and migrated > 0 and ref["link"][0] > 0  # requests crossed the link
    assert all(f > 0 for f in ref["finish"])  # every request finished


def _swap(monkeypatch, on_kernel: bool, share: float, grow: float | None) -> dict:
    """Two one-instance GPUs, one busy with a long request: the instances swap GPUs (the busy one drains in place),
    so the arriving one waits for the memory (``share`` > 0.5) or, loaded, for the SMs (``grow``: the busy one's SM
    share grown) its departing neighbour still holds."""
    layout = PoolLayout(((Instance(0, share),), (Instance(0, share),)))
    opt = EngineOptions(noise=NoiseSpec(0, 0), closed_form=False, log_steps=True)
    pool = (Pool if on_kernel else ReferencePool)(_profile(), layout, opt)
    pool.attach(make_table(np.array([0.0, 30.0]), np.array([100, 50]), np.array([1000, 20])))
    pool.run_until(0.5)
    states = []
    if grow is not None:
        pool.set_share(0.5, 0, grow)
    pool.move(0.5, {0: 1, 1: 0})
    for t in (1.0, 5.4, 5.6, 6.0, 20.0, 40.0):
        pool.run_until(t)
        states.append((pool._ks.states().tolist() if pool._ks is not None else [r.state for r in pool.replicas],
                       pool.gpu_energy_j(t).tolist(), pool.cold_starts))
    pool.run_until(math.inf)
    return {"on_kernel": pool._ks is not None, "states": states, "finish": pool.finish_t.tolist(),
            "log": [(e.gpu, e.replica, e.t0, e.t1, e.n_steps, e.energy_j, e.floor_j) for e in pool.log],
            "meters": pool.gpu_energy_j(pool.now).tolist(), "now": pool.now}


@pytest.mark.parametrize("share,grow", [(0.6, None), (0.5, 0.7)], ids=["memory", "sms"])
def test_a_swap_waiting_for_its_neighbour_equals_the_reference(monkeypatch, share, grow):
    ref = _swap(monkeypatch, False, share, grow)
    got = _swap(monkeypatch, True, share, grow)
    assert got.pop("on_kernel") and not ref.pop("on_kernel")
    assert ref == got
    assert any(LOADING in s for s, _, _ in ref["states"])  # the arriving instance waited, loading
    assert ref["states"][-1][2] == 2  # both loaded in the end
