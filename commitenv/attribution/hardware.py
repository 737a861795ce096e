"""Closed-form shares on a hardware pool, period by period: StepSplit where only each GPU's cumulative energy
counter is measured (`commitenv.backends.pool.HardwarePool`; what `CommitServeEnv(..., backend=...,
attribution=True)` uses).

What is measured: each GPU's energy counter (NVML's total-energy counter; the fakes' `FakeGpu`), read at every
period close, and every engine step's start, duration and per-request progress (the workers' step log, entries of the
simulator's `StepLogEntry` shape with ``n_steps=1``). What is modelled: the law terms of each step's members (the
profile's step-energy law at the step's clock, `commitenv.attribution.law.member_terms`) and the GPU's idle floor
(the profile's active-idle, draining-idle or standby power at its clock, from the workers' lifecycle states and the
pool's clock locks, effective after the profile's clock-change latency). Per GPU and period ``[start, end]``:

    metered_j = counter(end) - counter(start)
    idle_j    = floor power integrated over the time of the period no step of that GPU covers, clipped to
                [0, metered_j]; all of metered_j when no step of the GPU falls in the period
    busy_j    = metered_j - idle_j

and ``busy_j`` is divided among the period's step members in proportion to their law terms: member i of step k
weighs ``f_k * (e_ik + a_k / m_k)`` (own terms plus an equal part of the step's shared term), where ``f_k`` is the
fraction of the step's time inside the period (a step straddling a close is split by time). So a period's request
shares add up to its busy energy exactly and busy + idle = metered; a common scale error of the law's coefficients
cancels (only the ratios c1 : c2 : b : kappa : a and the floor matter). The profile's law energies themselves are
never billed: a step's ``energy_j`` in the log is a model estimate, kept for inspection only.

Why the floor over uncovered time is idle: the profiles' step energies include the GPU's floor over the step (as the
simulator meters them), so the counter is the floor over the gaps between steps plus the steps' energies; removing
the floor of the gaps leaves the steps' energy, the part the requests caused. Accuracy: the floor is a profile
figure (a GPU idling above or below it moves energy between idle and the requests of that period), the counter
advances every 20-100 ms and is read at the close's wall time (a lag of one update moves up to one update's energy
across a boundary; it cancels over consecutive periods), the weights are the law's, not the hardware's (shares are
as good as the calibrated ratios), and a prefix-cache hit on the engine counts as computed prompt tokens.

Periods are read in trace time: ``close(t)`` reads the counters *now* (at or after ``t`` on the pool's clock), waits
for every step that started before then to be logged, and splits; `PeriodSplit.start`/``end`` report the nominal
boundaries, ``reads`` the trace times the counters were read. The first period starts when the pool read its
counters' origin.
"""

from __future__ import annotations

import numpy as np

from commitenv.attribution.law import member_terms
from commitenv.attribution.online import PeriodSplit, PoolAttributor, entry_law

_FLOOR_KEYS = {"active": "active_idle_w", "draining": "draining_idle_w"}


def nearest_level(levels: list[int], mhz: float) -> int:
    """Index of the clock level nearest to ``mhz`` (ties to the higher level)."""
    return min(range(len(levels)), key=lambda i: (abs(levels[i] - mhz), -levels[i]))


def floor_timeline(profile, states: list[tuple[float, str]], clocks: list[tuple[float, int]]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(times, watts): the idle floor as a step function from lifecycle states and effective clocks, each a list of
    (time, value) in time order; before the first event of either list its first value holds."""
    levels = profile.clock_mhz
    times = sorted({t for t, _ in states} | {t for t, _ in clocks})
    watts = []
    i = j = 0
    for t in times:
        while i + 1 < len(states) and states[i + 1][0] <= t:
            i += 1
        while j + 1 < len(clocks) and clocks[j + 1][0] <= t:
            j += 1
        state = states[i][1]
        if state == "standby":
            w = profile.standby_w
        else:
            w = getattr(profile.clocks[nearest_level(levels, clocks[j][1])], _FLOOR_KEYS[state])
        watts.append(w)
    return np.asarray(times, dtype=np.float64), np.asarray(watts, dtype=np.float64)


def floor_energy(times: np.ndarray, watts: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The floor's cumulative energy (J, from ``times[0]``) at ``t``."""
    cum = np.concatenate([[0.0], np.cumsum(watts[:-1] * np.diff(times))])
    i = np.clip(np.searchsorted(times, t, side="right") - 1, 0, len(times) - 1)
    return cum[i] + watts[i] * (np.asarray(t, dtype=np.float64) - times[i])


class HardwareAttributor(PoolAttributor):
    """Step-sharing shares of a hardware ``pool`` per period and per request; see the module docstring.

    ``pool`` provides ``table``, ``profiles`` (one), ``gpus``, ``enable_step_log()``, ``counters_start``,
    ``read_counters() -> (trace time, per-GPU J)``, ``take_steps(t) -> [StepLogEntry]`` (the steps logged so far,
    all those that started before ``t`` included) and ``floor_events(g) -> (states, clocks)``, as
    `commitenv.backends.pool.HardwarePool` does. ``keep_log``: keep every logged step in ``log``."""

    def __init__(self, pool, tenant=None, *, n_tenants: int | None = None, keep_log: bool = False) -> None:
        if getattr(pool, "table", None) is None:
            raise ValueError("HardwareAttributor: attach the pool to its workload first (pool.attach(table))")
        if any(getattr(w, "steps", 0) for w in getattr(pool, "workers", ())):
            raise ValueError("HardwareAttributor: attach before the pool runs a step (its steps were not logged)")
        if len(pool.profiles) != 1:
            raise ValueError("HardwareAttributor: a hardware pool serves one model")
        self._init_bills(pool, tenant, n_tenants)
        self.profile = pool.profiles[0]
        self.n_gpus = len(pool.gpus)
        self._rep_gpu = np.arange(self.n_gpus, dtype=np.int64)  # one instance per GPU: replica = GPU
        self._rep_model = np.zeros(self.n_gpus, dtype=np.int64)
        self._coef: dict = {}
        self._colocated = False
        self._pending: list = []  # steps straddling the last close (their later part is priced next)
        self.log: list | None = [] if keep_log else None
        self._start = float(pool.counters_start)  # trace time the open period started (the counters' origin)
        self._t_prev = 0.0  # the nominal start the open period reports
        self._meter_prev = np.zeros(self.n_gpus)
        self.reads: list[tuple[float, float]] = []  # (nominal t, trace time the counters were read) per close
        self.periods = 0
        self.entries = 0
        pool.enable_step_log()

    def detach(self) -> None:
        """Stop the workers' step log (steps not yet closed are dropped)."""
        off = getattr(self.pool, "disable_step_log", None)
        if callable(off):
            off()
        self._pending.clear()

    # ------------------------------------------------------------------------------------------ periods
    def close(self, t: float) -> PeriodSplit:
        """End the open period: read the counters now (after ``pool.run_until(t)``), take the logged steps and
        split each GPU's busy energy among them; see the module docstring."""
        pool = self.pool
        if t < self._t_prev - 1e-9:
            raise ValueError(f"close: t={t} precedes the open period's start {self._t_prev}")
        t_read, meter = pool.read_counters()
        meter = np.asarray(meter, dtype=np.float64)
        metered = meter - self._meter_prev
        self._meter_prev = meter
        start = self._start
        end = max(float(t_read), start)
        new = pool.take_steps(end)
        if self.log is not None:
            self.log.extend(new)
        rows = self._pending + new
        ng = self.n_gpus
        busy = np.zeros(ng)
        idle = metered.copy()  # a GPU without steps in the period: all idle
        tj, gj, priced = np.zeros(self.n_tenants), np.zeros(ng), 0
        if rows:
            head = np.array([(e.gpu, e.t0, e.t1) for e in rows], dtype=np.float64).reshape(len(rows), 3)
            gpu, t0, t1 = head[:, 0].astype(np.int64), head[:, 1], head[:, 2]
            lo, hi = np.maximum(t0, start), np.minimum(t1, end)
            dur = t1 - t0
            done = t1 <= end
            frac = np.where(dur > 0, np.clip(np.divide(hi - lo, dur, out=np.zeros(len(rows)), where=dur > 0), 0, 1),
                            done.astype(np.float64))
            self._pending = [e for e, d in zip(rows, done.tolist()) if not d]
            for g in np.unique(gpu).tolist():
                sel = np.flatnonzero(gpu == g)
                if not (frac[sel] > 0).any():
                    continue
                times, watts = floor_timeline(self.profile, *pool.floor_events(g))
                o = sel[np.argsort(lo[sel], kind="stable")]
                a, b = lo[o], hi[o]
                run = np.maximum.accumulate(b)
                a = np.maximum(a, np.concatenate([[start], run[:-1]]))  # steps of one GPU never overlap; if they did
                ok = b > a
                covered = float(np.sum(floor_energy(times, watts, b[ok]) - floor_energy(times, watts, a[ok])))
                total = float(np.diff(floor_energy(times, watts, np.array([start, end])))[0])
                idle[g] = min(max(total - covered, 0.0), metered[g])
                busy[g] = metered[g] - idle[g]
            use = np.flatnonzero(frac > 0)
            if len(use):
                prow = [rows[i] for i in use.tolist()]
                pg, pf = gpu[use], frac[use]
                mhz = np.array([e.clock_mhz for e in prow], dtype=np.int64)
                share = np.array([e.share for e in prow], dtype=np.float64)
                n_steps = np.array([e.n_steps for e in prow], dtype=np.int64)
                coef = self._coeff_arrays(pg, mhz, share)
                mt = member_terms(prow, n_steps, coef)
                _, law = entry_law(n_steps, coef, mt)
                w = pf * law
                wg = np.bincount(pg, weights=w, minlength=ng)
                fg = np.bincount(pg, weights=pf, minlength=ng)
                energy = np.where(wg[pg] > 0, busy[pg] * np.divide(w, wg[pg], out=np.zeros(len(w)), where=wg[pg] > 0),
                                  busy[pg] * pf / fg[pg])
                tj, gj = self._split(pg, n_steps, energy, coef, mt)
                priced = len(prow)
        self._start = end
        self.reads.append((float(t), float(t_read)))
        start_nominal, self._t_prev = self._t_prev, float(t)
        self.periods += 1
        total_m = float(metered.sum())
        busy_j = float(gj.sum())
        return PeriodSplit(start_nominal, float(t), total_m, busy_j, total_m - busy_j, tj, metered, gj, priced)
