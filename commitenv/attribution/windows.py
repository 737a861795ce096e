"""Scheduler-replay correction of a finished run's bills, window by window (StepSplit section 5.3 at run scale).

The closed form prices each request by the steps it was actually in. The replay game asks instead what each
request *causes* when the engine's own scheduler serves coalitions of requests. At run scale the game is
played on *attribution windows*: on every replica, its requests in arrival order, cut into windows of up to
``window`` requests. A window is a game of its own: a fresh one-GPU engine (noise off, the run's profile)
serves any coalition of the window's requests at their arrival times, with the controller's clock changes
replayed at the times they were applied (lifecycle changes do not matter to a single replica). Its Shapley
value is estimated from ``n_pairs`` antithetic permutation pairs with the window's model game (the window served
alone, priced by the closed form) as control variate, or computed exactly when that is cheaper (small windows).
The corrected shares are then scaled to the window's closed-form total, so the correction only moves energy
*within* a window and the bills still add up to the run's busy energy.

The state at a window's start is held fixed (section 7, "bills of a continuous service"): the requests of
the same replica that arrived before the window and were still unfinished at its first arrival are served in
every coalition (players of no game here), so ``v(S) = E(state + S) - E(state)`` and the window's requests pay
what they add to the steps that run anyway (`FixedStateGame`). With prefix blocks, the state also holds the
latest earlier request of the replica that cached each block a window request holds, so the window finds those
blocks cached. That state is rebuilt by serving those requests from their own arrivals on the fresh engine,
not copied from the run: their progress at the window start is approximate (they meet no earlier competition)
and the cache of the replay keeps blocks the run may have evicted. ``hold_state=False`` serves each window
from an idle engine. Steps are priced at the clock in force at the window's first arrival.

Approximations, by construction: requests of other replicas never share a step with a window's requests (one
replica per window), requests of later windows are absent from its game (their shared energy is split by the
closed form), and a window's law is the profile's at the clock in force at its first served arrival.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from commitenv.attribution.law import StepLaw
from commitenv.attribution.prefix import shareable_hashes
from commitenv.attribution.replay import ReplayGame, model_game_for, replay_shapley
from commitenv.attribution.shapley import FixedStateGame
from commitenv.profiles.schema import Profile
from commitenv.workload.table import RequestTable


@dataclass(frozen=True)
class WindowCorrection:
    """Replay-corrected bills of a run (aligned with the table's rows; NaN where not replayed)."""

    shares: np.ndarray  # J
    se: np.ndarray  # standard error per request, J (0 in exactly computed windows)
    windows: int  # windows replayed
    windows_total: int  # windows in the run
    exact_windows: int
    requests: int  # requests replayed
    n_pairs: int
    replays: int  # coalitions served
    wall_s: float
    l1: float  # sum |corrected - closed form| / sum closed form, over the replayed requests
    l1_noise: float  # expected L1 of the sampling noise alone: sqrt(2/pi) sum se / total

    def as_dict(self) -> dict:
        return {
            "windows": self.windows,
            "windows_total": self.windows_total,
            "exact_windows": self.exact_windows,
            "requests": self.requests,
            "pairs": self.n_pairs,
            "replays": self.replays,
            "wall_s": round(self.wall_s, 3),
            "l1_vs_closed_form": self.l1,
            "l1_noise": self.l1_noise,
        }


def attribution_windows(replica_of: np.ndarray, window: int) -> list[np.ndarray]:
    """Rows of every window: per replica (``replica_of[row]``, -1 = never served, skipped), consecutive
    requests in row (arrival) order, cut into chunks of up to ``window``; ordered by their first row."""
    if window < 1:
        raise ValueError(f"window: expected at least 1 request, got {window}")
    rep = np.asarray(replica_of)
    out: list[np.ndarray] = []
    for r in np.unique(rep[rep >= 0]).tolist():
        rows = np.flatnonzero(rep == r)
        out.extend(rows[i : i + window] for i in range(0, len(rows), window))
    out.sort(key=lambda w: int(w[0]))
    return out


def _prefix_providers(table: RequestTable, rep_of: np.ndarray, block_tokens: int) -> list[set[int]] | None:
    """For every row, the latest earlier rows of its replica that hold one of its shareable prefix blocks (the
    requests that put those blocks in the cache it found), or None for a table without prefix blocks."""
    if table.prefix_offsets is None or table.prefix_hashes is None:
        return None
    last: dict[tuple[int, int], int] = {}
    out: list[set[int]] = []
    for i in range(len(table)):
        r = int(rep_of[i])
        hs = shareable_hashes(table, i, block_tokens).tolist() if r >= 0 else []
        out.append({last[(r, h)] for h in hs if (r, h) in last})
        for h in hs:
            last[(r, h)] = i
    return out


def _clock_plan(actions: Sequence[tuple], initial_mhz: int, t_from: float, t_to: float) -> tuple[int, list[tuple]]:
    """The clock in force at ``t_from`` and the clock changes applied in ``[t_from, t_to]``."""
    clock = initial_mhz
    later: list[tuple] = []
    for a in actions:
        if a[0] != "clock":
            continue
        if a[1] < t_from:
            clock = int(a[2])
        elif a[1] <= t_to:
            later.append(("clock", float(a[1]), int(a[2])))
    return clock, later


def replay_correction(
    table: RequestTable,
    bills: np.ndarray,
    profile: Profile,
    replica_of: np.ndarray,
    *,
    finish_s: np.ndarray | None = None,
    actions: Sequence[tuple] = (),
    initial_clock_mhz: int | None = None,
    window: int = 16,
    n_pairs: int = 10,
    seed: int = 0,
    max_windows: int | None = None,
    progress: Callable[[int], None] | None = None,
    prefix_block_tokens: int = 512,
    hold_state: bool = True,
) -> WindowCorrection:
    """Replay-correct ``bills`` (closed-form J per row of ``table``) over the run's attribution windows (see the
    module docstring). ``replica_of``: serving replica per row; ``finish_s``: completion times (bounds the
    clock changes replayed, and tells which earlier requests were still running when a window started: the state
    held fixed with ``hold_state``); ``actions``: the run's ``("clock", t, mhz)`` changes (other kinds are ignored);
    ``max_windows``: replay only the first windows (by first arrival). ``progress(k)`` is called per window."""
    if n_pairs < 2:
        raise ValueError(f"pairs: need at least 2 antithetic pairs for an error bar, got {n_pairs}")
    bills = np.asarray(bills, dtype=np.float64)
    n = len(table)
    if len(bills) != n or len(replica_of) != n:
        raise ValueError(f"replay_correction: {len(bills)} bills and {len(replica_of)} replicas for {n} requests")
    init = profile.reference_clock_mhz if initial_clock_mhz is None else int(initial_clock_mhz)
    wins = attribution_windows(replica_of, window)
    todo = wins if max_windows is None else wins[: max(int(max_windows), 0)]
    shares = np.full(n, np.nan)
    se = np.full(n, np.nan)
    t_start = time.perf_counter()
    replays = exact_n = 0
    rep_of = np.asarray(replica_of)
    providers = _prefix_providers(table, rep_of, prefix_block_tokens) if hold_state else None
    # per replica: its earlier rows not known to have finished by its latest window start (windows of one
    # replica come in arrival order, so a row that has finished by one window start stays out)
    unfinished: dict[int, list[int]] = {}
    for w_idx, rows in enumerate(todo):
        t_lo = float(table.arrival_s[rows[0]])
        state = np.zeros(0, dtype=np.int64)
        if hold_state:
            r = int(rep_of[rows[0]])
            held: set[int] = set()
            if finish_s is not None:  # still running at the window start (NaN: never finished)
                cand = unfinished.get(r, [])
                unfinished[r] = [j for j in cand if not finish_s[j] <= t_lo] + rows.tolist()
                held.update(unfinished[r][: -len(rows)])
            if providers is not None:  # the latest earlier requests that cached the window's prefix blocks
                held.update(j for i in rows.tolist() for j in providers[i] if j < rows[0])
            state = np.asarray(sorted(held), dtype=np.int64)
        sub = table.take(np.concatenate([state, rows]))
        t_hi = float(np.max(finish_s[rows])) if finish_s is not None else math.inf
        clock, plan = _clock_plan(actions, init, float(sub.arrival_s[0]), t_hi)
        law = StepLaw.from_profiles(profile, clock_mhz=_clock_plan(actions, init, t_lo, t_lo)[0])
        inner = ReplayGame(sub, profile, clock_mhz=clock, actions=plan, law=law,
                           prefix_block_tokens=prefix_block_tokens)
        nf = len(state)
        game = FixedStateGame(inner, nf) if nf else inner
        m = len(rows)
        exact = (1 << m) - 1 <= 2 * n_pairs * m
        total = float(bills[rows].sum())
        if exact:
            res = replay_shapley(game, exact=True, total_j=total)
            exact_n += 1
            shares[rows] = res.attribution.shares
            se[rows] = 0.0
        else:
            full = inner.serve(range(nf + m))
            control = model_game_for(full.log, full.table, inner.law, prefix_block_tokens=prefix_block_tokens)
            if nf:
                control = FixedStateGame(control, nf)
            res = replay_shapley(game, control=control, n_pairs=n_pairs, seed=seed + w_idx, exact=False,
                                 total_j=total)
            shares[rows] = res.attribution.shares
            se[rows] = res.attribution.se
        replays += inner.counters["replays"]
        if progress is not None:
            progress(w_idx + 1)
    done = ~np.isnan(shares)
    tot = float(bills[done].sum())
    l1 = float(np.abs(shares[done] - bills[done]).sum() / tot) if tot > 0 else 0.0
    noise = float(math.sqrt(2 / math.pi) * se[done].sum() / tot) if tot > 0 else 0.0
    return WindowCorrection(shares, se, len(todo), len(wins), exact_n, int(done.sum()), n_pairs, replays,
                            time.perf_counter() - t_start, l1, noise)
