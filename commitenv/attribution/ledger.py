"""Online ledger (StepSplit section 5.5): step sharing as the engine runs, settled per attribution window against
metered energy, each request billed when it finishes.

Feeding. `consume` takes one `StepLogEntry` as it ends (`sync` consumes the new tail of ``pool.log``). Every
member of a segment gets its own law term and its part ``n_steps * a(m) / m`` of the segment's shared energy.
Entries inside the open window are buffered and priced in one vectorised pass when the window closes: the own
terms come from the entries' per-member decode flags (the engine's classification), or, for a log without
them, from walking the log (`OwnTracker`); a request is complete when an entry computes its last token
(computed tokens - prompt + 1 >= output length). A segment that spans a window boundary is priced at once and
split between the windows in proportion to its time overlap with each (exact for single steps, which is what
`Pool.settle` leaves in flight at a boundary; a multi-step run split this way is an approximation).

Settling. `close_window(t_end, metered_j, idle_w)` ends the open window at ``t_end`` with the energy the
meter read over it. When every step that started before the window's end has been consumed (the caller
says so with ``settle(complete_before)``; for a `Pool` use `ledger_horizon(pool)`), the window's busy energy
``metered - sum_g idle_w[g] * (time of the window no step on GPU g covers)`` is divided among the requests in
proportion to the parts they accumulated in it; idle gaps are thus excluded, and the shares of a window add up
to its busy energy exactly. (``idle_w`` is each GPU's floor power; if the floor changed inside the window,
close windows at lifecycle changes or pass the busy energy with ``idle_w=0``.) A request whose last token fell
in window w is billed when w settles: ``bills[slot]`` is final, and ``on_bill(slot, joules)`` is called.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from commitenv.attribution.law import OwnTracker, StepLaw, member_terms
from commitenv.sim.devices import device_state
from commitenv.sim.states import SEG_NONE

INF = math.inf


@dataclass(frozen=True)
class WindowSettlement:
    """One settled attribution window."""

    index: int
    start: float
    end: float
    metered_j: float
    idle_j: float  # idle floor energy over the time no step covered, subtracted from the meter
    busy_j: float
    law_j: float  # the law's energy of the (parts of) segments in the window
    logged_j: float  # the logged energy of the same
    shares: dict[int, float]  # slot -> joules; sum == busy_j (unless no request ran: see unattributed_j)
    unattributed_j: float  # busy energy with no request to bill (no step overlapped the window)


class _Window:
    __slots__ = ("index", "start", "end", "chunks", "cover", "law_j", "logged_j", "metered", "idle_w", "finished")

    def __init__(self, index: int, start: float) -> None:
        self.index = index
        self.start = start
        self.end = INF
        self.chunks: list[tuple[np.ndarray, np.ndarray]] = []  # (slots, law parts) per priced batch
        self.cover: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (gpu, t0, t1) of the (parts of) segments
        self.law_j = 0.0
        self.logged_j = 0.0
        self.metered = 0.0
        self.idle_w: np.ndarray | None = None
        self.finished: list[int] = []


def _union_length(t0: np.ndarray, t1: np.ndarray, lo: float, hi: float) -> float:
    """Length of the union of the intervals ``[t0, t1)`` clipped to ``[lo, hi]`` (touching intervals merge)."""
    a = np.clip(t0, lo, hi)
    b = np.clip(t1, lo, hi)
    keep = b > a
    if not keep.all():
        a, b = a[keep], b[keep]
    if len(a) == 0:
        return 0.0
    if (a[1:] < a[:-1]).any():
        order = np.argsort(a, kind="stable")
        a, b = a[order], b[order]
    reach = np.maximum.accumulate(b)
    new = np.empty(len(a), dtype=bool)
    new[0] = True
    new[1:] = a[1:] > reach[:-1]
    heads = np.flatnonzero(new)
    return float((np.maximum.reduceat(b, heads) - a[heads]).sum())


def _sum_by_slot(slots: np.ndarray, parts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct slots (ascending) and the sum of their parts."""
    lo = int(slots.min())
    span = int(slots.max()) - lo + 1
    if span <= 64 * len(slots):  # the slots of one window are close together: count densely
        cnt = np.bincount(slots - lo, minlength=span)
        tot = np.bincount(slots - lo, weights=parts, minlength=span)
        idx = np.flatnonzero(cnt)
        return idx + lo, tot[idx]
    uniq, inv = np.unique(slots, return_inverse=True)
    return uniq, np.bincount(inv, weights=parts, minlength=len(uniq))


def _dense(values) -> np.ndarray | None:
    """Per-slot lengths as an array (None for a mapping, which is looked up slot by slot)."""
    if values is None or isinstance(values, Mapping):
        return None
    return np.asarray(getattr(values, "prompt_tokens", values), dtype=np.int64)


def ledger_horizon(pool) -> float:
    """Time before which every step of ``pool`` has been logged: the earliest start of a segment still in
    flight, or the pool's clock when none is."""
    dev = device_state(pool)
    started = dev.replica_segment_t0[dev.replica_segment != SEG_NONE]
    return float(min(pool.now, started.min())) if len(started) else float(pool.now)


@dataclass
class _Priced:
    """A batch of log entries under the law: per entry and per membership (members in entry order)."""

    entry: np.ndarray  # entry index of every membership
    m: np.ndarray  # members per entry
    slots: np.ndarray
    part: np.ndarray  # own + equal part of the entry's shared energy, per membership
    law: np.ndarray  # law energy per entry
    energy: np.ndarray  # logged energy per entry
    gpu: np.ndarray
    t0: np.ndarray
    t1: np.ndarray
    done: np.ndarray  # per membership: the entry produced the request's last token


class Ledger:
    """Step sharing online, settled per window (see the module docstring).

    ``prompts``: prompt length by slot (a `RequestTable`, array, or mapping) — needed to classify one-token
    work as decode or prefill exactly as the engine does. ``outputs``: output length by slot (use
    ``pool.out_tokens``, which the engine caps at the context limit) to detect completions; without it no
    request is ever billed, but window shares still settle. ``n_gpus``: GPUs metered (for idle subtraction).
    """

    def __init__(
        self,
        law: StepLaw,
        prompts,
        outputs=None,
        *,
        n_gpus: int = 1,
        t_start: float = 0.0,
        on_bill: Callable[[int, float], None] | None = None,
    ) -> None:
        self.law = law
        self._tracker = OwnTracker(law, prompts)
        # computed tokens at which a request is complete: prompt + output - 1 (its last token is never fed back)
        self._last: np.ndarray | Callable[[int], int] | None = None
        if outputs is not None:
            out_src = getattr(outputs, "output_tokens", outputs)
            prompt_arr, out_arr = _dense(prompts), _dense(out_src)
            if prompt_arr is not None and out_arr is not None:
                if len(prompt_arr) != len(out_arr):
                    raise ValueError(f"Ledger: {len(prompt_arr)} prompt lengths but {len(out_arr)} output lengths")
                self._last = prompt_arr + out_arr - 1
            else:
                prompt = self._tracker.prompt
                out = out_src.__getitem__
                self._last = lambda s: prompt(s) + out(s) - 1
        self.n_gpus = n_gpus
        self.on_bill = on_bill
        self._open = _Window(0, t_start)
        self._pending: list[_Window] = []
        self._n_windows = 1
        self._seen = 0
        self._max_t1 = t_start
        self._meter_prev: np.ndarray | None = None
        self._buf: list = []  # consumed entries of the open window, priced when it closes
        self._owns: list[list[float]] = []  # their own energies, for logs without decode flags
        self._flagged: bool | None = None  # whether the log's entries carry per-member decode flags
        self._coef = np.zeros((0, 5))  # a, b, kappa, c1, c2 by replica
        self._settled = np.zeros(0)  # joules settled so far, by slot
        self._touched = np.zeros(0, dtype=bool)  # slots with a share in a settled window
        self.bills: dict[int, float] = {}  # slot -> final bill of a finished request
        self.windows: list[WindowSettlement] = []
        self.unattributed_j = 0.0
        self.entries = 0
        self.steps = 0

    # ------------------------------------------------------------------------------------------ feeding
    def sync(self, log: Sequence) -> int:
        """Consume the entries of ``log`` (a growing list, e.g. ``pool.log``) not seen yet. Returns how many."""
        n = len(log)
        for i in range(self._seen, n):
            self.consume(log[i])
        k = n - self._seen
        self._seen = n
        return k

    def consume(self, e) -> None:
        """Add one ended log entry. Entries are buffered and priced together when the open window closes (or
        a window settles); one that starts before the open window is split between the windows it overlaps."""
        flagged = bool(e.decode)
        if flagged is not self._flagged:
            if self._flagged is not None:
                raise ValueError("ledger: the log mixes entries with and without per-member decode flags")
            self._flagged = flagged
        if e.t0 < self._open.start:
            first = self._pending[0].start if self._pending else self._open.start
            if e.t0 < first - 1e-12:
                raise ValueError(
                    f"ledger: a segment starting at t={e.t0} reached the ledger after the window holding it was "
                    f"settled (settle only up to ledger_horizon(pool))"
                )
        self.entries += 1
        self.steps += e.n_steps
        if e.t1 > self._max_t1:
            self._max_t1 = e.t1
        self._buf.append(e)
        if not flagged:
            self._owns.append(self._tracker.own(e))

    def _coeff_rows(self, rep: np.ndarray) -> np.ndarray:
        """(E, 5) law coefficients of the entries' replicas."""
        top = int(rep.max()) + 1
        if top > len(self._coef):
            c = [self.law.coeffs(r) for r in range(top)]
            self._coef = np.array([(x.a, x.b, x.kappa, x.c1, x.c2) for x in c])
        return self._coef[rep]

    def _price(self, batch: list, owns: list[list[float]] | None) -> _Priced:
        """Law parts of a batch of entries in one vectorised pass: own energy from the decode flags (or the
        tracker's ``owns``), the shared energy ``n_steps * a(m)`` split equally among the members."""
        ne = len(batch)
        head = np.array([(e.replica, e.n_steps, e.t0, e.t1, e.energy_j, e.gpu) for e in batch],
                        dtype=np.float64).reshape(ne, 6)
        rep = head[:, 0].astype(np.int64)
        ns = head[:, 1]
        cf = self._coeff_rows(rep)
        mt = member_terms(batch, ns, cf, owns)
        ent, m, slots, own, nm = mt.entry, mt.m, mt.slots, mt.own, len(mt.slots)
        if self.law.shared_fn is None:
            a = cf[:, 0]
        else:
            a = np.array([self.law.shared(r, x) for r, x in zip(rep.tolist(), m.tolist())])
        sh = ns * a
        law = sh + np.bincount(ent, weights=own, minlength=ne)
        part = own + (sh / m)[ent]
        if self._last is None:
            done = np.zeros(nm, dtype=bool)
        else:  # the entry computed the request's last token (prompt + output - 1 tokens: the last is never fed)
            last = (self._last[slots] if isinstance(self._last, np.ndarray)
                    else np.fromiter(map(self._last, slots.tolist()), np.int64, nm))
            done = mt.computed >= last
        return _Priced(ent, m, slots, part, law, head[:, 4], head[:, 5].astype(np.int64), head[:, 2], head[:, 3], done)

    def _flush(self) -> None:
        """Price the buffered entries: those inside the open window go to it, the others are split between
        the windows they overlap in proportion to time (the last one gets their completions)."""
        if not self._buf:
            return
        pr = self._price(self._buf, self._owns if self._owns else None)
        self._buf = []
        self._owns = []
        w = self._open
        span = pr.t0 < w.start
        if not span.any():
            w.chunks.append((pr.slots, pr.part))
            w.law_j += float(pr.law.sum())
            w.logged_j += float(pr.energy.sum())
            w.cover.append((pr.gpu, pr.t0, pr.t1))
            if pr.done.any():
                w.finished.extend(pr.slots[pr.done].tolist())
            return
        inside = ~span
        mem = inside[pr.entry]
        w.chunks.append((pr.slots[mem], pr.part[mem]))
        w.law_j += float(pr.law[inside].sum())
        w.logged_j += float(pr.energy[inside].sum())
        w.cover.append((pr.gpu[inside], pr.t0[inside], pr.t1[inside]))
        if pr.done[mem].any():
            w.finished.extend(pr.slots[mem & pr.done].tolist())
        first = np.cumsum(pr.m) - pr.m
        for i in np.flatnonzero(span).tolist():
            self._split(pr, i, slice(int(first[i]), int(first[i] + pr.m[i])))

    def _split(self, pr: _Priced, i: int, mem: slice) -> None:
        """Entry ``i`` of ``pr`` (members ``mem``), which started before the open window, split between the
        windows it overlaps in proportion to its time in each (a zero-length step goes to the one holding t0)."""
        t0, t1 = float(pr.t0[i]), float(pr.t1[i])
        dur = t1 - t0
        last = None
        for w in [w for w in self._pending if w.end > t0] + [self._open]:
            lo, hi = max(t0, w.start), min(t1, w.end)
            if dur > 0:
                if hi <= lo:
                    continue
                f = (hi - lo) / dur
            else:
                if not (w.start <= t0 < w.end):
                    continue
                f = 1.0
            w.chunks.append((pr.slots[mem], f * pr.part[mem]))
            w.law_j += f * float(pr.law[i])
            w.logged_j += f * float(pr.energy[i])
            w.cover.append((pr.gpu[i:i + 1], np.array([lo]), np.array([hi])))
            last = w
        if last is not None and pr.done[mem].any():
            last.finished.extend(pr.slots[mem][pr.done[mem]].tolist())

    # ------------------------------------------------------------------------------------------ windows
    def close_window(self, t_end: float, metered_j, idle_w=0.0) -> None:
        """End the open window at ``t_end``. ``metered_j``: energy the meter read over the window (total, or
        per GPU); ``idle_w``: floor power per GPU (or one value for all) to subtract over uncovered time."""
        self._flush()
        w = self._open
        if t_end < w.start:
            raise ValueError(f"close_window: t_end={t_end} precedes the window start {w.start}")
        if t_end < self._max_t1 - 1e-9:
            raise ValueError(
                f"close_window: t_end={t_end} precedes the end of an already consumed segment ({self._max_t1}); "
                "close windows at or after the time the log has reached"
            )
        w.end = t_end
        w.metered = float(np.sum(metered_j))
        iw = np.asarray(idle_w, dtype=np.float64)
        w.idle_w = np.full(self.n_gpus, float(iw)) if iw.ndim == 0 else iw
        if len(w.idle_w) != self.n_gpus:
            raise ValueError(f"close_window: idle_w has {len(w.idle_w)} values for {self.n_gpus} GPUs")
        self._pending.append(w)
        self._open = _Window(self._n_windows, t_end)
        self._n_windows += 1

    def close_from_pool(self, pool, t_end: float) -> None:
        """Close the open window at ``t_end`` reading ``pool``'s per-GPU meters (difference since the last
        close) and each GPU's floor power at ``t_end``. Call after ``pool.run_until(t_end)``,
        ``pool.settle(t_end)`` and `sync`."""
        meter = pool.gpu_energy_j(t_end)
        prev = self._meter_prev if self._meter_prev is not None else np.zeros(len(meter))
        self._meter_prev = meter
        self.close_window(t_end, meter - prev, device_state(pool).gpu_floor_w)

    def settle(self, complete_before: float = INF) -> list[WindowSettlement]:
        """Settle every closed window ending at or before ``complete_before`` (a time before which every step
        has been consumed). Returns the newly settled windows, in order."""
        self._flush()
        done: list[WindowSettlement] = []
        while self._pending and self._pending[0].end <= complete_before:
            w = self._pending.pop(0)
            span = w.end - w.start
            idle = 0.0
            if w.cover:
                g_all = np.concatenate([c[0] for c in w.cover])
                a_all = np.concatenate([c[1] for c in w.cover])
                b_all = np.concatenate([c[2] for c in w.cover])
            for g in range(self.n_gpus):
                cov = 0.0
                if w.cover:
                    on = g_all == g
                    cov = _union_length(a_all[on], b_all[on], w.start, w.end)
                idle += w.idle_w[g] * max(span - cov, 0.0)
            busy = w.metered - idle
            shares: dict[int, float] = {}
            unattr = 0.0
            tot = 0.0
            if w.chunks:
                uniq, per = _sum_by_slot(np.concatenate([c[0] for c in w.chunks]),
                                         np.concatenate([c[1] for c in w.chunks]))
                tot = float(per.sum())
            if tot > 0:
                v = per * (busy / tot)
                shares = dict(zip(uniq.tolist(), v.tolist()))
                top = int(uniq[-1]) + 1
                if top > len(self._settled):
                    grow = max(top, 2 * len(self._settled)) - len(self._settled)
                    self._settled = np.concatenate([self._settled, np.zeros(grow)])
                    self._touched = np.concatenate([self._touched, np.zeros(grow, dtype=bool)])
                self._settled[uniq] += v  # uniq holds each slot once
                self._touched[uniq] = True
            else:
                unattr = busy
                self.unattributed_j += busy
            for s in w.finished:
                b = float(self._settled[s]) if s < len(self._settled) else 0.0
                self.bills[s] = b
                if self.on_bill is not None:
                    self.on_bill(s, b)
            ws = WindowSettlement(w.index, w.start, w.end, w.metered, idle, busy, w.law_j, w.logged_j, shares, unattr)
            self.windows.append(ws)
            done.append(ws)
        return done

    @property
    def settled(self) -> dict[int, float]:
        """Joules settled so far, by slot (every slot with a share in a settled window)."""
        idx = np.flatnonzero(self._touched)
        return dict(zip(idx.tolist(), self._settled[idx].tolist()))

    @property
    def pending_windows(self) -> int:
        return len(self._pending)
