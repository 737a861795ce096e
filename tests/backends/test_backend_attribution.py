"""Per-request energy attribution on the hardware backend (`commitenv.attribution.hardware.HardwareAttributor`):
each GPU's counter energy above the profile's idle floor over uncovered time, split among the logged steps' members
in proportion to their law terms. By hand on a stub pool (no threads), the workers' step log on hand-fed records,
and on the CPU fakes (short traces in scaled real time: invariants exactly, agreement with the simulator to a
stated tolerance)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from commitenv.attribution.hardware import HardwareAttributor, floor_energy, floor_timeline
from commitenv.attribution.law import member_terms
from commitenv.attribution.online import PoolAttributor, entry_law
from commitenv.backends.clock import LockstepClock, VirtualClock
from commitenv.backends.engine import ServingEngine, StepRecord
from commitenv.backends.fake_engine import SimEngine
from commitenv.backends.fake_gpu import FakeGpu
from commitenv.backends.pool import DeviceWorker, HardwarePool, fake_backend
from commitenv.envs import CommitServeEnv
from commitenv.sim import Pool, PoolLayout
from commitenv.sim.noise import NoiseSpec
from commitenv.sim.pool import EngineOptions, StepLogEntry
from commitenv.sim.request import Req
from commitenv.workload.table import RequestTable
from helpers.profiles import attn_toy_profile, toy_profile
from helpers.scenarios import toy_three_hour

OPTS = EngineOptions(noise=NoiseSpec(0, 0), alpha=10.0, length_error_sigma=0.0)
REL = 1e-9


def _table(n: int, span_s: float, seed: int, tenants: int = 1) -> RequestTable:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, span_s, n))
    p, o = rng.integers(4, 40, n), rng.integers(2, 24, n)
    p[5] = 70  # over the toy context limit: rejected, never runs
    return RequestTable(arrival_s=t, prompt_tokens=p, output_tokens=o, tenant=(np.arange(n) % tenants).astype(np.int32),
                        request_id=np.arange(n, dtype=np.int64), tenant_names=tuple("abc"[:tenants]))


def _check_period(s) -> None:
    """metered = request shares + idle (and = busy + idle), shares and idle non-negative, per GPU too."""
    assert s.tenant_j.sum() + s.idle_j == pytest.approx(s.metered_j, rel=REL, abs=1e-9)
    assert s.busy_j == pytest.approx(s.tenant_j.sum(), rel=REL, abs=1e-9)
    assert (s.tenant_j >= 0).all() and s.idle_j >= -1e-9
    assert (s.busy_gpu >= 0).all() and (s.idle_gpu >= -1e-9).all()
    assert s.metered_gpu.sum() == pytest.approx(s.metered_j, rel=REL)


# ------------------------------------------------------------------------------------------ by hand
class _StubPool:
    """What `HardwareAttributor` reads of a pool, fed by hand: one GPU, counters and steps set by the test."""

    def __init__(self, profile, table) -> None:
        self.profiles, self.table, self.gpus = [profile], table, [None]
        self.counters_start = 0.0
        self.t = 0.0
        self.counter = np.zeros(1)
        self.steps: list[StepLogEntry] = []
        self.states = [(0.0, "active")]
        self.clocks = [(-1.0, 1000)]
        self.logging = False

    def enable_step_log(self) -> None:
        self.logging = True

    def read_counters(self):
        return self.t, self.counter.copy()

    def take_steps(self, t):
        out = [e for e in self.steps if e.t0 < t]
        self.steps = [e for e in self.steps if e.t0 >= t]
        return out

    def floor_events(self, g):
        return list(self.states), list(self.clocks)


def _entry(t0, t1, slots, new, before, decode, mhz=1000) -> StepLogEntry:
    return StepLogEntry(0, 0, t0, t1, 1, 0.0, tuple(slots), tuple(new), tuple(before), tuple(decode), clock_mhz=mhz)


def test_by_hand_the_busy_energy_is_split_by_law_terms_and_idle_is_the_floor_over_uncovered_time():
    prof = attn_toy_profile()  # top clock: a=1, c1=0.1, c2=1e-4, b=0.01, kappa=0.001; idle 50 W (40 W at 500 MHz)
    table = RequestTable(arrival_s=np.array([0.0, 0.5, 1.0]), prompt_tokens=np.array([8, 4, 5]),
                         output_tokens=np.array([3, 2, 2]), tenant=np.array([0, 1, 1], dtype=np.int32),
                         request_id=np.arange(3, dtype=np.int64), tenant_names=("a", "b"))
    pool = _StubPool(prof, table)
    att = HardwareAttributor(pool)
    assert pool.logging
    pool.steps = [
        _entry(1.0, 1.2, [0, 1], [8, 4], [0, 0], [False, False]),  # both prefill
        _entry(2.0, 2.1, [0, 1], [1, 1], [8, 4], [True, True]),  # both decode
        _entry(4.0, 6.0, [0], [1], [9], [True]),  # straddles the close at 5: half of it in each period
    ]
    own0 = [0.1 * 8 + 1e-4 * 36, 0.01 + 0.001 * 9, 0.01 + 0.001 * 10]  # c1 k + c2 (k c + k(k+1)/2); b + kappa (c+1)
    own1 = [0.1 * 4 + 1e-4 * 10, 0.01 + 0.001 * 5]
    # period 1 [0, 5]: steps cover 0.2 + 0.1 + 1.0 s, the floor (50 W) the other 3.7 s
    pool.t, pool.counter = 5.0, np.array([300.0])
    s1 = att.close(5.0)
    idle1 = 50.0 * 3.7
    busy1 = 300.0 - idle1
    w0 = [own0[0] + 0.5, own0[1] + 0.5, 0.5 * (own0[2] + 1.0)]
    w1 = [own1[0] + 0.5, own1[1] + 0.5]
    W = sum(w0) + sum(w1)
    assert s1.idle_j == pytest.approx(idle1, rel=1e-12) and s1.busy_j == pytest.approx(busy1, rel=1e-12)
    assert s1.tenant_j == pytest.approx([busy1 * sum(w0) / W, busy1 * sum(w1) / W], rel=1e-12)
    assert att.bills_j == pytest.approx([busy1 * sum(w0) / W, busy1 * sum(w1) / W, 0.0], rel=1e-12)
    own_part0 = busy1 * (own0[0] + own0[1] + 0.5 * own0[2]) / W
    assert att.own_j[0] == pytest.approx(own_part0, rel=1e-12)
    _check_period(s1)
    # period 2 [5, 10]: the rest of the straddling step (1 s); the clock drops to 500 MHz at 7 (floor 40 W) and the
    # GPU sleeps at 8 (standby 20 W): idle = 50 x 1 + 40 x 1 + 20 x 2
    pool.clocks.append((7.0, 500))
    pool.states.append((8.0, "standby"))
    pool.t, pool.counter = 10.0, np.array([500.0])
    b0 = att.bills_j[0]
    s2 = att.close(10.0)
    idle2 = 50.0 + 40.0 + 40.0
    assert s2.idle_j == pytest.approx(idle2, rel=1e-12) and s2.busy_j == pytest.approx(200.0 - idle2, rel=1e-12)
    assert att.bills_j[0] - b0 == pytest.approx(200.0 - idle2, rel=1e-12)  # its only member
    assert s2.tenant_j == pytest.approx([200.0 - idle2, 0.0], abs=1e-12)
    _check_period(s2)
    # period 3 [10, 12]: no step: everything metered is idle (more than the floor's 40 J here) ...
    pool.t, pool.counter = 12.0, np.array([545.0])
    s3 = att.close(12.0)
    assert s3.idle_j == 45.0 and s3.busy_j == 0.0 and s3.segments == 0
    # ... and a step over a period that metered less than the floor of its gaps: idle clipped, nothing busy
    pool.steps = [_entry(13.0, 13.5, [1], [1], [5], [True])]
    pool.t, pool.counter = 14.0, np.array([565.0])  # 20 J < 20 W x 1.5 s uncovered
    b1 = att.bills_j[1]
    s4 = att.close(14.0)
    assert s4.idle_j == 20.0 and s4.busy_j == 0.0 and att.bills_j[1] == b1
    assert att.bills_j[2] == 0.0  # never ran
    assert [s.start for s in (s1, s2, s3, s4)] == [0.0, 5.0, 10.0, 12.0]
    assert att.reads[-1] == (14.0, 14.0)


def test_floor_timeline_combines_states_and_clocks():
    prof = toy_profile()  # idle 50 W at 1000 MHz, 40 W at 500 MHz, standby 20 W
    times, watts = floor_timeline(prof, [(0.0, "active"), (4.0, "draining"), (6.0, "standby"), (9.0, "active")],
                                  [(-1.0, 1000), (2.0, 500), (7.0, 1000)])
    assert times.tolist() == [-1.0, 0.0, 2.0, 4.0, 6.0, 7.0, 9.0]
    assert watts.tolist() == [50.0, 50.0, 40.0, 40.0, 20.0, 20.0, 50.0]
    e = floor_energy(times, watts, np.array([0.0, 10.0]))
    assert e[1] - e[0] == pytest.approx(50 * 2 + 40 * 4 + 20 * 3 + 50 * 1)


# ------------------------------------------------------------------------------------------ the workers' step log
class _Idle(ServingEngine):
    def add_request(self, request_id, prompt_tokens, max_tokens): ...

    def step(self):
        return None

    def has_work(self):
        return False

    def sleep(self): ...

    def wake(self): ...


def test_the_worker_logs_new_tokens_decode_flags_and_recomputes_after_a_preemption():
    prof = toy_profile()
    clock = VirtualClock()
    w = DeviceWorker(0, FakeGpu(prof, clock), _Idle(), clock, lambda r, t: None)
    try:
        w._law = lambda mhz, P, n, L, A: 1000.0 * mhz + P  # marks what the log asked the law for
        w._level = lambda mhz: 500 if mhz < 750 else 1000
        w.origin = 1.0
        a, b = Req(0, 0.0, 6, 3, math.inf), Req(1, 0.0, 4, 2, math.inf)
        w.live = {"0": a, "1": b}

        def feed(rec, mhz=1000):
            e = w._log_entry(rec, mhz)
            for rid, c, g in rec.progress:  # as the worker then updates the requests
                w.live[rid].computed, w.live[rid].generated = c, g
            return e

        e1 = feed(StepRecord(2.0, 0.5, 8, 0, 0, 0, progress=(("0", 4, 0), ("1", 4, 1))))  # a chunk; b's whole prompt
        assert (e1.slots, e1.new_tokens, e1.computed_before, e1.decode) == ((0, 1), (4, 4), (0, 0), (False, False))
        assert (e1.t0, e1.t1, e1.n_steps, e1.energy_j, e1.clock_mhz) == (1.0, 1.5, 1, 1000.0 * 1000 + 8, 1000)
        e2 = feed(StepRecord(3.0, 0.1, 2, 0, 1, 5, progress=(("0", 6, 1), ("1", 5, 2))), mhz=600)
        assert (e2.new_tokens, e2.computed_before, e2.decode, e2.clock_mhz) == ((2, 1), (4, 4), (False, True), 500)
        e3 = feed(StepRecord(4.0, 0.1, 0, 0, 1, 7, progress=(("0", 7, 2),), preempted=("1",)))
        assert (e3.slots, e3.decode) == ((0,), (True,))
        e4 = feed(StepRecord(5.0, 0.1, 6, 0, 0, 0, progress=(("1", 6, 2),)))  # b recomputes from scratch
        assert (e4.new_tokens, e4.computed_before, e4.decode) == ((6,), (0,), (False,))
    finally:
        w.stop()


# ------------------------------------------------------------------------------------------ on the fake backend
def _fake_pool(prof, n_gpus: int) -> HardwarePool:
    """A pool of fakes on a lockstep virtual clock (the threads' timing cannot change the run)."""
    clock = LockstepClock()
    devices = []
    for i in range(n_gpus):
        g = FakeGpu(prof, clock, i)
        devices.append((g, SimEngine(prof, g, clock)))
    return HardwarePool(prof, devices, clock, OPTS)


def _ranks(x: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(x, kind="stable"), kind="stable").astype(np.float64)


def test_on_the_fake_backend_periods_add_up_and_bills_follow_the_simulator():
    """30 s of trace, 60 requests of two tenants on 2 GPUs on virtual time (the fake pool steps as the simulator
    does); a clock change and a deactivation mid-run. The logged steps are the simulator's (their law energy is its
    busy energy); the bills differ from its only by where the counter's 50 ms ticks put energy between periods."""
    prof = toy_profile()
    table = _table(60, 30.0, seed=3, tenants=2)
    bounds = [5.0, 10.0, 15.0, 20.0, 25.0, 30.0]

    def schedule(pool, t):
        if t == 10.0:
            pool.set_clock(t, 500)
        if t == 20.0:
            pool.set_active(t, 1)

    hw = _fake_pool(prof, 2)
    try:
        hw.attach(table)
        att = HardwareAttributor(hw, keep_log=True)
        splits = []
        for t in bounds:
            hw.run_until(t)
            splits.append(att.close(t))
            schedule(hw, t)
        hw.run_until(math.inf)
        splits.append(att.close(hw.now))
    finally:
        hw.close()
    sim = Pool(prof, PoolLayout.single(2), OPTS)
    sim.attach(table)
    sa = PoolAttributor(sim)
    for t in bounds:
        sim.run_until(t)
        sim.settle(t)
        sa.close(t)
        schedule(sim, t)
    sim.run_until(math.inf)
    sa.close(sim.now)

    for s in splits:
        _check_period(s)
    assert not att._pending
    assert sum(s.metered_j for s in splits) == pytest.approx(att._meter_prev.sum(), rel=REL)  # counters telescope
    bills = att.bills_j
    assert (bills >= 0).all() and (att.own_j >= 0).all() and (att.shared_j >= 0).all()
    assert bills[5] == 0.0 and hw.rejected[5]  # never ran
    served = ~hw.rejected
    assert (bills[served] > 0).all()
    tj = np.sum([s.tenant_j for s in splits], axis=0)
    for k in range(2):
        assert tj[k] == pytest.approx(bills[table.tenant == k].sum(), rel=REL)
    assert bills.sum() == pytest.approx(sum(s.busy_j for s in splits), rel=REL)
    # the step records are read as the engine ran them: each logged step's law energy (from the engine's own P, n,
    # L, A) equals its members' own terms plus the shared term (new tokens, computed counts and decode flags right)
    log = att.log
    coef = np.repeat(np.array([[1.0, 0.01, 0.001, 0.1, 0.0]]), len(log), axis=0)
    c_low = np.array([0.8, 0.008, 0.0009, 0.12, 0.0])
    coef[[e.clock_mhz == 500 for e in log]] = c_low
    n1 = np.ones(len(log), dtype=np.int64)
    _, law = entry_law(n1, coef, member_terms(log, n1, coef))
    assert law == pytest.approx([e.energy_j for e in log], rel=1e-12)
    assert {e.clock_mhz for e in log} == {500, 1000}
    # against the simulator on the same trace and schedule
    sb = sa.bills_j
    assert (sb[served] > 0).all() and sb[5] == 0.0
    rho = np.corrcoef(_ranks(bills[served]), _ranks(sb[served]))[0, 1]
    l1 = np.abs(bills / bills.sum() - sb / sb.sum()).sum()
    assert rho > 0.99 and l1 < 0.02, (rho, l1)
    assert bills.sum() == pytest.approx(sb.sum(), rel=1e-4)  # whole-mJ counter readings, telescoping
    assert sum(e.energy_j for e in log) == pytest.approx(sb.sum(), rel=1e-9)  # the law over the logged steps


def test_the_env_attributes_on_the_fake_backend(tmp_path):
    """A one-hour toy episode (about 100 requests) on virtual time."""
    sc = toy_three_hour(tmp_path / "sc", horizon_hours=1, commitment={"mj": [0.2]}, alpha=30.0, name="toy-hw-attr")
    env = CommitServeEnv(str(sc), backend=fake_backend(speed=None), attribution=True)
    infos = []
    try:
        env.reset(seed=0)
        assert isinstance(env.attributor, HardwareAttributor)
        done = False
        k = 0
        while not done:
            _, _, done, _, info = env.step({"active": 2 - (k >= 3), "clock": env.profile.reference_clock_index})
            infos.append(info)
            k += 1
        bills = env.bills()
    finally:
        env.close()
    sim = CommitServeEnv(str(sc), attribution=True)
    sim.reset(seed=0)
    _, _, _, _, sim_info = sim.step({"active": 2, "clock": sim.profile.reference_clock_index})
    assert set(infos[0]["attribution"]) == set(sim_info["attribution"])
    assert set(infos[0]["attribution"]["interval"]) == set(sim_info["attribution"]["interval"])
    periods = [i["attribution"]["interval"] for i in infos] + [infos[-1]["attribution"]["tail"]]
    hour = infos[-1]["attribution"]["hour"]
    for p in periods + [hour]:
        assert p["busy_j"] + p["idle_j"] == pytest.approx(p["energy_j"], rel=REL)
        assert sum(p["tenant_j"].values()) == pytest.approx(p["busy_j"], rel=REL, abs=1e-9)
        assert p["busy_j"] >= 0 and p["idle_j"] >= 0
    assert set(hour) >= {"cost_kwh_eq", "idle_cost_kwh_eq", "tenant_cost_kwh_eq", "tenant_cost_se_kwh_eq"}
    assert [p["start_s"] for p in periods[:-1]] == [600.0 * i for i in range(6)]
    total = bills["total_j"]
    assert total == pytest.approx(bills["own_j"] + bills["shared_j"], rel=1e-12)
    assert (total >= 0).all()
    assert total.sum() == pytest.approx(sum(p["busy_j"] for p in periods), rel=REL)
    assert hour["tenant_j"]["default"] + infos[-1]["attribution"]["tail"]["tenant_j"].get("default", 0.0) == \
        pytest.approx(total.sum(), rel=REL)
    ran = ~np.isnan(env.pool.first_t)  # (the trace's over-long request arrives in hour 1, past this horizon)
    assert ran.sum() > 50 and (total[ran] > 0).all() and (total[~ran] == 0).all()
