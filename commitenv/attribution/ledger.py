"""Online ledger (StepSplit section 5.5): step sharing as the engine runs, settled per attribution window against
metered energy, each request billed when it finishes.

Feeding. `consume` takes one `StepLogEntry` as it ends (`sync` consumes the new tail of ``pool.log``) and
adds to every member its own law term and its part ``n_steps * a(m) / m`` of the segment's shared energy —
O(m) per entry, a decode run included. A segment that spans a window boundary is split between the windows in
proportion to its time overlap with each (exact for single steps, which is what `Pool.settle` leaves in flight
at a boundary; a multi-step run split this way is an approximation).

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

from commitenv.attribution.law import OwnTracker, StepLaw

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
    __slots__ = ("index", "start", "end", "parts", "cover", "law_j", "logged_j", "metered", "idle_w", "finished")

    def __init__(self, index: int, start: float) -> None:
        self.index = index
        self.start = start
        self.end = INF
        self.parts: dict[int, float] = {}
        self.cover: dict[int, list[tuple[float, float]]] = {}
        self.law_j = 0.0
        self.logged_j = 0.0
        self.metered = 0.0
        self.idle_w: np.ndarray | None = None
        self.finished: list[int] = []


def _union_length(ivs: list[tuple[float, float]], lo: float, hi: float) -> float:
    tot = 0.0
    cur_a = cur_b = None
    for a, b in sorted(ivs):
        a = max(a, lo)
        b = min(b, hi)
        if b <= a:
            continue
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                tot += cur_b - cur_a
            cur_a, cur_b = a, b
        elif b > cur_b:
            cur_b = b
    if cur_b is not None:
        tot += cur_b - cur_a
    return tot


def ledger_horizon(pool) -> float:
    """Time before which every step of ``pool`` has been logged: the earliest start of a segment still in
    flight, or the pool's clock when none is."""
    t = pool.now
    for rep in pool.replicas:
        if rep.seg and rep.t0 < t:
            t = rep.t0
    return t


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
        if outputs is None:
            self._out = None
        elif isinstance(outputs, Mapping):
            self._out = outputs.__getitem__
        else:
            self._out = np.asarray(getattr(outputs, "output_tokens", outputs)).tolist().__getitem__
        self.n_gpus = n_gpus
        self.on_bill = on_bill
        self._open = _Window(0, t_start)
        self._pending: list[_Window] = []
        self._n_windows = 1
        self._seen = 0
        self._max_t1 = t_start
        self._meter_prev: np.ndarray | None = None
        self.settled: dict[int, float] = {}  # slot -> joules settled so far
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
        """Add one ended log entry (O(m))."""
        own = self._tracker.own(e)
        slots = e.slots
        m = len(slots)
        sh = e.n_steps * self.law.shared(e.replica, m)
        each = sh / m
        t0, t1 = e.t0, e.t1
        self.entries += 1
        self.steps += e.n_steps
        if t1 > self._max_t1:
            self._max_t1 = t1
        w = self._open
        gen = self._tracker.gen
        out = self._out
        if t0 >= w.start:  # the common case: wholly inside the open window
            parts = w.parts
            tot = sh
            for s, o in zip(slots, own):
                parts[s] = parts.get(s, 0.0) + o + each
                tot += o
            w.law_j += tot
            w.logged_j += e.energy_j
            cv = w.cover.get(e.gpu)
            if cv is None:
                w.cover[e.gpu] = [(t0, t1)]
            else:
                cv.append((t0, t1))
            if out is not None:
                for s in slots:
                    if gen.get(s, 0) >= out(s):
                        w.finished.append(s)
            return
        self._consume_spanning(e, own, each, sh)

    def _consume_spanning(self, e, own: list[float], each: float, sh: float) -> None:
        t0, t1 = e.t0, e.t1
        wins = [w for w in self._pending if w.end > t0] + [self._open]
        if not self._pending or t0 < self._pending[0].start:
            first = self._pending[0].start if self._pending else self._open.start
            if t0 < first - 1e-12:
                raise ValueError(
                    f"ledger: a segment starting at t={t0} reached the ledger after the window holding it was "
                    f"settled (settle only up to ledger_horizon(pool))"
                )
        dur = t1 - t0
        tot = sh + sum(own)
        last = None
        for w in wins:
            lo, hi = max(t0, w.start), min(t1, w.end)
            if dur > 0:
                if hi <= lo:
                    continue
                f = (hi - lo) / dur
            else:
                if not (w.start <= t0 < w.end):
                    continue
                f = 1.0
            parts = w.parts
            for s, o in zip(e.slots, own):
                parts[s] = parts.get(s, 0.0) + f * (o + each)
            w.law_j += f * tot
            w.logged_j += f * e.energy_j
            w.cover.setdefault(e.gpu, []).append((lo, hi))
            last = w
        if self._out is not None and last is not None:
            gen = self._tracker.gen
            for s in e.slots:
                if gen.get(s, 0) >= self._out(s):
                    last.finished.append(s)

    # ------------------------------------------------------------------------------------------ windows
    def close_window(self, t_end: float, metered_j, idle_w=0.0) -> None:
        """End the open window at ``t_end``. ``metered_j``: energy the meter read over the window (total, or
        per GPU); ``idle_w``: floor power per GPU (or one value for all) to subtract over uncovered time."""
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
        self.close_window(t_end, meter - prev, np.array([g.floor_w for g in pool.gpus]))

    def settle(self, complete_before: float = INF) -> list[WindowSettlement]:
        """Settle every closed window ending at or before ``complete_before`` (a time before which every step
        has been consumed). Returns the newly settled windows, in order."""
        done: list[WindowSettlement] = []
        while self._pending and self._pending[0].end <= complete_before:
            w = self._pending.pop(0)
            span = w.end - w.start
            idle = 0.0
            for g in range(self.n_gpus):
                cov = _union_length(w.cover.get(g, []), w.start, w.end)
                idle += w.idle_w[g] * max(span - cov, 0.0)
            busy = w.metered - idle
            tot = sum(w.parts.values())
            shares: dict[int, float] = {}
            unattr = 0.0
            if tot > 0:
                f = busy / tot
                st = self.settled
                for s, p in w.parts.items():
                    v = p * f
                    shares[s] = v
                    st[s] = st.get(s, 0.0) + v
            else:
                unattr = busy
                self.unattributed_j += busy
            for s in w.finished:
                b = self.settled.get(s, 0.0)
                self.bills[s] = b
                if self.on_bill is not None:
                    self.on_bill(s, b)
            ws = WindowSettlement(w.index, w.start, w.end, w.metered, idle, busy, w.law_j, w.logged_j, shares, unattr)
            self.windows.append(ws)
            done.append(ws)
        return done

    @property
    def pending_windows(self) -> int:
        return len(self._pending)
