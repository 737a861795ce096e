"""ePACT's local selection rule (section 4.3): SLO admission (eq. 2), target matching (eq. 3) and the
service-first fallback, expressed as one ranking key so that search and selection agree on "best".

Energy band (an extension, off with ``band=0``): eq. 3 ranks admitted candidates by predicted deviation cost
J alone, and the paper breaks *equal* costs by service. Predicted interval energy is uncertain, though, so
two admitted candidates whose J differ by less than the energy predictor's error are not distinguishable
as matches of the target. With ``band > 0`` every admitted candidate whose J is within ``band`` of the
lowest admitted J counts as an equal-cost match, and those are ranked by service (fewer predicted misses,
then lower J, then larger margin); admitted candidates beyond the band keep eq. 3's order after them."""

from __future__ import annotations

import math
from collections.abc import Callable
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


def candidate_cost(ev: Evaluation, target: float, lambda_plus: float, lambda_minus: float,
                   cost: Callable[[float], float] | None = None) -> float:
    """The cost a candidate is ranked by: eq. 3 against ``target``, or ``cost(predicted energy)`` when a planner
    prices the interval's energy itself (e.g. `plus.EPACTPlus`'s hour-end term)."""
    return cost(ev.energy_j) if cost is not None else deviation_cost(ev.energy_j, target, lambda_plus, lambda_minus)


def rank_key(ev: Evaluation, target: float, lambda_plus: float, lambda_minus: float, n_captured: int,
             epsilon: float, *, best_j: float | None = None, band: float = 0.0,
             cost: Callable[[float], float] | None = None) -> tuple:
    """Smaller is better. Admitted candidates first, by deviation cost J, then fewer misses and larger
    worst-request margin; then candidates with valid predictions by fewest misses, largest margin, lowest
    J (the service-first fallback); invalid predictions last. Final ties: fewer replicas, lower clock.

    With ``band > 0`` and ``best_j`` (the lowest J among the admitted candidates of the same decision, see
    `best_admitted_cost`), admitted candidates with J <= best_j + band rank equal on cost and are ordered by
    fewer misses, then J, then margin; the others follow by J as before. ``cost``: see `candidate_cost`."""
    j = candidate_cost(ev, target, lambda_plus, lambda_minus, cost)
    m = -ev.margin_s if math.isfinite(ev.margin_s) else -math.inf
    if admitted(ev, n_captured, epsilon):
        if band > 0 and best_j is not None:
            excess = max(j - best_j - band, 0.0)
            if excess == 0.0:
                return (0, 0.0, ev.misses, j, m, ev.active, ev.clock_mhz)
            return (0, excess, ev.misses, m, j, ev.active, ev.clock_mhz)
        return (0, j, ev.misses, m, j, ev.active, ev.clock_mhz)
    if ev.valid:
        return (1, ev.misses, m, j, 0.0, ev.active, ev.clock_mhz)
    return (2, 0.0, 0.0, 0.0, 0.0, ev.active, ev.clock_mhz)


def best_admitted_cost(evals: list[Evaluation], target: float, lambda_plus: float, lambda_minus: float,
                       n_captured: int, epsilon: float, cost: Callable[[float], float] | None = None) -> float | None:
    """The lowest cost J (`candidate_cost`) among admitted candidates (None when none is admitted)."""
    js = [candidate_cost(e, target, lambda_plus, lambda_minus, cost) for e in evals if admitted(e, n_captured, epsilon)]
    return min(js) if js else None


def select(evals: list[Evaluation], target: float, lambda_plus: float, lambda_minus: float, n_captured: int,
           epsilon: float, band: float = 0.0, cost: Callable[[float], float] | None = None) -> Evaluation | None:
    """The candidate ePACT applies, or None when no prediction is valid (keep the current configuration).
    ``band``: the energy band in cost units (0: eq. 3 as printed); ``cost``: see `candidate_cost`."""
    valid = [e for e in evals if e.valid]
    if not valid:
        return None
    best_j = (best_admitted_cost(valid, target, lambda_plus, lambda_minus, n_captured, epsilon, cost)
              if band > 0 else None)
    return min(valid, key=lambda e: rank_key(e, target, lambda_plus, lambda_minus, n_captured, epsilon,
                                             best_j=best_j, band=band, cost=cost))
