"""The MPC controller's causal forecast: the work of the coming intervals from observed arrivals, its tracked
error, the work scenarios the plan prices, a shape prior from the public commitments, and the fraction of
requests a clock level makes late whatever the capacity. Everything here reads only arrived requests (with
predicted output lengths) and public scenario terms."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def normal_nodes(S: int) -> tuple[np.ndarray, np.ndarray]:
    """``S`` equally likely standard-normal points (the medians of S equal-probability bins) and their
    probabilities 1/S; S = 1 gives the single point 0."""
    if S < 1:
        raise ValueError(f"scenarios: expected at least 1, got {S}")
    from statistics import NormalDist

    nd = NormalDist()
    z = np.array([nd.inv_cdf((i + 0.5) / S) for i in range(S)])
    return z, np.full(S, 1.0 / S)


@dataclass(frozen=True)
class Work:
    """Work of a set of requests at every clock level: replica-seconds ``busy_s`` (F,), step energy
    ``energy_j`` (F,) and the number of requests."""

    busy_s: np.ndarray
    energy_j: np.ndarray
    count: float

    @staticmethod
    def zero(F: int) -> "Work":
        return Work(np.zeros(F), np.zeros(F), 0.0)

    def scaled(self, f: float) -> "Work":
        return Work(self.busy_s * f, self.energy_j * f, self.count * f)

    def plus(self, other: "Work") -> "Work":
        return Work(self.busy_s + other.busy_s, self.energy_j + other.energy_j, self.count + other.count)


@dataclass
class ErrorTracker:
    """Exponentially weighted statistics of the log forecast error e_k = log(observed_k / forecast_k):
    mean (bias), variance and lag-1 autocorrelation. Before ``prior_n`` errors are in, the variance leans on
    ``prior_sigma`` (weight prior_n / (prior_n + n))."""

    weight: float = 0.1  # weight of the newest error
    prior_sigma: float = 0.25
    prior_n: float = 3.0
    floor: float = 0.05  # observed and forecast are floored at floor x their larger value (log of 0)
    mean: float = 0.0
    var: float = 0.0
    cov1: float = 0.0
    n: int = 0
    last: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.weight <= 1:
            raise ValueError(f"error tracker weight: expected a value in (0, 1], got {self.weight}")
        if self.prior_sigma < 0 or self.prior_n < 0:
            raise ValueError("error tracker: prior_sigma and prior_n must be >= 0")

    def update(self, forecast: float, observed: float) -> float | None:
        """Record one (forecast, observed) pair; returns the log error, or None when both are 0."""
        top = max(forecast, observed)
        if not (top > 0 and math.isfinite(top)):
            return None
        e = math.log(max(observed, self.floor * top) / max(forecast, self.floor * top))
        w = self.weight if self.n else 1.0
        prev_mean = self.mean
        self.mean += w * (e - self.mean)
        if self.n:
            self.var = (1 - w) * (self.var + w * (e - prev_mean) ** 2)
            if self.last is not None:
                self.cov1 = (1 - w) * self.cov1 + w * (e - self.mean) * (self.last - self.mean)
        self.last = e
        self.n += 1
        return e

    @property
    def sigma(self) -> float:
        """Standard deviation of one interval's log error (prior-blended)."""
        a = self.prior_n / (self.prior_n + self.n) if (self.prior_n + self.n) > 0 else 0.0
        return math.sqrt(a * self.prior_sigma ** 2 + (1 - a) * self.var)

    @property
    def rho(self) -> float:
        """Lag-1 autocorrelation of the errors, clipped to [0, 1] (0 until three errors are in)."""
        if self.n < 3 or self.var <= 0:
            return 0.0
        return float(min(max(self.cov1 / self.var, 0.0), 1.0))

    def sigma_of_mean(self, R: int) -> float:
        """Std of the mean log error over ``R`` intervals, equicorrelated at `rho`:
        sigma sqrt((1 + (R - 1) rho) / R)."""
        R = max(int(R), 1)
        return self.sigma * math.sqrt((1 + (R - 1) * self.rho) / R)

    def bias(self, limit: float = 0.4) -> float:
        """The mean log error (used as a multiplicative correction exp(bias)), clipped to +-limit and
        shrunk toward 0 like the variance before ``prior_n`` errors."""
        a = self.n / (self.prior_n + self.n) if (self.prior_n + self.n) > 0 else 0.0
        return float(np.clip(a * self.mean, -limit, limit))


def scenario_multipliers(R: int, S: int, sigma: float, bias: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(S, R) work multipliers and (S,) probabilities: one common log-normal level error per scenario,
    xi_s = exp(bias + sigma z_s - sigma^2 / 2) (mean exp(bias)) at the S equally likely normal points z_s."""
    z, pi = normal_nodes(S)
    xi = np.exp(bias + sigma * z - 0.5 * sigma ** 2)
    return np.repeat(xi[:, None], R, axis=1), pi


def commitment_shape(commitments_j: Sequence[float], hour: int, k: int, K: int, R: int) -> np.ndarray:
    """(R,) relative load of the remaining intervals k..k+R-1 of ``hour`` against interval k, from the public
    hourly commitments (they scale with the expected load): E*_h placed at hour midpoints, linearly
    interpolated, flat beyond the ends; all ones for a single hour or equal commitments."""
    c = np.asarray(commitments_j, dtype=np.float64)
    if len(c) <= 1 or not np.all(c > 0):
        return np.ones(R)
    mids = np.arange(len(c)) + 0.5
    t = hour + (k + np.arange(R) + 0.5) / K
    v = np.interp(t, mids, c)
    return v / v[0]


def late_fraction(prompt: Any, output: Any, laws: Any, alpha: float, latency_frac: float) -> np.ndarray:
    """(F,) fraction of the given requests whose standalone latency at clock f exceeds ``latency_frac`` of
    their SLO window alpha x L_ref (L_ref: standalone latency at the reference clock, the env's deadline
    base). Such requests are counted as misses at that clock whatever the replica count (queueing only
    adds to the standalone latency)."""
    p = np.asarray(prompt, dtype=np.float64)
    o = np.asarray(output, dtype=np.float64)
    F = laws.n_clocks
    if not len(p):
        return np.zeros(F)
    chunks = np.ceil(p / laws.budget)
    A = p * (p + 1) / 2
    d = np.maximum(o - 1, 0)
    ctx = d * p + d * (d + 1) / 2
    lat = (np.outer(chunks, laws.tau0) + np.outer(p, laws.tau1) + np.outer(A, laws.tau4)
           + np.outer(d, laws.tau0 + laws.tau2) + np.outer(ctx, laws.tau3))  # (m, F)
    window = alpha * lat[:, laws.top]
    return (lat > latency_frac * window[:, None]).mean(axis=0)


def table_work(table: Any, laws: Any, batch: float) -> Work:
    """`Work` of the requests of ``table`` (a RequestTable or None), decode steps shared by ``batch``."""
    from commitenv_controllers.dynamollm import arrivals_work

    if table is None or len(table) == 0:
        return Work.zero(laws.n_clocks)
    busy, energy = arrivals_work(table, laws, batch)
    return Work(np.asarray(busy, dtype=np.float64), np.asarray(energy, dtype=np.float64), float(len(table)))
