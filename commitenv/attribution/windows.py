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

What there is to correct. The game differs from the closed form only where requests interact. A window whose
every request arrived at an idle replica and ran alone *in the run* (no other request of the replica between its
arrival and its finish, by ``finish_s``; ``windows_alone``), and none of which shares a cached prefix block with
another, is served identically in every coalition: removing the others changes nothing it meets, so its bills
are its Shapley value and are kept (nothing is replayed). Otherwise the
full window is replayed once (state included) and the game is played when the replay has a step that holds more
than one request (``windows_shared``), or, without one, a request had to wait for another (a coalition without
the one it waited for can share steps; ``windows_queued``) or two of the window's requests hold the same cached
prefix block (``windows_prefix``). In every other window the game is additive and its Shapley value is the
closed form of its replay, computed without serving any coalition (standard error 0). A run in which no window
is played has nothing to correct. (The run's own timeline decides first because the replay is noise-free: on a
run with step-time noise its timeline can make requests meet that never met.)
``l1_correction`` is the scheduling correction at the law level, ``sum |phi - closed form| / total`` (0 where
nothing interacts); ``l1`` compares the returned shares with the bills, which also differ by how metered energy is
divided (the bills follow each step's metered energy, the shares divide each window's by the noise-free law).

Own energy. ``own_mode="replayed"`` (default) sums each coalition's own energy over its replayed steps, so the
game is the engine's (recompute after a preemption is charged by the Shapley value of who caused it);
``"fixed"`` is the paper's Eq. (6) with every request's own energy fixed at the full window's, which charges all
recompute to the preempted request (`ReplayGame`).

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
from commitenv.attribution.replay import OWN_MODES, ReplayGame, model_game_for, replay_shapley
from commitenv.attribution.shapley import FixedStateGame
from commitenv.profiles.schema import Profile
from commitenv.workload.table import RequestTable


@dataclass(frozen=True)
class WindowCorrection:
    """Replay-corrected bills of a run (aligned with the table's rows; NaN where not replayed)."""

    shares: np.ndarray  # J
    se: np.ndarray  # standard error per request, J (0 in exactly computed windows and windows with nothing to correct)
    windows: int  # windows replayed
    windows_total: int  # windows in the run
    exact_windows: int  # windows whose game was enumerated (of windows_played)
    requests: int  # requests replayed
    n_pairs: int
    replays: int  # coalitions served
    wall_s: float
    l1: float  # sum |corrected - closed form| / sum closed form, over the replayed requests
    l1_noise: float  # expected L1 of the sampling noise alone: sqrt(2/pi) sum se / total
    windows_alone: int = 0  # windows whose every request ran alone on an idle replica in the run (finish_s)
    windows_shared: int = 0  # windows whose full replay has a step holding more than one request
    windows_queued: int = 0  # no such step, but a request waited for another
    windows_prefix: int = 0  # neither, but two of the window's requests hold the same cached prefix block
    l1_se: float = 0.0  # standard error of l1 (an upper bound; 0 when nothing was sampled)
    l1_correction: float = 0.0  # the scheduling correction: sum |phi - closed form| / total at the law level
    l1_correction_se: float = 0.0  # its standard error (an upper bound; 0 when nothing was sampled)
    own_mode: str = "replayed"
    prefix: bool = False  # the table has prefix hash blocks

    @property
    def windows_played(self) -> int:
        """Windows whose game was played (the others have nothing to correct)."""
        return self.windows_shared + self.windows_queued + self.windows_prefix

    @property
    def sampled_windows(self) -> int:
        return self.windows_played - self.exact_windows

    @property
    def status(self) -> str:
        """``"nothing to correct"`` (no window's requests interact), ``"exact"`` (every window whose requests
        interact was enumerated) or ``"sampled"``."""
        if self.windows_played == 0:
            return "nothing to correct"
        return "exact" if self.sampled_windows == 0 else "sampled"

    def as_dict(self) -> dict:
        sampled = self.sampled_windows > 0
        return {
            "status": self.status,
            "own": self.own_mode,
            "windows": self.windows,
            "windows_total": self.windows_total,
            "windows_alone": self.windows_alone,
            "windows_shared": self.windows_shared,
            "windows_queued": self.windows_queued,
            "windows_prefix": self.windows_prefix,
            "windows_played": self.windows_played,
            "exact_windows": self.exact_windows,
            "sampled_windows": self.sampled_windows,
            "requests": self.requests,
            "pairs": self.n_pairs,
            "replays": self.replays,
            "wall_s": round(self.wall_s, 3),
            "l1_correction": self.l1_correction,
            "l1_correction_se": self.l1_correction_se if sampled else None,
            "l1_vs_closed_form": self.l1,
            "l1_se": self.l1_se if sampled else None,
            "l1_noise": self.l1_noise,
        }

    def summary(self) -> str:
        """One line saying what the correction did (the printed line of ``commitenv attribute --replay``)."""
        head = (f"replay correction ({self.own_mode} own energy), {self.windows} of {self.windows_total} windows "
                f"({self.requests} requests)")
        bills = f"L1 distance to the closed form {_pct(self.l1)}"
        if self.windows_played == 0:
            why = []
            if self.windows_alone:
                why.append(f"in {self.windows_alone} every request arrived at an idle replica and ran alone in the "
                           f"run")
            rest = self.windows - self.windows_alone
            if rest:
                pfx = " or shares a cached prefix block" if self.prefix else ""
                why.append(f"in {rest} no step of the replay holds more than one request and no request waits for "
                           f"another{pfx}")
            out = (f"{head}: nothing to correct ({'; '.join(why)}): every window's game is additive and its Shapley "
                   f"value is the closed form; ")
            if self.l1 == 0:
                return out + "replay_j = total_j"
            return out + (f"replay_j divides the energy of the {rest} windows judged by their replay by its noise-free "
                          f"law ({bills}: the meter's deviations from the law, which total_j follows step by step, "
                          f"not a correction)")
        other = self.windows_queued + self.windows_prefix
        what = f"{self.windows_shared} with a step holding more than one request"
        if other:
            what += f" and {other} where requests interact otherwise (a queued request or a shared prefix block)"
        if self.windows_alone:
            what += f" ({self.windows_alone} whose requests each ran alone in the run: nothing to correct there)"
        if self.sampled_windows == 0:
            corr = f"{_pct(self.l1_correction)} (exact: all {self.windows_played} such windows enumerated)"
            b = f"{bills} (exact)"
        else:
            how = (f"standard error, an upper bound; {self.n_pairs} pairs in {self.sampled_windows} sampled windows, "
                   f"{self.exact_windows} enumerated")
            corr = f"{_pct(self.l1_correction)} +- {_pct(self.l1_correction_se)} ({how})"
            b = f"{bills} +- {_pct(self.l1_se)}"
        return (f"{head}: {what}; scheduling correction (law level, L1 to the closed form) {corr}; replay_j vs "
                f"total_j: {b}")


def _pct(x: float) -> str:
    """A fraction as a percentage with three significant digits (never a bare "0.000 %" for a small non-zero)."""
    return "0 %" if x == 0 else f"{100 * x:.3g} %"


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


def _interaction(pool, sub: RequestTable, n_fixed: int, block_tokens: int) -> str | None:
    """How the requests of a window's full replay (``pool`` serving ``sub``, whose first ``n_fixed`` rows are the
    held state) interact: ``"shared"`` (a step holds more than one request), ``"queued"`` (no such step, but a
    request's first step started after its arrival: it waited for another), ``"prefix"`` (neither, but two of
    the window's requests hold the same shareable prefix block), or None (each request arrived at an idle engine
    and ran alone: every coalition serves it the same way, so the game is additive)."""
    first: dict[int, float] = {}
    for e in pool.log:
        if len(e.slots) > 1:
            return "shared"
        first.setdefault(e.slots[0], e.t0)
    arr = sub.arrival_s
    if any(t0 > arr[s] + 1e-9 * max(1.0, abs(arr[s])) for s, t0 in first.items()):
        return "queued"
    if not _prefix_free(sub, n_fixed, block_tokens):
        return "prefix"
    return None


def _prefix_free(sub: RequestTable, n_fixed: int, block_tokens: int) -> bool:
    """No two of the window's requests (rows ``n_fixed..`` of ``sub``) hold the same shareable prefix block."""
    if sub.prefix_offsets is None or sub.prefix_hashes is None:
        return True
    seen: set[int] = set()
    for i in range(n_fixed, len(sub)):
        hs = set(shareable_hashes(sub, i, block_tokens).tolist())
        if hs & seen:
            return False
        seen |= hs
    return True


def _ran_alone(table: RequestTable, rep_of: np.ndarray, finish_s: np.ndarray) -> np.ndarray:
    """Per row: the request arrived at an idle replica and ran alone in the run, i.e. no other request of its
    replica was between arrival and finish while it was (strictly: it arrived after every earlier arrival of the
    replica had finished, and finished before the next arrived). Never-finished requests are not alone."""
    out = np.zeros(len(table), dtype=bool)
    arr = np.asarray(table.arrival_s, dtype=np.float64)
    fin = np.asarray(finish_s, dtype=np.float64)
    for r in np.unique(rep_of[rep_of >= 0]).tolist():
        rows = np.flatnonzero(rep_of == r)
        rows = rows[np.argsort(arr[rows], kind="stable")]
        a, f = arr[rows], fin[rows]
        done_before = np.concatenate([[-np.inf], np.maximum.accumulate(np.where(np.isnan(f), np.inf, f))[:-1]])
        next_arrival = np.concatenate([a[1:], [np.inf]])
        out[rows] = (a > done_before) & (f < next_arrival) & ~np.isnan(f)
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
    own_mode: str = "replayed",
) -> WindowCorrection:
    """Replay-correct ``bills`` (closed-form J per row of ``table``) over the run's attribution windows (see the
    module docstring). ``replica_of``: serving replica per row; ``finish_s``: completion times (bounds the
    clock changes replayed, and tells which earlier requests were still running when a window started: the state
    held fixed with ``hold_state``); ``actions``: the run's ``("clock", t, mhz)`` changes (other kinds are ignored);
    ``max_windows``: replay only the first windows (by first arrival). ``progress(k)`` is called per window.
    ``finish_s`` should be when each request left the engine (without client-side serving overheads): it also
    decides which windows ran alone in the run. ``own_mode``: ``"replayed"`` (the engine's game, default) or
    ``"fixed"`` (Eq. (6), see `ReplayGame`)."""
    if own_mode not in OWN_MODES:
        raise ValueError(f"own_mode: expected 'replayed' or 'fixed', got {own_mode!r}")
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
    counts = {"shared": 0, "queued": 0, "prefix": 0}
    alone = _ran_alone(table, rep_of, finish_s) if finish_s is not None else None
    n_alone = 0
    se_win: list[float] = []  # summed standard errors of each sampled window (of the shares)
    se_law: list[float] = []  # the same at the law level
    law_dev = law_tot = 0.0
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
        total = float(bills[rows].sum())
        if alone is not None and alone[rows].all() and _prefix_free(table.take(rows), 0, prefix_block_tokens):
            # every request ran alone in the run: no coalition changes what it meets, the game is additive and
            # the bills (the run's closed form) are its Shapley value; nothing is replayed
            n_alone += 1
            shares[rows] = bills[rows]
            se[rows] = 0.0
            law_tot += total  # adds nothing to the correction, its energy to the denominator
            if progress is not None:
                progress(w_idx + 1)
            continue
        sub = table.take(np.concatenate([state, rows]))
        t_hi = float(np.max(finish_s[rows])) if finish_s is not None else math.inf
        clock, plan = _clock_plan(actions, init, float(sub.arrival_s[0]), t_hi)
        law = StepLaw.from_profiles(profile, clock_mhz=_clock_plan(actions, init, t_lo, t_lo)[0])
        inner = ReplayGame(sub, profile, clock_mhz=clock, actions=plan, law=law,
                           prefix_block_tokens=prefix_block_tokens, own_mode=own_mode)
        nf = len(state)
        m = len(rows)
        full = inner.serve(range(nf + m))
        kind = _interaction(full, sub, nf, prefix_block_tokens)
        control = model_game_for(full.log, full.table, inner.law, prefix_block_tokens=prefix_block_tokens)
        if nf:
            control = FixedStateGame(control, nf)
        cf = np.asarray(control.shapley(), dtype=np.float64)  # the closed form of the window's replay (law level)
        law_tot += float(cf.sum())
        if kind is None:
            # nothing to correct: the game is additive, its Shapley value is the closed form (no coalition served)
            phi, phi_se = cf, None
            shares[rows] = cf * (total / cf.sum()) if cf.sum() > 0 else bills[rows]
            se[rows] = 0.0
        else:
            counts[kind] += 1
            game = FixedStateGame(inner, nf) if nf else inner
            exact = (1 << m) - 1 <= 2 * n_pairs * m
            if exact:
                res = replay_shapley(game, exact=True, total_j=total)
                exact_n += 1
                se[rows] = 0.0
                phi_se = None
            else:
                res = replay_shapley(game, control=control, n_pairs=n_pairs, seed=seed + w_idx, exact=False,
                                     total_j=total)
                se[rows] = res.attribution.se
                se_win.append(float(res.attribution.se.sum()))
                phi_se = res.estimate.se
            phi = res.law_phi
            shares[rows] = res.attribution.shares
        law_dev += float(np.abs(phi - cf).sum())
        if phi_se is not None:
            se_law.append(float(np.sum(phi_se)))
        replays += inner.counters["replays"]
        if progress is not None:
            progress(w_idx + 1)
    done = ~np.isnan(shares)
    tot = float(bills[done].sum())
    l1 = float(np.abs(shares[done] - bills[done]).sum() / tot) if tot > 0 else 0.0
    noise = float(math.sqrt(2 / math.pi) * se[done].sum() / tot) if tot > 0 else 0.0
    # |L1(x) - L1(x')| <= sum |x_i - x'_i| / tot: within a window the errors' RMS adds at most linearly
    # (Minkowski), windows are sampled independently
    l1_se = float(math.sqrt(sum(x * x for x in se_win)) / tot) if tot > 0 else 0.0
    l1c = law_dev / law_tot if law_tot > 0 else 0.0
    l1c_se = float(math.sqrt(sum(x * x for x in se_law)) / law_tot) if law_tot > 0 else 0.0
    return WindowCorrection(shares, se, len(todo), len(wins), exact_n, int(done.sum()), n_pairs, replays,
                            time.perf_counter() - t_start, l1, noise, n_alone, counts["shared"], counts["queued"],
                            counts["prefix"], l1_se, l1c, l1c_se, own_mode,
                            table.prefix_offsets is not None and table.prefix_hashes is not None)
