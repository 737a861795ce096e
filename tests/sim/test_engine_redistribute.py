"""Re-routing a replica set's queue after an active-set change: the batched least-loaded routing assigns every
request where one-by-one least-loaded routing would (fewest unfinished, ties to the lower index), in order, and pokes
each receiving replica once, in the order it first received work."""

from __future__ import annotations

import numpy as np
import pytest

from commitenv.sim import Pool, PoolLayout
from commitenv.sim.request import Req
from commitenv.workload.table import RequestTable
from helpers.profiles import toy_profile


def _one_by_one(loads: list[int], n: int) -> list[int]:
    """The reference: each request to the first replica with the fewest unfinished requests."""
    loads = list(loads)
    out = []
    for _ in range(n):
        p = min(range(len(loads)), key=lambda i: (loads[i], i))
        out.append(p)
        loads[p] += 1
    return out


@pytest.mark.parametrize("trial", range(40))
def test_batched_routing_matches_one_by_one_routing(trial):
    rng = np.random.default_rng(trial)
    n_rep = int(rng.integers(1, 9))
    pool = Pool(toy_profile(), PoolLayout.single(n_rep))
    cands = list(pool.replicas)
    loads = [int(x) for x in rng.integers(0, 6, n_rep)] if trial % 3 else [int(x) for x in rng.integers(0, 40, n_rep)]
    for rep, u in zip(cands, loads):
        rep.unf = u
    n = int(rng.integers(0, 60))
    reqs = [Req(i, 0.0, 8, 4, 10.0, 0) for i in range(n)]
    poked: list[int] = []
    pool._poke = lambda rep, t: poked.append(rep.index)  # record the pokes only
    pool._route_least_loaded(reqs, cands, 0.0)
    want = _one_by_one(loads, n)
    assert [r.replica for r in reqs] == [cands[p].index for p in want]
    for i, rep in enumerate(cands):
        mine = [r for r, p in zip(reqs, want) if p == i]
        assert list(rep.waiting) == mine  # in arrival order
        assert rep.unf == loads[i] + len(mine)
    assert poked == [cands[p].index for p in dict.fromkeys(want)]


def test_scale_down_with_a_long_queue_re_routes_like_one_by_one():
    """End to end: a burst queued on four replicas, then two of them drained; every not-started request moves to
    the two left, balanced as one-by-one routing of the queue in arrival order would balance it."""
    n = 200
    table = RequestTable(arrival_s=np.linspace(0.0, 0.5, n), prompt_tokens=np.full(n, 30),
                         output_tokens=np.full(n, 20), tenant=np.zeros(n, dtype=np.int32),
                         request_id=np.arange(n, dtype=np.int64))
    pool = Pool(toy_profile(), PoolLayout.single(4))
    pool.attach(table)
    pool.run_until(0.5)
    kept = pool.replicas[:2]
    loads_before = [len(r.running) + sum(1 for q in r.waiting if q.started) for r in kept]
    queued = sorted((q for r in pool.replicas for q in r.waiting if not q.started), key=lambda q: q.slot)
    assert len(queued) > 50  # a real queue to re-route
    pool.set_active(0.5, 2)
    want = _one_by_one(loads_before, len(queued))
    assert [q.replica for q in queued] == [kept[p].index for p in want]
    assert all(not r.waiting or all(q.started for q in r.waiting) for r in pool.replicas[2:])


@pytest.mark.parametrize(("loads", "n"), [([0, 3, 0, 200], 150), ([0, 3, 0, 200], 1000), ([7, 7, 7], 10), ([5], 3)])
def test_batched_routing_with_an_outlier_replica(loads, n):
    """Levels below a far busier replica fill first; it joins the rounds once the others reach its load."""
    pool = Pool(toy_profile(), PoolLayout.single(len(loads)))
    cands = list(pool.replicas)
    for rep, u in zip(cands, loads):
        rep.unf = u
    reqs = [Req(i, 0.0, 8, 4, 10.0, 0) for i in range(n)]
    pool._poke = lambda rep, t: None
    pool._route_least_loaded(reqs, cands, 0.0)
    assert [r.replica for r in reqs] == [cands[p].index for p in _one_by_one(loads, n)]
