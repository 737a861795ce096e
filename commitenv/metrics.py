"""Scores (kept apart from any training reward): hourly settlement cost, signed deviation, SLO attainment.

Settlement of hour h (ePACT eq. 1 and 6): C_h = lambda_plus*[E_h - E*_h]+ + lambda_minus*[E*_h - E_h]+,
energies in kWh, each hour alone (no netting), so the day's score sum_h C_h is in kWh-equivalent.
Signed deviation delta_h = 100 (E_h - E*_h) / E*_h (positive = overuse).

Energy-only settlement (a scenario with ``commitment: {energy_only: true}``): E*_h = 0, so C_h = lambda_plus E_h
(kWh) and the deviation is undefined: `signed_deviation_pct` gives NaN for such an hour, and every reported deviation
(`summarize`, the hourly table, summary.json) is None there (JSON null), never NaN or inf.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

J_PER_KWH = 3.6e6


def deviation_cost_kwh(energy_j, commit_j, lambda_plus: float = 2.0, lambda_minus: float = 1.0):
    """Settlement cost in kWh-equivalent of energies against commitments (both in joules), elementwise."""
    e = np.asarray(energy_j, dtype=np.float64) / J_PER_KWH
    c = np.asarray(commit_j, dtype=np.float64) / J_PER_KWH
    return lambda_plus * np.maximum(e - c, 0.0) + lambda_minus * np.maximum(c - e, 0.0)


def signed_deviation_pct(energy_j, commit_j):
    """100 (E - E*) / E*, elementwise; NaN where E* = 0 (energy-only: no commitment, no deviation)."""
    e = np.asarray(energy_j, dtype=np.float64)
    c = np.asarray(commit_j, dtype=np.float64)
    if np.all(c != 0):
        return 100.0 * (e - c) / c
    e, c = np.broadcast_arrays(e, c)
    out = np.full(e.shape, np.nan)
    np.divide(100.0 * (e - c), c, out=out, where=c != 0)
    return out if out.ndim else float(out)


def deviation_pct_or_none(energy_j: float, commit_j: float) -> float | None:
    """The signed deviation of one hour in %, or None for an energy-only hour (E* = 0), as outputs report it."""
    return None if float(commit_j) == 0.0 else float(signed_deviation_pct(energy_j, commit_j))


def settlement_kind(commit_j) -> str:
    """``"energy_only"`` when every hour's commitment is 0 (every hour's energy billed), else ``"commitment"``."""
    return "energy_only" if np.all(np.asarray(commit_j, dtype=np.float64) == 0.0) else "commitment"


@dataclass(frozen=True)
class SloOutcome:
    """Deadline outcomes, pooled and by arrival hour (requests belong to the hour they arrive in).

    Per hour, ``arrivals = met + late + unfinished + rejected``: late requests finished after their deadline,
    unfinished ones have no finish time (NaN), rejected ones were never served (the engine's context-limit
    rejections; their finish time is inf)."""

    arrivals: np.ndarray  # per hour
    met: np.ndarray  # per hour
    pooled_pct: float
    late: np.ndarray | None = None  # per hour; None when built by hand without the split
    unfinished: np.ndarray | None = None
    rejected: np.ndarray | None = None

    @property
    def by_hour_pct(self) -> np.ndarray:
        return np.divide(100.0 * self.met, self.arrivals, out=np.full(len(self.met), 100.0), where=self.arrivals > 0)

    @property
    def misses(self) -> int:
        return int(np.sum(self.arrivals) - np.sum(self.met))


def arrival_hours(arrival_s: np.ndarray, hours: int) -> np.ndarray:
    """Each request's arrival hour (int64, arrival // 3600 s), those at or after the horizon in the last hour: the
    hour the SLO gate counts a request in."""
    return np.minimum((np.asarray(arrival_s) // 3600.0).astype(np.int64), hours - 1)


def slo_outcome(arrival_s: np.ndarray, finish_s: np.ndarray, deadline_s: np.ndarray, hours: int,
                rejected: np.ndarray | None = None) -> SloOutcome:
    """A request meets its SLO when it finishes at or before its deadline; unfinished (NaN) or rejected
    requests miss. ``rejected`` (bool, aligned with the requests) marks the requests the engine refused; without
    it a request whose finish time is +inf counts as rejected (the engine's mark). Requests arriving at or after
    the horizon are counted in the last hour."""
    hour = arrival_hours(arrival_s, hours)
    finish = np.asarray(finish_s, dtype=np.float64)
    deadline = np.asarray(deadline_s, dtype=np.float64)
    rej = np.isposinf(finish) if rejected is None else np.asarray(rejected, dtype=bool)
    ok = (finish <= deadline) & ~rej  # NaN compares False
    late = np.isfinite(finish) & (finish > deadline) & ~rej
    unfinished = ~ok & ~late & ~rej

    def per_hour(mask: np.ndarray) -> np.ndarray:
        return np.bincount(hour, weights=mask.astype(np.float64), minlength=hours)[:hours].astype(np.int64)

    arrivals = np.bincount(hour, minlength=hours)[:hours].astype(np.int64)
    pooled = 100.0 * float(ok.sum()) / len(ok) if len(ok) else 100.0
    return SloOutcome(arrivals, per_hour(ok), pooled, per_hour(late), per_hour(unfinished), per_hour(rej))


@dataclass(frozen=True)
class SloGate:
    """The scenario's SLO gate: every arrival hour attains at least ``100 (1 - epsilon)`` % (hours without
    arrivals pass)."""

    passed: bool
    epsilon: float
    threshold_pct: float  # 100 (1 - epsilon)
    worst_hour: int | None  # the hour with the lowest attainment among hours with arrivals (first if tied)
    worst_hour_pct: float  # its attainment; 100 when no hour has arrivals
    failed_hours: tuple[int, ...]


def slo_gate(slo: SloOutcome, epsilon: float) -> SloGate:
    """Check ``slo`` against the miss tolerance ``epsilon`` hour by hour. An hour passes when its misses are at
    most ``epsilon x arrivals`` (i.e. attainment >= 100 (1 - epsilon) %, the boundary included); the comparison
    is made on request counts with a 1e-9 slack so that float rounding of ``epsilon x arrivals`` cannot fail an
    hour exactly on the boundary (a miss count is an integer, so the slack never admits one more miss)."""
    eps = float(epsilon)
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"epsilon: expected a share in [0, 1], got {epsilon}")
    arrivals = np.asarray(slo.arrivals, dtype=np.int64)
    misses = arrivals - np.asarray(slo.met, dtype=np.int64)
    ok = misses <= eps * arrivals + 1e-9
    failed = tuple(int(h) for h in np.flatnonzero(~ok))
    att = slo.by_hour_pct
    busy = np.flatnonzero(arrivals > 0)
    if len(busy):
        worst = int(busy[np.argmin(att[busy])])
        worst_pct = float(att[worst])
    else:
        worst, worst_pct = None, 100.0
    return SloGate(not failed, eps, 100.0 * (1.0 - eps), worst, worst_pct, failed)


def summarize(
    energy_j: np.ndarray, commit_j: np.ndarray, lambda_plus: float, lambda_minus: float, slo: SloOutcome
) -> dict[str, float | int | None]:
    """The paper's Table 1 columns (plus totals) from hourly energies, commitments and SLO outcomes. The deviation
    columns cover the hours with a commitment; with none (energy-only) they are None."""
    dev = signed_deviation_pct(energy_j, commit_j)
    cost = deviation_cost_kwh(energy_j, commit_j, lambda_plus, lambda_minus)
    committed = np.asarray(commit_j, dtype=np.float64) != 0.0
    if not np.all(committed):
        dev = np.asarray(dev)[np.broadcast_to(committed, np.shape(dev))]
    some = np.size(dev) > 0
    return {
        "attainment_pct": float(slo.pooled_pct),
        "mean_abs_dev_pct": float(np.mean(np.abs(dev))) if some else None,
        "hours_within_5pct": int(np.sum(np.abs(dev) <= 5.0)) if some else None,
        "cost_kwh_eq": float(np.sum(cost)),
        "energy_mj": float(np.sum(energy_j) / 1e6),
        "commitment_mj": float(np.sum(commit_j) / 1e6),
    }
