"""The scheduler-replay game (StepSplit section 5.3) on the real engine, and the replay-corrected shares.

    v(S) = sum_{i in S} e_i(S) + sum_{k in T(S)} a(m_k)          (= sum e_i + a*|T(S)| for a constant a)

``T(S)`` are the steps the engine's own scheduler produces when it serves coalition S alone: the sub-workload
of S's requests keeps their arrival times, and a fresh `Pool` (noise off, same profiles, layout, clock and
controller actions) serves it, so with several replicas the router is replayed too. Nothing of the scheduler
is re-implemented here. On a GPU hosting several instances (SM shares) each step's energy includes the GPU's idle
floor over its time while the meter counts the floor once; the game subtracts what overlapping steps count
twice (`floor_overlap_j`), so ``v(S)`` is the metered busy energy there too.

Own energy. By default (``own_mode="replayed"``) ``e_i(S)`` is request i's own law energy summed over the steps
S's replay actually runs, so ``v(S)`` is the engine's energy of serving S (noise off) and the game's Shapley
value is the Shapley value of the engine's actual game. Without preemption a request's own energy does not
depend on the schedule (prefill chunks telescope, each output token costs ``b + kappa*context``), so this equals
the paper's Eq. (6) with ``e_i`` fixed. With preemption it does not: a preempted request recomputes its prompt
and the tokens generated so far, and whether it is preempted, how often and how far it had got depends on who
else holds KV blocks. ``own_mode="fixed"`` is the paper's Eq. (6) with ``e_i`` fixed across coalitions (taken
from the full window served alone, or the ``own`` values given): it charges every recompute of the full run to
the preempted request in every coalition, so it is not the Shapley value of the engine's game once a run
preempts (``docs/results/attribution-replay.md`` has a measured case). A table with prefix hash blocks is served with
the engine's prefix cache (``prefix_block_tokens`` per hash block); which blocks a coalition computes depends on
who is in it (section 6.7), so fixed own energies are wrong there too.

Exact Shapley values enumerate the ``2**N - 1`` coalitions (N <= 12 is quick); larger windows sample
antithetic permutation pairs, replay every prefix of each order, and use the model game of the logged timeline
as a control variate (Proposition 5.2), so only the correction to the closed form is sampled.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from commitenv.attribution.closed_form import Attribution, closed_form
from commitenv.attribution.law import StepLaw, StepTable, decompose
from commitenv.attribution.shapley import (
    MAX_EXACT,
    ModelGame,
    ShapleyEstimate,
    exact_shapley,
    members_of,
    sample_shapley,
)
from commitenv.profiles.schema import Profile
from commitenv.sim.noise import NoiseSpec
from commitenv.sim.pool import EngineOptions, Pool, PoolLayout
from commitenv.workload.table import RequestTable

OWN_MODES = ("replayed", "fixed")

# A controller action replayed at its time: ("clock", t, mhz[, gpus]), ("active", t, count[, model]),
# ("share", t, replica, share).
Action = tuple


class ReplayGame:
    """Coalitions of the requests of ``table`` (player i = row i) served alone by the engine.

    ``layout`` defaults to one GPU; ``clock_mhz`` to the reference clock (the clock the attributed run used);
    ``actions`` replays a controller's lifecycle/clock/share changes at their times; ``law`` (default: the
    profiles' law at ``clock_mhz`` for every replica) prices the replayed steps. ``own_mode``: ``"replayed"``
    (default: own energy summed over each coalition's replayed steps, the engine's game) or ``"fixed"`` (Eq. (6):
    ``own``, or by default the full window's own energies, in every coalition; passing ``own`` implies it).
    """

    def __init__(
        self,
        table: RequestTable,
        profiles: Profile | Sequence[Profile],
        layout: PoolLayout | None = None,
        *,
        clock_mhz: int | None = None,
        tenant_model: dict[int, int] | None = None,
        actions: Sequence[Action] = (),
        law: StepLaw | None = None,
        own: np.ndarray | None = None,
        own_mode: str | None = None,
        cache_size: int = 1 << 16,
        prefix_block_tokens: int = 512,
    ) -> None:
        if own_mode is None:  # the engine's game, unless the caller fixes the own energies
            own_mode = "fixed" if own is not None else "replayed"
        if own_mode not in OWN_MODES:
            raise ValueError(f"own_mode: expected 'replayed' or 'fixed', got {own_mode!r}")
        if own is not None and own_mode != "fixed":
            raise ValueError("own: fixed own energies are only used with own_mode='fixed'")
        self.table = table
        self.n = len(table)
        self.profiles = [profiles] if isinstance(profiles, Profile) else list(profiles)
        self.layout = layout or PoolLayout.single(1)
        self.clock_mhz = clock_mhz
        self.tenant_model = tenant_model
        self.actions = sorted(actions, key=lambda a: a[1])
        for a in self.actions:
            if a[0] not in ("clock", "active", "share"):
                raise ValueError(f"actions: unknown kind {a[0]!r} (expected 'clock', 'active' or 'share')")
        self.law = law or StepLaw.from_profiles(self.profiles, self.layout, clock_mhz)
        self.own_mode = own_mode
        self.cache_size = cache_size
        self._cache: dict[int, float] = {}
        self.counters = {"replays": 0, "replay_s": 0.0, "replayed_requests": 0}
        self._opts = EngineOptions(noise=NoiseSpec(0.0, 0.0), log_steps=True, closed_form=True,
                                   prefix_block_tokens=prefix_block_tokens)
        self._has_prefix = table.prefix_offsets is not None and table.prefix_hashes is not None
        self._own: np.ndarray | None = None
        if own is not None:
            self._own = np.asarray(own, dtype=np.float64)
            if len(self._own) != self.n:
                raise ValueError(f"own: expected {self.n} values, got {len(self._own)}")
        elif own_mode == "fixed":
            self._own = self.own_of_full()
        self._nominal = None if self._has_prefix else self._nominal_coeffs()
        self._colocated = any(len(g) > 1 for g in self.layout.gpus)

    @property
    def own(self) -> np.ndarray:
        """The fixed own energies (``own_mode="fixed"``); with ``"replayed"`` the own energy of every request in
        the full window served alone (for reference: the game itself sums each coalition's replayed steps)."""
        if self._own is None:
            self._own = self.own_of_full()
        return self._own

    def _nominal_coeffs(self) -> np.ndarray | None:
        """(replicas, 4) array of the law's c1, c2, b, kappa per replica, for the own energy of a request that is
        never preempted (schedule-independent); None when the law has no per-replica coefficients to read."""
        n_rep = sum(len(g) for g in self.layout.gpus)
        try:
            rows = [self.law.coeffs(r) for r in range(n_rep)]
        except ValueError:
            return None
        return np.array([[c.c1, c.c2, c.b, c.kappa] for c in rows], dtype=np.float64)

    # ------------------------------------------------------------------------------------------ engine
    def serve(self, members: Sequence[int]) -> Pool:
        """Serve the requests ``members`` (row indices, ascending) alone on a fresh engine; returns the pool
        (its ``log`` slots are positions in ``members``)."""
        idx = np.asarray(members, dtype=np.int64)
        sub = self.table.take(idx)
        pool = Pool(self.profiles, self.layout, self._opts, clock_mhz=self.clock_mhz)
        pool.attach(sub, self.tenant_model)
        for a in self.actions:
            kind, t = a[0], float(a[1])
            pool.run_until(t)
            if kind == "clock":
                pool.set_clock(t, int(a[2]), None if len(a) < 4 else list(a[3]))
            elif kind == "active":
                pool.set_active(t, int(a[2]), 0 if len(a) < 4 else int(a[3]))
            else:
                pool.set_share(t, int(a[2]), float(a[3]))
        pool.run_until(math.inf)
        return pool

    def replay_steps(self, members: Sequence[int]) -> StepTable:
        """The replayed steps of coalition ``members`` decomposed under the law (players = ``members``)."""
        members = list(members)
        pool = self.serve(members)
        return decompose(pool.log, pool.table.prompt_tokens, self.law, players=range(len(members)))

    def own_of_full(self) -> np.ndarray:
        """Own energy of every request when the whole window is served (noise off)."""
        st = self.replay_steps(range(self.n))
        own = np.zeros(self.n)
        own[st.players] = st.own_per_player("none")
        return own

    # ------------------------------------------------------------------------------------------ game
    def value(self, mask: int) -> float:
        if mask == 0:
            return 0.0
        hit = self._cache.get(mask)
        if hit is not None:
            return hit
        members = members_of(mask, self.n)
        t0 = time.perf_counter()
        pool = self.serve(members)
        law = self.law
        shared = 0.0
        for e in pool.log:
            shared += e.n_steps * law.shared(e.replica, len(e.slots))
        if self._colocated:
            shared += floor_overlap_j(pool.log)
        if self.own_mode == "fixed":
            own = float(self.own[list(members)].sum())
        else:
            own = self._replayed_own(pool, members)
        c = self.counters
        c["replays"] += 1
        c["replay_s"] += time.perf_counter() - t0
        c["replayed_requests"] += len(members)
        v = own + shared
        if len(self._cache) < self.cache_size:
            self._cache[mask] = v
        return v

    def _nominal_own(self, pool: Pool) -> np.ndarray:
        """Own law energy of every request of ``pool`` (a replay) had it never been preempted: schedule-independent,
        ``c1*p + c2*p(p+1)/2 + (d-1)*b + kappa*((d-1)*p + d(d-1)/2)`` on the replica it was routed to (0 for a request
        never served)."""
        rep = np.asarray(pool.replica_of)
        out = np.zeros(len(rep))
        ok = rep >= 0
        c = self._nominal[rep[ok]]
        p = pool.table.prompt_tokens[ok].astype(np.float64)
        d1 = np.asarray(pool.out_tokens, dtype=np.float64)[ok] - 1.0
        out[ok] = (c[:, 0] * p + c[:, 1] * (p * (p + 1.0) / 2.0) + d1 * c[:, 2]
                   + c[:, 3] * (d1 * p + d1 * (d1 + 1.0) / 2.0))
        return out

    def _replayed_own(self, pool: Pool, members: Sequence[int]) -> float:
        """Own law energy of the requests over the steps ``pool`` (a coalition's replay) ran: without a preemption
        (and without prefix caching) the schedule-independent `_nominal_own`; otherwise the replayed log
        decomposed under the law (recompute chunks included)."""
        if self._nominal is not None and not np.any(pool.preemptions):
            return float(self._nominal_own(pool).sum())
        st = decompose(pool.log, pool.table.prompt_tokens, self.law, players=range(len(members)))
        return float(st.own_law.sum())

    def recompute_j(self) -> np.ndarray:
        """Recompute energy of every request when the full window is served alone: its own law energy over the
        steps it ran minus its own energy had it never been preempted (0 for a request never preempted)."""
        if self._nominal is None:
            raise ValueError("recompute_j: needs a table without prefix blocks (a cached prefix also changes the "
                             "own energy)")
        pool = self.serve(range(self.n))
        st = decompose(pool.log, pool.table.prompt_tokens, self.law, players=range(self.n))
        return st.own_per_player("none") - self._nominal_own(pool)

    @property
    def replay_ms(self) -> float:
        """Mean wall time of one coalition replay so far (ms)."""
        c = self.counters
        return 1e3 * c["replay_s"] / c["replays"] if c["replays"] else float("nan")


def floor_overlap_j(log: Sequence) -> float:
    """The idle floor that overlapping steps of co-located instances count more than once (<= 0): every step's
    energy includes its GPU's floor over its own time, the meter counts it once over the time any step runs, so
    ``sum(step energies) + floor_overlap_j(log)`` is the GPUs' metered busy energy."""
    spans: dict[int, list[tuple[float, float, float]]] = {}
    counted = 0.0
    for e in log:
        counted += e.floor_j
        if e.t1 > e.t0:
            spans.setdefault(e.gpu, []).append((e.t0, e.t1, e.floor_j / (e.t1 - e.t0)))
    once = 0.0
    for ivs in spans.values():
        ivs.sort()
        a, b, w = ivs[0]
        for x, y, p in ivs[1:]:
            if x > b:
                once += w * (b - a)
                a, b, w = x, y, p
            else:
                b = max(b, y)
        once += w * (b - a)
    return once - counted


@dataclass(frozen=True)
class ReplayResult:
    """Replay-corrected shares and how they were obtained."""

    attribution: Attribution  # normalised to ``total_j`` when one was given
    law_phi: np.ndarray  # Shapley value of the law-level replay game (J)
    exact: bool
    estimate: ShapleyEstimate | None
    replays: int
    replay_ms: float  # mean wall time per coalition replay


def replay_shapley(
    game: ReplayGame,
    *,
    control: ModelGame | None = None,
    n_pairs: int = 50,
    seed: int = 0,
    exact: bool | None = None,
    workers: int = 1,
    total_j: float | None = None,
) -> ReplayResult:
    """Shapley value of the replay game: exact for ``n <= 12`` (or when ``exact``), else sampled with
    ``n_pairs`` antithetic pairs and ``control`` (the law-level model game of the attributed run's log, whose
    closed form is the known mean) as control variate. ``total_j`` rescales the shares to the metered busy
    energy of the window."""
    if exact is None:
        exact = game.n <= 12
    if exact and game.n > MAX_EXACT:
        raise ValueError(f"exact replay Shapley for {game.n} requests needs 2**{game.n} replays")
    r0, s0 = game.counters["replays"], game.counters["replay_s"]
    est = None
    if exact:
        phi = exact_shapley(game, workers=workers)
        se = None
    else:
        est = sample_shapley(game, n_pairs, seed=seed, control=control, workers=workers)
        phi, se = est.phi, est.se
    dr = game.counters["replays"] - r0
    ds = game.counters["replay_s"] - s0
    att = Attribution(np.arange(game.n), phi.copy(), None, None, se, "replay")
    if total_j is not None:
        att = att.normalized(total_j)
    return ReplayResult(att, phi, bool(exact), est, dr, 1e3 * ds / dr if dr else float("nan"))


def model_game_for(log: Sequence, table: RequestTable, law: StepLaw, scale: str = "none",
                   prefix_block_tokens: int = 512) -> ModelGame:
    """The model game of a logged run of ``table`` (slots = rows), players aligned with `ReplayGame`; with the
    prefix blocks priced in (`PrefixModelGame`) when the table has them."""
    steps = decompose(log, table.prompt_tokens, law, players=range(len(table)))
    if table.prefix_offsets is not None and table.prefix_hashes is not None:
        from commitenv.attribution.prefix import PrefixModelGame

        return PrefixModelGame(log, table, law, prefix_block_tokens, steps, scale)
    return ModelGame(steps, scale=scale)


def closed_form_for(log: Sequence, table: RequestTable, law: StepLaw, *, scale: str = "step",
                    total_j: float | None = None) -> Attribution:
    """Closed-form shares of a logged run of ``table`` aligned with `ReplayGame` players (rows)."""
    return closed_form(decompose(log, table.prompt_tokens, law, players=range(len(table))), scale=scale,
                       total_j=total_j)
