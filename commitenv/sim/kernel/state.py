"""`KernelState`: the arrays `advance` works on, imported from a `Pool`'s state, and the host-side calls that drive
the compiled loop (loading workload rows, growing tables, draining the step log, copies, compaction)."""

from __future__ import annotations

import copy
import os

import numpy as np

from commitenv.sim.kernel.actuate import _poke, _redistribute, _set_clock, _set_share, move, set_active
from commitenv.sim.kernel.clone import KernelClone
from commitenv.sim.kernel.export import KernelExport
from commitenv.sim.kernel.layout import (ASK_HEAP, ASK_LOG, ASK_NOISE, ENGINE_ARRAYS, F_LAST, F_NOW, GF_CLOCK_LAT,
                                         GF_E_FLOOR, GF_FLOOR_W, GF_PENDING_T, GF_POWER, GF_T_FLOOR, G_CLOCK, G_NHOST,
                                         G_PENDING, G_VER, INF, I_CAPARR, I_CAPLEFT, I_COLD, I_CURSOR, I_DONE, I_EVENTS,
                                         I_HEAP, I_LIVE, I_LOG, I_MIGRATED, I_N, I_NMIG, I_PLAN_REP, I_SEQ, N_QI, N_RF,
                                         N_RI, N_SI, Q_ARRIVAL, Q_FINISH, Q_FIRST, Q_HOFF, Q_MODEL, Q_OUT, Q_OVERHEAD,
                                         Q_PROMPT, Q_REPLICA, REQUEST_ARRAYS, R_AFTER, R_BATCH_N, R_BS, R_BT0, R_BUDGET,
                                         R_CAP, R_D, R_DEST, R_E0, R_ENERGY, R_F, R_FE, R_FLOOR_ACC, R_FLOOR_T,
                                         R_FLOOR_W, R_FREE, R_FT, R_GPU, R_K, R_KVB, R_LOAD_S, R_LOAD_T, R_LOAD_W,
                                         R_LOCAL, R_LOGGED, R_LREADY, R_LWAIT, R_MAXSEQ, R_MEM, R_MIGRATE, R_MODEL,
                                         R_NEND, R_NPOS, R_RESERVE, R_RUN_N, R_SCLK, R_SEG, R_SHARE, R_SSHARE, R_STATE,
                                         R_T0, R_T1, R_UNF, R_VER, R_WHEAD, R_WLEN, R_WTAIL, S_CELL0, S_DISPATCH, S_LOG,
                                         S_NOISE)
from commitenv.sim.kernel.heap import _upush_back
from commitenv.sim.kernel.host import CURRENT
from commitenv.sim.kernel.loop import _compact_core, _noise_low, advance, settle
from commitenv.sim.kernel.policies import KernelPolicies
from commitenv.sim.kernel.prefix_state import KernelPrefix
from commitenv.sim.kernel.reads import KernelReads
from commitenv.sim.kernel.rows import _Rows, _clock_coefficients
from commitenv.sim.migration import MIGRATE_MODES
from commitenv.sim.noise import NoiseSource
from commitenv.sim.prefix_cache import PrefixCache
from commitenv.sim.states import ACTIVE, DRAINING, EV_LAND, MOVING, SEG_NONE, SEG_RUN, SEG_STEP

# pools run here whenever covered; COMMITENV_KERNEL=0 (or ENABLED = False) keeps every pool on the Python loop
# (`commitenv.sim.kernel.ENABLED` reads and sets this flag)
ENABLED = os.environ.get("COMMITENV_KERNEL", "1") != "0"
# whether a pool with a local policy enters the kernel by itself (each planned step called back to the host; False
# keeps such pools on the Python loop, for comparison: benchmarks/bench_festina.py)
LOCAL_ON_KERNEL = True


class KernelState(KernelExport, KernelPolicies, KernelReads, KernelPrefix, KernelClone):
    """The arrays `advance` works on, imported from a `Pool`'s state: its live requests, segments in flight and pending
    events when it has served already (a what-if copy, say), and its workload's rows as the clock nears them.

    Requests are indexed the head first (the requests live at the import or the last compaction, by slot, so index
    order is arrival order), then the workload's rows loaded: index ``n_live + row - row0``; `slots` maps indices
    back to the pool's request slots. Rows are loaded ``LOOKAHEAD_S`` ahead; with ``compact`` the finished requests
    are dropped when room is needed and on `copy`, so a state holds about the live requests and an hour of rows."""

    LOOKAHEAD_S = 3600.0  # workload rows are loaded this far ahead of the engine clock
    COPY_LOOKAHEAD_S = 300.0  # ... and in a copy (a fork runs short stretches; it keeps only these rows, and loads on)

    @staticmethod
    def covers(pool) -> bool:
        """Whether the kernel can run ``pool`` from its current state: any number of models and instances per GPU
        with any SM shares, instances moving and loading, requests migrating or
        unrouted, the truth model, the legacy per-segment noise, a what-if copy's nominal model or no noise, any
        dispatch and local policies (answered on the host: `KernelPolicies`), prefix caches (on every replica or
        none)."""
        from commitenv.sim.truth import NominalModel

        reps, gpus = pool._replicas, pool._gpus
        noise_ok = pool.noise is pool.truth or (pool.truth is None
                                                and isinstance(pool.noise, (NominalModel, NoiseSource)))
        return (noise_ok and not pool._pending
                and (pool.overhead_s is None or (pool.captured_left == 0 and not pool._capture_arrivals))
                and all(g.index == x for x, g in enumerate(gpus))
                and all(r.index == x and r in r.gpu.replicas and r.gpu is gpus[r.gpu.index] for x, r in enumerate(reps))
                and sum(len(g.replicas) for g in gpus) == len(reps)
                and all(not r.pending_start for r in reps)
                and len({r.pcache is None for r in reps}) <= 1)

    @classmethod
    def covering(cls, pool) -> "KernelState | None":
        """The kernel state of ``pool`` if the kernel is on and covers it (with compaction: the pool takes results); a
        pool with a local policy only with `LOCAL_ON_KERNEL`."""
        if not ENABLED or not cls.covers(pool):
            return None
        if not LOCAL_ON_KERNEL and any(p is not None for p in pool.local_policies):
            return None
        return cls(pool, compact=True)

    def __init__(self, pool, heap_size: int = 0, *, compact: bool = False) -> None:
        """``compact``: finished requests may be dropped once `take_finished` handed them out (a pool records their
        results); without it every request stays, at its index, for the caller to read."""
        if not self.covers(pool):
            raise ValueError("kernel: pool outside the covered subset (truth factors, legacy, nominal or no noise, "
                             "no replica pending a start)")

        reps, gpus = pool._replicas, pool._gpus
        live = sorted([r for rep in reps for q in (rep.running, rep.waiting) for r in q] + list(pool.unrouted)
                      + [r for _, r in pool.transit.values()], key=lambda r: r.slot)
        L = len(live)
        self.R = R = len(reps)
        self.G = G = len(gpus)
        max_seqs = max(rep.max_seqs for rep in reps)
        self.src = _Rows.of(pool)
        self.slot_base = pool._slot_base
        # workload rows [row0, row_end) follow the head, at index n_live + row - row0
        self.row0 = self.row_end = pool._cursor
        self._stopped = False  # `stop_arrivals`: no row loaded or arriving any more
        self.lookahead_s = self.LOOKAHEAD_S
        self.compact = compact
        self.taken = 0  # completions handed out by `take_finished`
        self.done0 = pool.completed  # completions before the import or the last compaction (``I_DONE``: the rest)
        index = self._head(pool, live)
        self._import_prefix(pool, live)
        prof = pool.profiles[0]
        self.profiles = pool.profiles
        self.clock_mhz = tuple(prof.clock_mhz)  # (every profile's: `Pool` refuses others)
        self.coc = np.stack([_clock_coefficients(rep.profile, rep.share) for rep in reps])
        self.sched = np.array([max_seqs, 0, 0, int(pool.log is not None or pool.on_step is not None),
                               int(pool.opt.closed_form), int(pool.dispatch is not None)], np.int64)
        self.run = np.zeros((R, max_seqs + 1), np.int64)
        self.bq = np.zeros((R, max_seqs + 1), np.int64)
        self.bk = np.zeros((R, max_seqs + 1), np.int64)
        self.ri = np.zeros((R, N_RI), np.int64)
        self.rf = np.zeros((R, N_RF))
        ri, rf = self.ri, self.rf  # (column by column: a what-if copy is imported for every candidate)
        for col, name in ((R_MODEL, "model"), (R_BUDGET, "budget"), (R_MAXSEQ, "max_seqs"), (R_BS, "bs"),
                          (R_RESERVE, "reserve_full"), (R_UNF, "unf"), (R_FREE, "free_blocks"), (R_STATE, "state"),
                          (R_VER, "version"), (R_SEG, "seg"), (R_K, "run_k")):
            ri[:, col] = [getattr(rep, name) for rep in reps]
        ri[:, R_GPU] = [rep.gpu.index for rep in reps]
        ri[:, R_DEST] = [-1 if rep.dest is None else rep.dest.index for rep in reps]
        ri[:, R_MIGRATE] = [MIGRATE_MODES.index(rep.migrate) for rep in reps]
        for col, name in ((R_AFTER, "after_load"), (R_LREADY, "load_ready"), (R_LWAIT, "load_wait"),
                          (R_CAP, "cap_blocks")):
            ri[:, col] = [getattr(rep, name) for rep in reps]
        rf[:, R_MEM] = [rep.mem_share for rep in reps]
        rf[:, R_LOAD_T] = [rep.load_t for rep in reps]
        lat = [rep.profile.latencies for rep in reps]
        rf[:, R_LOAD_S] = [np.nan if la.load_s is None else la.load_s for la in lat]
        rf[:, R_LOAD_W] = [np.nan if la.load_w is None else la.load_w for la in lat]
        rf[:, R_KVB] = [rep.profile.model.kv_bytes_per_token for rep in reps]
        ri[:, R_LOCAL] = [p is not None for p in pool.local_policies]
        rf[:, R_SHARE] = [rep.share for rep in reps]
        rf[:, R_SSHARE] = [rep.share if rep.seg_log is None else rep.seg_log.share for rep in reps]
        self.n_per_model = np.bincount(ri[:, R_MODEL], minlength=pool.n_models)
        self.cap_blocks = np.array([rep.cap_blocks for rep in reps], np.int64)  # (what a dispatch policy sees)
        # a local plan the host wrote (`KernelPolicies._plan`; as long as the request arrays: a plan lists at most
        # every live request, and the arrays are never replaced while the loop runs)
        self.plan = np.zeros(L + 64, np.int64)
        self.on_run = np.zeros(L + 64, np.int64)
        ri[:, R_SCLK] = [rep.gpu.clock_idx if rep.seg_log is None else prof.clock_index(rep.seg_log.clock_mhz) for rep in reps]
        ri[:, R_LOGGED] = [rep.seg != SEG_NONE and rep.seg_log is not None for rep in reps]
        for col, name in ((R_T0, "t0"), (R_T1, "t1"), (R_BT0, "T0"), (R_D, "D"), (R_E0, "E0"), (R_F, "F"),
                          (R_FT, "ft"), (R_FE, "fe"), (R_ENERGY, "seg_energy"), (R_FLOOR_W, "seg_floor_w"),
                          (R_FLOOR_T, "seg_floor_t"), (R_FLOOR_ACC, "seg_floor_acc")):
            rf[:, col] = [getattr(rep, name) for rep in reps]
        for x, rep in enumerate(reps):
            if rep.running:
                if len(rep.running) > rep.max_seqs:
                    raise ValueError(f"kernel: replica {x} runs {len(rep.running)} requests, above max_seqs "
                                     f"{rep.max_seqs}")
                ri[x, R_RUN_N] = len(rep.running)
                self.run[x, : len(rep.running)] = [index[id(r)] for r in rep.running]
            if rep.waiting:  # (the linked list of `_wpush_back`, written at once)
                w = [index[id(r)] for r in rep.waiting]
                self.wq[w[:-1]] = w[1:]
                ri[x, R_WHEAD], ri[x, R_WTAIL], ri[x, R_WLEN] = w[0], w[-1], len(w)
            if rep.seg == SEG_STEP:
                ri[x, R_BATCH_N] = len(rep.batch)
                self.bq[x, : len(rep.batch)] = [index[id(r)] for r, _ in rep.batch]
                self.bk[x, : len(rep.batch)] = [k for _, k in rep.batch]
            elif rep.seg == SEG_RUN:
                ri[x, R_BATCH_N] = len(rep.run_reqs)
                self.bq[x, : len(rep.run_reqs)] = [index[id(r)] for r in rep.run_reqs]
        self.gi = np.zeros((G, 4), np.int64)
        self.gf = np.zeros((G, 6))
        self.gh = np.full((G, R), -1, np.int64)  # replicas hosted, in order (instances move: room for every one)
        for g, gpu in enumerate(gpus):
            self.gh[g, : len(gpu.replicas)] = [r.index for r in gpu.replicas]
        self.gi[:, G_NHOST] = [len(g.replicas) for g in gpus]
        # each GPU's idle floor (active, draining, standby) at each clock, from the profile that sets it, multiplied
        # as `GPU.floor_power` does
        gprof = [g.profile if g.profile is not None else g.replicas[0].profile for g in gpus]
        self.floor_tab = self._floor_table([g.power_factor for g in gpus], gprof)
        self.gf[:, GF_POWER] = [g.power_factor for g in gpus]
        self.gf[:, GF_CLOCK_LAT] = [p.latencies.clock_change_s for p in gprof]
        self.gi[:, G_CLOCK] = [gpu.clock_idx for gpu in gpus]
        self.gi[:, G_PENDING] = [-1 if gpu.pending_clock is None else gpu.pending_clock for gpu in gpus]
        self.gi[:, G_VER] = [gpu.version for gpu in gpus]
        self.gf[:, GF_PENDING_T] = [gpu.pending_t for gpu in gpus]
        self.gf[:, GF_FLOOR_W] = [gpu.floor_w for gpu in gpus]
        self.gf[:, GF_T_FLOOR] = [gpu.t_floor for gpu in gpus]
        self.gf[:, GF_E_FLOOR] = [gpu.e_floor for gpu in gpus]
        self.e_dyn = np.array([gpu.e_dyn for gpu in gpus], dtype=np.float64)
        self._sources(pool)
        self._counters(pool)
        self.si[I_N] = self.si[I_CURSOR] = L
        self.si[I_NMIG] = sum(rep.state == MOVING for rep in reps)
        for r in pool.unrouted:
            _upush_back(self.si, self.wq, index[id(r)])
        self._ensure(pool.now)
        self.pend = np.zeros(R, np.int64)
        heap = pool._heap
        size = max(heap_size, 4 * R + 8, 2 * len(heap)) if heap_size else 8 * R + 64 + 2 * len(heap)
        self.ht = np.zeros(size)
        self.hk, self.hs, self.hi, self.hv = (np.zeros(size, np.int64) for _ in range(4))
        self.si[I_HEAP] = len(heap)
        if heap:  # (heapq's list is a binary heap under the same order: copied as it stands)
            slot_index = {r.slot: k for k, r in enumerate(live)}  # (a landing names its request by slot there)
            heap = [e if e[1] != EV_LAND else (e[0], e[1], e[2], slot_index[e[3]], e[4]) for e in heap]
            cols = list(zip(*heap))
            self.ht[: len(heap)] = cols[0]
            for a, col in zip((self.hk, self.hs, self.hi, self.hv), cols[1:]):
                a[: len(heap)] = col
        self._load(pool.now)
        # the step log (`Pool.log`, `Pool.on_step`): written by the compiled loop, drained into `StepLogEntry`s after
        # every call (`take_log`)
        self._mhz = np.array(self.clock_mhz, np.int64)
        self._log_out: list = []
        self._new_log_arrays(bool(self.sched[S_LOG]))

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
        self.si[I_SEQ] = pool._seq
        self.si[I_LIVE], self.si[I_EVENTS] = pool.live, pool.events
        self.si[I_CAPLEFT], self.si[I_CAPARR] = pool.captured_left, pool._capture_arrivals
        self.si[I_COLD], self.si[I_MIGRATED] = pool.cold_starts, pool.migrated
        mig = pool.opt.migration
        self.sf = np.array([pool.now, pool.now, pool.migration_bytes, pool.migration_j, mig.setup_s, mig.link_gbs,
                            mig.j_per_gb])

    def _head(self, pool, live: list) -> dict[int, int]:
        """The request arrays holding ``live`` (`Req` records, by slot) as the head, at indices 0.., with room for as
        many more; returns the index of each (by object id). Prefix columns: `_import_prefix`."""
        L = len(live)
        self.n_live = L  # the head: requests live at the import (or the last compaction), by slot
        self.live_slots = np.array([r.slot for r in live], np.int64)
        self.head_deadline = np.array([r.deadline for r in live], np.float64)
        cap = L + 64
        self.qi = np.zeros((cap, N_QI), np.int64)
        self.qf = np.zeros((cap, 4))
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
                          oh[r.slot] if oh is not None and r.slot < pool._n_results else 0.0)
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
        caches = [None] * self.R
        if pool._hashes is not None:  # (new caches: every KV block free, as `Pool._attach_prefixes` makes them)
            bt = pool.opt.prefix_block_tokens
            caches = [PrefixCache(bt, int(self.ri[x, R_BS]), int(self.ri[x, R_FREE])) for x in range(self.R)]
        self._import_prefix(pool, [], caches, self.cap_blocks.tolist())
        self.sf[F_NOW] = self.sf[F_LAST] = pool.now
        self._ensure(pool.now)
        self._load(pool.now)

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
        self.qf[a:b, Q_FIRST] = -1.0
        self.qf[a:b, Q_FINISH] = np.nan
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
        self.qf = np.concatenate([self.qf, np.zeros((new - cap, 4))])
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
        (the sequence the Python loop would draw)."""
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
        return advance(t_end, stop_captured, self.si, self.sf, self.ri, self.rf, self.qi, self.qf, self.qc,
                       self.rejected, self.wq, self.run, self.bq, self.bk, self.pend, self.ht, self.hk, self.hs,
                       self.hi, self.hv, self.coc, self.gi, self.gf, self.gh, self.floor_tab, self.ftab, self.fetab,
                       self.cell, self.sched, self.e_dyn, self.done_out, self.lgi, self.lgf, self.lgm, self.plan,
                       self.on_run, *self._task_args(pool), self.pfx)

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
        if not 1 <= count <= n:
            raise ValueError(f"active replicas: expected 1..{n} for model {model}, got {count}")
        if t < self.sf[F_NOW] - 1e-9:
            raise ValueError(f"set_active at t={t} precedes the engine clock {self.sf[F_NOW]}")
        self._room(3 * self.R + 8)
        self._refill()
        if not set_active(t, model, count, self.profiles[model].latencies.activation_s, self.ri, self.rf, self.gi,
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

    def set_local(self, replicas: list[int], on: bool) -> None:
        """Whether a local policy plans the steps of ``replicas`` from their next start on."""
        self.ri[replicas, R_LOCAL] = int(on)

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
        self._room(self.R)
        settle(t, self.ri, self.rf, self.qi, self.bk, self.bq, self.e_dyn, self.sched, self.si, self.ht, self.hk,
               self.hs, self.hi, self.hv, self.lgi, self.lgf, self.lgm, self.pfx)  # (room for R entries: drained after each call)
        self._drain_log()
