"""Run the engine under one fixed configuration and meter energy per hour (the vLLM full-capacity
reference that commitments are scaled from, calibration, and the engine benchmark)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from commitenv.profiles.schema import Profile
from commitenv.settlement import HourlySettlement
from commitenv.sim.pool import EngineOptions, Pool, PoolLayout
from commitenv.workload.table import RequestTable


@dataclass(frozen=True)
class FixedRunResult:
    """Hourly energy and SLO outcome of one fixed-configuration run."""

    hourly_energy_j: np.ndarray  # energy consumed in each hour [h, h+1)
    hourly_arrivals: np.ndarray  # requests arriving in each hour
    hourly_attainment: np.ndarray  # fraction of each hour's arrivals finishing by their deadline
    attainment: float  # pooled over all arrivals
    finish_t: np.ndarray
    deadline: np.ndarray
    pool: Pool


def run_fixed(
    profile: Profile | list[Profile],
    table: RequestTable,
    *,
    n_gpus: int = 32,
    layout: PoolLayout | None = None,
    tenant_model: dict[int, int] | None = None,
    active: int | None = None,
    clock_mhz: int | None = None,
    options: EngineOptions | None = None,
    hours: int | None = None,
    interval_s: float = 60.0,
    progress: bool = False,
) -> FixedRunResult:
    """Serve ``table`` with ``active`` of ``n_gpus`` replicas at ``clock_mhz`` (defaults: all, reference clock); a
    shared pool gives its ``layout`` (every instance active) and ``tenant_model`` instead of ``n_gpus``.

    Energy is settled per hour over ``hours`` (default: the trace span rounded up); every request is then
    run to completion so that late finishes still count against their arrival hour.
    """
    opts = options or EngineOptions()
    if layout is not None and active is not None:
        raise ValueError("run_fixed: a given layout runs every instance (active must be None)")
    pool = Pool(profile, layout or PoolLayout.single(n_gpus), opts, clock_mhz=clock_mhz)
    if active is not None and active != n_gpus:
        pool.set_active(0.0, active)
    pool.attach(table, tenant_model)
    H = hours if hours is not None else max(1, math.ceil(table.duration_s / 3600.0 + 1e-9))
    steps = int(round(H * 3600.0 / interval_s))
    bar = None
    if progress:
        from tqdm import tqdm

        name = profile.name if isinstance(profile, Profile) else "+".join(p.name for p in profile)
        bar = tqdm(total=steps, unit="interval", desc=f"{name} x{len(pool.layout.gpus)}", leave=False)
    per_hour = int(round(3600.0 / interval_s))
    book = HourlySettlement(np.ones(H), intervals_per_hour=per_hour)  # hourly energies only: no commitment yet
    for k in range(1, steps + 1):
        t = k * interval_s
        pool.run_until(t)
        pool.settle(t)
        book.record(pool.energy_j(t))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    pool.run_until(math.inf)
    hour_of = np.minimum((table.arrival_s // 3600.0).astype(np.int64), H - 1)
    ok = pool.finish_t <= pool.deadline
    arrivals = np.bincount(hour_of, minlength=H)[:H]
    met = np.bincount(hour_of, weights=ok.astype(float), minlength=H)[:H]
    att = np.divide(met, arrivals, out=np.ones(H), where=arrivals > 0)
    return FixedRunResult(book.energy_j, arrivals, att, float(ok.mean()) if len(ok) else 1.0, pool.finish_t, pool.deadline, pool)
