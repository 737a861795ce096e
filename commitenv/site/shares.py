"""Per-step rewards of a site's pools that add up to the site's reward: the Shapley value of the open hour's cost game
(players = pools, a player's worth its energy so far in the hour; `commitenv.attribution.cost_split`), differenced
from one interval boundary to the next.

Why it adds up. The site's reward for a step is -(C(M_{k+1}) - C(M_k)), C the hour's settlement cost on the site meter
and M the hour's energy so far. With v_k(S) = C(sum_{i in S} e_i(k)) the hour-to-date game, Shapley's efficiency gives
sum_i phi_i(v_k) = C(M_k) - C(0), and C(0) is the same at every step of the hour, so the differences
-(phi_i(v_{k+1}) - phi_i(v_k)) sum over the pools to the site's reward of the step exactly; over the hour they
telescope to -phi_i(v_K), the pool's Shapley share of the hour's settled cost (the hour's first step starts from
phi = 0: no energy yet). The energy after the last hour is priced linearly (lambda_plus per kWh), so its Shapley
split is each pool's own tail times lambda_plus. Sampled shares (many pools straddling E*) draw the same orders at
every step (one seed): their increments carry sampling error, their sum over the pools none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from commitenv.attribution.cost_split import hour_cost_shares
from commitenv.settlement import tail_cost_kwh


@dataclass
class RunningShares:
    """The pools' Shapley shares of the open hour's site cost, updated at every boundary (kWh-eq)."""

    names: tuple[str, ...]
    lambda_plus: float
    lambda_minus: float
    seed: int = 0
    phi: np.ndarray = field(init=False)  # the open hour's shares at the last boundary
    se: np.ndarray | None = field(init=False, default=None)  # their standard errors (None: exact)

    def __post_init__(self) -> None:
        self.phi = np.zeros(len(self.names))

    def update(self, hour_j: np.ndarray, commit_j: float) -> np.ndarray:
        """The shares of the hour so far (each pool's energy ``hour_j``, J, against the hour's commitment); returns
        each pool's change since the last boundary (its reward is minus it)."""
        split = hour_cost_shares(dict(zip(self.names, hour_j.tolist())), 0.0, commit_j, self.lambda_plus,
                                 self.lambda_minus, seed=self.seed)
        phi = np.array([split.tenant_kwh_eq[n] for n in self.names])
        self.se = None if split.se_kwh_eq is None else np.array([split.se_kwh_eq[n] for n in self.names])
        change = phi - self.phi
        self.phi = phi
        return change

    def close_hour(self) -> None:
        """The hour settled: the next one starts from no energy (all shares 0)."""
        self.phi = np.zeros(len(self.names))
        self.se = None

    def tail(self, tail_j: np.ndarray) -> np.ndarray:
        """Each pool's share of the tail's cost (its own tail at lambda_plus)."""
        return np.array([tail_cost_kwh(float(e), self.lambda_plus) for e in tail_j])
