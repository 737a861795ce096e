"""Snapshots and what-if prediction: causality (only arrived requests, predicted lengths), exact reproduction of
the ground truth under oracle lengths and no noise, no mutation of the snapshot, determinism of seeds."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.reference import ReferencePool, reference_snapshot as take_snapshot
from helpers.profiles import toy_profile

from commitenv.sim import EngineOptions, NoiseSpec, PoolLayout, observed_arrivals, simulate
from commitenv.sim.pool import REPLAY_SLOT_BASE
from commitenv.workload.table import make_table


def workload(seed, n, rate, t_shift=0.0):
    rng = np.random.default_rng(seed)
    arr = t_shift + np.cumsum(rng.exponential(1.0 / rate, n))
    return arr, rng.integers(1, 40, n), rng.integers(2, 40, n)


def make(arr, prompt, out, *, n=2, oracle=False, noise=NoiseSpec(0, 0), seed=0, sched=None, sigma=0.25):
    opt = EngineOptions(noise=noise, oracle_lengths=oracle, seed=seed, length_error_sigma=sigma)
    pool = ReferencePool(toy_profile(scheduler=sched or {}), PoolLayout.single(n), opt)
    pool.attach(make_table(arr, prompt, out))
    return pool


def state_of(snap):
    return sorted((r.slot, r.computed, r.generated, r.out, r.blocks, r.replica, r.first_t) for r in snap._engine.live_requests())


# ------------------------------------------------------------------------------------------- causality
def test_snapshot_holds_only_arrived_unfinished_requests():
    arr, prompt, out = workload(1, 60, 40.0)
    pool = make(arr, prompt, out)
    t = 0.6
    pool.run_until(t)
    pool.settle(t)
    snap = take_snapshot(pool)
    slots = {r.slot for r in snap._engine.live_requests()}
    expected = {i for i in range(60) if arr[i] <= t and not (pool.finish_t[i] <= t)}
    assert slots == expected and len(slots) > 3
    assert set(snap.deadlines) == slots and snap.n_requests == len(slots)
    assert all(r.arrival <= t for r in snap._engine.live_requests())
    assert max(slots) < int(np.searchsorted(arr, t, side="right"))
    # the copy carries no workload: no way to reach a future arrival through it
    assert snap._engine.table is None and snap._engine.counts()["arrived"] == 0
    assert snap.t == t and snap.active == 2 and snap.clock_mhz == 1000
    for s in slots:
        assert snap.deadlines[s] == pytest.approx(pool.deadline[s])


def test_snapshot_output_lengths_are_predictions():
    arr, prompt, out = workload(2, 60, 40.0)
    pool = make(arr, prompt, out)
    pool.run_until(0.6)
    pool.settle(0.6)
    snap = take_snapshot(pool)
    live = snap._engine.live_requests()
    differs = 0
    for r in live:
        pred = int(pool.pred_out[r.slot])
        assert r.out == max(pred, r.generated + 1)
        if r.generated + 1 <= pred:
            assert r.out == pred
        differs += r.out != int(pool.out_tokens[r.slot])
    assert differs > 0, "with a length error the snapshot must not carry the true lengths"
    # the ground truth keeps the true lengths
    for r in pool.live_requests():
        assert r.out == int(pool.out_tokens[r.slot])


def test_oracle_snapshot_carries_true_lengths():
    arr, prompt, out = workload(2, 60, 40.0)
    pool = make(arr, prompt, out, oracle=True)
    pool.run_until(0.6)
    pool.settle(0.6)
    snap = take_snapshot(pool)
    assert all(r.out == int(pool.out_tokens[r.slot]) for r in snap._engine.live_requests())


def test_prediction_is_deterministic_and_seeded():
    arr, prompt, out = workload(3, 200, 40.0)
    a = make(arr, prompt, out, seed=5)
    b = make(arr, prompt, out, seed=5)
    c = make(arr, prompt, out, seed=6)
    assert np.array_equal(a.pred_out, b.pred_out)
    assert not np.array_equal(a.pred_out, c.pred_out)
    assert np.all(a.pred_out >= 1)
    # log-normal with mean one: the mean ratio stays near 1
    assert 0.9 < float(np.mean(a.pred_out / a.out_tokens)) < 1.1
    assert np.array_equal(make(arr, prompt, out, sigma=0.0).pred_out, a.out_tokens)


# ------------------------------------------------------------------------------------------- exactness
def truth_and_whatif(pool, t, horizon, action=None):
    pool.run_until(t)
    pool.settle(t)
    snap = take_snapshot(pool)
    e_t = pool.energy_j(t)
    if action is not None:
        action(pool, t)
    pool.run_until(t + horizon)
    e_truth = pool.energy_j(t + horizon) - e_t
    pool.run_until(t + horizon + 1000.0)
    return snap, e_truth


def no_queued_unstarted(pool):
    return all(r.started for rep in pool.replicas for r in rep.waiting)


@pytest.mark.parametrize("horizon", [0.05, 0.3, 5.0])
def test_oracle_whatif_reproduces_ground_truth_single_replica(horizon):
    # heavy load on one replica: queues, chunked prefill and preemptions are in flight at the snapshot
    arr, prompt, out = workload(4, 40, 200.0)
    pool = make(arr, prompt, out, n=1, oracle=True)
    t = float(arr[-1]) + 0.001  # every request has arrived: no arrivals after the snapshot
    snap, e_truth = truth_and_whatif(pool, t, horizon)
    assert snap.n_requests > 10
    w = simulate(snap, 1, 1000, horizon)
    assert w.complete
    assert w.energy_j == pytest.approx(e_truth, abs=1e-9)
    for s, f in w.finish.items():
        assert f == pytest.approx(pool.finish_t[s], abs=1e-9)
    assert pool.preemptions.sum() > 0
    margins = [snap.deadlines[s] - f for s, f in w.finish.items()]
    assert w.misses == sum(m < 0 for m in margins)
    assert w.worst_margin_s == pytest.approx(min(margins))


def test_oracle_whatif_reproduces_ground_truth_two_replicas():
    arr, prompt, out = workload(21, 12, 20.0)
    pool = make(arr, prompt, out, n=2, oracle=True)
    t = float(arr[-1]) + 0.001
    pool.run_until(t)
    pool.settle(t)
    assert no_queued_unstarted(pool) and pool.live >= 4  # no queued requests; the queued case is tested below
    snap, e_truth = truth_and_whatif(pool, t, 0.2)
    w = simulate(snap, 2, 1000, 0.2)
    assert w.energy_j == pytest.approx(e_truth, abs=1e-9)
    assert w.finish == pytest.approx({s: pool.finish_t[s] for s in w.finish}, abs=1e-9)


@pytest.mark.parametrize("active,mhz", [(1, 1000), (2, 500), (1, 500)])
def test_oracle_whatif_of_an_action_equals_truth_taking_it(active, mhz):
    arr, prompt, out = workload(6, 30, 80.0)
    pool = make(arr, prompt, out, n=2, oracle=True)
    t = float(arr[-1]) + 0.001

    def act(p, t):
        p.set_active(t, active)
        p.set_clock(t, mhz)

    snap, e_truth = truth_and_whatif(pool, t, 0.5, act)
    w = simulate(snap, active, mhz, 0.5)
    assert w.energy_j == pytest.approx(e_truth, abs=1e-9)
    assert w.finish == pytest.approx({s: pool.finish_t[s] for s in w.finish}, abs=1e-9)


def test_oracle_whatif_with_replayed_future_arrivals_matches_truth():
    # the truth serves arrivals before and after t; the what-if is told the later ones as a forecast
    arr, prompt, out = workload(7, 30, 60.0)
    t = float(arr[14]) + 0.0001
    pool = make(arr, prompt, out, n=2, oracle=True)
    pool.run_until(t)
    pool.settle(t)
    assert pool.arrived == 15
    snap = take_snapshot(pool)
    later = make_table(arr[15:], prompt[15:], out[15:])
    e_t = pool.energy_j(t)
    H = float(arr[-1] - t) + 0.01
    pool.run_until(t + H)
    e_truth = pool.energy_j(t + H) - e_t
    pool.run_until(t + 1000.0)
    w = simulate(snap, 2, 1000, H, arrivals=later)
    assert set(w.finish) == set(range(15)) - {i for i in range(15) if pool.finish_t[i] <= t}
    assert w.energy_j == pytest.approx(e_truth, abs=1e-9)
    assert w.finish == pytest.approx({s: pool.finish_t[s] for s in w.finish}, abs=1e-9)
    # followed to completion, the replayed arrivals finish when their ground-truth twins do
    wt = simulate(snap, 2, 1000, H, arrivals=later, track_arrivals=True)
    assert wt.energy_j == w.energy_j and wt.misses == w.misses
    for i in range(len(later)):
        assert wt.finish[REPLAY_SLOT_BASE + i] == pytest.approx(pool.finish_t[15 + i], abs=1e-9)
    # the slacks: the snapshot's requests (in its order), then the replayed ones, each its ground-truth twin's
    # deadline - finish; those below zero are the misses
    live = snap.requests.slot.tolist()
    truth = [pool.deadline[s] - pool.finish_t[s] for s in live] + [pool.deadline[15 + i] - pool.finish_t[15 + i]
                                                                   for i in range(len(later))]
    assert wt.slack_s == pytest.approx(truth, abs=1e-9)
    assert np.count_nonzero(np.asarray(wt.slack_s) < 0) == wt.misses + wt.forecast_misses
    assert len(w.slack_s) == len(live)  # without tracking, only the snapshot's requests


def test_oracle_whatif_reproduces_truth_with_queued_requests_on_several_replicas():
    # simulate() applies the unchanged configuration (set_active with the same count): that must not re-route
    # the requests queued on the two replicas, or the what-if diverges from the ground truth
    arr = [0.011, 0.018, 0.038, 0.052, 0.06, 0.099]
    prompt = [3, 2, 2, 4, 2, 3]
    out = [9, 5, 8, 8, 11, 5]
    pool = make(arr, prompt, out, n=2, oracle=True, sched=dict(max_seqs=1))
    t = 0.1
    snap, e_truth = truth_and_whatif(pool, t, 0.5)
    w = simulate(snap, 2, 1000, 0.5)
    assert w.finish == pytest.approx({s: pool.finish_t[s] for s in w.finish}, abs=1e-9)
    assert w.energy_j == pytest.approx(e_truth, abs=1e-9)


# ------------------------------------------------------------------------------------------- purity
def test_simulate_does_not_mutate_snapshot():
    arr, prompt, out = workload(8, 40, 100.0)
    pool = make(arr, prompt, out, n=2)
    pool.run_until(0.2)
    pool.settle(0.2)
    snap = take_snapshot(pool)
    before = state_of(snap)
    e_before = snap._engine.energy_j(0.2)
    w1 = simulate(snap, 1, 500, 0.3)
    w2 = simulate(snap, 1, 500, 0.3)
    w3 = simulate(snap, 2, 1000, 0.3, arrivals=observed_arrivals(pool, 0.1))
    w4 = simulate(snap, 1, 500, 0.3)
    assert w1 == w2 == w4
    assert w3 != w1
    assert state_of(snap) == before
    assert snap._engine.energy_j(0.2) == e_before and snap._engine.now == 0.2
    assert [r.state for r in snap._engine.replicas] == [0, 0]
    assert snap._engine.gpus[0].clock_idx == 1 and snap._engine.gpus[0].pending_clock is None


def test_simulate_does_not_touch_ground_truth():
    arr, prompt, out = workload(9, 40, 100.0)
    a = make(arr, prompt, out, n=2, noise=NoiseSpec())
    b = make(arr, prompt, out, n=2, noise=NoiseSpec())
    for t in (0.1, 0.2, 0.3):
        for p in (a, b):
            p.run_until(t)
            p.settle(t)
        simulate(take_snapshot(a), 1, 500, 0.2, arrivals=observed_arrivals(a, 0.1))
    for p in (a, b):
        p.run_until(100.0)
    assert a.finish_t.tolist() == b.finish_t.tolist()
    assert a.energy_j(100.0) == b.energy_j(100.0)


def test_observed_arrivals_are_causal_and_predicted():
    arr, prompt, out = workload(10, 60, 40.0)
    pool = make(arr, prompt, out)
    t = 0.8
    pool.run_until(t)
    obs = observed_arrivals(pool, 0.3)
    idx = [i for i in range(60) if t - 0.3 <= arr[i] <= t]
    assert obs.arrival_s.tolist() == pytest.approx([arr[i] + 0.3 for i in idx])
    assert obs.prompt_tokens.tolist() == [prompt[i] for i in idx]
    assert obs.output_tokens.tolist() == [int(pool.pred_out[i]) for i in idx]
    assert all(a >= t for a in obs.arrival_s)


# ------------------------------------------------------------------------------------------- seeds
def test_same_seed_same_numbers_other_seed_other_energy():
    arr, prompt, out = workload(11, 50, 80.0)
    runs = []
    for seed in (3, 3, 4):
        p = make(arr, prompt, out, n=2, noise=NoiseSpec(0.05, 0.05), seed=seed)
        for t in np.linspace(0.1, 3.0, 12):
            p.run_until(float(t))
            p.settle(float(t))
        p.run_until(100.0)
        runs.append((p.finish_t.copy(), p.energy_j(100.0), p.first_t.copy()))
    assert np.array_equal(runs[0][0], runs[1][0]) and runs[0][1] == runs[1][1]
    assert np.array_equal(runs[0][2], runs[1][2])
    assert runs[0][1] != runs[2][1]
    assert not np.array_equal(runs[0][0], runs[2][0])


def test_noise_is_mean_one_and_off_means_exact():
    arr, prompt, out = workload(12, 50, 80.0)
    clean = make(arr, prompt, out, n=2)
    clean.run_until(100.0)
    noisy = [make(arr, prompt, out, n=2, noise=NoiseSpec(0.03, 0.02), seed=s) for s in range(4)]
    for p in noisy:
        p.run_until(100.0)
    # mean-one factors: energies stay within a few percent of the clean run
    for p in noisy:
        assert abs(p.energy_j(100.0) / clean.energy_j(100.0) - 1) < 0.02


def test_oracle_whatif_with_wakeup_and_pending_clock_in_flight():
    # truth: 3 replicas; at 0.1 the count drops to 1 (replicas 1, 2 drain, then stand by); at 0.45 it rises to
    # 2 (replica 1 wakes, 1 s latency) and a clock change to 500 MHz is requested (0.3 s latency). At the
    # snapshot (0.55) replica 1 is waking and the clock change is pending; both complete inside the horizon.
    prof = toy_profile(latencies=dict(clock_change_s=0.3, activation_s=1.0))
    arr, prompt, out = workload(13, 40, 60.0)
    pool = ReferencePool(prof, PoolLayout.single(3), EngineOptions(noise=NoiseSpec(0, 0), oracle_lengths=True))
    pool.attach(make_table(arr, prompt, out))
    pool.run_until(0.1)
    pool.settle(0.1)
    pool.set_active(0.1, 1)
    pool.run_until(0.45)
    pool.settle(0.45)
    assert [r.state for r in pool.replicas] == [0, 2, 2]
    pool.set_active(0.45, 2)
    pool.set_clock(0.45, 500)
    t = 0.55
    pool.run_until(t)
    pool.settle(t)
    assert [r.state for r in pool.replicas] == [0, 3, 2]  # active, waking, standby
    assert pool.gpus[0].pending_clock is not None
    snap = take_snapshot(pool)
    assert snap.active == 2 and snap.clock_mhz == 1000
    e_t = pool.energy_j(t)
    H = 2.0
    pool.run_until(t + H)
    e_truth = pool.energy_j(t + H) - e_t
    pool.run_until(t + 1000.0)
    # arrivals after t are replayed as the forecast, with their true lengths
    k = int(np.searchsorted(arr, t, side="right"))
    later = make_table(arr[k:], prompt[k:], out[k:])
    w = simulate(snap, 2, 500, H, arrivals=later)
    assert w.complete and len(w.finish) > 10
    assert w.energy_j == pytest.approx(e_truth, abs=1e-9)
    assert w.finish == pytest.approx({s: pool.finish_t[s] for s in w.finish}, abs=1e-9)
