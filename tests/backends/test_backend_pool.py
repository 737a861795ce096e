"""The hardware backend on the CPU fakes: a pool of worker threads replaying a trace, metered by the GPUs' counters,
behind the simulator pool's surface. On a lockstep virtual clock (`LockstepClock`) the threads' timing cannot
change the run, so comparisons with the simulator are exact up to the counter's granularity, however loaded the
machine; on a scaled wall clock only the invariants are checked (every request served once, causal times)."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

from commitenv.backends.clock import Clock, LockstepClock, ScaledClock
from commitenv.backends.fake_engine import SimEngine
from commitenv.backends.fake_gpu import FakeGpu
from commitenv.backends.pool import ACTIVE, STANDBY, HardwarePool, fake_backend
from commitenv.envs import CommitServeEnv
from commitenv.evaluation import run_episode, score_episode
from commitenv.sim import Pool, PoolLayout
from commitenv.sim.noise import NoiseSpec
from commitenv.sim.pool import EngineOptions
from commitenv.workload.table import RequestTable
from helpers.profiles import toy_profile
from helpers.scenarios import toy_three_hour

OPTS = EngineOptions(noise=NoiseSpec(0, 0), alpha=10.0, length_error_sigma=0.0)  # predictions fit the toy KV
# a fake counter updates every 50 ms, so a reading lags the energy drawn by at most 50 ms of each GPU's draw (the toy's
# TDP is 100 W): on the toy scenarios' 2 GPUs, 10 J
COUNTER_LAG_MJ = 2 * 0.05 * 100.0 / 1e6


def _table(n: int = 40, span_s: float = 60.0, seed: int = 2) -> RequestTable:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, span_s, n))
    return RequestTable(arrival_s=t, prompt_tokens=rng.integers(4, 40, n), output_tokens=rng.integers(2, 30, n),
                        tenant=np.zeros(n, dtype=np.int32), request_id=np.arange(n, dtype=np.int64))


def _pool(n_gpus: int = 2, clock: Clock | None = None):
    """A pool of fakes on ``clock`` (a fresh lockstep virtual clock by default)."""
    prof = toy_profile()
    clock = clock or LockstepClock()
    devices = []
    for i in range(n_gpus):
        g = FakeGpu(prof, clock, i)
        devices.append((g, SimEngine(prof, g, clock)))
    return HardwarePool(prof, devices, clock, OPTS), prof


def _served_once_causally(hw, table) -> None:
    assert not np.isnan(hw.finish_t).any() and hw.completed == len(table)
    assert np.all(hw.first_t >= table.arrival_s) and np.all(hw.finish_t >= hw.first_t)
    assert set(hw.replica_of.tolist()) == {0, 1}


def test_a_fake_pool_serves_every_request_once_and_meters_as_the_simulator_does():
    """On virtual time the worker threads step as the simulator's replicas do: the same routing, first tokens and
    finishes, and the energy counter at 60 s the simulator's energy to its whole-mJ reading."""
    table = _table()
    hw, prof = _pool()
    try:
        hw.attach(table)
        hw.run_until(60.0)
        e60 = hw.energy_j()
        hw.run_until(math.inf)
    finally:
        hw.close()
    _served_once_causally(hw, table)
    sim = Pool(prof, PoolLayout.single(2), OPTS)
    sim.attach(table)
    sim.run_until(60.0)
    sim.settle(60.0)
    assert e60 == pytest.approx(sim.energy_j(60.0), abs=2e-3)  # two counters, each read down to a whole mJ
    sim.run_until(math.inf)
    assert np.all(sim.finish_t <= sim.deadline)  # alpha 10: the deadlines are feasible (0.43 s of slack at least)
    assert np.array_equal(hw.replica_of, sim.replica_of)
    assert hw.finish_t == pytest.approx(sim.finish_t, abs=1e-9) and hw.first_t == pytest.approx(sim.first_t, abs=1e-9)
    # per-token TBT from the engines' step records (each step's progress) equals the simulator's
    assert hw.max_tbt_s == pytest.approx(sim.max_tbt_s, abs=1e-9) and (hw.max_tbt_s > 0).any()


def test_a_fake_pool_in_scaled_real_time_serves_every_request_once():
    """On a wall clock run 100 times faster the threads' timing is the machine's: only the invariants hold."""
    table = _table()
    hw, _ = _pool(clock=ScaledClock(100.0))
    try:
        hw.attach(table)
        hw.run_until(math.inf)
    finally:
        hw.close()
    _served_once_causally(hw, table)


def test_the_lockstep_clock_gives_the_same_run_twice():
    """Virtual time: two runs of the same trace are identical to the bit, whatever the threads' interleaving."""
    runs = []
    for _ in range(2):
        hw, _ = _pool()
        try:
            hw.attach(_table(n=60, span_s=30.0, seed=5))
            hw.run_until(15.0)
            hw.set_clock(15.0, 500)
            hw.run_until(math.inf)
            runs.append((hw.energy_j(), hw.finish_t.copy(), hw.replica_of.copy(), hw.now))
        finally:
            hw.close()
    (e0, f0, r0, n0), (e1, f1, r1, n1) = runs
    assert e0 == e1 and n0 == n1 and np.array_equal(f0, f1) and np.array_equal(r0, r1)


def test_the_lockstep_clock_moves_only_when_every_thread_waits():
    """Time stands still while any thread on the clock runs, then jumps to each wake-up in turn."""
    clock = LockstepClock()
    seen = []

    def sleeper(name: str, s: float) -> None:
        clock.sleep(s)
        seen.append((name, clock.now()))
        clock.leave()

    threads = []
    for name, s in (("b", 2.0), ("a", 1.0)):
        clock.enter()
        threads.append(threading.Thread(target=sleeper, args=(name, s)))
        threads[-1].start()
    time.sleep(0.05)  # real time passes; this thread still runs on the clock, so its time does not
    assert clock.now() == 0.0 and seen == []
    clock.sleep(5.0)
    for th in threads:
        th.join()
    assert seen == [("a", 1.0), ("b", 2.0)] and clock.now() == 5.0
    clock.sleep(0.0)  # nothing to wait for
    assert clock.now() == 5.0


def test_lifecycle_and_clocks_reach_the_workers():
    table = _table(n=60, span_s=60.0)
    hw, prof = _pool()
    try:
        hw.attach(table)
        hw.run_until(10.0)
        hw.set_active(10.0, 1)
        hw.set_clock(10.0, prof.clocks[0].mhz)
        hw.run_until(40.0)
        assert hw.workers[1].state == STANDBY and hw.active_count() == 1
        late = [i for i in range(len(table)) if 10.5 <= table.arrival_s[i] <= 40.0]
        hw.set_active(40.0, 2)
        hw.run_until(math.inf)
    finally:
        hw.close()
    assert all(hw.replica_of[i] == 0 for i in late)  # nothing routed to the sleeping GPU
    assert hw.workers[1].state == ACTIVE
    assert all(g.locks[:2] == [prof.reference_clock_mhz, prof.clocks[0].mhz] for g in hw.gpus)
    assert all(g.current_clock_mhz() == prof.clocks[-1].mhz for g in hw.gpus)  # reset at close
    assert hw.completed == len(table)


def test_a_failing_engine_is_reported_with_its_gpu():
    hw, prof = _pool()

    def boom():
        raise RuntimeError("CUDA error: an illegal memory access")

    hw.workers[1].engine.step = boom
    try:
        hw.attach(_table(n=10, span_s=5.0))
        with pytest.raises(RuntimeError, match="GPU 1: the engine failed: RuntimeError: CUDA error"):
            hw.run_until(math.inf)
    finally:
        hw.close()


def test_the_env_runs_on_the_fake_backend_and_scores_like_the_simulator(tmp_path):
    sc = toy_three_hour(tmp_path / "sc", horizon_hours=1, commitment={"mj": [0.2]}, alpha=30.0, name="toy-hw")
    env = CommitServeEnv(str(sc), backend=fake_backend(speed=None))  # virtual time
    try:
        obs, info = env.reset(seed=0)
        done = False
        while not done:
            obs, reward, done, _, info = env.step({"active": 2, "clock": env.profile.reference_clock_index})
            assert env.observation_space.contains(obs)
            if info["interval"] == 3:  # the what-if view of the hardware's state
                snap = env.snapshot()
                assert snap.t == pytest.approx(info["t"]) and len(snap.replicas) == 2
                assert all(s == "active" for s in snap.replicas.state)
                assert snap.simulate(2, env.clocks_mhz[-1], 600.0).energy_j > 0
        res = score_episode(env, "vllm", 0, 0.0, 0.0)
    finally:
        env.close()
    _, sim = run_episode("vllm", str(sc), 0)
    assert res.summary["requests"] == sim.summary["requests"]
    for k in ("rejected", "unfinished", "misses"):
        assert res.summary[k] == sim.summary[k] == 0, k
    assert res.summary["energy_mj"] == pytest.approx(sim.summary["energy_mj"], abs=COUNTER_LAG_MJ)
    assert all(g.current_clock_mhz() == env.profile.clocks[-1].mhz for g in env.pool.gpus)


def test_backend_argument_errors():
    with pytest.raises(ValueError, match="pool factory"):
        CommitServeEnv("epact-h200-hour-fixed-a30", backend="vllm")


def test_the_what_if_view_mirrors_the_workers_queues():
    """A snapshot of the hardware pool holds exactly its live requests, with their progress, predicted lengths
    and visible deadlines; a what-if run from it serves them all."""
    from commitenv.sim.view import take_snapshot

    n = 40
    table = RequestTable(arrival_s=np.linspace(0.0, 1.0, n), prompt_tokens=np.full(n, 12),
                         output_tokens=np.full(n, 30), tenant=np.zeros(n, dtype=np.int32),
                         request_id=np.arange(n, dtype=np.int64))
    hw, prof = _pool()
    try:
        hw.attach(table)
        hw.run_until(1.5)
        live = {r.slot: (r.computed, r.generated) for r in hw.live_requests()}
        snap = take_snapshot(hw)
    finally:
        hw.close()
    assert 0 < len(live) <= n
    seen = dict(zip(snap.requests.slot.tolist(), zip(snap.requests.computed_tokens.tolist(),
                                                     snap.requests.generated_tokens.tolist())))
    assert set(seen) == set(live)
    # progress read after the snapshot may have moved on by a step: never backwards, never past the pool's
    assert all(seen[s][0] <= live[s][0] + 42 and seen[s][1] <= live[s][1] + 1 for s in live)
    slots = snap.requests.slot
    assert np.array_equal(snap.requests.deadline_s, hw.visible_deadline[slots])
    assert np.all(snap.requests.output_tokens == np.maximum(hw.pred_out[slots],
                                                            snap.requests.generated_tokens + 1))
    w = snap.simulate(2, prof.reference_clock_mhz, 600.0)
    assert w.energy_j > 0 and w.complete and set(w.finish) == set(live)
    assert all(math.isfinite(t) for t in w.finish.values())


def test_epact_runs_on_the_fake_backend_through_the_what_if_view(tmp_path):
    """ePACT plans with snapshots of the hardware pool; on virtual time (its planning takes none) its hourly energy
    is its simulated run's to the counter's lag, with no misses in either."""
    sc = toy_three_hour(tmp_path / "sc", horizon_hours=1, commitment={"mj": [0.2]}, alpha=30.0, name="toy-ep")
    _, hw = run_episode("epact", str(sc), 0, controller_kwargs={"workers": 0}, backend=fake_backend(speed=None))
    _, sim = run_episode("epact", str(sc), 0, controller_kwargs={"workers": 0})
    assert hw.summary["energy_mj"] == pytest.approx(sim.summary["energy_mj"], abs=COUNTER_LAG_MJ)
    assert sim.summary["misses"] == 0 and hw.summary["misses"] == 0
    assert hw.summary["backend"] == "hardware"


def test_cli_run_on_the_fake_backend(tmp_path, capsys):
    from commitenv.cli import main

    sc = toy_three_hour(tmp_path / "sc", horizon_hours=1, commitment={"mj": [0.2]}, alpha=30.0, name="toy-cli")
    assert main(["run", str(sc), "--backend", "fake:600", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert '"backend": "hardware"' in out
    assert main(["run", str(sc), "--backend", "gpu"]) == 2
    assert "fake[:SPEED]" in capsys.readouterr().err
    assert main(["run", str(sc), "--backend", "fake:0"]) == 2
    assert main(["run", str(sc), "--backend", "fake", "--seeds", "0-1"]) == 2
