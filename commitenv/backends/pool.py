"""`HardwarePool`: GPUs serving a trace in real time, behind the surface of the simulator's `Pool` that the
environment, the settlement and the scores use, so `CommitServeEnv(..., backend=...)` runs a controller against
hardware (NVML + vLLM) or against the CPU fakes unchanged.

A worker thread per GPU owns its engine: it admits the requests routed to it, runs one engine step after another
and records each request's first token and finish at the step's end. The pool's thread replays the trace in real
time: at each arrival's time it routes the request to the least-loaded active worker (as the simulator's router
does) and, at interval boundaries, reads each GPU's energy counter. Deactivated workers stop receiving requests,
finish what they hold (the simulator moves their queued requests away instead: an engine cannot hand its queue
over) and sleep; reactivated ones wake (the engine's wake latency). Clock changes lock every GPU's clock.

Not modelled here, because the hardware is the truth: the realism level's truth model (speed and power factors,
noise), which this pool ignores. What-if snapshots (`clone`) mirror the workers' queues into a nominal simulated
pool, so controllers that simulate (ePACT, MPC) run here too.

Step log (for per-request energy attribution, `commitenv.attribution.hardware.HardwareAttributor`): once
`enable_step_log` is called, every worker records each executed step as a `commitenv.sim.pool.StepLogEntry` of the
simulator's shape (``n_steps=1``; members, new tokens from the change of each request's computed count, computed
before, decode flags, the clock read from the GPU before the step, ``t0``/``t1`` from the record in trace time). Its
``energy_j`` is a *model estimate*, the profile's step-energy law at that clock over the record's terms: a GPU's
energy is measured only by its cumulative counter, which `read_counters` reads. Each worker also keeps its lifecycle
states and the pool the clock locks (effective after the profile's clock-change latency) with their times, from
which `floor_events` gives the idle floor's timeline.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time as _time
from dataclasses import replace
from typing import Callable

import numpy as np

from commitenv.backends.clock import Clock, LockstepClock
from commitenv.backends.engine import ServingEngine
from commitenv.backends.gpu import GpuControl, LockedClocks
from commitenv.backends.lag import LagBound, LagMeter, ReplayLagError
from commitenv.profiles.schema import Profile
from commitenv.sim import states as sim_states
from commitenv.sim.noise import NoiseSpec
from commitenv.sim.coeffs import coeffs_for
from commitenv.sim.kernel.fresh import placement_caps
from commitenv.sim.pool import EngineOptions, Pool, PoolLayout, StepLogEntry, request_terms
from commitenv.sim.request import Req, live_state
from commitenv.workload.table import RequestTable

log = logging.getLogger(__name__)
ACTIVE, DRAINING, STANDBY = "active", "draining", "standby"


class DeviceWorker:
    """One GPU and its engine, stepped by a thread of its own (engines are not thread-safe: only this thread
    calls its engine)."""

    def __init__(self, index: int, gpu: GpuControl, engine: ServingEngine, clock: Clock,
                 on_finish: Callable[[Req, float], None]) -> None:
        self.index, self.gpu, self.engine, self.clock = index, gpu, engine, clock
        self.on_finish = on_finish
        self.state = ACTIVE
        self.live: dict[str, Req] = {}
        self._inbox: collections.deque[Req] = collections.deque()
        self._want: str = ACTIVE
        self._cv = threading.Condition()
        self._stop = False
        self.error: BaseException | None = None
        self.steps = 0
        # attribution (see `HardwarePool.enable_step_log`): lifecycle states with their clock times, and once enabled
        # the step log, the clock time a step in flight started, each request's computed count as the log knows it
        self.state_log: list[tuple[float, str]] = [(clock.now(), ACTIVE)]
        self.step_log: collections.deque[StepLogEntry] | None = None
        self.in_step: float | None = None
        self.origin = 0.0
        self._law: Callable[[int, int, int, int, int], float] | None = None
        self._level: Callable[[int], int] | None = None
        self._log_c: dict[str, int] = {}
        self._thread = threading.Thread(target=self._run, name=f"commitenv-gpu{index}", daemon=True)
        clock.enter()  # counted on a shared clock before it starts (see `commitenv.backends.clock.LockstepClock`)
        self._thread.start()

    @property
    def load(self) -> int:
        return len(self.live) + len(self._inbox)

    def submit(self, r: Req) -> None:
        with self._cv:
            self._inbox.append(r)
            self.clock.unpark(self)
            self._cv.notify()

    def want(self, state: str) -> None:
        """Ask for ``ACTIVE`` (wake if asleep) or ``DRAINING`` (finish the held requests, then sleep)."""
        with self._cv:
            self._want = state
            if state == DRAINING and self.state == ACTIVE:
                self._set_state(DRAINING)
            self.clock.unpark(self)
            self._cv.notify()

    def _set_state(self, state: str) -> None:
        """Change the lifecycle state and note when (call with ``_cv`` held)."""
        if state != self.state:
            self.state_log.append((self.clock.now(), state))
        self.state = state

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self.clock.unpark(self)
            self._cv.notify()
        with self.clock.released():  # a shared clock moves on while this thread waits for the worker to finish
            self._thread.join(timeout=30)
        close = getattr(self.engine, "close", None)  # an engine in its own process (`ProcessEngine`) stops it
        if callable(close):
            close()

    def _log_entry(self, rec, mhz: int) -> StepLogEntry:
        """The step log entry of ``rec`` (called before the requests' progress is updated from it): a member's new
        tokens are the change of its computed count (from 0 after a preemption: vLLM recomputes), a decode token is
        one new token of a request whose prompt and earlier tokens were all computed (as the simulator flags it);
        ``energy_j`` is the profile's law at the step's clock over the record's terms (an estimate, not measured)."""
        known = self._log_c
        for rid in rec.preempted:
            known[rid] = 0
        slots, new, before, dec = [], [], [], []
        for rid, computed, _ in rec.progress:
            r = self.live[rid]
            c0 = known.get(rid, 0)
            if computed < c0:  # a preemption the record did not name
                c0 = 0
            known[rid] = computed
            k = computed - c0
            if k <= 0:
                continue
            g0 = r.generated  # tokens generated before this step
            slots.append(r.slot)
            new.append(k)
            before.append(c0)
            dec.append(k == 1 and g0 >= 1 and c0 + 1 == r.prompt + g0)
        for rid in rec.finished:
            known.pop(rid, None)
        level = self._level(mhz)
        t0 = rec.t_start - self.origin
        return StepLogEntry(self.index, self.index, t0, t0 + rec.elapsed_s, 1,
                            self._law(level, rec.P, rec.n, rec.L, rec.A), tuple(slots), tuple(new), tuple(before),
                            tuple(dec), clock_mhz=level, share=1.0)

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self.clock.unpark(self)
            self.clock.leave()

    def _serve(self) -> None:
        eng = self.engine
        try:
            while True:
                with self._cv:
                    if self._stop:
                        return
                    while self._inbox:
                        r = self._inbox.popleft()
                        self.live[str(r.slot)] = r
                        eng.add_request(str(r.slot), r.prompt, r.out)
                    if not eng.has_work():
                        if self.state == DRAINING and self._want == DRAINING:
                            eng.sleep()
                            self._set_state(STANDBY)
                        if not (self.state == STANDBY and self._want == ACTIVE):
                            self.clock.park(self)  # waits for work: a shared clock may move on
                            self._cv.wait(timeout=0.002)
                            self.clock.unpark(self)
                            continue
                if self.state == STANDBY:  # asked to serve again: wake outside the lock (it takes a while)
                    with self._cv:
                        self.state_log.append((self.clock.now(), ACTIVE))  # a waking GPU draws active idle
                    eng.wake()
                    with self._cv:
                        self.state = ACTIVE if self._want == ACTIVE else DRAINING
                        if self.state != ACTIVE:
                            self.state_log.append((self.clock.now(), self.state))
                    continue
                if self.state == DRAINING and self._want == ACTIVE:
                    with self._cv:
                        self._set_state(ACTIVE)
                slog = self.step_log
                if slog is not None:
                    mhz = self.gpu.current_clock_mhz()
                    self.in_step = self.clock.now()
                rec = eng.step()
                if rec is None:
                    self.in_step = None
                    continue
                if slog is not None:
                    if rec.progress:
                        slog.append(self._log_entry(rec, mhz))
                    self.in_step = None
                self.steps += 1
                t_end = rec.t_start + rec.elapsed_s
                for rid in rec.preempted:
                    self.live[rid].preemptions += 1
                for rid, computed, generated in rec.progress:  # as the engine counts them, after the step
                    r = self.live[rid]
                    if generated > r.generated and r.first_t >= 0:  # a token after the first (per-token TBT)
                        r.max_gap = max(r.max_gap, t_end - r.last_t)
                        r.last_t = t_end
                    r.computed, r.generated, r.started = computed, generated, True
                for rid in rec.first_token:
                    r = self.live[rid]
                    r.first_t = r.last_t = t_end
                    if not rec.progress:  # an engine that does not report progress: the prompt is in, and the
                        r.generated, r.computed = max(r.generated, 1), max(r.computed, r.prompt)
                        r.max_gap = np.nan  # gaps between its tokens are not known
                for rid in rec.finished:
                    r = self.live.pop(rid)
                    r.generated = r.out
                    self.on_finish(r, t_end)
        except BaseException as e:  # noqa: BLE001  (the pool's thread raises it at its next call)
            self.error = e


class HardwarePool:
    """See the module docstring. ``devices``: one (GPU, engine) per replica, all serving ``profile``'s model."""

    def __init__(self, profile: Profile, devices: list[tuple[GpuControl, ServingEngine]], clock: Clock,
                 options: EngineOptions, *, clock_mhz: int | None = None,
                 lag_bound: LagBound | None = LagBound()) -> None:
        self.profiles = [profile]
        self.lag = LagMeter(lag_bound.late_arrival_s if lag_bound is not None else LagBound.late_arrival_s)
        # (how far the replay falls behind real time: `commitenv.backends.lag`)
        self.lag_bound = lag_bound
        self.opt = options
        self.clock = clock
        # how long the replay sleeps at most between looks at the workers (clock seconds): 5 ms of real time
        self._poll_s = clock.poll_s if isinstance(clock, LockstepClock) else 0.005 * getattr(clock, "speed", 1.0)
        self.now = 0.0
        self._lock = threading.Lock()
        self.workers = [DeviceWorker(i, g, e, clock, self._finished) for i, (g, e) in enumerate(devices)]
        self.gpus = [w.gpu for w in self.workers]
        self._clock_mhz = clock_mhz if clock_mhz is not None else profile.reference_clock_mhz
        self._locked = LockedClocks(self.gpus).__enter__()  # reset on close, exceptions, exit and signals
        for g in self.gpus:
            g.lock_clock(self._clock_mhz)
        self._e0 = np.array([g.energy_mj() for g in self.gpus], dtype=np.float64)
        self._t_e0 = clock.now()  # when the counters' origin was read (clock time)
        cs = profile.latencies.clock_change_s  # the locks' times as they take effect (the profile's latency)
        self.clock_log: list[list[tuple[float, int]]] = [[(self._t_e0, int(g.current_clock_mhz()))] for g in self.gpus]
        for log_ in self.clock_log:
            log_.append((self._t_e0 + cs, self._clock_mhz))
        self._origin = self._t_e0
        self.unrouted: list[Req] = []
        self.done_slots: list[int] | None = None
        self._cursor = 0
        self.completed = 0

    # ------------------------------------------------------------------------------------------ workload
    def attach(self, table: RequestTable) -> None:
        """Serve ``table``; its time 0 is now on the pool's clock."""
        n = len(table)
        self.table = table
        t = request_terms(self.profiles, self.opt, table, np.zeros(n, dtype=np.int64))
        self.rejected, self.out_tokens, self.lref = t.rejected, t.out_tokens, t.lref
        self.deadline, self.pred_out, self.visible_deadline = t.deadline, t.pred_out, t.visible_deadline
        self.finish_t = np.full(n, np.nan)
        self.first_t = np.full(n, np.nan)
        self.max_tbt_s = np.full(n, np.nan)  # NaN also where the engine reports no per-token progress
        self.replica_of = np.full(n, -1, dtype=np.int32)
        self.preemptions = np.zeros(n, dtype=np.int32)  # from the engines' step records (preempted ids)
        self._arr = table.arrival_s.tolist()
        self._origin = self.clock.now()
        for w in self.workers:
            w.origin = self._origin

    @property
    def arrived(self) -> int:
        return self._cursor

    def _finished(self, r: Req, t_clock: float) -> None:
        with self._lock:
            s = r.slot
            self.finish_t[s] = t_clock - self._origin
            self.first_t[s] = r.first_t - self._origin
            self.max_tbt_s[s] = r.max_gap
            self.replica_of[s] = r.replica
            self.preemptions[s] = r.preemptions
            self.completed += 1
            if self.done_slots is not None:
                self.done_slots.append(s)

    def _route(self, r: Req) -> None:
        cands = [w for w in self.workers if w.state == ACTIVE]
        if not cands:
            self.unrouted.append(r)
            return
        best = min(cands, key=lambda w: w.load)  # least loaded; ties to the lowest index, as the simulator's router
        r.replica = best.index
        best.submit(r)

    def _check(self) -> None:
        for w in self.workers:
            if w.error is not None:
                raise RuntimeError(f"GPU {w.index}: the engine failed: {type(w.error).__name__}: {w.error}")

    # ------------------------------------------------------------------------------------------ the pool's time
    def run_until(self, t_end: float) -> None:
        """Replay arrivals in real time until the pool's clock reaches ``t_end`` (trace time)."""
        n = len(self._arr)
        while True:
            self._check()
            now = self.clock.now() - self._origin
            while self._cursor < n and self._arr[self._cursor] <= now:
                i = self._cursor
                self._cursor += 1
                if self.rejected[i]:
                    continue
                r = Req(i, self._arr[i], int(self.table.prompt_tokens[i]), int(self.out_tokens[i]),
                        float(self.deadline[i]))
                self.lag.routed(self._arr[i], now)
                self._route(r)
            if now >= t_end or (math.isinf(t_end) and self._cursor >= n and self._idle()):
                break
            nxt = min(self._arr[self._cursor] if self._cursor < n else math.inf, t_end)
            self.clock.sleep(min(max(nxt - now, 0.0), self._poll_s))
        self.now = max(self.now, min(t_end, self.clock.now() - self._origin))
        self._check_lag()

    def _check_lag(self) -> None:
        """Gather the engines' step overrun (engines that model their steps, the fakes, report it) and hold the lag
        to ``lag_bound``: abort with `ReplayLagError`, or warn once and mark the run."""
        lag = self.lag
        lag.modelled_step_s = math.fsum(getattr(w.engine, "modelled_step_s", 0.0) for w in self.workers)
        lag.step_overrun_s = math.fsum(getattr(w.engine, "step_overrun_s", 0.0) for w in self.workers)
        bound = self.lag_bound
        if bound is None:
            return
        first = lag.exceeded is None
        why = lag.check(bound, self.now)
        if why is None:
            return
        if bound.on_exceed == "abort":
            raise ReplayLagError(f"the hardware replay fell behind real time: {why}, so its energy and SLO numbers "
                                 "would not describe the pool. On the CPU fakes lower the speed (--backend "
                                 "fake:SPEED) or the pool's size; on GPUs run the host with free cores")
        if first:
            log.warning("the hardware replay fell behind real time: %s; the run is marked backend_lagging", why)

    def _idle(self) -> bool:
        return all(w.load == 0 for w in self.workers) and not self.unrouted

    def settle(self, t: float) -> None:
        """Nothing to cut: hardware steps are what they are."""

    def set_active(self, t: float, count: int, model: int = 0) -> None:
        """The first ``count`` workers serve; the others finish what they hold and sleep."""
        for w in self.workers:
            w.want(ACTIVE if w.index < count else DRAINING)
        if self.unrouted and count > 0:
            pending, self.unrouted = self.unrouted, []
            for r in pending:
                self._route(r)

    def set_clock(self, t: float, mhz: int, gpus: list[int] | None = None) -> None:
        cs = self.profiles[0].latencies.clock_change_s
        for g in (self.gpus if gpus is None else [self.gpus[i] for i in gpus]):
            g.lock_clock(int(mhz))
            now = self.clock.now()
            log_ = self.clock_log[g.index]
            log_[:] = [c for c in log_ if c[0] <= now]  # a newer lock replaces a pending one
            log_.append((now + cs, int(mhz)))
        self._clock_mhz = int(mhz)

    def active_count(self, model: int = 0) -> int:
        return sum(1 for w in self.workers if w.state == ACTIVE)

    # ------------------------------------------------------------------------------------------ meters and views
    def gpu_energy_j(self, t: float | None = None) -> np.ndarray:
        """Each GPU's energy counter since the pool started (J), read now (NVML's counter lags by up to one
        update period)."""
        return (np.array([g.energy_mj() for g in self.gpus], dtype=np.float64) - self._e0) / 1000.0

    def energy_j(self, t: float | None = None) -> float:
        return float(math.fsum(self.gpu_energy_j(t)))

    # ------------------------------------------------------------------------------------------ attribution
    def enable_step_log(self) -> None:
        """Make every worker record its steps (see the module docstring); call before the pool runs a step."""
        from commitenv.attribution.hardware import nearest_level

        prof = self.profiles[0]
        levels = prof.clock_mhz

        def level(mhz: int) -> int:  # the profile's level nearest to a clock the GPU reports
            return levels[nearest_level(levels, mhz)]

        def law(mhz: int, P: int, n: int, L: int, A: int) -> float:
            return coeffs_for(prof, prof.clock_index(mhz)).step_energy(P, n, L, A)

        for w in self.workers:
            w._law, w._level, w.origin = law, level, self._origin
            if w.step_log is None:
                w.step_log = collections.deque()

    def disable_step_log(self) -> None:
        for w in self.workers:
            w.step_log = None

    @property
    def counters_start(self) -> float:
        """Trace time at which the energy counters' origin was read (just before the trace's time 0)."""
        return self._t_e0 - self._origin

    def read_counters(self) -> tuple[float, np.ndarray]:
        """(trace time now, each GPU's counter since the pool started, J), read together."""
        e = self.gpu_energy_j()
        return self.clock.now() - self._origin, e

    def take_steps(self, t: float, timeout_s: float = 60.0) -> list[StepLogEntry]:
        """The logged steps not taken yet, after waiting until no worker runs a step that started before trace time
        ``t`` (at most ``timeout_s`` seconds of real time per worker; a step still running then is taken later)."""
        out: list[StepLogEntry] = []
        for w in self.workers:
            slog = w.step_log
            if slog is None:
                continue
            give_up = _time.monotonic() + timeout_s
            while (s := w.in_step) is not None and s - self._origin < t and w.error is None:
                if _time.monotonic() > give_up:
                    log.warning("GPU %d: a step in flight at %.3f s did not end within %.0f s", w.index, t, timeout_s)
                    break
                if isinstance(self.clock, LockstepClock):  # its time moves only while this thread sleeps on it
                    self.clock.sleep(self._poll_s / 50)
                else:
                    _time.sleep(1e-4)
            for _ in range(len(slog)):
                out.append(slog.popleft())
        return out

    def floor_events(self, g: int) -> tuple[list[tuple[float, str]], list[tuple[float, int]]]:
        """GPU ``g``'s lifecycle states and effective clocks (MHz) from the pool's start, with their trace times."""
        w = self.workers[g]
        with w._cv:
            states = list(w.state_log)
        o = self._origin
        return [(t - o, s) for t, s in states], [(t - o, m) for t, m in self.clock_log[g]]

    def live_requests(self) -> list[Req]:
        out = [r for w in self.workers for r in list(w.live.values())]
        return out + list(self.unrouted)

    def live_state(self) -> tuple[np.ndarray, np.ndarray]:
        """`commitenv.sim.pool.Pool.live_state` of the hardware's live requests."""
        return live_state(self.live_requests())

    def counts(self) -> dict[str, int]:
        live = self.live_requests()
        running = sum(1 for r in live if r.generated > 0)
        return {"waiting": len(live) - running, "running": running, "live": len(live), "arrived": self._cursor,
                "completed": self.completed}

    def clone(self, *, hide_lengths: bool, own_profiles: bool = False) -> Pool:
        """The serving state now as a simulated pool for what-if runs (what `commitenv.sim.take_snapshot` needs):
        a nominal mirror of every worker's state and queue (requests with their computed and generated tokens, KV
        blocks, started or waiting), cloned as the simulator clones its own pool. A step the hardware is running
        now is not in the mirror: its requests restart from their last reported progress."""
        prof = self.profiles[0]
        mirror = Pool(prof, PoolLayout.single(len(self.workers)),
                      replace(self.opt, truth=None, noise=NoiseSpec(0, 0), log_steps=False, seed=0),
                      clock_mhz=self._clock_mhz)
        mirror.now = self.now
        mirror.pred_out, mirror.visible_deadline = self.pred_out, self.visible_deadline
        mirror._n_results = len(self.out_tokens)
        states = {ACTIVE: sim_states.ACTIVE, DRAINING: sim_states.DRAINING, STANDBY: sim_states.STANDBY}
        bs, max_seqs = prof.scheduler.block_size, prof.scheduler.max_seqs
        running, waiting = [], []
        for w, free in zip(self.workers, placement_caps([prof], mirror.layout)):
            reqs = sorted((r.copy() for r in list(w.live.values())), key=lambda q: q.slot)
            run, evicted = [], []
            for c in reqs:  # started ones keep their KV while it fits (the last report may predate a preemption)
                need = -(-c.computed // bs) if c.started else 0
                if c.started and need <= free and len(run) < max_seqs:
                    c.blocks = need
                    free -= need
                    run.append(c)
                elif c.started:
                    c.computed, c.blocks = 0, 0  # as the engine would have preempted it: recompute from scratch
                    evicted.append(c)
            running.append(run)
            waiting.append(evicted + [c for c in reqs if not c.started])
        mirror.place(running, waiting, [r.copy() for r in self.unrouted], [states[w.state] for w in self.workers])
        copy = mirror.clone(hide_lengths=hide_lengths, own_profiles=own_profiles)
        copy.resume(copy.now)
        return copy

    def close(self) -> None:
        """Stop the workers and reset the GPUs' clocks (once; later calls do nothing)."""
        for w in self.workers:
            w.stop()
        self._locked.__exit__(None, None, None)


def fake_backend(speed: float | None = 200.0, *, energy_update_s: float = 0.05, noise_sigma: float = 0.0,
                 seed: int = 0, lag_bound: LagBound | None = LagBound()
                 ) -> Callable[[Profile, int, EngineOptions, int], HardwarePool]:
    """A pool factory for `CommitServeEnv(backend=...)`: one `FakeGpu` + `SimEngine` per replica on a shared
    clock running ``speed`` times real time, or, with ``speed=None``, on a `LockstepClock` (virtual time: the same
    run however loaded the machine, a controller's thinking taking no time, no lag); ``lag_bound`` holds the replay's
    lag behind real time (`commitenv.backends.lag`; None: measured, never held)."""
    if speed is not None and not (isinstance(speed, (int, float)) and math.isfinite(speed) and speed > 0):
        raise ValueError(f"speed: expected a finite number > 0 (how many times real time) or None (virtual time), "
                         f"got {speed!r}")

    def build(profile: Profile, n: int, options: EngineOptions, clock_mhz: int) -> HardwarePool:
        from commitenv.backends.clock import LockstepClock, ScaledClock
        from commitenv.backends.fake_engine import SimEngine
        from commitenv.backends.fake_gpu import FakeGpu

        clock = LockstepClock() if speed is None else ScaledClock(speed)
        devices = []
        for i in range(n):
            g = FakeGpu(profile, clock, i, energy_update_s=energy_update_s)
            devices.append((g, SimEngine(profile, g, clock, noise_sigma=noise_sigma, seed=seed + i)))
        return HardwarePool(profile, devices, clock, options, clock_mhz=clock_mhz, lag_bound=lag_bound)

    return build
