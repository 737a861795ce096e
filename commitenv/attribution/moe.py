"""Mixture-of-experts split (StepSplit section 6.6, Eq. 8), with the expert routing of every step given explicitly.

In an MoE step the weights outside the experts are read once for all requests (shared energy ``a0(m_k)``), but
expert x is read only if some request in the step is routed to it. With ``w`` the energy of reading all ``X``
experts once, a step costs ``a0(m_k) + (w/X) * |union of the experts its requests use|`` plus own energies,
and the Shapley value is

    phi_i = e_i + sum_{k : i in M_k} [ a0(m_k)/m_k + (w/X) * sum_{x in R_ik} 1/q_kx ]

with ``R_ik`` the experts request i uses in step k and ``q_kx`` the number of requests of step k routed to x:
each expert read is a game of the form of Proposition 5.1 among its users. Profiles do not declare experts
yet, so routing is an explicit argument here.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np

from commitenv.attribution.shapley import FunctionGame

Routing = Sequence[Mapping[int, Collection[int]]]  # per step: player -> experts it is routed to


def _a0(a0: float | Callable[[int], float], m: int) -> float:
    return float(a0(m)) if callable(a0) else float(a0)


def moe_split(
    steps: Routing,
    n_players: int,
    *,
    n_experts: int,
    w: float,
    a0: float | Callable[[int], float],
    own: Sequence[float] | None = None,
    weights: Sequence[float] | None = None,
) -> np.ndarray:
    """Eq. (8): shares of players ``0..n_players-1``. ``steps[k]`` maps each player in step k to the experts
    it uses there; ``weights[k]`` (default 1) multiplies step k (e.g. a run of identical steps)."""
    if n_experts <= 0:
        raise ValueError(f"n_experts: expected a positive count, got {n_experts}")
    phi = np.zeros(n_players) if own is None else np.asarray(own, dtype=np.float64).copy()
    unit = w / n_experts
    for k, step in enumerate(steps):
        if not step:
            continue
        wk = 1.0 if weights is None else float(weights[k])
        m = len(step)
        base = _a0(a0, m) / m
        q: dict[int, int] = {}
        for experts in step.values():
            for x in set(experts):
                q[x] = q.get(x, 0) + 1
        for i, experts in step.items():
            phi[i] += wk * (base + unit * sum(1.0 / q[x] for x in set(experts)))
    return phi


def moe_game(
    steps: Routing,
    n_players: int,
    *,
    n_experts: int,
    w: float,
    a0: float | Callable[[int], float],
    own: Sequence[float] | None = None,
    weights: Sequence[float] | None = None,
) -> FunctionGame:
    """The MoE model game: ``v(S) = sum_{i in S} e_i + sum_k [a0(|M_k ∩ S|) + (w/X) |∪_{i in S ∩ M_k} R_ik|]``
    (with ``a0(0) = 0``), every request routed to the same experts in every coalition."""
    own_arr = np.zeros(n_players) if own is None else np.asarray(own, dtype=np.float64)
    unit = w / n_experts

    def value(members: tuple[int, ...]) -> float:
        ms = set(members)
        v = float(own_arr[list(members)].sum()) if members else 0.0
        for k, step in enumerate(steps):
            wk = 1.0 if weights is None else float(weights[k])
            present = [i for i in step if i in ms]
            if not present:
                continue
            used: set[int] = set()
            for i in present:
                used.update(step[i])
            v += wk * (_a0(a0, len(present)) + unit * len(used))
        return v

    return FunctionGame(n_players, value)
