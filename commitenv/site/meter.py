"""The site meter: the pools' settlement meters summed at every interval boundary and settled hour by hour against
the site's commitment, with each pool's Shapley share of the hour's cost (`commitenv.site.shares`). Used by the
Gymnasium env and the runner alike, in process or with the pools in Ray actors."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from commitenv.settlement import HourlySettlement
from commitenv.site.shares import RunningShares


@dataclass(frozen=True)
class SiteBooking:
    """What one boundary changed on the site meter: the site's reward (minus the open hour's cost change), the
    closed hour's bill with the pools' shares (None while it is open) and, when asked for, each pool's part of the
    reward (they sum to it)."""

    hour: int
    reward: float
    settlement: dict[str, Any] | None
    pool_reward: np.ndarray | None


class SiteMeter:
    """Settles the site meter of pools ``names`` against ``commit_j`` (J per hour) at ``lambda_plus`` /
    ``lambda_minus`` with ``intervals_per_hour`` boundaries per hour; ``pool_rewards`` computes every step's
    per-pool rewards (else the shares only when an hour closes)."""

    def __init__(self, names: tuple[str, ...], commit_j: np.ndarray, lambda_plus: float, lambda_minus: float,
                 intervals_per_hour: int, *, seed: int = 0, pool_rewards: bool = False) -> None:
        self.names = names
        self.settlement = HourlySettlement(commit_j, lambda_plus, lambda_minus, intervals_per_hour)
        self.shares = RunningShares(names, lambda_plus, lambda_minus, seed=seed)
        self.pool_rewards = pool_rewards
        self._hour_start = np.zeros(len(names))  # each pool's settlement meter when the hour began
        self.tail_energy_j = 0.0
        self.tail_cost_kwh = 0.0

    def record(self, meters: np.ndarray) -> SiteBooking:
        """Book every pool's cumulative settlement meter (J, in ``names`` order) at the next boundary."""
        booked = self.settlement.record(math.fsum(meters.tolist()))
        change = None
        if self.pool_rewards or booked.closed is not None:
            change = self.shares.update(meters - self._hour_start, float(self.settlement.commit_j[booked.hour]))
        settlement = None
        if booked.closed is not None:
            settlement = booked.closed.as_dict()
            settlement["pool_cost_share_kwh_eq"] = dict(zip(self.names, self.shares.phi.tolist()))
            settlement["pool_cost_share_se_kwh_eq"] = (None if self.shares.se is None
                                                       else dict(zip(self.names, self.shares.se.tolist())))
            self.shares.close_hour()
            self._hour_start = np.array(meters, dtype=np.float64)
        return SiteBooking(booked.hour, -booked.cost_change_kwh, settlement,
                           -change if self.pool_rewards else None)

    def finish(self, tails: np.ndarray) -> tuple[float, np.ndarray]:
        """The energy every pool drew after the last hour (J): the site's tail cost (kWh-eq, at lambda_plus) and
        each pool's share of it (its own tail at lambda_plus)."""
        self.tail_energy_j = math.fsum(tails.tolist())
        self.tail_cost_kwh = self.settlement.tail_cost(self.tail_energy_j)
        return self.tail_cost_kwh, self.shares.tail(tails)
