"""Router and replica lifecycle: fewest-unfinished routing with ties to the lowest index, draining on a lower
active count (queued not-started requests move, running ones stay), standby floor power, reactivation latency
from standby, immediate reactivation of a draining replica, per-model routing."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.reference import ReferencePool
from helpers.profiles import toy_profile

from commitenv.sim import EngineOptions, Instance, NoiseSpec, PoolLayout
from commitenv.workload.table import make_table

STANDBY_W = 20.0
IDLE_W = 50.0


def exact(**kw) -> EngineOptions:
    return EngineOptions(noise=NoiseSpec(0, 0), log_steps=True, **kw)


def make(arrivals, prompts, outputs, n=2, profile=None, tenants=None):
    pool = ReferencePool(profile or toy_profile(), PoolLayout.single(n), exact())
    pool.attach(make_table(arrivals, prompts, outputs, tenant=tenants))
    return pool


def slope(pool, gpu, t0, t1):
    e = pool.gpu_energy_j
    return (e(t1)[gpu] - e(t0)[gpu]) / (t1 - t0)


def test_fewest_unfinished_with_ties_to_lowest_index():
    arr = [0.000, 0.001, 0.002, 0.003, 0.020, 0.021, 0.022]
    out = [40, 1, 40, 40, 40, 40, 40]
    pool = make(arr, [4] * 7, out, n=3)
    pool.run_until(0.0225)
    # R1 (prompt 4, out 1) finishes at 0.001 + 0.014 = 0.015, leaving replica 1 empty at 0.020
    assert pool.finish_t[1] == pytest.approx(0.015)
    # loads at each arrival: (0,0,0)->0 (1,0,0)->1 (1,1,0)->2 (1,1,1)->0 (2,0,1)->1 (2,1,1)->1 (2,2,1)->2
    assigned = {r.slot: r.replica for r in pool.live_requests()}
    assigned[1] = int(pool.replica_of[1])
    assert [assigned[i] for i in range(7)] == [0, 1, 2, 0, 1, 1, 2]


def test_waiting_requests_count_as_unfinished():
    # max_seqs = 1: a queued request counts toward its replica's load
    prof = toy_profile(scheduler=dict(max_seqs=1))
    pool = make([0.0, 0.001, 0.002, 0.003, 0.004], [4] * 5, [30] * 5, n=2, profile=prof)
    pool.run_until(0.005)
    assert [len(r.running) for r in pool.replicas] == [1, 1]
    assert [[q.slot for q in r.waiting] for r in pool.replicas] == [[2, 4], [3]]


def drain_scenario():
    """max_seqs = 1, two replicas. R0 (out 30) -> rep0, R1 (out 10) -> rep1, R2 -> rep0 queued, R3 -> rep1
    queued, R4 -> rep0 queued; at 0.05 the active count drops to 1; R5 arrives at 0.06."""
    prof = toy_profile(scheduler=dict(max_seqs=1))
    arr = [0.0, 0.001, 0.002, 0.003, 0.004, 0.06]
    pool = make(arr, [4] * 6, [30, 10, 5, 5, 5, 5], n=2, profile=prof)
    pool.run_until(0.05)
    pool.settle(0.05)
    assert [[q.slot for q in r.waiting] for r in pool.replicas] == [[2, 4], [3]]
    pool.set_active(0.05, 1)
    return pool


def test_drain_moves_queued_and_keeps_running():
    pool = drain_scenario()
    r0, r1 = pool.replicas
    assert [q.slot for q in r1.running] == [1] and not r1.waiting
    assert [q.slot for q in r0.waiting] == [2, 3, 4]  # moved R3 joins in arrival (slot) order
    assert pool.active_count() == 1
    pool.run_until(5.0)
    assert pool.completed == 6
    # R1 finished where it ran; everything else (including R5, which arrived while rep1 drained) on rep0
    assert pool.replica_of.tolist() == [0, 1, 0, 0, 0, 0]
    # R1 by hand: prefill [0.001, 0.015], 9 decodes of 0.0101 + 0.00001 (4 + j)
    fin1 = 0.015 + sum(0.0101 + 0.00001 * (4 + j) for j in range(1, 10))
    assert pool.finish_t[1] == pytest.approx(fin1, abs=1e-12)
    # the draining replica ran nothing but R1 after the drain started
    assert all(e.slots == (1,) for e in pool.log if e.replica == 1)
    assert r1.state == 2  # standby


def test_drained_replica_goes_to_standby_floor():
    pool = drain_scenario()
    pool.run_until(5.0)
    fin1 = pool.finish_t[1]
    assert slope(pool, 1, fin1 + 0.01, 4.0) == pytest.approx(STANDBY_W)
    # GPU 1 in total: R1's steps, then the standby floor (toy draining idle = active idle = 50 W)
    steps1 = sum(e.energy_j for e in pool.log if e.gpu == 1)
    idle_before = IDLE_W * 0.001
    assert pool.gpu_energy_j(5.0)[1] == pytest.approx(idle_before + steps1 + STANDBY_W * (5.0 - fin1), abs=1e-9)


def test_idle_replica_drains_to_standby_at_once():
    pool = make([10.0], [4], [2], n=3)
    pool.run_until(1.0)
    pool.set_active(1.0, 1)
    assert [r.state for r in pool.replicas] == [0, 2, 2]
    assert slope(pool, 1, 1.0, 2.0) == pytest.approx(STANDBY_W)
    assert slope(pool, 0, 1.0, 2.0) == pytest.approx(IDLE_W)
    assert pool.energy_j(2.0) == pytest.approx(3 * IDLE_W * 1.0 + (IDLE_W + 2 * STANDBY_W) * 1.0)


def test_reactivation_from_standby_takes_activation_latency():
    prof = toy_profile(scheduler=dict(max_seqs=1))  # activation_s = 1.0
    pool = make([1.5, 1.6, 2.5], [4, 4, 4], [55, 5, 5], n=2, profile=prof)
    pool.set_active(0.0, 1)
    pool.run_until(1.0)
    assert slope(pool, 1, 0.0, 1.0) == pytest.approx(STANDBY_W)
    pool.set_active(1.0, 2)
    assert pool.active_count() == 2
    pool.run_until(1.99)
    # during the wake-up both arrivals went to replica 0; R1 waits there (max_seqs = 1)
    r0, r1 = pool.replicas
    assert [q.slot for q in r0.running] == [0] and [q.slot for q in r0.waiting] == [1]
    assert not r1.running and not r1.waiting
    pool.run_until(10.0)
    # at 2.0 the woken replica takes the queued, not-started R1 and starts it at once
    # R2 at 2.5: both replicas are empty again (tie -> replica 0)
    assert pool.finish_t[0] < 2.5 and pool.finish_t[1] < 2.5
    assert pool.replica_of.tolist() == [0, 1, 0]
    assert pool.replica_of[1] == 1
    assert pool.first_t[1] == pytest.approx(2.0 + 0.014, abs=1e-12)
    first_r1 = next(e for e in pool.log if 1 in e.slots)
    assert first_r1.t0 == pytest.approx(2.0) and first_r1.replica == 1
    # GPU 1: standby 0..1, waking at the active-idle floor 1..2
    steps1 = sum(e.energy_j for e in pool.log if e.gpu == 1)
    busy1 = sum(e.t1 - e.t0 for e in pool.log if e.gpu == 1)
    assert pool.gpu_energy_j(10.0)[1] == pytest.approx(STANDBY_W * 1.0 + steps1 + IDLE_W * (9.0 - busy1), abs=1e-9)


def test_lowering_again_while_waking_returns_to_standby():
    pool = make([2.5], [4], [3], n=2)
    pool.set_active(0.0, 1)
    pool.run_until(1.0)
    e1 = pool.gpu_energy_j(1.0)[1]
    pool.set_active(1.0, 2)
    pool.run_until(1.5)
    e15 = pool.gpu_energy_j(1.5)[1]
    pool.set_active(1.5, 1)
    pool.run_until(10.0)
    assert e1 == pytest.approx(STANDBY_W * 1.0)
    assert (e15 - e1) / 0.5 == pytest.approx(IDLE_W)  # waking is metered at the active-idle floor
    assert pool.replicas[1].state == 2
    assert pool.replica_of[0] == 0  # the stale wake-up at 2.0 did not reactivate replica 1
    assert (pool.gpu_energy_j(10.0)[1] - e15) / 8.5 == pytest.approx(STANDBY_W)


def test_reactivating_a_draining_replica_is_immediate():
    prof = toy_profile(scheduler=dict(max_seqs=1))
    # R0 -> rep0, R1 (long) -> rep1, R2 -> rep0 queued; R3 at 0.031
    pool = make([0.0, 0.001, 0.002, 0.031], [4] * 4, [40, 40, 5, 5], n=2, profile=prof)
    pool.run_until(0.02)
    pool.settle(0.02)
    pool.set_active(0.02, 1)
    assert pool.replicas[1].state == 1  # draining with R1 running
    pool.run_until(0.03)
    pool.settle(0.03)
    pool.set_active(0.03, 2)
    assert pool.replicas[1].state == 0  # active at once, no activation latency
    pool.run_until(0.0311)
    # loads at 0.031: rep0 = R0 + R2 = 2, rep1 = R1 = 1
    assert [q.slot for q in pool.replicas[1].waiting] == [3]
    pool.run_until(10.0)
    assert pool.replica_of.tolist() == [0, 1, 0, 1]


def test_per_model_routing():
    p0 = toy_profile()
    p1 = toy_profile(name="toy-b")
    layout = PoolLayout(((Instance(0),), (Instance(1),), (Instance(0),)))
    pool = ReferencePool([p0, p1], layout, exact())
    tenants = [0, 1, 1, 0, 1, 0]
    pool.attach(
        make_table([0.0, 0.001, 0.002, 0.003, 0.004, 0.005], [4] * 6, [20] * 6, tenant=tenants, tenant_names=("a", "b")),
        tenant_model={0: 0, 1: 1},
    )
    pool.run_until(10.0)
    assert pool.replica_of.tolist() == [0, 1, 1, 2, 1, 0]
    # set_active per model: model 1 has one replica
    with pytest.raises(ValueError):
        pool.set_active(10.0, 2, model=1)


def test_set_active_with_unchanged_count_is_a_no_op():
    # requests are queued on both replicas at 0.1 (max_seqs = 1); re-routing them would change the outcome
    prof = toy_profile(scheduler=dict(max_seqs=1))
    arr = [0.011, 0.018, 0.038, 0.052, 0.06, 0.12, 0.146, 0.163]
    prompt = [3, 2, 2, 4, 2, 3, 2, 1]
    out = [9, 5, 8, 8, 11, 5, 3, 7]
    res = []
    for call in (False, True):
        pool = make(arr, prompt, out, n=2, profile=prof)
        pool.run_until(0.1)
        pool.settle(0.1)
        if call:
            pool.set_active(0.1, 2)
        pool.run_until(100.0)
        res.append(pool.finish_t.copy())
    np.testing.assert_allclose(res[1], res[0], rtol=0, atol=1e-12)


def drain_profile():
    """Toy profile whose draining-idle power (30 W) differs from its active-idle power (50 W)."""
    clocks = [c.model_dump() for c in toy_profile().clocks]
    for c in clocks:
        c["draining_idle_w"] = 30.0
    return toy_profile(clocks=clocks)


def test_draining_replica_with_no_work_left_never_meters_draining_floor_when_idle():
    # an idle replica never sits in the draining state: it goes straight to standby
    pool = ReferencePool(drain_profile(), PoolLayout.single(2), exact())
    pool.attach(make_table([5.0], [4], [2]))
    pool.run_until(1.0)
    pool.set_active(1.0, 1)
    pool.run_until(3.0)
    assert pool.gpu_energy_j(3.0)[1] == pytest.approx(IDLE_W * 1.0 + STANDBY_W * 2.0)


def test_draining_replica_meter_equals_its_steps_then_standby():
    # GPU meter contract (gpu.py): step energies plus idle gaps at the state's idle power. A draining replica
    # running work has no idle gap, so the draining-idle power (30 W) must not leak into its steps.
    pool = ReferencePool(drain_profile(), PoolLayout.single(2), exact())
    pool.attach(make_table([0.0, 0.0001], [8, 8], [30, 20]))  # R1 -> replica 1
    pool.run_until(0.02)
    pool.settle(0.02)
    pool.set_active(0.02, 1)  # replica 1 drains with R1 running: no idle gap until R1 finishes
    pool.run_until(2.0)
    fin1 = pool.finish_t[1]
    assert pool.replica_of[1] == 1 and pool.replicas[1].state == 2
    steps1 = sum(e.energy_j for e in pool.log if e.gpu == 1)
    expected = IDLE_W * 0.0001 + steps1 + STANDBY_W * (2.0 - fin1)
    assert pool.gpu_energy_j(2.0)[1] == pytest.approx(expected, abs=1e-9)
