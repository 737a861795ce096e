"""The scheduler-replay game (StepSplit section 5.3) on the real engine, and the replay-corrected shares.

    v(S) = sum_{i in S} e_i + sum_{k in T(S)} a(m_k)          (= sum e_i + a*|T(S)| for a constant a)

``T(S)`` are the steps the engine's own scheduler produces when it serves coalition S alone: the sub-workload
of S's requests keeps their arrival times, and a fresh `Pool` (noise off, same profiles, layout, clock and
controller actions) serves it, so with several replicas the router is replayed too. Nothing of the scheduler
is re-implemented here. ``e_i`` is each request's own energy under the law, fixed across coalitions as in the
paper's Eq. (6) (by default taken from the full window served alone; pass the attributed run's values to use
those). With ``own="replayed"`` the own terms are instead summed over S's replayed steps, which differs only
when a coalition changes preemptions (recompute). A table with prefix hash blocks is served with the engine's
prefix cache (``prefix_block_tokens`` per hash block) and then defaults to ``own="replayed"``: which blocks a
coalition computes depends on who is in it (section 6.7).

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

# A controller action replayed at its time: ("clock", t, mhz[, gpus]), ("active", t, count[, model]),
# ("share", t, replica, share).
Action = tuple


class ReplayGame:
    """Coalitions of the requests of ``table`` (player i = row i) served alone by the engine.

    ``layout`` defaults to one GPU; ``clock_mhz`` to the reference clock (the clock the attributed run used);
    ``actions`` replays a controller's lifecycle/clock/share changes at their times; ``law`` (default: the
    profiles' law at ``clock_mhz`` for every replica) prices the replayed steps.
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
        has_prefix = table.prefix_offsets is not None and table.prefix_hashes is not None
        if own_mode is None:
            own_mode = "replayed" if has_prefix else "fixed"
        if own_mode not in ("fixed", "replayed"):
            raise ValueError(f"own_mode: expected 'fixed' or 'replayed', got {own_mode!r}")
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
        if own is None and own_mode == "fixed":
            own = self.own_of_full()
        self.own = None if own is None else np.asarray(own, dtype=np.float64)
        if self.own is not None and len(self.own) != self.n:
            raise ValueError(f"own: expected {self.n} values, got {len(self.own)}")

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
        if self.own_mode == "fixed":
            own = float(self.own[list(members)].sum())
        else:
            st = decompose(pool.log, pool.table.prompt_tokens, law, players=range(len(members)))
            own = float(st.own_law.sum())
        c = self.counters
        c["replays"] += 1
        c["replay_s"] += time.perf_counter() - t0
        c["replayed_requests"] += len(members)
        v = own + shared
        if len(self._cache) < self.cache_size:
            self._cache[mask] = v
        return v

    @property
    def replay_ms(self) -> float:
        """Mean wall time of one coalition replay so far (ms)."""
        c = self.counters
        return 1e3 * c["replay_s"] / c["replays"] if c["replays"] else float("nan")


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
