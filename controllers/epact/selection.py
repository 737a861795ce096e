"""ePACT's local selection rule (section 4.3): SLO admission (eq. 2), target matching (eq. 3) and the
service-first fallback, expressed as one ranking key so that search and selection agree on "best"."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Evaluation:
    """A candidate configuration's prediction."""

    active: int
    clock_mhz: int
    energy_j: float  # predicted interval energy E_k(u)
    misses: int  # captured requests predicted to miss their deadline
    margin_s: float  # min over captured of deadline - predicted finish (inf when none captured)
    valid: bool = True  # a complete, valid prediction

    @property
    def config(self) -> tuple[int, int]:
        return (self.active, self.clock_mhz)


def deviation_cost(energy: float, target: float, lambda_plus: float, lambda_minus: float) -> float:
    """J_k(u) = lambda_plus [E - T]+ + lambda_minus [T - E]+ (eq. 3)."""
    return lambda_plus * max(energy - target, 0.0) + lambda_minus * max(target - energy, 0.0)


def admitted(ev: Evaluation, n_captured: int, epsilon: float) -> bool:
    """Eq. 2: predicted misses <= epsilon |I_k| (vacuous for an empty snapshot); compared as integers so
    that e.g. 29 misses pass at epsilon 0.29 with |I_k| = 100 despite floating-point rounding."""
    return ev.valid and ev.misses <= math.floor(epsilon * n_captured + 1e-9)


def rank_key(ev: Evaluation, target: float, lambda_plus: float, lambda_minus: float, n_captured: int,
             epsilon: float) -> tuple:
    """Smaller is better. Admitted candidates first, by deviation cost J, then fewer misses and larger
    worst-request margin; then candidates with valid predictions by fewest misses, largest margin, lowest
    J (the service-first fallback); invalid predictions last. Final ties: fewer replicas, lower clock."""
    j = deviation_cost(ev.energy_j, target, lambda_plus, lambda_minus)
    m = -ev.margin_s if math.isfinite(ev.margin_s) else -math.inf
    if admitted(ev, n_captured, epsilon):
        return (0, j, ev.misses, m, ev.active, ev.clock_mhz)
    if ev.valid:
        return (1, ev.misses, m, j, ev.active, ev.clock_mhz)
    return (2, 0.0, 0.0, 0.0, ev.active, ev.clock_mhz)


def select(evals: list[Evaluation], target: float, lambda_plus: float, lambda_minus: float, n_captured: int,
           epsilon: float) -> Evaluation | None:
    """The candidate ePACT applies, or None when no prediction is valid (keep the current configuration)."""
    valid = [e for e in evals if e.valid]
    if not valid:
        return None
    return min(valid, key=lambda e: rank_key(e, target, lambda_plus, lambda_minus, n_captured, epsilon))
