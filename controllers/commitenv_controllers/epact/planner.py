"""ePACT's global planner (section 4.2): the current interval's energy target from measured consumption.

Energy-only hours (E* = 0, no commitment): the nominal allocation is all zeros and every target is 0, so the local
selection's deviation cost J_k(u) = lambda_plus [E - 0]+ = lambda_plus E ranks the admitted candidates by energy:
ePACT then minimises energy subject to its SLO admission (eq. 2), which is exactly its cost model with E* = 0."""

from __future__ import annotations

from collections.abc import Sequence


def interval_target(commitment: float, consumed: float, nominal: Sequence[float], k: int, *, static: bool = False) -> float:
    """T_k = b_k (E* - M_k) / (E* - B_k), with B_k the nominal allocation of the k elapsed intervals.

    ``nominal`` holds b_0..b_{K-1} (non-negative, summing to E*, positive remaining mass). Targets may be
    negative after overuse (a cost reference, not physical energy). ``static`` gives the Static-Target
    ablation, T_k = b_k (no feedback). With E* = 0 (energy-only) the target is 0 (every joule costs lambda_plus),
    with or without feedback.
    """
    K = len(nominal)
    if not 0 <= k < K:
        raise ValueError(f"interval index {k} outside 0..{K - 1}")
    if commitment == 0:
        return 0.0
    b_k = float(nominal[k])
    if static:
        return b_k
    remaining_nominal = float(sum(nominal[k:]))
    if remaining_nominal <= 0:
        raise ValueError(f"nominal allocation: no remaining mass at interval {k}")
    return b_k * (commitment - consumed) / remaining_nominal


def equal_allocation(commitment: float, K: int) -> list[float]:
    """The default nominal allocation b_k = E*/K."""
    if K < 1:
        raise ValueError("K must be positive")
    return [commitment / K] * K


def check_allocation(commitment: float, nominal: Sequence[float], rel_tol: float = 1e-6) -> None:
    """Raise unless ``nominal`` is non-negative, sums to E*, and keeps positive remaining mass (with E* = 0, the
    energy-only allocation, every b_k is 0 and no mass is needed: `interval_target` is then 0)."""
    if commitment < 0:
        raise ValueError(f"nominal allocation: the commitment must be >= 0, got {commitment}")
    if any(b < 0 for b in nominal):
        raise ValueError("nominal allocation: every b_k must be >= 0")
    total = float(sum(nominal))
    if abs(total - commitment) > rel_tol * max(abs(commitment), 1.0):
        raise ValueError(f"nominal allocation: sums to {total}, expected the commitment {commitment}")
    if commitment > 0 and nominal and nominal[-1] <= 0:
        raise ValueError("nominal allocation: the last interval needs positive mass (remaining mass must stay > 0)")
