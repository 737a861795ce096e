"""Split an hour's settlement cost among tenants by their Shapley values in the cost game of the hour's energy.

What. An hour settles at ``C(E) = lambda_plus [E - E*]+ + lambda_minus [E* - E]+`` (kWh-eq; E the hour's metered
energy, E* its commitment; `commitenv.metrics.deviation_cost_kwh`). E is the idle energy (the floor of the time no
step covers, billed to no request) plus each tenant's energy e_i. The cost game has the tenants as players,

    v(S) = C(idle + sum_{i in S} e_i),

the idle energy belongs to nobody: ``v(empty) = C(idle)`` is the operator's share (what the hour would have cost
with no tenant work), and the tenants split ``v(N) - v(empty)`` by their Shapley values, so the tenant shares plus
the idle share add up to ``C(E)`` exactly (efficiency). `hour_cost_shares` returns them as a `CostSplit`.

Why. Splitting the cost in proportion to energy charges every kWh the same, whichever side of E* the hour is on.
In an under-used hour the penalty is for energy *not* used: a tenant that used more energy reduced the penalty,
yet the energy split charges it more of it. The Shapley value charges each tenant what it adds to the cost,
averaged over the orders in which the tenants' energies could have been added on top of the idle floor; here that
is a credit (a negative share) of ``lambda_minus`` per kWh while the sum stays below E*, a charge of
``lambda_plus`` per kWh once it is above.

Worked example (energies in kWh for readability; the function takes joules). Idle 10 kWh, E* = 20 kWh,
lambda_plus : lambda_minus = 2 : 1, tenants A = 4 kWh and B = 2 kWh. The hour uses E = 16 kWh, 4 under E*, so
C = 1 x 4 = 4 kWh-eq.

    v({}) = C(10) = 10      v({A}) = C(14) = 6      v({B}) = C(12) = 8      v({A, B}) = C(16) = 4
    phi_A = 1/2 [(v(A) - v({})) + (v(AB) - v(B))] = 1/2 [(6 - 10) + (4 - 8)] = -4
    phi_B = 1/2 [(v(B) - v({})) + (v(AB) - v(A))] = 1/2 [(8 - 10) + (4 - 6)] = -2
    idle = v({}) = 10;  10 - 4 - 2 = 4 = C  (efficiency)

The energy split would bill A 4 x 4/16 = 1.0, B 0.5 and idle 2.5: the tenants would pay for a shortfall their
energy had cut by 6 kWh-eq. Every coalition of this hour is on the same (under) side of E*, so C is linear over
all of them and the Shapley split among the tenants *is* an energy split, of ``v(N) - v(empty) = -6``: -4 : -2.

Straddling E* (some coalitions over, some under): same hour with A = 8 kWh and B = 6 kWh: E = 24, 4 over, C = 8.
v({}) = 10, v({A}) = C(18) = 2, v({B}) = C(16) = 4, v({A, B}) = C(24) = 8;
phi_A = 1/2 [(2 - 10) + (8 - 4)] = -2, phi_B = 1/2 [(4 - 10) + (8 - 2)] = 0, idle 10; -2 + 0 + 10 = 8. (The
energy split: A 2.667, B 2.0, idle 3.333.) docs/attribution-cost.md has both cases and the reasoning.

Algorithms (`CostSplit.method`):

* ``"linear"`` (exact, any number of tenants): when every coalition is on the same side of E* (idle >= E*, or
  idle + sum e <= E*), C is linear on all coalition energies and each tenant's share is its energy's part of
  ``v(N) - v(empty)``. An energy-only hour (E* = 0: C = lambda_plus E) is always split so: every tenant pays
  lambda_plus per kWh of its energy (an idle energy rounded to -1e-9 J does not send it to the enumeration).
* ``"enumeration"`` (exact): tenants with equal energies are interchangeable, so a coalition is described by how
  many of each energy group it holds (for all-distinct energies: the 2**n subsets). Every count vector k is
  enumerated, vectorised; the marginal of a member of group g is ``v(k + 1_g) - v(k)`` with the standard Shapley
  weight of a predecessor set of size s, ``s! (n-1-s)! / n!``, times the number of sets with count vector k,
  ``C(c_g - 1, k_g) prod_{h != g} C(c_h, k_h)``. Cost ~ ``G prod_g (c_g + 1)`` for G groups of sizes c_g; used
  when that is at most ``max_grid`` (default 2**22), which always holds for n <= 17 tenants (17 x 2**17; 0.2 s)
  and for any n with few distinct energies (n equal energies: n + 1 count vectors).
* ``"sampled"`` (not exact): otherwise, antithetic permutation sampling (each order and its reverse) with the
  per-tenant standard error in ``se_kwh_eq``. Estimates of tenants with equal energies are pooled (so they are
  equal, as symmetry demands) and every order's marginals telescope to ``v(N) - v(empty)``, so the sampled shares
  are efficient too; only the split among tenants carries sampling error.

No exact polynomial algorithm for arbitrary real energies is to be expected: with integer energies,
``[w(S) - (q-1)]+ - [w(S) - q]+ = 1{w(S) >= q}``, so exact Shapley values of this game would give those of weighted
voting games, which are #P-complete to compute (Deng and Papadimitriou 1994). (A meet-in-the-middle enumeration
could push the exact range to about 30-35 distinct energies; not implemented.)

Zero-energy tenants are null players: their share is 0 and they change nobody else's. Tenant energies must be
finite and >= 0; the idle energy may be any finite number (a period's idle may round to -1e-9 J).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from commitenv.metrics import deviation_cost_kwh

MAX_GRID = 1 << 22  # count vectors x energy groups the exact enumeration may evaluate (n <= 17 always fits)
N_PAIRS = 4096  # antithetic pairs of the sampled estimate
_CHUNK = 1 << 20  # (pairs x tenants) marginals per sampling chunk


@dataclass(frozen=True)
class CostSplit:
    """The split of one hour's settlement cost (kWh-eq): ``tenant_kwh_eq`` (a tenant's share, negative = a credit:
    its energy lowered the cost) plus ``idle_kwh_eq`` (the operator's, the cost of the idle energy alone) add up
    to ``cost_kwh_eq``. ``exact`` says whether the shares are exact Shapley values; if not, ``se_kwh_eq`` holds
    each tenant's standard error (else None). ``method``: ``"linear"``, ``"enumeration"``, ``"sampled"``, or
    ``"none"`` (no tenant energy)."""

    tenant_kwh_eq: dict[str, float]
    idle_kwh_eq: float
    exact: bool
    se_kwh_eq: dict[str, float] | None
    cost_kwh_eq: float
    method: str


def hour_cost_shares(tenant_j: dict[str, float], idle_j: float, commit_j: float, lambda_plus: float,
                     lambda_minus: float, *, max_grid: int = MAX_GRID, n_pairs: int = N_PAIRS,
                     seed: int = 0) -> CostSplit:
    """Shapley split of the settlement cost of an hour with tenant energies ``tenant_j`` (J), idle energy
    ``idle_j`` (J) and commitment ``commit_j`` (J), settled at ``lambda_plus`` / ``lambda_minus`` per kWh over /
    under. Exact when the enumeration fits ``max_grid`` (by default always for <= 17 tenants) or the hour is on
    one side of E*; otherwise sampled from ``n_pairs`` antithetic pairs drawn from ``seed`` (deterministic)."""
    names = list(tenant_j)
    e = np.array([float(tenant_j[k]) for k in names], dtype=np.float64)
    idle = float(idle_j)
    if not (np.all(np.isfinite(e)) and math.isfinite(idle) and math.isfinite(float(commit_j))):
        raise ValueError(f"hour_cost_shares: energies and commitment must be finite (tenants {dict(tenant_j)}, "
                         f"idle {idle_j}, commitment {commit_j})")
    if np.any(e < 0):
        raise ValueError(f"hour_cost_shares: tenant energies must be >= 0 J, got {dict(tenant_j)}")

    def cost(x):
        return deviation_cost_kwh(x, commit_j, lambda_plus, lambda_minus)

    v0 = float(cost(idle))
    live = np.flatnonzero(e > 0)
    x = e[live]
    total = math.fsum(x.tolist())
    v_all = float(cost(idle + total))
    phi = np.zeros(len(e))
    se = None
    if len(x) == 0:
        method = "none"
    elif commit_j <= 0 or idle >= commit_j or idle + total <= commit_j:  # (E* = 0: energy-only, C = lambda_plus E)
        method = "linear"
        phi[live] = (v_all - v0) * (x / total)
    else:
        vals, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
        grid = math.prod(int(c) + 1 for c in counts)
        if grid * len(vals) <= max_grid:
            method = "enumeration"
            phi[live] = _enumerate(vals, counts, idle, cost)[inv]
        else:
            method = "sampled"
            if n_pairs < 2:
                raise ValueError(f"n_pairs: need at least 2 antithetic pairs for a standard error, got {n_pairs}")
            m, s = _sample(x, inv, len(vals), idle, cost, n_pairs, seed)
            phi[live] = m
            se = np.zeros(len(e))
            se[live] = s
    exact = method != "sampled"
    return CostSplit(
        tenant_kwh_eq={k: float(p) for k, p in zip(names, phi)},
        idle_kwh_eq=v0,
        exact=exact,
        se_kwh_eq=None if exact else {k: float(s) for k, s in zip(names, se)},
        cost_kwh_eq=v_all,
        method=method,
    )


def _enumerate(vals: np.ndarray, counts: np.ndarray, idle: float, cost) -> np.ndarray:
    """Exact Shapley value of one member of each energy group (energies ``vals``, group sizes ``counts``)."""
    g_n = len(vals)
    n = int(counts.sum())
    radix = counts.astype(np.int64) + 1
    stride = np.concatenate([[1], np.cumprod(radix)[:-1]]).astype(np.int64)
    idx = np.arange(int(np.prod(radix)), dtype=np.int64)
    k = (idx[:, None] // stride[None, :]) % radix[None, :]  # count vector of every coalition class
    size = k.sum(axis=1)
    v = cost(idle + k @ vals)
    # sets with count vector k, times the Shapley weight of a predecessor set of their size, 1 / (n C(n-1, s))
    if n <= 1000:  # every binomial fits a float
        base = np.ones(len(idx))
        for g in range(g_n):
            c = int(counts[g])
            base *= np.array([float(math.comb(c, j)) for j in range(c + 1)])[k[:, g]]
        denom = np.array([float(n * math.comb(n - 1, s)) if s < n else math.inf for s in range(n + 1)])
        base /= denom[size]
    else:
        lb = np.zeros(len(idx))
        for g in range(g_n):
            c = int(counts[g])
            lb += np.array([_log_comb(c, j) for j in range(c + 1)])[k[:, g]]
        ld = np.array([math.log(n) + _log_comb(n - 1, s) if s < n else math.inf for s in range(n + 1)])
        base = np.exp(lb - ld[size])
    phi = np.empty(g_n)
    for g in range(g_n):
        c = int(counts[g])
        sel = k[:, g] < c  # a member of g is not among its predecessors: at most c - 1 of them
        src = idx[sel]
        w = base[sel] * (c - k[sel, g]) / c  # C(c-1, k_g) = C(c, k_g) (c - k_g) / c
        # the weights are a distribution over predecessor sets (they sum to 1): dividing by their computed sum
        # removes the rounding of the binomials (1e-16 with floats, up to 1e-13 in logs)
        phi[g] = float(np.dot(w, v[src + stride[g]] - v[src]) / w.sum())
    return phi


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _sample(x: np.ndarray, group: np.ndarray, g_n: int, idle: float, cost, n_pairs: int,
            seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Antithetic permutation estimate (mean, standard error) of every player's Shapley value, pooled within
    equal-energy groups (``group[i]`` is player i's group)."""
    n = len(x)
    rng = np.random.default_rng(seed)
    sizes = np.bincount(group, minlength=g_n).astype(np.float64)  # every group has a member
    by_group = np.argsort(group, kind="stable")
    starts = np.concatenate([[0], np.cumsum(sizes[:-1])]).astype(np.int64)
    terms = np.empty((n_pairs, g_n))  # per pair: the mean over each group's members of (order + reverse) / 2
    chunk = max(1, _CHUNK // n)
    rows = np.arange(chunk)[:, None]
    for a in range(0, n_pairs, chunk):
        b = min(n_pairs, a + chunk)
        perm = np.argsort(rng.random((b - a, n)), axis=1)
        pair = np.zeros((b - a, n))
        for order in (perm, perm[:, ::-1]):
            cum = idle + np.concatenate([np.zeros((b - a, 1)), np.cumsum(x[order], axis=1)], axis=1)
            pair[rows[: b - a], order] += np.diff(cost(cum), axis=1)
        pair *= 0.5
        terms[a:b] = np.add.reduceat(pair[:, by_group], starts, axis=1) / sizes
    mean = terms.mean(axis=0)
    se = terms.std(axis=0, ddof=1) / math.sqrt(n_pairs)
    return mean[group], se[group]
