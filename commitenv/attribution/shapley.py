"""Shapley values of cooperative games over requests: exact enumeration, and permutation sampling with antithetic
pairs and a control variate (StepSplit Proposition 5.2), optionally in parallel.

A *game* has ``n`` players (indices 0..n-1) and ``value(mask) -> float`` for a coalition given as a bit mask
(a Python int, so any n works); ``value(0)`` is the empty coalition. A game may also offer
``values_all()`` (all ``2**n`` values at once) and ``marginals(perm)`` (every player's marginal contribution
along one order) when it can do better than evaluating prefixes one by one.

`ModelGame` is StepSplit's model game on a logged timeline (Eq. 4, with ``a(m)`` allowed): the value of a
coalition S is its members' own energy plus, for every logged segment, the shared energy of the members of S
it holds, ``n_steps * a(|M_k ∩ S|)`` (``a`` if any is present, for a constant ``a``). Its Shapley value is
the closed form (Proposition 5.1), which makes it the control variate with a known mean.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from commitenv.attribution.closed_form import closed_form
from commitenv.attribution.law import StepTable

MAX_EXACT = 20  # 2**20 coalitions; StepSplit enumerates up to 12


# ================================================================================================ games
class TabularGame:
    """A game given by the values of all ``2**n`` coalitions (index = bit mask)."""

    def __init__(self, values: Sequence[float]) -> None:
        v = np.asarray(values, dtype=np.float64)
        n = int(round(math.log2(len(v)))) if len(v) else -1
        if n < 0 or 1 << n != len(v):
            raise ValueError(f"TabularGame: expected 2**n values, got {len(v)}")
        self.n = n
        self.values = v

    def value(self, mask: int) -> float:
        return float(self.values[mask])

    def values_all(self) -> np.ndarray:
        return self.values

    def shapley(self) -> np.ndarray:
        return shapley_from_values(self.values)


class FunctionGame:
    """A game from ``fn(members) -> float`` where ``members`` is the sorted tuple of player indices."""

    def __init__(self, n: int, fn: Callable[[tuple[int, ...]], float]) -> None:
        self.n = n
        self.fn = fn

    def value(self, mask: int) -> float:
        return float(self.fn(members_of(mask, self.n)))


def members_of(mask: int, n: int) -> tuple[int, ...]:
    """Player indices in bit mask ``mask`` (ascending)."""
    return tuple(i for i in range(n) if mask >> i & 1)


def mask_of(members) -> int:
    m = 0
    for i in members:
        m |= 1 << int(i)
    return m


class ModelGame:
    """StepSplit's model game on the logged segments of a `StepTable` (see the module docstring).

    ``scale="step"`` rescales every segment to its logged energy (the game whose Shapley value is the default
    closed form); ``"none"`` keeps the law's energies (the control variate for a law-level replay game).
    """

    def __init__(self, steps: StepTable, scale: str = "step") -> None:
        self.steps = steps
        self.scale_mode = scale
        self.n = steps.n
        f = steps.scale(scale)
        self._f = f
        self._own = steps.own_per_player(scale)
        ent = steps.entry_of
        self._entry_of = ent
        self.shared_fn = steps.shared_fn
        # weight W_e multiplying a(c) (c members present); with a constant a it already includes a
        self._w = f * steps.n_steps * (steps.a_unit if self.shared_fn is None else 1.0)
        self._a_tab: np.ndarray | None = None
        if self.shared_fn is not None:
            mmax = int(steps.m.max()) if steps.n_entries else 0
            self._a_tab = np.array([0.0] + [float(self.shared_fn(c)) for c in range(1, mmax + 1)])
        # segments grouped by member set (bit mask): value(S) = own(S) + sum_g W_g * a(|g ∩ S|)
        groups: dict[int, float] = {}
        off = steps.offsets
        mem = steps.member.tolist()
        w = self._w.tolist()
        for e in range(steps.n_entries):
            gm = mask_of(mem[off[e] : off[e + 1]])
            groups[gm] = groups.get(gm, 0.0) + w[e]
        self._groups = list(groups.items())

    def value(self, mask: int) -> float:
        v = 0.0
        own = self._own
        for i in range(self.n):
            if mask >> i & 1:
                v += own[i]
        if self._a_tab is None:
            for gm, w in self._groups:
                if gm & mask:
                    v += w
        else:
            tab = self._a_tab
            for gm, w in self._groups:
                c = (gm & mask).bit_count()
                if c:
                    v += w * tab[c]
        return float(v)

    def values_all(self) -> np.ndarray:
        n = self.n
        if n > MAX_EXACT:
            raise ValueError(f"values_all: {n} players is too many to enumerate (max {MAX_EXACT})")
        S = np.arange(1 << n, dtype=np.int64)
        v = np.zeros(1 << n)
        for i in range(n):
            v[(S >> i) & 1 == 1] += self._own[i]
        if self._a_tab is None:
            for gm, w in self._groups:
                v[(S & gm) != 0] += w
        else:
            pc_tab = _popcount(S)
            for gm, w in self._groups:
                v += w * self._a_tab[pc_tab[S & gm]]
        return v

    def marginals(self, perm: np.ndarray) -> np.ndarray:
        """Marginal contribution of every player along order ``perm`` in O(sum of m) (vectorised)."""
        st = self.steps
        n = self.n
        out = self._own.copy()
        if st.n_entries == 0:
            return out
        rank = np.empty(n, dtype=np.int64)
        rank[np.asarray(perm, dtype=np.int64)] = np.arange(n)
        r_m = rank[st.member]
        if self._a_tab is None:
            # the member that comes first in the order pays the segment's whole shared energy
            first = np.minimum.reduceat(r_m, st.offsets[:-1])
            out += np.bincount(np.asarray(perm)[first], weights=self._w, minlength=n)
        else:
            ent = self._entry_of
            order = np.lexsort((r_m, ent))
            j = np.arange(len(order)) - st.offsets[ent[order]] + 1  # position of the member among its segment's
            inc = self._w[ent[order]] * (self._a_tab[j] - self._a_tab[j - 1])
            out += np.bincount(st.member[order], weights=inc, minlength=n)
        return out

    def shapley(self) -> np.ndarray:
        """The closed form (Proposition 5.1) — the game's exact Shapley value."""
        return closed_form(self.steps, scale=self.scale_mode).shares

    def _cost_groups(self) -> list[tuple[int, float, np.ndarray | None]]:
        """The game's shared costs as (member mask, weight, a-table): a group adds ``w * a[c]`` when ``c`` of its
        members are present (a-table None: ``w`` once any member is present)."""
        return [(gm, w, self._a_tab) for gm, w in self._groups]

    def shapley_fixed(self, n_fixed: int) -> np.ndarray:
        """Shapley value of the players ``n_fixed..`` when players ``0..n_fixed-1`` are always present
        (`FixedStateGame`): own energy, plus for every shared cost an equal part of what its non-fixed members
        add on top of its fixed ones, ``w * (a(f + p) - a(f)) / p`` (so a cost a fixed player holds is paid by
        the state when ``a`` is constant)."""
        fixed = (1 << n_fixed) - 1
        phi = self._own.copy()
        for gm, w, tab in self._cost_groups():
            who = members_of(gm & ~fixed, self.n)
            if not who:
                continue
            f, p = (gm & fixed).bit_count(), len(who)
            rise = (tab[f + p] - tab[f]) if tab is not None else (0.0 if f else 1.0)
            phi[list(who)] += w * rise / p
        return phi[n_fixed:]


class FixedStateGame:
    """The players ``n_fixed..`` of ``inner`` with players ``0..n_fixed-1`` always present: the engine state at a
    window's start (requests still running, their cached prefixes) held fixed, StepSplit section 7,
    ``v(S) = inner(S | F) - inner(F)``. Player ``i`` here is player ``n_fixed + i`` of ``inner``."""

    def __init__(self, inner, n_fixed: int) -> None:
        if not 0 <= n_fixed <= inner.n:
            raise ValueError(f"n_fixed: expected 0..{inner.n}, got {n_fixed}")
        self.inner = inner
        self.n_fixed = n_fixed
        self.n = inner.n - n_fixed
        self._fmask = (1 << n_fixed) - 1
        self._base = inner.value(self._fmask) if n_fixed else 0.0

    @property
    def counters(self) -> dict | None:
        return getattr(self.inner, "counters", None)

    def value(self, mask: int) -> float:
        if mask == 0:
            return 0.0
        return self.inner.value((mask << self.n_fixed) | self._fmask) - self._base

    def marginals(self, perm: np.ndarray) -> np.ndarray:
        order = np.concatenate([np.arange(self.n_fixed), np.asarray(perm, dtype=np.int64) + self.n_fixed])
        return marginals(self.inner, order)[self.n_fixed:]

    def shapley(self) -> np.ndarray:
        """Closed form when ``inner`` offers ``shapley_fixed`` (the model games)."""
        f = getattr(self.inner, "shapley_fixed", None)
        if f is None:
            raise TypeError(f"{type(self.inner).__name__} has no closed-form Shapley value: use exact_shapley or "
                            "sample_shapley on this game")
        return f(self.n_fixed)


# ================================================================================================ exact
def _popcount(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.int64)
    c = np.zeros_like(x)
    while np.any(x):
        c += x & 1
        x = x >> 1
    return c


def shapley_from_values(values: np.ndarray) -> np.ndarray:
    """Exact Shapley values from the values of all ``2**n`` coalitions (index = bit mask), Eq. (1) in the
    subset form ``phi_i = sum_{S not containing i} |S|!(n-|S|-1)!/n! * (v(S+i) - v(S))``."""
    v = np.asarray(values, dtype=np.float64)
    n = int(round(math.log2(len(v))))
    if 1 << n != len(v):
        raise ValueError(f"expected 2**n coalition values, got {len(v)}")
    S = np.arange(1 << n, dtype=np.int64)
    pc = _popcount(S)
    w = np.array([math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) for s in range(n)])
    phi = np.empty(n)
    for i in range(n):
        without = S[(S >> i) & 1 == 0]
        phi[i] = float(np.dot(w[pc[without]], v[without | (1 << i)] - v[without]))
    return phi


_STATE: dict = {}


def _init_worker(game, control) -> None:
    _STATE["game"] = game
    _STATE["control"] = control


def _values_chunk(masks: np.ndarray) -> tuple[np.ndarray, dict]:
    game = _STATE["game"]
    before = dict(getattr(game, "counters", {}) or {})
    vals = np.array([game.value(int(s)) for s in masks])
    return vals, _delta(game, before)


def _delta(game, before: dict) -> dict:
    now = getattr(game, "counters", None)
    if not now:
        return {}
    return {k: now[k] - before.get(k, 0) for k in now}


def _merge(game, delta: dict) -> None:
    c = getattr(game, "counters", None)
    if c is not None:
        for k, v in delta.items():
            c[k] = c.get(k, 0) + v


def _fork_pool(workers: int, game, control):
    ctx = mp.get_context("fork")
    return ctx.Pool(workers, initializer=_init_worker, initargs=(game, control))


def coalition_values(game, *, workers: int = 1) -> np.ndarray:
    """Values of all ``2**n`` coalitions (``values_all`` when the game has it; else one ``value`` each,
    across ``workers`` processes)."""
    n = game.n
    if n > MAX_EXACT:
        raise ValueError(f"exact enumeration of {n} players needs 2**{n} coalitions (max {MAX_EXACT} players)")
    if hasattr(game, "values_all"):
        return np.asarray(game.values_all(), dtype=np.float64)
    masks = np.arange(1 << n, dtype=np.int64)
    if workers <= 1:
        return np.array([game.value(int(s)) for s in masks])
    chunks = np.array_split(masks, 4 * workers)
    with _fork_pool(workers, game, None) as pool:
        res = pool.map(_values_chunk, chunks)
    for _, d in res:
        _merge(game, d)
    return np.concatenate([v for v, _ in res])


def exact_shapley(game, *, workers: int = 1) -> np.ndarray:
    """Exact Shapley values by enumerating all ``2**n`` coalitions."""
    return shapley_from_values(coalition_values(game, workers=workers))


# ================================================================================================ sampling
def marginals(game, perm: np.ndarray) -> np.ndarray:
    """Marginal contribution of every player when they join in order ``perm``."""
    f = getattr(game, "marginals", None)
    if f is not None:
        return np.asarray(f(perm), dtype=np.float64)
    out = np.empty(game.n)
    mask = 0
    prev = game.value(0)
    for p in perm:
        p = int(p)
        mask |= 1 << p
        v = game.value(mask)
        out[p] = v - prev
        prev = v
    return out


def _pair_terms(game, control, perms: np.ndarray) -> np.ndarray:
    """Per antithetic pair (order and its reverse): mean marginals of ``game`` minus those of ``control``."""
    out = np.empty((len(perms), game.n))
    for q, p in enumerate(perms):
        d = marginals(game, p) + marginals(game, p[::-1])
        if control is not None:
            d -= marginals(control, p) + marginals(control, p[::-1])
        out[q] = 0.5 * d
    return out


def _pairs_chunk(perms: np.ndarray) -> tuple[np.ndarray, dict]:
    game = _STATE["game"]
    before = dict(getattr(game, "counters", {}) or {})
    return _pair_terms(game, _STATE["control"], perms), _delta(game, before)


@dataclass(frozen=True)
class ShapleyEstimate:
    """A sampled Shapley value: ``phi`` with per-player standard error ``se`` (the spread of the antithetic
    pair means over sqrt(pairs)); with a control variate ``phi = phi_control + mean(pair differences)``."""

    phi: np.ndarray
    se: np.ndarray
    n_pairs: int
    seed: int
    controlled: bool
    elapsed_s: float
    pair_terms: np.ndarray = field(repr=False)

    def l1_noise(self, total: float | None = None) -> float:
        """Expected normalised L1 of the estimate against the true value, ``sqrt(2/pi) * sum se / total``
        (the paper's paired-noise formula)."""
        t = float(self.phi.sum()) if total is None else float(total)
        return float(math.sqrt(2 / math.pi) * self.se.sum() / t) if t else 0.0


def sample_permutations(n: int, n_pairs: int, seed: int) -> np.ndarray:
    """The ``n_pairs`` first orders of the antithetic pairs (each pair is an order and its reverse),
    deterministic from ``seed``."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(n) for _ in range(n_pairs)]) if n_pairs else np.empty((0, n), dtype=np.int64)


def sample_shapley(
    game,
    n_pairs: int,
    *,
    seed: int = 0,
    control=None,
    control_phi: np.ndarray | None = None,
    workers: int = 1,
) -> ShapleyEstimate:
    """Permutation-sampling estimate of the Shapley value of ``game`` from ``n_pairs`` antithetic pairs.

    With ``control`` (a game on the same players whose Shapley value is known: ``control_phi``, or its
    ``shapley()``), the estimate is ``phi_control + mean(Delta_game - Delta_control)`` over the same orders
    (Proposition 5.2): unbiased whatever the control is; its variance comes only from the difference of the
    two games. Orders are drawn in the parent from ``seed`` and pairs are combined in order, so the result
    does not depend on ``workers``.
    """
    if n_pairs < 2:
        raise ValueError(f"n_pairs: need at least 2 antithetic pairs for a standard error, got {n_pairs}")
    if control is not None and control.n != game.n:
        raise ValueError(f"control has {control.n} players, the game {game.n}")
    t0 = time.perf_counter()
    perms = sample_permutations(game.n, n_pairs, seed)
    if workers <= 1:
        terms = _pair_terms(game, control, perms)
    else:
        chunks = [c for c in np.array_split(perms, min(n_pairs, 4 * workers)) if len(c)]
        with _fork_pool(workers, game, control) as pool:
            res = pool.map(_pairs_chunk, chunks)
        for _, d in res:
            _merge(game, d)
        terms = np.concatenate([t for t, _ in res])
    mean = terms.mean(axis=0)
    se = terms.std(axis=0, ddof=1) / math.sqrt(n_pairs)
    if control is not None:
        base = np.asarray(control.shapley() if control_phi is None else control_phi, dtype=np.float64)
        mean = base + mean
    return ShapleyEstimate(mean, se, n_pairs, seed, control is not None, time.perf_counter() - t0, terms)
