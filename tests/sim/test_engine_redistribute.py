"""Re-routing a replica set's queue after an active-set change: every queued request that has not started goes where
one-by-one least-loaded routing would send it (fewest unfinished, ties to the lower index), in arrival order; the
compiled loop (a heap of loads) routes as the reference does one request at a time."""

from __future__ import annotations

import numpy as np

from commitenv.sim import EngineOptions, Pool, PoolLayout
from commitenv.workload.table import RequestTable
from helpers.profiles import toy_profile
from helpers.reference import ReferencePool


def _one_by_one(loads: list[int], n: int) -> list[int]:
    """The reference: each request to the first replica with the fewest unfinished requests."""
    loads = list(loads)
    out = []
    for _ in range(n):
        p = min(range(len(loads)), key=lambda i: (loads[i], i))
        out.append(p)
        loads[p] += 1
    return out


def test_scale_down_with_a_long_queue_re_routes_like_one_by_one():
    """End to end: a burst queued on four replicas, then two of them drained; every not-started request moves to
    the two left, balanced as one-by-one routing of the queue in arrival order would balance it, on the reference and
    on the compiled loop alike."""
    n = 200
    table = RequestTable(arrival_s=np.linspace(0.0, 0.5, n), prompt_tokens=np.full(n, 30),
                         output_tokens=np.full(n, 20), tenant=np.zeros(n, dtype=np.int32),
                         request_id=np.arange(n, dtype=np.int64))
    pool = ReferencePool(toy_profile(), PoolLayout.single(4), EngineOptions(closed_form=False))
    lib = Pool(toy_profile(), PoolLayout.single(4), EngineOptions(closed_form=False))
    for p in (pool, lib):
        p.attach(table)
        p.run_until(0.5)
    kept = pool.replicas[:2]
    loads_before = [len(r.running) + sum(1 for q in r.waiting if q.started) for r in kept]
    queued = sorted((q for r in pool.replicas for q in r.waiting if not q.started), key=lambda q: q.slot)
    assert len(queued) > 50  # a real queue to re-route
    for p in (pool, lib):
        p.set_active(0.5, 2)
    want = _one_by_one(loads_before, len(queued))
    assert [q.replica for q in queued] == [kept[p].index for p in want]
    assert all(not r.waiting or all(q.started for q in r.waiting) for r in pool.replicas[2:])
    for p in (pool, lib):
        p.run_until(float("inf"))
    assert np.array_equal(pool.replica_of, lib.replica_of) and np.array_equal(pool.finish_t, lib.finish_t)
