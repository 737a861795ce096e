"""Scores (kept apart from any training reward): hourly settlement cost, signed deviation, SLO attainment.

Settlement of hour h (ePACT eq. 1 and 6): C_h = lambda_plus*[E_h - E*_h]+ + lambda_minus*[E*_h - E_h]+,
energies in kWh, each hour alone (no netting), so the day's score sum_h C_h is in kWh-equivalent.
Signed deviation delta_h = 100 (E_h - E*_h) / E*_h (positive = overuse).
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
    """100 (E - E*) / E*, elementwise."""
    e = np.asarray(energy_j, dtype=np.float64)
    c = np.asarray(commit_j, dtype=np.float64)
    return 100.0 * (e - c) / c


@dataclass(frozen=True)
class SloOutcome:
    """Deadline outcomes, pooled and by arrival hour (requests belong to the hour they arrive in)."""

    arrivals: np.ndarray  # per hour
    met: np.ndarray  # per hour
    pooled_pct: float

    @property
    def by_hour_pct(self) -> np.ndarray:
        return np.divide(100.0 * self.met, self.arrivals, out=np.full(len(self.met), 100.0), where=self.arrivals > 0)


def slo_outcome(arrival_s: np.ndarray, finish_s: np.ndarray, deadline_s: np.ndarray, hours: int) -> SloOutcome:
    """A request meets its SLO when it finishes at or before its deadline; unfinished (NaN) or rejected
    (inf) requests miss. Requests arriving at or after the horizon are counted in the last hour."""
    hour = np.minimum((np.asarray(arrival_s) // 3600.0).astype(np.int64), hours - 1)
    ok = np.asarray(finish_s) <= np.asarray(deadline_s)  # NaN compares False
    arrivals = np.bincount(hour, minlength=hours)[:hours].astype(np.int64)
    met = np.bincount(hour, weights=ok.astype(np.float64), minlength=hours)[:hours].astype(np.int64)
    pooled = 100.0 * float(ok.sum()) / len(ok) if len(ok) else 100.0
    return SloOutcome(arrivals, met, pooled)


def summarize(
    energy_j: np.ndarray, commit_j: np.ndarray, lambda_plus: float, lambda_minus: float, slo: SloOutcome
) -> dict[str, float]:
    """The paper's Table 1 columns (plus totals) from hourly energies, commitments and SLO outcomes."""
    dev = signed_deviation_pct(energy_j, commit_j)
    cost = deviation_cost_kwh(energy_j, commit_j, lambda_plus, lambda_minus)
    return {
        "attainment_pct": float(slo.pooled_pct),
        "mean_abs_dev_pct": float(np.mean(np.abs(dev))),
        "hours_within_5pct": int(np.sum(np.abs(dev) <= 5.0)),
        "cost_kwh_eq": float(np.sum(cost)),
        "energy_mj": float(np.sum(energy_j) / 1e6),
        "commitment_mj": float(np.sum(commit_j) / 1e6),
    }
