"""Calibrate a profile from measurements: StepSplit's microbenchmark grid (prefill chunks and batch sizes, decode
batches at several contexts) at every clock level, non-negative least squares fits of the step-time law (per step)
and the step-energy law (per energy window: the law is linear, so a window's energy is the law applied to its
summed terms plus the idle floor over its gaps), idle power per state, clock-change and wake latencies, and a
validation on a held-out replay (latency and energy WAPE, as ePACT's App. C.5).

Energy comes from the device counter, which advances every 20-100 ms: every window starts and ends on a counter
update (`aligned_energy`), so its energy and duration agree to the polling interval.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np
from scipy.optimize import nnls

from commitenv.backends.clock import Clock
from commitenv.backends.engine import ServingEngine, StepRecord
from commitenv.backends.gpu import GpuControl
from commitenv.profiles.schema import ClockLevel, EnergyLaw, Latencies, Profile, TimeLaw


@dataclass(frozen=True)
class Grid:
    """The microbenchmark grid. Prefill: ``batch`` requests of each ``chunk`` prompt length, one output token each.
    Decode: ``batch`` requests with each ``context`` prompt, ``decode_steps`` + 1 output tokens. Each experiment
    runs ``repeats`` times; idle power is measured over ``idle_s``."""

    prefill_chunks: tuple[int, ...] = (64, 256, 1024, 2048)
    prefill_batches: tuple[int, ...] = (1, 4)
    decode_contexts: tuple[int, ...] = (256, 1024, 4096)
    decode_batches: tuple[int, ...] = (1, 8, 32, 64)
    decode_steps: int = 24
    repeats: int = 2
    idle_s: float = 2.0
    poll_s: float = 0.001
    validation_requests: int = 64


@dataclass
class Window:
    """An energy window: its steps' summed law terms, its duration, busy time and metered energy."""

    steps: int = 0
    P: int = 0
    A: int = 0
    n: int = 0
    L: int = 0
    busy_s: float = 0.0
    duration_s: float = 0.0
    energy_j: float = 0.0


@dataclass
class ClockFit:
    mhz: int
    time: dict[str, float]
    energy: dict[str, float]
    active_idle_w: float
    time_wape: float  # of the per-step fit on the grid
    energy_wape: float  # of the per-window fit on the grid
    steps: int
    windows: int


@dataclass
class Calibration:
    profile: Profile
    clocks: list[ClockFit]
    standby_w: float
    clock_change_s: float
    activation_s: float
    validation: dict[str, float]
    grid: dict[str, Any] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        return {"profile": self.profile.name, "clocks": [asdict(c) for c in self.clocks], "standby_w": self.standby_w,
                "clock_change_s": self.clock_change_s, "activation_s": self.activation_s,
                "validation": self.validation, "grid": self.grid}


def aligned_energy(gpu: GpuControl, clock: Clock, poll_s: float, max_wait_s: float = 1.0) -> tuple[float, float]:
    """(time, energy J) of an advance of the device's energy counter, polled every ``poll_s``: the time is the
    middle of the poll interval in which the value changed (within ``poll_s / 2`` of the update)."""
    e0 = gpu.energy_mj()
    t_end = clock.now() + max_wait_s
    while clock.now() < t_end:
        t_prev = clock.now()
        clock.sleep(poll_s)
        e = gpu.energy_mj()
        if e != e0:
            return (t_prev + clock.now()) / 2, e / 1000.0
    raise RuntimeError(f"GPU {gpu.index}: the energy counter did not advance within {max_wait_s} s")


def idle_power(gpu: GpuControl, clock: Clock, seconds: float, poll_s: float) -> float:
    """Mean power over ``seconds`` with nothing running, between two counter updates (W)."""
    t0, e0 = aligned_energy(gpu, clock, poll_s)
    clock.sleep(seconds)
    t1, e1 = aligned_energy(gpu, clock, poll_s)
    return (e1 - e0) / (t1 - t0)


def run_window(engine: ServingEngine, gpu: GpuControl, clock: Clock, requests: list[tuple[int, int]], poll_s: float,
               tag: str) -> tuple[Window, list[StepRecord]]:
    """Serve ``requests`` [(prompt, output)] to completion inside one energy window."""
    t0, e0 = aligned_energy(gpu, clock, poll_s)
    for i, (p, o) in enumerate(requests):
        engine.add_request(f"{tag}-{i}", p, o)
    steps = []
    while engine.has_work():
        rec = engine.step()
        if rec is not None:
            steps.append(rec)
    t1, e1 = aligned_energy(gpu, clock, poll_s)
    w = Window(len(steps), sum(s.P for s in steps), sum(s.A for s in steps), sum(s.n for s in steps),
               sum(s.L for s in steps), sum(s.elapsed_s for s in steps), t1 - t0, e1 - e0)
    return w, steps


def _wape(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.abs(pred - meas).sum() / np.abs(meas).sum()) if np.abs(meas).sum() > 0 else 0.0


def fit_time(steps: list[StepRecord]) -> tuple[TimeLaw, float]:
    """NNLS of t = tau0 + tau1 P + tau2 n + tau3 L + tau4 A over the steps; the law and its WAPE."""
    X = np.array([[1.0, s.P, s.n, s.L, s.A] for s in steps])
    y = np.array([s.elapsed_s for s in steps])
    coef = _nnls_scaled(X, y)
    return TimeLaw(tau0=coef[0], tau1=coef[1], tau2=coef[2], tau3=coef[3], tau4=coef[4]), _wape(X @ coef, y)


def fit_energy(windows: list[Window], idle_w: float) -> tuple[EnergyLaw, float]:
    """NNLS of each window's busy energy (metered minus the idle floor over its gaps) on its summed law terms
    [steps, P, A, n, L]; the law and the WAPE of the windows' metered energy."""
    X = np.array([[w.steps, w.P, w.A, w.n, w.L] for w in windows], dtype=float)
    gaps = np.array([w.duration_s - w.busy_s for w in windows])
    y = np.array([w.energy_j for w in windows]) - idle_w * gaps
    coef = _nnls_scaled(X, y)
    pred = X @ coef + idle_w * gaps
    return (EnergyLaw(a=coef[0], c1=coef[1], c2=coef[2], b=coef[3], kappa=coef[4]),
            _wape(pred, np.array([w.energy_j for w in windows])))


def _nnls_scaled(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """NNLS with columns scaled to unit norm (the terms span ten orders of magnitude); unused columns give 0."""
    norms = np.linalg.norm(X, axis=0)
    used = norms > 0
    coef = np.zeros(X.shape[1])
    sol, _ = nnls(X[:, used] / norms[used], y)
    coef[used] = sol / norms[used]
    return coef


def _experiments(grid: Grid) -> list[list[tuple[int, int]]]:
    out = []
    for c in grid.prefill_chunks:
        for b in grid.prefill_batches:
            out.append([(c, 1)] * b)
    for ctx in grid.decode_contexts:
        for b in grid.decode_batches:
            out.append([(ctx, grid.decode_steps + 1)] * b)
    return out * grid.repeats


def _fits(profile: Profile, reqs: list[tuple[int, int]]) -> bool:
    sch = profile.scheduler
    total = sum(-(-(p + o) // sch.block_size) * sch.block_size for p, o in reqs)
    return all(p + o <= sch.context_limit for p, o in reqs) and total <= sch.kv_capacity_tokens


def measure_clock_change(gpu: GpuControl, clock: Clock, mhz: int, poll_s: float, max_wait_s: float = 5.0) -> float:
    """Seconds from `lock_clock` until the device reports the new clock (polled)."""
    t0 = clock.now()
    gpu.lock_clock(mhz)
    while clock.now() - t0 < max_wait_s:
        if gpu.current_clock_mhz() == mhz:
            return clock.now() - t0
        clock.sleep(poll_s)
    raise RuntimeError(f"GPU {gpu.index}: the clock did not reach {mhz} MHz within {max_wait_s} s")


def calibrate(gpu: GpuControl, engine: ServingEngine, clock: Clock, template: Profile, *, grid: Grid = Grid(),
              clocks_mhz: list[int] | None = None, name: str | None = None, seed: int = 0,
              progress: Callable[[str], None] | None = None) -> Calibration:
    """Measure ``engine`` on ``gpu`` and fit a profile; ``template`` gives what is not measured (model and
    hardware facts, scheduler limits, SM-share scaling; it should describe the engine's configuration)."""
    say = progress or (lambda msg: None)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"calibrate: seed must be a whole number >= 0, got {seed!r}")
    if clocks_mhz is not None and (not clocks_mhz or len(set(clocks_mhz)) != len(clocks_mhz) or any(
            isinstance(m, bool) or not isinstance(m, int) or m <= 0 for m in clocks_mhz)):
        raise ValueError(f"calibrate: clocks_mhz must be distinct whole numbers of MHz > 0, got {clocks_mhz!r}")
    supported = gpu.supported_clocks_mhz()
    levels = sorted(clocks_mhz or [c.mhz for c in template.clocks if c.mhz in supported])
    bad = [m for m in levels if m not in supported]
    if bad or not levels:
        raise ValueError(f"clocks {bad or levels}: not supported by GPU {gpu.index} (supported: {supported})")
    exps = [e for e in _experiments(grid) if _fits(template, e)]
    fits: list[ClockFit] = []
    changes = []
    for mhz in levels:
        changes.append(measure_clock_change(gpu, clock, mhz, grid.poll_s))
        idle_w = idle_power(gpu, clock, grid.idle_s, grid.poll_s)
        windows, steps = [], []
        for i, reqs in enumerate(exps):
            w, s = run_window(engine, gpu, clock, reqs, grid.poll_s, f"{mhz}-{i}")
            windows.append(w)
            steps += s
        tlaw, twape = fit_time(steps)
        elaw, ewape = fit_energy(windows, idle_w)
        fits.append(ClockFit(mhz, tlaw.model_dump(), elaw.model_dump(), idle_w, twape, ewape, len(steps), len(windows)))
        say(f"{mhz} MHz: {len(steps)} steps, {len(windows)} windows, idle {idle_w:.1f} W, time WAPE {twape:.4f}, "
            f"energy WAPE {ewape:.4f}")
    engine.sleep()
    standby_w = idle_power(gpu, clock, grid.idle_s, grid.poll_s)
    t0 = clock.now()
    engine.wake()
    activation_s = clock.now() - t0
    ref = template.reference_clock_mhz if template.reference_clock_mhz in levels else levels[-1]
    clock_change_s = float(max(changes))
    profile = _profile(template, fits, standby_w, clock_change_s, activation_s, ref, name, gpu)
    validation = validate(profile, gpu, engine, clock, grid, seed=seed)
    say(f"validation at {ref} MHz: latency WAPE {validation['latency_wape']:.4f}, energy WAPE "
        f"{validation['energy_wape']:.4f}")
    return Calibration(profile, fits, standby_w, clock_change_s, activation_s, validation, asdict(grid))


def _profile(template: Profile, fits: list[ClockFit], standby_w: float, clock_change_s: float, activation_s: float,
             ref: int, name: str | None, gpu: GpuControl) -> Profile:
    when = dt.date.today().isoformat()
    what = (f"measured by `commitenv calibrate` on GPU {gpu.index} ({gpu.name}), {when}: microbenchmark grid at "
            f"each clock, NNLS fits (see the calibration report)")
    levels = tuple(ClockLevel(mhz=f.mhz, time=TimeLaw(**f.time), energy=EnergyLaw(**f.energy),
                              active_idle_w=f.active_idle_w, draining_idle_w=f.active_idle_w) for f in fits)
    sources = dict(template.sources)
    for k in [k for k in sources if k.split(".")[0] in ("clocks", "standby_w", "latencies", "reference_clock_mhz")]:
        del sources[k]
    sources.update({"clocks": what + "; draining idle = active idle (a draining replica with nothing left runs no "
                                     "kernels)",
                    "standby_w": what + " (engine asleep)", "latencies": what + " (clock: lock until the device "
                    "reports it; activation: wake of the sleeping engine)",
                    "reference_clock_mhz": "the template's reference clock when measured, else the top level"})
    return Profile.model_validate({
        **template.model_dump(exclude={"clocks", "standby_w", "latencies", "sources", "reference_clock_mhz", "name"}),
        "name": name or f"{template.name}-calibrated", "clocks": [lv.model_dump() for lv in levels],
        "reference_clock_mhz": ref, "standby_w": standby_w,
        "latencies": Latencies(clock_change_s=clock_change_s, activation_s=activation_s).model_dump(),
        "sources": sources, "notes": f"{template.notes} Calibrated {when}.".strip()})


def validate(profile: Profile, gpu: GpuControl, engine: ServingEngine, clock: Clock, grid: Grid, *,
             seed: int = 0) -> dict[str, float]:
    """Replay a held-out random workload at the reference clock, a few requests per window: WAPE of the fitted
    laws' step latencies and window energies against the measured ones."""
    from commitenv.sim.coeffs import coeffs_for

    gpu.lock_clock(profile.reference_clock_mhz)
    clock.sleep(profile.latencies.clock_change_s + grid.poll_s)
    c = coeffs_for(profile, profile.reference_clock_index, 1.0)
    lvl = profile.clocks[profile.reference_clock_index]
    rng = np.random.default_rng(seed)
    limit = profile.scheduler.context_limit
    pred_t, meas_t, pred_e, meas_e = [], [], [], []
    left = grid.validation_requests
    while left > 0:
        k = int(min(left, rng.integers(1, 17)))
        reqs = []
        for _ in range(k):
            p = int(min(rng.lognormal(6.5, 1.0), limit // 2))
            o = int(min(rng.lognormal(4.5, 0.8), limit - p))
            reqs.append((max(p, 1), max(o, 1)))
        if not _fits(profile, reqs):
            reqs = reqs[:1]
        left -= len(reqs)
        w, steps = run_window(engine, gpu, clock, reqs, grid.poll_s, f"val-{left}")
        pred_t += [c.step_time(s.P, s.n, s.L, s.A) for s in steps]
        meas_t += [s.elapsed_s for s in steps]
        pred_e.append(sum(c.step_energy(s.P, s.n, s.L, s.A) for s in steps) + lvl.active_idle_w * (w.duration_s - w.busy_s))
        meas_e.append(w.energy_j)
    return {"latency_wape": _wape(np.array(pred_t), np.array(meas_t)),
            "energy_wape": _wape(np.array(pred_e), np.array(meas_e)), "steps": float(len(meas_t)),
            "windows": float(len(meas_e))}
