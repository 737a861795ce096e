"""Hourly settlement: the one place where a metered energy stream becomes hourly energies, deviations and costs
against the commitments (used by the environment, the fixed-configuration runner and scoring alike).

Each hour is settled alone (ePACT eq. 1 and 6): C_h = lambda_plus [E_h - E*_h]+ + lambda_minus [E*_h - E_h]+ in
kWh-equivalent, with E_h the energy metered in [h, h+1) hours. Feeding the meter reading at every interval
boundary gives the change of the open hour's cost, whose sum over an episode telescopes to
-(sum_h C_h) + lambda_minus sum_h E*_h (the environment's reward, which also pays `tail_cost` for the energy drawn
after the last hour).

A commitment may be 0 (energy-only settlement, ``commitment: {energy_only: true}``): the formula is unchanged, so
such an hour costs lambda_plus E_h (kWh), the reward offset is 0 and the hour's deviation is undefined
(``HourSettled.deviation_pct`` is None). Negative or non-finite commitments are refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from commitenv.metrics import J_PER_KWH, deviation_cost_kwh, deviation_pct_or_none


def remaining_per_interval(commit_j: float, used_j: float, k: int, K: int) -> float:
    """The hour's commitment left after ``used_j`` of it in ``k`` of its ``K`` intervals, split evenly over the
    intervals left (J; 0 once the hour is over): the target an env's ``info["target_j"]`` reports."""
    return (commit_j - used_j) / (K - k) if k < K else 0.0


def tail_cost_kwh(energy_j: float, lambda_plus: float) -> float:
    """The cost of energy drawn after the last settled hour (the completion tail): an hour for which nothing was
    bought, so every joule is overuse, lambda_plus E (kWh-eq; the energy-only formula, E* = 0)."""
    if not (energy_j >= -1e-6 and np.isfinite(energy_j)):
        raise ValueError(f"settlement: the tail's energy must be finite and >= 0, got {energy_j} J")
    return float(lambda_plus * max(energy_j, 0.0) / J_PER_KWH)


@dataclass(frozen=True)
class HourSettled:
    """The bill of one closed hour."""

    hour: int
    energy_j: float
    commitment_j: float
    deviation_pct: float | None  # None: an energy-only hour (E* = 0) has no deviation
    cost_kwh_eq: float

    def as_dict(self) -> dict[str, float | int | None]:
        return {"hour": self.hour, "energy_j": self.energy_j, "commitment_j": self.commitment_j,
                "deviation_pct": self.deviation_pct, "cost_kwh_eq": self.cost_kwh_eq}


@dataclass(frozen=True)
class IntervalSettled:
    """What one interval boundary changed: the interval's energy, the open hour's cost change, the closed hour."""

    hour: int
    interval_j: float
    cost_change_kwh: float
    closed: HourSettled | None


@dataclass
class HourlySettlement:
    """Settles a cumulative energy meter, read at every interval boundary, hour by hour against ``commit_j``
    (finite, >= 0; 0 = an energy-only hour)."""

    commit_j: np.ndarray  # one commitment per hour of the horizon, J
    lambda_plus: float = 2.0
    lambda_minus: float = 1.0
    intervals_per_hour: int = 60
    energy_j: np.ndarray = field(init=False)  # settled energy of every closed hour (0 while open)
    cost_kwh: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        c = np.asarray(self.commit_j, dtype=np.float64)
        if c.ndim != 1 or len(c) == 0 or not np.all(np.isfinite(c)) or np.any(c < 0):
            raise ValueError(f"commitments: expected one finite value >= 0 per hour (0: energy-only), got {c}")
        self.commit_j = c
        self.energy_j = np.zeros(len(c))
        self.cost_kwh = np.zeros(len(c))
        self.k = 0
        self.e_prev = 0.0
        self.e_hour_start = 0.0

    @property
    def hours(self) -> int:
        return len(self.commit_j)

    @property
    def reward_offset_kwh(self) -> float:
        """lambda_minus sum_h E*_h: the cost of an hour with no energy, which the telescoping reward starts from."""
        return float(self.lambda_minus * self.commit_j.sum() / J_PER_KWH)

    @property
    def hour_so_far_j(self) -> float:
        return self.e_prev - self.e_hour_start

    def cost(self, energy_j: float, hour: int) -> float:
        return float(deviation_cost_kwh(energy_j, self.commit_j[hour], self.lambda_plus, self.lambda_minus))

    def tail_cost(self, energy_j: float) -> float:
        """The cost of energy drawn after the last settled hour (`tail_cost_kwh`)."""
        return tail_cost_kwh(energy_j, self.lambda_plus)

    def record(self, meter_j: float) -> IntervalSettled:
        """Book the cumulative meter reading at the end of the next interval."""
        if self.k >= self.hours * self.intervals_per_hour:
            raise RuntimeError("settlement: every hour of the horizon is already closed")
        h = self.k // self.intervals_per_hour
        m_old = self.e_prev - self.e_hour_start
        m_new = meter_j - self.e_hour_start
        d_cost = self.cost(m_new, h) - self.cost(m_old, h)
        interval_j = meter_j - self.e_prev
        self.e_prev = meter_j
        self.k += 1
        closed = None
        if self.k % self.intervals_per_hour == 0:
            self.energy_j[h] = m_new
            self.cost_kwh[h] = self.cost(m_new, h)
            ec = float(self.commit_j[h])
            closed = HourSettled(h, float(m_new), ec, deviation_pct_or_none(m_new, ec), float(self.cost_kwh[h]))
            self.e_hour_start = meter_j
        return IntervalSettled(h, float(interval_j), float(d_cost), closed)
