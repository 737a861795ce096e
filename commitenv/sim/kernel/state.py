"""`KernelState`: the arrays `advance` works on, imported from a `Pool`'s state, and the host-side calls that drive
the compiled loop (loading workload rows, growing tables, draining the step log, copies, compaction)."""

from __future__ import annotations

import copy

import numpy as np

from commitenv.sim.kernel.actuate import _poke, _redistribute, _set_clock, _set_share, move, set_active
from commitenv.sim.kernel.arrays import LoopArrays
from commitenv.sim.kernel.clone import KernelClone
from commitenv.sim.kernel.layout import (ASK_HEAP, ASK_LOG, ASK_NOISE, ENGINE_ARRAYS, F_LAST, F_NOW, INF, I_CAPARR,
                                         I_CAPLEFT, I_COLD, I_CURSOR, I_DONE, I_EVENTS, I_HEAP, I_LIVE, I_LOG,
                                         I_MIGRATED, I_N, I_PLAN_REP, N_QF, N_QI, N_SI, Q_ARRIVAL, Q_FINISH, Q_FIRST,
                                         Q_HOFF, Q_LAST, Q_MAXGAP,
                                         Q_MODEL, Q_OUT, Q_OVERHEAD, Q_PROMPT, Q_REPLICA, REQUEST_ARRAYS,
                                         R_NEND, R_NPOS, R_RUN_N, R_STATE, R_WLEN, S_CELL0, S_DISPATCH, S_NOISE,
                                         S_WAKE)
from commitenv.sim.kernel.host import CURRENT
from commitenv.sim.kernel.loop import _compact_core, _noise_low, advance, settle
from commitenv.sim.kernel.policies import KernelPolicies
from commitenv.sim.kernel.prefix_state import KernelPrefix
from commitenv.sim.kernel.reads import KernelReads
from commitenv.sim.kernel.rows import _Rows, _clock_coefficients
from commitenv.sim.migration import MIGRATE_MODES
from commitenv.sim.noise import NoiseSource
from commitenv.sim.states import ACTIVE, DRAINING


class KernelState(KernelPolicies, KernelReads, KernelPrefix, KernelClone):
    """The arrays `advance` works on: a pool's replicas, GPUs, live requests, segments in flight and pending events,
    built from its layout (`commitenv.sim.kernel.fresh`) or copied (`KernelClone`), and its workload's rows as the clock
    nears them.

    Requests are indexed the head first (the requests live when the state was made or at the last compaction, by slot,
    so index order is arrival order), then the workload's rows loaded: index ``n_live + row - row0``; `slots` maps
    indices back to the pool's request slots. Rows are loaded ``LOOKAHEAD_S`` ahead; with ``compact`` the finished
    requests are dropped when room is needed and on `copy`, so a state holds about the live requests and an hour of
    rows."""

    LOOKAHEAD_S = 3600.0  # workload rows are loaded this far ahead of the engine clock
    COPY_LOOKAHEAD_S = 300.0  # ... and in a copy (a fork runs short stretches; it keeps only these rows, and loads on)

    @staticmethod
    def _floor_table(power: list[float], profiles: list) -> np.ndarray:
        """Each GPU's idle floor (active, draining, standby) at each clock of the profile that sets it (``profiles``),
        times its power factor (``power``), then the same without the factor (``[g, clock, :3]``, ``[3:]``)."""
        return np.array([[[lvl.active_idle_w * f, lvl.draining_idle_w * f, p.standby_w * f, lvl.active_idle_w,
                           lvl.draining_idle_w, p.standby_w] for lvl in p.clocks] for f, p in zip(power, profiles)])

    def _sources(self, pool) -> None:
        """The variation ``pool``'s segments run under: the truth's factor tables (grown as the clock nears them), the
        legacy noise (each replica's stream of draws, taken over from the source) or constant factors (no noise, or
        a what-if copy's nominal model) in one endless cell."""
        from commitenv.sim.truth import NominalModel

        self._truth = pool.truth
        self.noise = pool.noise if isinstance(pool.noise, NoiseSource) else None
        if self.noise is not None:
            self.cell = INF
            self.sched[S_NOISE] = 1
            self._set_draws([self.noise.take(x) for x in range(self.R)])
        elif pool.truth is None:
            self.cell = INF
            fe = pool.noise.energy_factor if isinstance(pool.noise, NominalModel) else 1.0
            self.ftab, self.fetab = np.ones((self.G, 1)), np.full((self.G, 1), fe)
        else:
            self.cell = float(pool.truth._cell)
            self.ftab = self.fetab = np.zeros((self.G, 0))

    def _counters(self, pool) -> None:
        """The scalars (``si``, ``sf``) from ``pool``'s clock, counters and migration link; no request loaded."""
        self.si = np.zeros(N_SI, np.int64)
        self.si[I_PLAN_REP] = -1
        self.si[I_LIVE], self.si[I_EVENTS] = pool.live, pool.events
        self.si[I_CAPLEFT], self.si[I_CAPARR] = pool.captured_left, pool._capture_arrivals
        self.si[I_COLD], self.si[I_MIGRATED] = pool.cold_starts, pool.migrated
        mig = pool.opt.migration
        self.sf = np.array([pool.now, pool.now, pool.migration_bytes, pool.migration_j, mig.setup_s, mig.link_gbs,
                            mig.j_per_gb])

    def _head(self, pool, live: list) -> dict[int, int]:
        """The request arrays holding ``live`` (`Req` records, by slot) as the head, at indices 0.., with room for as
        many more; returns the index of each (by object id)."""
        L = len(live)
        self.n_live = L  # the head: requests live at the import (or the last compaction), by slot
        self.live_slots = np.array([r.slot for r in live], np.int64)
        self.head_deadline = np.array([r.deadline for r in live], np.float64)
        cap = L + 64
        self.qi = np.zeros((cap, N_QI), np.int64)
        self.qf = np.zeros((cap, N_QF))
        self.qc = np.zeros(cap, np.uint8)  # captured (a what-if run reports its finish)
        self.rejected = np.zeros(cap, np.bool_)
        self.wq = np.full(cap, -1, np.int64)  # next request in its waiting queue
        self.done_out = np.zeros(cap, np.int64)
        oh = pool.overhead_s
        index = {}
        for k, r in enumerate(live):
            index[id(r)] = k
            self.qi[k, :Q_HOFF] = (r.prompt, r.out, r.computed, r.generated, r.blocks, r.started, r.preemptions,
                                   r.replica, r.model)
            self.qf[k] = (r.arrival, r.first_t, np.nan,
                          oh[r.slot] if oh is not None and r.slot < pool._n_results else 0.0, r.last_t, r.max_gap)
            self.qc[k] = r.captured
        return index

    @property
    def unused(self) -> bool:
        """Whether no request was ever loaded or live here (a pool's state before its workload is attached)."""
        return self.n_live == 0 and self.row_end == 0 and int(self.si[I_N]) == 0 and len(self.src.arrival) == 0

    def attach_workload(self, pool) -> None:
        """`Pool.attach` on an `unused` state: ``pool``'s workload rows from its cursor on (loaded as the clock nears
        them), their serving overheads, and the replicas' prefix caches with the rows' hash blocks when it has them;
        the clock at ``pool.now``."""
        if not self.unused:
            raise RuntimeError("kernel: a workload attached to a state that has held requests")
        self.src = _Rows.of(pool)
        self.slot_base = pool._slot_base
        self.row0 = self.row_end = pool._cursor
        self._stopped = False
        self._new_prefix_caches(pool, pool.opt.prefix_block_tokens if pool._hashes is not None else None)
        self.sf[F_NOW] = self.sf[F_LAST] = pool.now
        self._ensure(pool.now)
        self._load(pool.now)

    def extend_rows(self, pool) -> None:
        """`Pool.extend`: the pool's workload rows, now more of them (the same rows first), loaded as the clock nears
        them."""
        if self._stopped or self.slot_base != 0:
            raise RuntimeError("kernel: rows added to a state whose arrivals were stopped, or to a copy")
        self.src = _Rows.of(pool)

    def _load(self, t: float) -> None:
        """Load the workload rows arriving at or before ``t`` (and those of ``lookahead_s`` after, so that loads are
        rare)."""
        src = self.src
        n = len(src.arrival)
        if self._stopped or self.row_end >= n:
            return
        hi = n if t == INF else int(np.searchsorted(src.arrival, t, side="right"))
        if hi <= self.row_end:
            return
        if t < INF:
            hi = max(hi, int(np.searchsorted(src.arrival, t + self.lookahead_s, side="right")))
        if self.n_live + hi - self.row0 > self.qi.shape[0]:
            self._make_room(hi)
        lo, L = self.row_end, self.n_live
        a, b = L + lo - self.row0, L + hi - self.row0
        self.qi[a:b] = 0
        self.qi[a:b, Q_PROMPT] = src.prompt[lo:hi]
        self.qi[a:b, Q_OUT] = src.out[lo:hi]
        self.qi[a:b, Q_REPLICA] = -1
        self.qi[a:b, Q_MODEL] = src.model[lo:hi]
        self.qf[a:b, Q_ARRIVAL] = src.arrival[lo:hi]
        self.qf[a:b, Q_FIRST] = self.qf[a:b, Q_LAST] = -1.0
        self.qf[a:b, Q_FINISH] = np.nan
        self.qf[a:b, Q_MAXGAP] = 0.0
        self.qf[a:b, Q_OVERHEAD] = 0.0 if src.overhead is None else src.overhead[lo:hi]
        self.qc[a:b] = 0
        self.rejected[a:b] = src.rejected[lo:hi]
        self.wq[a:b] = -1
        self._prefix_rows(lo, hi, a, b)
        self.row_end = hi
        self.si[I_N] = b

    def _make_room(self, hi: int) -> None:
        """Room for the rows up to ``hi``: drop the finished requests when they are many (`_compact`), else grow
        (doubling)."""
        droppable = int(self.si[I_CURSOR]) - int(self.si[I_LIVE])  # arrived and gone (finished or rejected)
        if self.compact and self.taken == self.si[I_DONE] and droppable >= (self.n_live + hi - self.row0) // 2:
            self._compact()
        need = self.n_live + hi - self.row0
        cap = self.qi.shape[0]
        if need <= cap:
            return
        new = max(2 * cap, need)
        self.qi = np.concatenate([self.qi, np.zeros((new - cap, N_QI), np.int64)])
        self.qf = np.concatenate([self.qf, np.zeros((new - cap, N_QF))])
        self.qc = np.concatenate([self.qc, np.zeros(new - cap, np.uint8)])
        self.rejected = np.concatenate([self.rejected, np.zeros(new - cap, np.bool_)])
        self.wq = np.concatenate([self.wq, np.full(new - cap, -1, np.int64)])
        self.done_out = np.concatenate([self.done_out, np.zeros(new - cap, np.int64)])
        self.plan, self.on_run = np.zeros(new, np.int64), np.zeros(new, np.int64)

    def _compact(self, copy_all: bool = False, ahead_s: float | None = None) -> None:
        """Keep only the live requests (the new head) and the rows loaded but not arrived (with ``ahead_s``, those
        arriving within that many seconds; the rest are loaded again when needed): the finished and rejected ones
        leave (their results were taken). With ``copy_all`` every state array is new afterwards (a copy shares
        nothing it writes with the original)."""
        if self.taken != self.si[I_DONE] or self.si[I_LOG]:
            raise RuntimeError("kernel: compaction before the finished requests' results (or step log) were taken")
        if copy_all:  # (first: the compaction writes into these)
            for name in ENGINE_ARRAYS:
                setattr(self, name, getattr(self, name).copy())
        cur, L = int(self.si[I_CURSOR]), self.n_live
        if ahead_s is not None and not self._stopped:
            row_cur = self.row0 + cur - L
            hi = row_cur + int(np.searchsorted(self.src.arrival[row_cur:self.row_end], self.sf[F_NOW] + ahead_s,
                                               side="right"))
            if hi < self.row_end:
                self.row_end = hi
                self.si[I_N] = cur + hi - row_cur
        self.done0 += int(self.si[I_DONE])
        (self.qi, self.qf, self.qc, self.rejected, self.wq, self.head_deadline,
         self.live_slots) = _compact_core(self.ri, self.wq, self.run, self.bq, self.qi, self.qf, self.qc,
                                          self.rejected, self.si, self.hk, self.hs, self.hi, self.head_deadline,
                                          self.live_slots, self.src.deadline, self.row0, L, self.slot_base)
        self.done_out = np.zeros(self.qi.shape[0], np.int64)
        self.plan, self.on_run = np.zeros(self.qi.shape[0], np.int64), np.zeros(self.qi.shape[0], np.int64)
        self.row0 += cur - L
        self.n_live = len(self.live_slots)
        self.taken = 0

    def _ensure(self, t: float) -> None:
        """Truth factor tables covering every segment that starts from the engine clock to ``t`` (generated as the
        pool would, in `TruthSource`'s blocks; grown by at least an hour at a time, the cells before the clock left
        out)."""
        if self._truth is None:
            return
        cell = self.cell
        need = int(t // cell) + 2
        c0, have = int(self.sched[S_CELL0]), self.ftab.shape[1]
        if need <= c0 + have:
            return
        need = max(need, c0 + have + int(3600 // cell))
        c0 = max(0, int((self.sf[F_NOW] - 1.0) // cell))  # (1 s back: a change may be applied just before the clock)
        ft, fe = self._truth.factor_tables(need)
        # (contiguous copies: a view of the truth's growing tables is C-contiguous or not depending on its capacity,
        # and numba compiles `advance` again for each memory layout it meets)
        self.ftab, self.fetab = np.ascontiguousarray(ft[:, c0:need]), np.ascontiguousarray(fe[:, c0:need])
        self.sched = self.sched.copy()  # (copies share it until one of them moves its tables)
        self.sched[S_CELL0] = c0

    def _set_draws(self, draws: list[np.ndarray]) -> None:
        """Tables of each replica's unconsumed legacy noise draws (``draws[x]``: rows of (time, energy) factors in
        order), padded to one width; new arrays, so that copies sharing the old tables keep them."""
        w = max([1] + [len(d) for d in draws])
        self.ftab, self.fetab = np.full((self.R, w), np.nan), np.full((self.R, w), np.nan)
        for x, d in enumerate(draws):
            self.ftab[x, : len(d)], self.fetab[x, : len(d)] = d[:, 0], d[:, 1]
        self.ri[:, R_NPOS] = 0
        self.ri[:, R_NEND] = [len(d) for d in draws]

    def _draws(self, x: int) -> np.ndarray:
        """Replica ``x``'s unconsumed legacy noise draws, in order (rows of (time, energy) factors)."""
        a, b = self.ri[x, R_NPOS], self.ri[x, R_NEND]
        return np.column_stack((self.ftab[x, a:b], self.fetab[x, a:b]))

    def _refill(self) -> None:
        """Under the legacy noise, a draw left for every replica: an exhausted stream gets its source's next block
        (the sequence a step-by-step draw would take)."""
        if self.noise is not None and _noise_low(self.ri):
            draws = [self._draws(x) for x in range(self.R)]
            self._set_draws([d if len(d) else self.noise.block(x) for x, d in enumerate(draws)])

    def _room(self, k: int) -> None:
        """Grow the event heap (doubling) until ``k`` more entries fit."""
        size = self.ht.shape[0]
        if self.si[I_HEAP] + k <= size:
            return
        new = max(2 * size, int(self.si[I_HEAP]) + k)
        self.ht = np.concatenate([self.ht, np.zeros(new - size)])
        self.hk, self.hs, self.hi, self.hv = (np.concatenate([a, np.zeros(new - size, np.int64)])
                                              for a in (self.hk, self.hs, self.hi, self.hv))

    def _advance(self, t_end: float, stop_captured: bool = False, pool=None) -> None:
        CURRENT.append((self, pool))  # (a local policy's plans are asked for from inside the loop)
        try:
            while code := self._advance_once(t_end, stop_captured, pool):
                if code == ASK_HEAP:
                    self._room(self.ht.shape[0] + 1)  # (doubles it)
                elif code == ASK_NOISE:
                    self._refill()
                elif code == ASK_LOG:
                    self._drain_log()
                else:
                    raise RuntimeError(f"kernel: unknown return code {code}")
        finally:
            CURRENT.pop()
        self._drain_log()

    def _advance_once(self, t_end: float, stop_captured: bool, pool=None) -> int:
        return advance(t_end, stop_captured, LoopArrays(
            self.si, self.sf, self.ri, self.rf, self.qi, self.qf, self.qc, self.rejected, self.wq, self.run, self.bq,
            self.bk, self.pend, self.ht, self.hk, self.hs, self.hi, self.hv, self.coc, self.gi, self.gf, self.gh,
            self.floor_tab, self.ftab, self.fetab, float(self.cell), self.sched, self.e_dyn, self.done_out, self.lgi,
            self.lgf, self.lgm, self.plan, self.on_run, *self._task_args(pool), self.pfx))

    def advance(self, t_end: float, stop_captured: bool = False, pool=None) -> None:
        """`Pool.run_until(t_end, stop_when_captured_done=stop_captured)`; to the end of all work when ``t_end`` is
        infinite (then, as the pool, the clock stops at the last event). ``pool``: the `Pool` whose dispatch and
        local policies answer the loop's hand-backs (needed when it has any)."""
        if t_end < INF or self._truth is None:
            self._ensure(t_end)
            self._load(t_end)
            self._advance(t_end, stop_captured, pool)
            return
        if stop_captured:
            raise ValueError("kernel: stop_captured needs a finite end under a truth model")
        now0 = self.sf[F_NOW]
        self.sf[F_LAST] = now0
        while self.si[I_HEAP] or self.si[I_CURSOR] < self.si[I_N] or not (self._stopped
                                                                         or self.row_end >= len(self.src.arrival)):
            self._ensure(self.sf[F_NOW] + 3600.0)
            t = (self.sched[S_CELL0] + self.ftab.shape[1] - 2) * self.cell
            self._load(t)
            self._advance(t, False, pool)
        self.sf[F_NOW] = max(now0, self.sf[F_LAST])

    def set_active(self, t: float, count: int, model: int = 0, pool=None) -> None:
        """`Pool.set_active` for ``model`` (``pool``: as for `advance`)."""
        if not 0 <= model < len(self.n_per_model):
            raise ValueError(f"model index {model} outside 0..{len(self.n_per_model) - 1}")
        n = int(self.n_per_model[model])
        low = 0 if self.sched[S_WAKE] else 1
        if not low <= count <= n:
            raise ValueError(f"active replicas: expected {low}..{n} for model {model}, got {count}")
        if t < self.sf[F_NOW] - 1e-9:
            raise ValueError(f"set_active at t={t} precedes the engine clock {self.sf[F_NOW]}")
        self._room(3 * self.R + 8)
        self._refill()
        if not set_active(t, model, count, self.ri, self.rf, self.gi,
                          self.gf, self.gh, self.floor_tab, self.si, self.ht, self.hk, self.hs, self.hi, self.hv):
            return
        if self.sched[S_DISPATCH] and pool is None:
            raise RuntimeError("kernel: a dispatch policy's re-routing needs the pool (set_active(..., pool=...))")
        CURRENT.append((self, pool))
        try:
            _redistribute(t, model, self.ri, self.rf, self.qi, self.wq, self.si, self.pend, self.ht, self.hk, self.hs,
                          self.hi, self.hv, self.gi, self.gf, self.gh, self.floor_tab, self.sched, self.pfx)
        finally:
            CURRENT.pop()
        self._flush_all(pool, t)

    def move(self, t: float, replica: int, gpu: int, migrate: str, pool=None) -> bool:
        """`Placement._move` of ``replica`` to ``gpu`` (checked by `Pool.move`) with migration mode ``migrate``;
        whether it counts as a move. ``pool``: as for `advance`."""
        if t < self.sf[F_NOW] - 1e-9:
            raise ValueError(f"move at t={t} precedes the engine clock {self.sf[F_NOW]}")
        self._room(5 * self.R + 8 + int(self.si[I_LIVE]))
        self._refill()
        CURRENT.append((self, pool))
        try:
            return bool(move(t, replica, gpu, MIGRATE_MODES.index(migrate), self.ri, self.rf, self.qi, self.qf,
                             self.wq, self.run, self.bq, self.bk, self.coc, self.gi, self.gf, self.gh, self.floor_tab,
                             self.ftab, self.fetab, self.cell, self.sched, self.sf, self.si, self.e_dyn, self.pend,
                             self.ht, self.hk, self.hs, self.hi, self.hv, self.plan, self.on_run,
                             *self._task_args(pool), self.pfx))
        finally:
            CURRENT.pop()

    def resume(self, t: float, pool=None) -> None:
        """`Pool.resume` at ``t``: every active or draining replica that holds work and runs no segment starts."""
        ri = self.ri
        self._room(self.R)
        for x in range(self.R):
            if ri[x, R_RUN_N] + ri[x, R_WLEN] and ri[x, R_STATE] in (ACTIVE, DRAINING):
                _poke(t, x, ri, self.rf, self.si, self.pend, self.ht, self.hk, self.hs, self.hi, self.hv)
        self._flush_all(pool, t)

    def set_clock(self, t: float, mhz: int, gpus: list[int] | None = None) -> None:
        """`Pool.set_clock` on ``gpus`` (every GPU by default): clock ``mhz`` applies after each GPU's clock-change
        latency."""
        if t < self.sf[F_NOW] - 1e-9:
            raise ValueError(f"set_clock at t={t} precedes the engine clock {self.sf[F_NOW]}")
        if mhz not in self.clock_mhz:
            raise ValueError(f"clock {mhz} MHz: expected one of {list(self.clock_mhz)}")
        sel = np.arange(self.G, dtype=np.int64) if gpus is None else np.asarray(gpus, np.int64).reshape(-1)
        if len(sel) and not (0 <= sel.min() and sel.max() < self.G):
            raise ValueError(f"set_clock: GPU indices {sel.tolist()} outside 0..{self.G - 1}")
        self._room(len(sel))
        _set_clock(t, self.clock_mhz.index(mhz), sel, self.gi, self.gf, self.si, self.ht, self.hk, self.hs, self.hi,
                   self.hv)

    def set_share(self, t: float, replica: int, share: float, profile) -> None:
        """`Pool.set_share` (checked there): replica ``replica`` steps at SM share ``share`` of its ``profile`` from its
        next step on."""
        self._room(1)
        _set_share(t, replica, float(share), _clock_coefficients(profile, share), self.ri, self.rf, self.coc, self.si,
                   self.ht, self.hk, self.hs, self.hi, self.hv)

    def copy(self, *, log: bool = True) -> "KernelState":
        """An independent copy (the state arrays copied; without the finished requests when their results were taken,
        and then with only ``COPY_LOOKAHEAD_S`` of rows ahead; tables, workload rows, profile and truth source shared,
        as they only grow or are read). Without ``log`` the copy writes no step log (a fork keeps none)."""
        c = copy.copy(self)
        if self.noise is not None:
            c.noise = self.noise.copy()
        if self.compact and self.taken == self.si[I_DONE]:
            c.lookahead_s = min(self.lookahead_s, self.COPY_LOOKAHEAD_S)
            c._compact(copy_all=True, ahead_s=c.lookahead_s)
        else:
            for name in REQUEST_ARRAYS + ENGINE_ARRAYS:
                setattr(c, name, getattr(self, name).copy())
        if log:
            c.lgi, c.lgf, c.lgm, c._log_out = self.lgi.copy(), self.lgf.copy(), self.lgm.copy(), list(self._log_out)
        else:
            c.drop_log()
        self._copy_prefix(c)
        return c

    @property
    def nbytes(self) -> int:
        """Bytes of the state arrays (what `copy` duplicates at most)."""
        return sum(getattr(self, name).nbytes for name in REQUEST_ARRAYS + ENGINE_ARRAYS)

    def stop_arrivals(self) -> None:
        """No request arrives after the ones already in (`Pool.stop_arrivals`)."""
        self.si[I_N] = self.si[I_CURSOR]
        self._stopped = True

    def settle(self, t: float) -> None:
        self._room(self.R)  # (room for R step log entries: drained after each call)
        settle(t, self.ri, self.rf, self.qi, self.qf, self.bk, self.bq, self.e_dyn, self.sched, self.si, self.ht,
               self.hk, self.hs, self.hi, self.hv, self.lgi, self.lgf, self.lgm, self.pfx)
        self._drain_log()
