"""A controller's snapshot and its what-if copies made on the compiled loop (`KernelState.whatif_copy`) against those
the reference engine (tests/helpers/reference) makes from its objects, both step by step, exactly: the same request
and replica views, and the same `WhatIf` for every candidate (with and without replayed arrivals, followed or not), on
a truth pool at `paper`, a pool under the legacy noise, two models sharing GPUs with instances moving and with dispatch
and local policies, and prefix caches."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers.prefix import tree_hashes, with_hashes
from helpers.profiles import toy_profile
from helpers.reference import ReferencePool, step_by_step, use_engine
from helpers.reference.copies import reference_snapshot

from commitenv.envs import CommitServeEnv
from commitenv.sim import EngineOptions, NoiseSpec, Pool, observed_arrivals, simulate, take_snapshot
from commitenv.sim.dispatch import LeastUnfinished
from commitenv.sim.local import FcfsLocal
from commitenv.sim.pool import Instance, PoolLayout
from commitenv.workload.table import make_table

SCHED = dict(token_budget=32, max_seqs=6, context_limit=512, block_size=4, kv_capacity_tokens=2048)
TAIL = 300.0  # what-if runs follow the captured requests this long after the horizon
LAYOUT = ((Instance(0, 0.5), Instance(1, 0.5)), (Instance(0, 0.4), Instance(1, 0.4)), (Instance(0, 0.3),))


def _toy():
    return toy_profile(scheduler=SCHED, latencies=dict(clock_change_s=0.05, activation_s=1.0, load_s=3.0, load_w=70.0),
                       model=dict(name="toy-model", params_b=1, weight_gb=1, kv_bytes_per_token=1e5))


def _shared(seed: int, kind: str, cls: type = Pool) -> Pool:
    """Two models on three GPUs (SM shares), the legacy noise; ``kind``: "policies" (a dispatch and a local policy),
    "prefix" (prefix caches) or "plain"."""
    rng = np.random.default_rng(seed)
    bt = 8
    pool = cls([_toy(), _toy()], PoolLayout(LAYOUT),
               EngineOptions(noise=NoiseSpec(0.03, 0.03), seed=seed, closed_form=False,
                              prefix_block_tokens=bt))
    if kind == "policies":
        pool.dispatch = LeastUnfinished()
        pool.set_local_policy(FcfsLocal())
    n = 150 if kind == "policies" else 500  # (a local policy is called back for every step: fewer requests)
    arrivals = np.sort(rng.uniform(0, 60, n))
    prompts, outputs = rng.integers(4, 300, n), rng.integers(1, 400, n)
    table = make_table(arrivals, prompts, outputs)
    if kind == "prefix":
        table = with_hashes(table, tree_hashes(rng, prompts, bt, depth=12))
    table = dataclasses.replace(table, tenant=rng.integers(0, 2, n).astype(np.int32), tenant_names=("a", "b"))
    pool.attach(table, {0: 0, 1: 1})
    return pool


def _n_of(pool: Pool, model: int) -> int:
    """Instances of ``model`` in the pool's layout."""
    return sum(inst.model == model for insts in pool.layout.gpus for inst in insts)


def _drive(pool: Pool, rng: np.random.Generator, t: float) -> None:
    """A random action at ``t`` (the same draws on twins): moves, activations, clocks."""
    if pool.n_models > 1:
        x, g = int(rng.integers(0, 5)), int(rng.integers(0, 3))
        try:
            pool.move(t, {x: g}, migrate=("none", "latency_aware", "all")[int(rng.integers(0, 3))])
        except ValueError:
            pass
        m = int(rng.integers(0, 2))
        pool.set_active(t, int(rng.integers(1, (3, 2)[m] + 1)), model=m)
    else:
        pool.set_active(t, int(rng.integers(1, _n_of(pool, 0) + 1)))
    mhz = [lvl.mhz for lvl in pool.profiles[0].clocks]
    pool.set_clock(t, int(mhz[rng.integers(len(mhz))]))


def _views_equal(a, b) -> None:
    assert (a.t, a.active, a.clock_mhz, a.meter_j) == (b.t, b.active, b.clock_mhz, b.meter_j)
    for name in ("requests", "replicas"):
        va, vb = getattr(a, name), getattr(b, name)
        for f in dataclasses.fields(va):
            x, y = getattr(va, f.name), getattr(vb, f.name)
            if isinstance(x, tuple):
                assert x == y, f"{name}.{f.name}"
            else:
                assert x.dtype == y.dtype and np.array_equal(x, y), f"{name}.{f.name}"
                assert not x.flags.writeable


def _candidates(pool: Pool) -> list:
    mhz = [lvl.mhz for lvl in pool.profiles[0].clocks]
    if pool.n_models > 1:
        return [((1, 1), mhz[0]), ((3, 2), mhz[-1]), ((2, 1), mhz[len(mhz) // 2])]
    n = _n_of(pool, 0)
    return [(1, mhz[0]), (n, mhz[-1]), ((n + 1) // 2, mhz[len(mhz) // 2])]


def _compare(twins: tuple[Pool, Pool], monkeypatch) -> int:
    """Snapshots of twin pools, one on the compiled loop, one on the reference; their views and every candidate's
    `WhatIf` equal. Returns the candidates checked."""
    a, b = twins
    snap_a, snap_b = take_snapshot(a), reference_snapshot(b)
    assert type(snap_b._engine) is ReferencePool
    _views_equal(snap_a, snap_b)
    replay = observed_arrivals(a, 30.0)
    checked = 0
    for active, mhz in _candidates(a):
        for arrivals, track in ((None, False), (replay, False), (replay, True)):
            got = simulate(snap_a, active, mhz, 30.0, arrivals, max_tail_s=TAIL, track_arrivals=track)
            assert got == simulate(snap_b, active, mhz, 30.0, arrivals, max_tail_s=TAIL, track_arrivals=track)
            checked += 1
    return checked


@pytest.mark.parametrize("kind", ["plain", "policies", "prefix"])
def test_what_if_copies_of_a_shared_pool_equal_the_reference(monkeypatch, kind):
    twins = (_shared(3, kind), _shared(3, kind, ReferencePool))
    rngs = [np.random.default_rng(11) for _ in twins]
    checked = 0
    for k in range(1, 9):
        t = 7.0 * k
        for p, rng in zip(twins, rngs):
            p.run_until(t)
            _drive(p, rng, t)
            p.settle(t)
        if k % 2 == 0:
            checked += _compare(twins, monkeypatch)
    assert checked == 4 * 9
    assert twins[0].events == twins[1].events


@pytest.mark.parametrize("scenario", ["bench-h200-hour-fixed-a30", "epact-h200-hour-fixed-a30"], ids=["paper", "ideal"])
def test_what_if_copies_of_an_environment_equal_the_reference(monkeypatch, scenario):
    """An environment's pool (``paper``: the truth model, the copy nominal with the power bias' factor; ``ideal``: the
    legacy noise) with few replicas serving, so that queues form, snapshotted between events (segments in flight)."""
    step_by_step(monkeypatch)
    envs = []
    for reference in (False, True):
        use_engine(monkeypatch, reference)
        envs.append(CommitServeEnv(scenario))
        envs[-1].reset(seed=100001)
    pools = (envs[0].pool, envs[1].pool)
    rngs = [np.random.default_rng(5) for _ in envs]
    mhz = [lvl.mhz for lvl in pools[0].profiles[0].clocks]
    for k in range(1, 5):
        t = 40.0 * k + 0.37
        for p, rng in zip(pools, rngs):
            p.set_active(p.now, int(rng.integers(1, 3)))
            p.set_clock(p.now, int(mhz[rng.integers(len(mhz))]))
            p.run_until(t)
            p.settle(t)
        if k % 2 == 0:
            assert len(take_snapshot(pools[0]).requests) > 20  # (queues)
            assert type(pools[1]) is ReferencePool
            _compare(pools, monkeypatch)
