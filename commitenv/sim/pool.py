"""The serving pool: GPUs and replicas, the router, lifecycle and clock actuation, and the event loop.

One engine serves three uses (docs/architecture.md): ground truth inside the environment, the what-if
predictor (`commitenv.sim.whatif`, which runs this class on a snapshot copy), and scheduler replay.
The pool only ever holds requests that have arrived: the attached workload is read through a cursor.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections import deque
from itertools import compress
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import TYPE_CHECKING, Iterable

import numpy as np

from commitenv.profiles.schema import Profile
from commitenv.sim import memory
from commitenv.sim.dispatch import ArrivalView, CandidateView, DispatchPolicy, make_dispatch
from commitenv.sim.gpu import GPU
from commitenv.sim.local import LocalPolicy, LocalView, TaskView
from commitenv.sim.lref import reference_latency
from commitenv.sim.migration import MIGRATE_MODES
from commitenv.sim.noise import NoiseSource
from commitenv.sim.prefix_cache import PrefixCache
from commitenv.sim.records import (EngineOptions, InFlightPart, Instance, PoolLayout, SegmentLog, StepLogBatch,  # noqa: F401
                                   StepLogEntry)
from commitenv.sim.replica import Replica
from commitenv.sim.request import Req, live_state
from commitenv.sim.states import (ACTIVE, DRAINING, EV_CLOCK, EV_LAND, EV_LOAD, EV_SEG, EV_WAKE, LOADING, MOVING, SEG_NONE,
                                  SEG_RUN, STANDBY, WAKING)
from commitenv.sim.truth import NominalModel, TruthSource
from commitenv.workload.table import RequestTable

if TYPE_CHECKING:
    from commitenv.sim.kernel import KernelState

REPLAY_SLOT_BASE = 1 << 40  # slot of the i-th replayed (hypothetical) arrival in a what-if copy: base + i
INF = math.inf
_UNFINISHED = attrgetter("unf")  # the router's load measure: running + waiting requests
_SLOT = attrgetter("slot")
_STARTED = attrgetter("started")


@dataclass(frozen=True)
class RequestTerms:
    """What the engine fixes for every request of a workload at attach time: rejected on arrival (prompt over the
    serving model's context limit), the output length it runs to (capped at the context limit), the standalone
    reference latency L_ref, the true deadline a + alpha L_ref, the predicted output length a controller sees and
    the deadline it sees (computed from the predicted length when deadlines are predicted)."""

    rejected: np.ndarray
    out_tokens: np.ndarray
    lref: np.ndarray
    deadline: np.ndarray
    pred_out: np.ndarray
    visible_deadline: np.ndarray


def _capped_lref(profiles: list[Profile], table: RequestTable, model_of: np.ndarray,
                 out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Output lengths capped at each model's context limit, and the requests' reference latencies L_ref."""
    out = np.asarray(out).astype(np.int64)  # a copy
    lref = np.zeros(len(out))
    for m, prof in enumerate(profiles):
        sel = model_of == m
        out[sel] = np.minimum(out[sel], np.maximum(prof.scheduler.context_limit - table.prompt_tokens[sel], 1))
        lref[sel] = reference_latency(prof, table.prompt_tokens[sel], out[sel])
    return out, lref


def request_terms(profiles: list[Profile], opt: "EngineOptions", table: RequestTable,
                  model_of: np.ndarray) -> RequestTerms:
    """The `RequestTerms` of ``table`` served by ``profiles`` (request i by model ``model_of[i]``) under ``opt``
    (SLO scale, length prediction error and bias with its seed, visible deadlines); shared by the simulated pool
    and the hardware backend, so both judge a request alike."""
    n = len(table)
    rejected = np.zeros(n, dtype=bool)
    for m, prof in enumerate(profiles):
        rejected |= (model_of == m) & (table.prompt_tokens >= prof.scheduler.context_limit)
    out, lref = _capped_lref(profiles, table, model_of, table.output_tokens)
    deadline = table.arrival_s + opt.alpha * lref
    s = opt.length_error_sigma
    if opt.oracle_lengths or (s == 0 and opt.length_bias == 0):
        pred_out = out.copy()
    else:
        rng = np.random.default_rng(np.random.SeedSequence([opt.seed, 7919]))
        f = np.exp(s * rng.standard_normal(n) - 0.5 * s * s) * (1.0 + opt.length_bias)
        pred_out = np.maximum(1, np.rint(out * f)).astype(np.int64)
    visible = deadline
    if opt.visible_deadlines == "predicted" and not opt.oracle_lengths:
        # what an operator can state at arrival: the SLO of the predicted length (scoring keeps the true one)
        visible = table.arrival_s + opt.alpha * _capped_lref(profiles, table, model_of, pred_out)[1]
    return RequestTerms(rejected, out, lref, deadline, pred_out, visible)


def _token_loads(rep: Replica) -> tuple[int, int]:
    """(tokens still to compute before the first output token, summed over the replica's requests; summed
    context of its requests past their prefill): what a router may know of a replica's load."""
    pre = dec = 0
    for r in (*rep.running, *rep.waiting):
        left = r.prompt + r.generated - r.computed
        if r.generated >= 1 and left <= 1:
            dec += r.computed + 1
        else:
            pre += left
    return pre, dec


def copy_devices(gpus: list[GPU], replicas: list[Replica], c: "Pool", cr) -> dict[int, Replica]:
    """Copies of ``gpus`` and ``replicas``, linked to each other, installed in ``c``; each replica's queues and
    segment members copied with ``cr`` (None: new empty ones). Returns the map from old replica ids to copies."""
    gmap: dict[int, GPU] = {}
    for g in gpus:
        ng = GPU.__new__(GPU)
        ng.__dict__.update(g.__dict__)
        gmap[id(g)] = ng
    rmap: dict[int, Replica] = {}
    for rep in replicas:
        nr = Replica.__new__(Replica)
        nr.__dict__.update(rep.__dict__)
        nr.gpu = gmap[id(rep.gpu)]
        if cr is None:
            nr.running, nr.waiting, nr.batch, nr.run_reqs = [], deque(), [], []
        else:
            nr.running = [cr(r) for r in rep.running]
            nr.waiting = deque(cr(r) for r in rep.waiting)
            nr.batch = [(cr(r), k) for r, k in rep.batch]
            nr.run_reqs = [cr(r) for r in rep.run_reqs]
        nr.dest = None if rep.dest is None else gmap[id(rep.dest)]
        rmap[id(rep)] = nr
    for g in gpus:
        gmap[id(g)].replicas = [rmap[id(r)] for r in g.replicas]
    c.gpus = [gmap[id(g)] for g in gpus]
    c.replicas = [rmap[id(r)] for r in replicas]
    return rmap


class _PythonLoopState:
    """State only the Python loop keeps: reading it makes a pool the kernel runs hand over to the Python loop."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = "_" + name

    def __get__(self, pool: "Pool | None", owner: type | None = None):
        if pool is None:
            return self
        if pool._ks is not None:
            pool._leave_kernel()
        return pool.__dict__[self.key]

    def __set__(self, pool: "Pool", value) -> None:
        pool.__dict__[self.key] = value


class _StepSink(_PythonLoopState):
    """The step log or hook: a new sink makes a pool the kernel runs hand over to the Python loop (segments started
    from then on are recorded); removing the last one stops the kernel's recording."""

    def __get__(self, pool: "Pool | None", owner: type | None = None):
        return self if pool is None else pool.__dict__[self.key]

    def __set__(self, pool: "Pool", value) -> None:
        ks = pool._ks
        if ks is not None and value is not None:
            pool._leave_kernel()
        pool.__dict__[self.key] = value
        if ks is not None and pool._ks is not None and ks.logging and pool.log is None and pool.on_step is None:
            ks.stop_logging()


class _KernelExcluded(_PythonLoopState):
    """A policy or hook the kernel cannot run: setting one makes a pool the kernel runs hand over to the Python loop."""

    def __get__(self, pool: "Pool | None", owner: type | None = None):
        return self if pool is None else pool.__dict__[self.key]

    def __set__(self, pool: "Pool", value) -> None:
        if value is not None and pool._ks is not None:
            pool._leave_kernel()
        pool.__dict__[self.key] = value


class Pool:
    """A pool of GPUs serving one or more models with vLLM scheduling semantics.

    Once a workload is attached, a pool that `commitenv.sim.kernel` covers (one full-share instance per GPU, one
    model, the default router, no prefix cache or local policy) runs its event loop there; the first use of anything
    the kernel does not hold (replicas, GPUs, the heap, a policy, a new hook, a snapshot) writes the kernel's state
    back into these objects and the Python loop below continues, with identical results."""

    _ks = None  # the kernel's state while the kernel runs this pool (`_enter_kernel`, `_leave_kernel`)
    # a copy that keeps no per-request results (a hindsight fork) counts here, by arrival hour (int64, one entry per
    # hour of the workload, `late_hours`), the requests that finished after their deadline or were rejected; None:
    # results are recorded per request (`finish_t`, ...)
    late_done: np.ndarray | None = None
    replicas: list[Replica] = _PythonLoopState()
    gpus: list[GPU] = _PythonLoopState()
    heap: list[tuple] = _PythonLoopState()
    dispatch: DispatchPolicy | None = _KernelExcluded()
    # optional callable(StepLogEntry), called as each segment (or part) is booked (on the kernel: in booking order
    # when the engine call that booked it returns; a hook with a ``take_batch`` method gets them as a `StepLogBatch`)
    on_step = _StepSink()
    log: list[StepLogEntry] | None = _StepSink()  # every booked segment, with `EngineOptions.log_steps`

    def _enter_kernel(self) -> None:
        """Run this pool's event loop in the kernel from here on if the kernel covers it (see the class docstring)."""
        from commitenv.sim.kernel import KernelState

        self._ks = KernelState.covering(self)

    def _leave_kernel(self) -> None:
        """Write the kernel's state back into the replicas, GPUs and heap; the Python loop continues from there."""
        ks, self._ks = self._ks, None
        if self.__dict__.pop("_devices_shared", False):  # (a fork shares its original's idle objects until now)
            rmap = copy_devices(self._gpus, self._replicas, self, None)
            self.routable = [[rmap[id(r)] for r in lst] for lst in self.routable]
        ks.export_to(self)

    def stop_arrivals(self) -> None:
        """No request arrives after the ones already in: the rest of the workload is dropped from this pool's future
        (a hindsight estimate's premise)."""
        self._n = self._cursor
        if self._ks is not None:
            self._ks.stop_arrivals()

    def use_kernel(self) -> bool:
        """Run the event loop in the kernel from the current state on, if the kernel covers this pool (a what-if copy
        calls it once set up); whether it does."""
        if self._ks is None:
            self._enter_kernel()
        return self._ks is not None

    def _sync_kernel(self) -> None:
        self.sync_from_kernel(self._ks)

    def sync_from_kernel(self, ks) -> None:
        """Counters, completions, captured finishes and per-request results of the kernel's last call, as the Python
        loop keeps them."""
        c0 = self._cursor
        self._cursor, self.now, self.live, self.completed, self.events = ks.counters()
        if self.late_done is not None:
            self.count_late(c0 + np.flatnonzero(self.rejected[c0:self._cursor]))
        elif self._n_results and self._slot_base == 0:
            rej = np.flatnonzero(self.rejected[c0:self._cursor])
            if len(rej):
                self.finish_t[c0 + rej] = INF
        done = ks.take_finished()
        if len(done):
            slots = ks.slots(done)
            if self.late_done is not None:
                self.count_late(slots[~(ks.finish_t[done] <= ks.deadlines(done))] - self._slot_base)
            elif self._n_results:
                keep = slots < self._n_results
                rows = slots[keep]
                ks.results_into(done[keep], rows, self.finish_t, self.first_t, self.replica_of, self.preemptions)
                if self.done_slots is not None:
                    self.done_slots.extend(rows.tolist())
            cap = ks.qc[done] != 0
            if cap.any():  # (a captured request's finish carries no overhead: `KernelState.covers`)
                self.captured_finish.update(zip(slots[cap].tolist(), ks.finish_t[done[cap]].tolist()))
        self.captured_left = int(ks.captured_left)
        self._take_log(ks)

    def _take_log(self, ks) -> None:
        """The step log entries the kernel booked in its last call, into ``log`` and to ``on_step`` (in booking order,
        once the call returns; as one `StepLogBatch` to a hook with a ``take_batch`` method)."""
        batch = ks.take_log() if ks.logging else None
        if batch is None:
            return
        hook = self.on_step
        take_batch = getattr(hook, "take_batch", None)
        entries = batch.entries() if self.log is not None or (hook is not None and take_batch is None) else []
        if self.log is not None:
            self.log.extend(entries)
        if take_batch is not None:
            take_batch(batch)
        elif hook is not None:
            for e in entries:
                hook(e)

    def __init__(
        self,
        profiles: Profile | list[Profile],
        layout: PoolLayout,
        options: EngineOptions | None = None,
        *,
        clock_mhz: int | None = None,
    ) -> None:
        self.profiles = [profiles] if isinstance(profiles, Profile) else list(profiles)
        self.layout = layout
        self.opt = options or EngineOptions()
        if self.opt.alpha <= 0:
            raise ValueError(f"alpha: expected a positive SLO scale, got {self.opt.alpha}")
        p0 = self.profiles[0]
        cidx = p0.reference_clock_index if clock_mhz is None else p0.clock_index(clock_mhz)
        self.gpus: list[GPU] = []
        self.replicas: list[Replica] = []
        for g, insts in enumerate(layout.gpus):
            for inst in insts:
                if not 0 <= inst.model < len(self.profiles):
                    raise ValueError(f"layout.gpus[{g}]: model index {inst.model} has no profile")
            gpu = GPU(g, cidx, self.profiles[insts[0].model])
            for inst in insts:
                mn = self.profiles[inst.model].sm_share.min_share
                if not mn <= inst.share <= 1.0:
                    raise ValueError(f"layout.gpus[{g}]: SM share {inst.share} outside [{mn}, 1.0] (profile sm_share.min_share)")
                rep = Replica(len(self.replicas), gpu, self.profiles[inst.model], inst.model, inst.share)
                gpu.replicas.append(rep)
                self.replicas.append(rep)
            self.gpus.append(gpu)
        for g in self.gpus:
            for rep in g.replicas:  # (its memory share is its placement share, `commitenv.sim.memory`)
                rep.cap_blocks = rep.free_blocks = memory.kv_blocks(rep.profile, rep.share, f"layout.gpus[{g.index}]")
        self.n_models = len(self.profiles)
        self.now = 0.0
        self.heap: list[tuple] = []
        self._seq = 0
        noise = self.opt.noise
        self.truth: TruthSource | None = None
        if self.opt.truth is not None:
            self.truth = TruthSource(self.opt.truth, self.opt.seed, len(self.gpus))
            for g in self.gpus:
                g.power_factor = float(self.truth.power[g.index])
        self.noise = self.truth if self.truth is not None else (None if noise.off else NoiseSource(noise, self.opt.seed, len(self.replicas)))
        self.log = [] if self.opt.log_steps else None
        self.on_step = None
        self.routable: list[list[Replica]] = [[r for r in self.replicas if r.model == m] for m in range(self.n_models)]
        self.unrouted: list[Req] = []
        self.dispatch: DispatchPolicy | None = make_dispatch(self.opt.dispatch)  # None: least unfinished requests
        self.dispatch_s = 0.0  # wall time spent in the dispatch policy
        self.dispatch_calls = 0
        self.local_s = 0.0  # wall time spent in local scheduling policies
        self.local_calls = 0
        self.pred_out: np.ndarray | None = None
        self._pending: list[Replica] = []
        self.transit: dict[int, tuple[float, Req]] = {}  # migrated requests on the link: slot -> (landing time, request)
        self.moves = 0  # instance moves ordered (`move`)
        self.cold_starts = 0  # instance loads begun
        self.migrated = 0  # running requests sent to another instance with their KV
        self.migration_bytes = 0.0
        self.migration_j = 0.0  # link energy of those transfers (metered on the source GPUs)
        self.events = 0  # processed events (arrivals and heap events), for benchmarks
        self.live = 0  # arrived, unfinished requests
        self.completed = 0
        # workload cursor
        self._arr: list[float] = []
        self._cursor = 0
        self._n = 0
        self.table: RequestTable | None = None
        self._slot_base = 0
        self._n_results = 0
        self._capture_arrivals = False
        self.captured_left = 0
        self.captured_finish: dict[int, float] = {}
        self._hashes: list[int] | None = None
        self.tenant_model: dict[int, int] = {}
        for gpu in self.gpus:
            gpu.update_floor(0.0)

    # ================================================================================ workload and results
    def attach(self, table: RequestTable, tenant_model: dict[int, int] | None = None, t_start: float = 0.0) -> None:
        """Serve ``table`` (arrivals are read causally, as the clock passes them)."""
        if self._ks is not None:
            self._leave_kernel()
        n = len(table)
        self.table = table
        self._arr = table.arrival_s.tolist()
        self._prompt = table.prompt_tokens.tolist()
        self._n = n
        tm = np.zeros(n, dtype=np.int64)
        if tenant_model:
            for ten, m in tenant_model.items():
                if not 0 <= m < self.n_models:
                    raise ValueError(f"tenant_model: tenant {ten} mapped to model {m}, but the pool has {self.n_models}")
                tm[table.tenant == ten] = m
        self.tenant_model = dict(tenant_model or {})  # the scenario's routing of tenants to models (public)
        self.model_of = tm  # model serving each request row
        self._model = tm.tolist()
        terms = request_terms(self.profiles, self.opt, table, tm)
        self.rejected, self.out_tokens, self.lref = terms.rejected, terms.out_tokens, terms.lref
        self.deadline, self.pred_out, self.visible_deadline = terms.deadline, terms.pred_out, terms.visible_deadline
        self._out = self.out_tokens.tolist()
        self._deadline = self.deadline.tolist()
        self.overhead_s = self.truth.request_overheads(n) if self.truth is not None else None
        self.done_slots: list[int] | None = None  # a list when the environment tracks completions (misses)
        self._n_results = n
        self._attach_prefixes(table)
        self.finish_t = np.full(n, np.nan)
        self.first_t = np.full(n, np.nan)
        self.replica_of = np.full(n, -1, dtype=np.int32)
        self.preemptions = np.zeros(n, dtype=np.int32)
        self._cursor = int(np.searchsorted(table.arrival_s, t_start, side="left"))
        self.now = max(self.now, t_start)
        self._enter_kernel()

    def _attach_prefixes(self, table: RequestTable) -> None:
        """Give every replica a prefix cache when the workload has hash blocks and caching is on."""
        self._hashes = None
        if not self.opt.prefix_caching or table.prefix_offsets is None or table.prefix_hashes is None:
            return
        bt = self.opt.prefix_block_tokens
        for rep in self.replicas:
            if rep.pcache is None:
                rep.pcache = PrefixCache(bt, rep.bs, rep.free_blocks)
        self._hashes = table.prefix_hashes.tolist()
        self._hoff = table.prefix_offsets.tolist()

    @property
    def arrived(self) -> int:
        """Number of requests whose arrival has been processed."""
        return self._cursor

    # ================================================================================ event loop
    def _push(self, t: float, kind: int, idx: int, version: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, idx, version))  # (Python loop only: no hand-over check)

    def _start(self, rep: Replica, t: float) -> None:
        if rep.state == MOVING:
            if rep.migrate != "none":
                self._migrate_out(rep, t)
            if not rep.has_work():
                self._detach(rep, t)
                return
        if rep.state == ACTIVE and not rep.running and not rep.waiting and rep.local is None:
            return  # nothing to schedule (the common end of a request on a lightly loaded replica)
        record = self.log is not None or self.on_step is not None
        if rep.local is not None:
            started = rep.start(t, self.noise, False, record, self._local_order(rep, t))
        else:
            started = rep.start(t, self.noise, self.opt.closed_form, record)
        if started:
            rep.version += 1
            self._push(rep.t1, EV_SEG, rep.index, rep.version)
        elif rep.state == DRAINING and not rep.has_work():
            self._to_standby(rep, t)

    def _poke(self, rep: Replica, t: float) -> None:
        """New work reached ``rep`` at ``t``: start it (once every event at ``t`` is in, so simultaneous
        arrivals share the step, as vLLM's next scheduling pass would see them all) if idle, or cut its
        decode run at the next step end."""
        if rep.seg == SEG_NONE:
            if rep.state in (ACTIVE, DRAINING) and not rep.pending_start:
                rep.pending_start = True
                self._pending.append(rep)
        elif rep.seg == SEG_RUN and rep.cut(t):
            rep.version += 1
            self._push(rep.t1, EV_SEG, rep.index, rep.version)

    def resume(self, t: float) -> None:
        """Start, at ``t``, every active or draining replica that holds work but runs no segment: a serving state
        assembled outside the engine (a hardware pool's mirror for what-if runs) continues from there."""
        for rep in self.replicas:
            if rep.has_work():
                self._poke(rep, t)
        self._flush(t)

    def _flush(self, t: float) -> None:
        """Start the steps of replicas that received work at ``t``."""
        pend = self._pending
        self._pending = []
        for rep in pend:
            rep.pending_start = False
            if rep.seg == SEG_NONE:
                self._start(rep, t)

    def _kernel_now(self) -> KernelState:
        """The kernel's state with `EngineOptions.closed_form` as it is now: a caller may change it after attach, and
        the segments that start from then on follow it (the Python loop reads it at every segment start)."""
        ks = self._ks
        ks.closed_form = self.opt.closed_form
        return ks

    def run_until(self, t_end: float, *, stop_when_captured_done: bool = False) -> None:
        """Advance the simulation through every event at or before ``t_end``."""
        if self._ks is not None:
            # (stopping at the captured ones needs an end under a truth)
            if not stop_when_captured_done or t_end < INF or self.truth is None:
                self._kernel_now().advance(t_end, stop_when_captured_done)
                self._sync_kernel()
                return
            self._leave_kernel()
        heap = self._heap  # (from here on the Python loop runs: read its state directly)
        replicas = self._replicas
        arr = self._arr
        n = self._n
        last = self.now
        while True:
            ta = arr[self._cursor] if self._cursor < n else INF
            th = heap[0][0] if heap else INF
            if self._pending and (th if th < ta else ta) > last:
                self._flush(last)  # every event at `last` is in: start the replicas that got work
                continue
            if th == INF and ta == INF:
                break
            if th <= ta:
                if th > t_end:
                    break
                t, kind, _, idx, ver = heapq.heappop(heap)
                last = t
                self.events += 1
                if kind == EV_SEG:
                    rep = replicas[idx]
                    if rep.version != ver:
                        continue
                    self._finish_segment(rep, t)
                    if stop_when_captured_done and self.captured_left == 0:
                        self.now = t
                        return
                    if (self._cursor < n and arr[self._cursor] == t) or (heap and heap[0][0] == t) or self._pending:
                        if not rep.pending_start:  # other events at t first: they may bring work
                            rep.pending_start = True
                            self._pending.append(rep)
                    else:
                        self._start(rep, t)
                elif kind == EV_WAKE:
                    rep = replicas[idx]
                    if rep.version != ver or rep.state != WAKING:
                        continue
                    rep.state = ACTIVE
                    self._floor_changed(rep.gpu, t)
                    self._refresh_routable(rep.model)
                    self._redistribute(rep.model, t)
                elif kind == EV_LOAD:
                    rep = replicas[idx]
                    if rep.version != ver or rep.state != LOADING:
                        continue
                    self._loaded(rep, t)
                elif kind == EV_LAND:
                    _, r = self.transit.pop(idx)
                    self._route(r, t)
                else:
                    gpu = self.gpus[idx]
                    if gpu.version != ver:
                        continue
                    self._apply_clock(gpu, t)
            else:
                if ta > t_end:
                    break
                self._arrive(self._cursor, ta)
                self._cursor += 1
                self.events += 1
                last = ta
        self.now = max(self.now, t_end if t_end < INF else last)

    def _arrive(self, i: int, t: float) -> None:
        if self.rejected[i]:
            if self.late_done is not None:
                self.late_done[self.arrival_hour(i)] += 1
            elif self._slot_base == 0:
                self.finish_t[i] = INF
            return
        r = Req(self._slot_base + i, t, self._prompt[i], self._out[i], self._deadline[i], self._model[i])
        if self._hashes is not None:
            lo = self._hoff[i]
            nb = PrefixCache.shareable(self._hoff[i + 1] - lo, r.prompt, self.opt.prefix_block_tokens)
            if nb > 0:
                r.hashes = tuple(self._hashes[lo : lo + nb])
        if self._capture_arrivals:
            r.captured = True
            self.captured_left += 1
        self.live += 1
        self._route(r, t)

    def _route(self, r: Req, t: float) -> None:
        cands = self.routable[r.model]
        if not cands:
            self.unrouted.append(r)
            return
        if self.dispatch is not None:
            best = self._dispatched(r, t, cands)
        else:
            best = min(cands, key=_UNFINISHED)  # least loaded; ties go to the first in index order
        r.replica = best.index
        best.waiting.append(r)
        best.unf += 1
        self._poke(best, t)

    def _book(self, rep: Replica, t0: float, t1: float, energy: float, floor_j: float, entry: SegmentLog | None,
              n_steps: int) -> None:
        rep.gpu.book(energy, floor_j)
        if entry is not None and (self.log is not None or self.on_step is not None):
            e = StepLogEntry.of_segment(rep.gpu.index, rep.index, t0, t1, n_steps, energy, entry, floor_j)
            if self.log is not None:
                self.log.append(e)
            if self.on_step is not None:
                self.on_step(e)

    def _finish_segment(self, rep: Replica, t: float) -> None:
        n_steps = rep.run_k if rep.seg == SEG_RUN else 1
        self._book(rep, rep.t0, rep.t1, rep.seg_energy, rep.floor_part(rep.t1), rep.seg_log, n_steps)
        for r in rep.finish():
            self._complete(r, t)

    def _complete(self, r: Req, t: float) -> None:
        self.live -= 1
        self.completed += 1
        s = r.slot
        if self.late_done is not None:
            oh = self.overhead_s[s] if self.overhead_s is not None else 0.0
            if not t + oh <= r.deadline:
                self.late_done[self.arrival_hour(s - self._slot_base)] += 1
        elif s < self._n_results:
            oh = self.overhead_s[s] if self.overhead_s is not None else 0.0
            self.finish_t[s] = t + oh  # as the client sees it: serving overheads outside the engine included
            self.first_t[s] = r.first_t + oh
            if self.done_slots is not None:
                self.done_slots.append(s)
            self.replica_of[s] = r.replica
            self.preemptions[s] = r.preemptions
        if r.captured:
            self.captured_left -= 1
            self.captured_finish[r.slot] = t

    # ================================================================================ lifecycle and clocks
    def _refresh_routable(self, model: int) -> None:
        self.routable[model] = [r for r in self.replicas if r.model == model and r.state == ACTIVE]

    def _floor_changed(self, gpu: GPU, t: float) -> None:
        """Re-evaluate ``gpu``'s floor power at ``t`` after a lifecycle change."""
        if gpu.floor_power() != gpu.floor_w:
            gpu.update_floor(t)

    def _to_standby(self, rep: Replica, t: float) -> None:
        rep.state = STANDBY
        self._floor_changed(rep.gpu, t)

    def _redistribute(self, model: int, t: float) -> None:
        """Re-route every queued request of ``model`` that has not started, in arrival order."""
        moved: list[Req] = []
        for rep in self.replicas:
            if rep.model != model or not rep.waiting:
                continue
            waiting = rep.waiting  # (split with C-level map/compress: a starved pool's queue reaches 10^5)
            started = list(map(_STARTED, waiting))
            if not any(started):
                moved.extend(waiting)
                waiting.clear()
            elif not all(started):
                moved.extend(compress(waiting, [not s for s in started]))
                keep = list(compress(waiting, started))
                waiting.clear()
                waiting.extend(keep)
            rep.unf = len(rep.running) + len(waiting)
        moved.extend(r for r in self.unrouted if r.model == model)
        self.unrouted = [r for r in self.unrouted if r.model != model]
        moved.sort(key=_SLOT)
        if self.dispatch is None and self.routable[model]:
            self._route_least_loaded(moved, self.routable[model], t)
        else:
            for r in moved:
                self._route(r, t)
        for rep in self.replicas:
            if rep.model == model and rep.seg == SEG_NONE and not rep.has_work():
                if rep.state == DRAINING:
                    self._to_standby(rep, t)
                elif rep.state == MOVING:
                    self._detach(rep, t)

    def _route_least_loaded(self, reqs: list[Req], cands: list[Replica], t: float) -> None:
        """Route ``reqs`` in order exactly as `_route` would one by one with the default router (least unfinished,
        ties to the first candidate), in O(Q + R^2) rather than O(Q R): the loads rise level by level, each
        level's replicas taking one request each in candidate order (water filling). Each receiving replica is poked
        once, in the order it first receives work, which is all a repeated poke at the same time amounts to."""
        if not reqs:
            return
        loads = [rep.unf for rep in cands]
        order = sorted(range(len(cands)), key=lambda p: (loads[p], p))
        need, pos, j, level = len(reqs), 0, 0, loads[order[0]]
        group: list[int] = []  # candidates the level has reached, in candidate order
        first: list[int] = []  # candidates in the order they first receive a request
        while pos < need:
            while j < len(order) and loads[order[j]] == level:
                bisect.insort(group, order[j])
                j += 1
            g = len(group)
            levels = loads[order[j]] - level if j < len(order) else -(-(need - pos) // g)
            end = min(pos + levels * g, need)  # until the next candidate joins: rounds over the same group
            for q, p in enumerate(group):
                chunk = reqs[pos + q : end : g]
                if not chunk:
                    break
                rep = cands[p]
                if rep.unf == loads[p]:
                    first.append(p)
                for r in chunk:
                    r.replica = rep.index
                rep.waiting.extend(chunk)
                rep.unf += len(chunk)
            pos, level = end, level + levels
        for p in first:
            self._poke(cands[p], t)

    def replicas_of(self, model: int) -> list[Replica]:
        return [r for r in self.replicas if r.model == model]

    def active_count(self, model: int = 0) -> int:
        """Replicas of ``model`` that are active or waking, or moving to become active (the configured count)."""
        return sum(1 for r in self.replicas if r.model == model and (
            r.state in (ACTIVE, WAKING) or (r.state in (MOVING, LOADING) and r.after_load == ACTIVE)))

    def set_active(self, t: float, count: int, model: int = 0) -> None:
        """Make the first ``count`` replicas of ``model`` active (waking from standby takes the profile's
        activation latency; a draining one resumes at once) and drain the rest."""
        if self._ks is not None and model == 0:
            if not 1 <= count <= self._ks.R:
                raise ValueError(f"active replicas: expected 1..{self._ks.R} for model {model}, got {count}")
            if t < self.now - 1e-9:
                raise ValueError(f"set_active at t={t} precedes the engine clock {self.now}")
            self._kernel_now().set_active(t, count)
            self._sync_kernel()
            return
        reps = self.replicas_of(model)
        if not 1 <= count <= len(reps):
            raise ValueError(f"active replicas: expected 1..{len(reps)} for model {model}, got {count}")
        if t < self.now - 1e-9:
            raise ValueError(f"set_active at t={t} precedes the engine clock {self.now}")
        before = [r.state for r in reps]
        for i, rep in enumerate(reps):
            if rep.state in (MOVING, LOADING):  # a move in progress: the state it takes once loaded
                rep.after_load = ACTIVE if i < count else STANDBY
            elif i < count:
                if rep.state == DRAINING:
                    rep.state = ACTIVE
                    self._floor_changed(rep.gpu, t)
                elif rep.state == STANDBY:
                    rep.state = WAKING
                    rep.version += 1
                    self._floor_changed(rep.gpu, t)
                    rep.wake_t = t + rep.profile.latencies.activation_s
                    self._push(rep.wake_t, EV_WAKE, rep.index, rep.version)
            else:
                if rep.state == ACTIVE:
                    rep.state = DRAINING
                    self._floor_changed(rep.gpu, t)
                elif rep.state == WAKING:
                    rep.version += 1
                    rep.state = STANDBY
                    self._floor_changed(rep.gpu, t)
        if [r.state for r in reps] == before:
            return  # same active set: nothing moves
        self._refresh_routable(model)
        self._redistribute(model, t)
        self._flush(t)

    def set_clock(self, t: float, mhz: int, gpus: list[int] | None = None) -> None:
        """Request clock ``mhz`` on ``gpus`` (all by default); it applies after the profile's clock-change
        latency, and a step already running finishes at the old clock."""
        if t < self.now - 1e-9:
            raise ValueError(f"set_clock at t={t} precedes the engine clock {self.now}")
        if self._ks is not None and gpus is None:
            self._ks.set_clock(t, mhz)
            return
        for g in range(len(self.gpus)) if gpus is None else gpus:
            gpu = self.gpus[g]
            self._request_clock(gpu, gpu.profile.clock_index(mhz), t)

    def _request_clock(self, gpu: GPU, idx: int, t: float) -> None:
        """`set_clock` on one GPU, for clock level ``idx`` (nothing when it is already the GPU's target)."""
        target = gpu.pending_clock if gpu.pending_clock is not None else gpu.clock_idx
        if idx == target:
            return
        gpu.version += 1
        if idx == gpu.clock_idx:
            gpu.pending_clock = None  # cancel a pending change back to the current clock
            return
        gpu.pending_clock = idx
        gpu.pending_t = t + gpu.profile.latencies.clock_change_s
        self._push(gpu.pending_t, EV_CLOCK, gpu.index, gpu.version)

    def _apply_clock(self, gpu: GPU, t: float) -> None:
        """The clock becomes effective: a step in flight finishes under the law it started with; decode runs
        are cut at their next step end so that every later step uses the new clock."""
        for rep in gpu.replicas:
            rep.invalidate_coeffs()
            if rep.seg == SEG_RUN and rep.cut(t):
                rep.version += 1
                self._push(rep.t1, EV_SEG, rep.index, rep.version)
        gpu.clock_idx = gpu.pending_clock
        gpu.pending_clock = None
        gpu.update_floor(t)

    def set_share(self, t: float, replica: int, share: float) -> None:
        """Give ``replica`` a new SM share from its next step on (shares on a GPU must sum to <= 1)."""
        if t < self.now - 1e-9:
            raise ValueError(f"set_share at t={t} precedes the engine clock {self.now}")
        if not 0 <= replica < len(self.replicas):
            raise ValueError(f"replica index {replica} outside 0..{len(self.replicas) - 1}")
        rep = self.replicas[replica]
        mn = rep.profile.sm_share.min_share
        if not mn <= share <= 1.0:
            raise ValueError(f"sm share of replica {replica}: expected {mn}..1.0, got {share}")
        gpu = rep.dest if rep.state == MOVING else rep.gpu
        total = share + sum(r.share for r in self.replicas if r is not rep and (
            (r.gpu is gpu and r.state != MOVING) or (r.state == MOVING and r.dest is gpu)))
        if total > 1.0 + 1e-9:
            raise ValueError(f"sm shares on GPU {gpu.index} would sum to {total:.3f} > 1")
        rep.share = share
        rep.invalidate_coeffs()
        if rep.seg == SEG_RUN and rep.cut(t):
            rep.version += 1
            self._push(rep.t1, EV_SEG, rep.index, rep.version)

    # ================================================================================ placement and migration
    def move(self, t: float, moves: dict[int, int], migrate: str = "none") -> None:
        """Move instances (``{replica: GPU}``) from ``t``: each takes no new requests (its queued ones are routed
        anew), its running requests finish where they are or travel with their KV cache to another active instance
        of the model (``migrate``, `commitenv.sim.migration`), then it unloads and cold-starts on its GPU (the
        profile's ``latencies.load_s`` at ``load_w``) and serves again (or stands by, as ``set_active`` says). The
        SM shares of every GPU's staying and arriving instances must sum to <= 1 once all ``moves`` are made."""
        if t < self.now - 1e-9:
            raise ValueError(f"move at t={t} precedes the engine clock {self.now}")
        if migrate not in MIGRATE_MODES:
            raise ValueError(f"move: migrate must be one of {MIGRATE_MODES}, got {migrate!r}")
        target = {r.index: (r.dest if r.state == MOVING else r.gpu).index for r in self.replicas}
        for replica, gpu in moves.items():
            if not 0 <= replica < len(self.replicas):
                raise ValueError(f"move: replica index {replica} outside 0..{len(self.replicas) - 1}")
            if not 0 <= gpu < len(self.gpus):
                raise ValueError(f"move: GPU index {gpu} outside 0..{len(self.gpus) - 1}")
            prof = self.replicas[replica].profile
            if gpu != target[replica] and prof.latencies.load_s is None:
                raise ValueError(f"move: profile {prof.name} has no cold-start figures (latencies.load_s, load_w)")
            target[replica] = gpu
        for g in set(moves.values()):
            held = sum(r.share for r in self.replicas if target[r.index] == g)
            if held > 1.0 + 1e-9:
                raise ValueError(f"move: the instances on GPU {g} would hold {held:.3f} > 1 of its SMs")
        self.check_memory(target, moves.values())
        for replica, gpu in moves.items():
            self._move(self.replicas[replica], self.gpus[gpu], migrate, t)

    def check_memory(self, target: dict[int, int], gpus: Iterable[int]) -> None:
        """Raise when the memory shares of the instances GPU g (each of ``gpus``) would host under ``target``
        ({replica: GPU}) sum to more than 1: an instance keeps the memory it reserved when first placed
        (`commitenv.sim.memory`). Changes nothing."""
        for g in set(gpus):
            held = sum(r.mem_share for r in self.replicas if target[r.index] == g)
            if held > 1.0 + 1e-9:
                raise memory.PlacementMemoryError(
                    f"move: the instances on GPU {g} would reserve {held:.3f} > 1 of its memory (an instance keeps the "
                    "memory share it was placed with; SM share changes do not move memory)")

    def _move(self, rep: Replica, dest: GPU, migrate: str, t: float) -> None:
        if dest is (rep.dest if rep.state == MOVING else rep.gpu):
            return
        self.moves += 1
        if rep.state == MOVING:
            if dest is rep.gpu:  # called back before it left: it stays and serves as before
                rep.state, rep.dest = (ACTIVE if rep.after_load == ACTIVE else DRAINING), None
                self._floor_changed(rep.gpu, t)
                self._refresh_routable(rep.model)
                self._redistribute(rep.model, t)
                self._flush(t)
            else:
                rep.dest, rep.migrate = dest, migrate
            return
        if rep.state == LOADING:  # the load so far is lost
            rep.dest = dest
            self._detach(rep, t)
            return
        if rep.state == WAKING:
            rep.version += 1  # cancels the wake
        rep.after_load = ACTIVE if rep.state in (ACTIVE, WAKING) else STANDBY
        rep.state, rep.dest, rep.migrate = MOVING, dest, migrate
        self._floor_changed(rep.gpu, t)
        self._refresh_routable(rep.model)
        if rep.seg == SEG_NONE:
            if migrate != "none":
                self._migrate_out(rep, t)
        elif migrate != "none" and rep.seg == SEG_RUN and rep.cut(t):  # leave at the next step end
            rep.version += 1
            self._push(rep.t1, EV_SEG, rep.index, rep.version)
        self._redistribute(rep.model, t)  # its queued requests go elsewhere; idle, it unloads at once
        self._flush(t)

    def _migrate_out(self, rep: Replica, t: float) -> None:
        """Send ``rep``'s requests that its migration mode moves (between steps) to be routed anew after their KV
        transfer; with ``latency_aware``, only those whose predicted remaining time exceeds the transfer time."""
        spec = self.opt.migration
        kvb = rep.profile.model.kv_bytes_per_token
        step_s = 0.0
        if rep.migrate == "latency_aware" and rep.running:
            ctx = sum(r.computed + 1 for r in rep.running)
            step_s = rep.coeffs.step_time(0, len(rep.running), ctx, 0)
        keep, moved = [], []
        for r in rep.running:
            nbytes = r.computed * kvb
            if rep.migrate == "latency_aware":
                pred = self._seen(r)[0]
                left = max(pred - r.generated, 1) + -(-(r.prompt - min(r.computed, r.prompt)) // rep.budget)
                if not left * step_s > spec.transfer_s(nbytes):
                    keep.append(r)
                    continue
            moved.append((r, nbytes))
        rep.running = keep
        for r in [r for r in rep.waiting if r.started]:  # preempted (no KV left) or landed here, not yet admitted
            moved.append((r, r.computed * kvb))
        rep.waiting = type(rep.waiting)(r for r in rep.waiting if not r.started)
        for r, nbytes in moved:
            rep._release(r)
            r.hashes, r.replica = (), -1  # its KV arrives as private blocks
            if nbytes:
                e = spec.transfer_j(nbytes)
                rep.gpu.book(e, 0.0)
                self.migration_j += e
                self.migration_bytes += nbytes
            self.migrated += 1
            land = t + (spec.transfer_s(nbytes) if nbytes else 0.0)
            self.transit[r.slot] = (land, r)
            self._push(land, EV_LAND, r.slot, 0)
        rep.unf = len(rep.running) + len(rep.waiting)

    def _detach(self, rep: Replica, t: float) -> None:
        """Take ``rep`` (idle) off its GPU and cold-start it on its destination (``rep.dest``); instances waiting
        for the memory it held on the GPU it left begin their loads, and loaded ones waiting for SMs may start."""
        src, dest = rep.gpu, rep.dest
        rep.dest = None
        src.replicas.remove(rep)
        self._begin_load(rep, dest, t)
        self._floor_changed(src, t)
        for r in list(src.replicas):
            if r.state == LOADING and r.load_wait:
                self._start_load(r, t)
        for r in list(src.replicas):
            if r.state == LOADING and r.load_ready:
                self._loaded(r, t)

    def _begin_load(self, rep: Replica, dest: GPU, t: float) -> None:
        """Put ``rep`` on ``dest`` with a fresh KV cache; its cold start begins once the memory it reserves is free
        there (a departing instance keeps its memory until it leaves)."""
        rep.gpu = dest
        dest.replicas.append(rep)
        rep.invalidate_coeffs()
        rep.free_blocks = rep.cap_blocks  # a fresh KV cache (an empty prefix cache)
        if rep.pcache is not None:
            rep.pcache = PrefixCache(rep.pcache.block_tokens, rep.bs, rep.cap_blocks)
        rep.state, rep.load_ready, rep.load_wait = LOADING, False, True
        rep.version += 1
        self._start_load(rep, t)

    def _start_load(self, rep: Replica, t: float) -> None:
        """Begin ``rep``'s cold start (the profile's ``latencies.load_s`` at ``load_w``) if its memory share fits
        beside what the instances on its GPU hold (those still waiting for memory hold none)."""
        held = sum(r.mem_share for r in rep.gpu.replicas if r is not rep and not (r.state == LOADING and r.load_wait))
        if held + rep.mem_share > 1.0 + 1e-9:
            return
        rep.load_wait = False
        rep.load_t = t + rep.profile.latencies.load_s
        self.cold_starts += 1
        self._floor_changed(rep.gpu, t)
        self._push(rep.load_t, EV_LOAD, rep.index, rep.version)

    def _loaded(self, rep: Replica, t: float) -> None:
        """``rep``'s cold start is over: it serves (or stands by) once the SMs of its share are free."""
        busy = sum(r.share for r in rep.gpu.replicas if r is not rep and r.state in (ACTIVE, DRAINING, MOVING, WAKING))
        if busy + rep.share > 1.0 + 1e-9:
            if not rep.load_ready:
                rep.load_ready = True
                self._floor_changed(rep.gpu, t)
            return
        rep.state, rep.load_ready = rep.after_load, False
        self._floor_changed(rep.gpu, t)
        if rep.state == ACTIVE:
            self._refresh_routable(rep.model)
            self._redistribute(rep.model, t)
            self._flush(t)

    # ================================================================================ metering
    def settle(self, t: float) -> None:
        """Cut every decode run at the first step end >= ``t`` and apply the steps that ended before, so each
        replica has at most one step in flight. The environment calls this at every decision boundary
        (whether or not a controller looks), so observation never changes the ground truth."""
        if self._ks is not None:
            self._ks.settle(t)
            self._take_log(self._ks)
            return
        for rep in self.replicas:
            if rep.seg == SEG_RUN:
                if rep.cut(t):
                    rep.version += 1
                    self._push(rep.t1, EV_SEG, rep.index, rep.version)
                entry = rep.seg_log
                part = rep.split_before(t)
                if part is not None:
                    t0, t1, e, floor_j, m = part
                    self._book(rep, t0, t1, e, floor_j, entry, m)
                    if entry is not None:
                        rep.seg_log = entry.advanced(m)

    def in_flight(self, t: float) -> list[InFlightPart]:
        """The logged segments in flight that started before ``t``, each with what the meter has counted of it by
        ``t`` (an online attribution prices them at a period's end), in replica order."""
        if self._ks is not None:
            return self._ks.in_flight(t)
        out = []
        for rep in self.replicas:
            if rep.seg != SEG_NONE and rep.t0 < t and rep.seg_log is not None:
                out.append(InFlightPart(rep.index, rep.gpu.index, rep.t0, rep.run_k if rep.seg == SEG_RUN else 1,
                                        rep.energy_until(t), rep.floor_part(min(t, rep.t1)), rep.seg_log))
        return out

    def energy_j(self, t: float | None = None) -> float:
        """Pool energy (J) metered from the start to ``t`` (default: now)."""
        t = self.now if t is None else t
        if self._ks is not None:
            return sum(self._ks.meter(t).tolist())  # (summed in GPU order, as below)
        return sum(g.meter(t) for g in self.gpus)

    def gpu_energy_j(self, t: float | None = None) -> np.ndarray:
        t = self.now if t is None else t
        if self._ks is not None:
            return self._ks.meter(t)
        return np.array([g.meter(t) for g in self.gpus])

    # ================================================================================ copies
    def clone(self, *, hide_lengths: bool, own_profiles: bool = False) -> "Pool":
        """A copy of the serving state at ``now`` holding only arrived, unfinished requests; with
        ``hide_lengths`` each request runs to its predicted output length (and carries its visible deadline)
        instead of the true one. The copy has no workload, no noise and no step log; its meters start at zero.
        It shares no mutable object with this pool; under a truth model (realism levels) it is nominal: the
        step in flight runs at nominal speed and power, and the GPUs draw the profile's idle power. With
        ``own_profiles`` (a controller's snapshot) the copy gets deep copies of the profiles, so nothing written
        into them can reach the truth or the process-wide profile cache."""
        c = Pool.__new__(Pool)
        c.profiles = [p.model_copy(deep=True) for p in self.profiles] if own_profiles else list(self.profiles)
        c.layout, c.n_models = self.layout, self.n_models
        c.tenant_model = dict(self.tenant_model)
        c.opt = replace(self.opt, log_steps=False, truth=None, seed=0)  # the run seed would regenerate the trace
        nominal = self.truth is not None
        c.now = self.now
        c.heap, c._seq = [], 0
        c.noise = None
        if nominal and self.opt.truth.power_bias != 0.0:
            c.noise = NominalModel(1.0 / (1.0 + self.opt.truth.power_bias))
        elif isinstance(self.noise, NominalModel):
            c.noise = self.noise
        c.truth = None
        c.overhead_s = None
        c.done_slots = None
        c.log = None
        c.on_step = None
        c.gpus, c.replicas = [], []
        for g in self.gpus:
            ng = GPU(g.index, g.clock_idx, c.profiles[self.profiles.index(g.profile)])
            ng.pending_clock, ng.pending_t = g.pending_clock, g.pending_t
            ng.floor_w, ng.t_floor = g.floor_w, self.now
            c.gpus.append(ng)
            for rep in g.replicas:
                nr = Replica(rep.index, ng, c.profiles[rep.model], rep.model, rep.share)
                nr.local = rep.local  # a what-if copy plans its steps as the original does
                ng.replicas.append(nr)
                c.replicas.append(nr)
        c.replicas.sort(key=lambda r: r.index)  # moves leave GPU order and index order apart
        for rep, nr in zip(self.replicas, c.replicas):
            if rep.dest is not None:
                nr.dest = c.gpus[rep.dest.index]
        reqmap: dict[int, Req] = {}
        for r in self.live_requests():
            cr = r.copy()
            if hide_lengths and r.slot < self._n_results:
                cr.out = max(int(self.pred_out[r.slot]), r.generated + 1)
                cr.deadline = float(self.visible_deadline[r.slot])
            reqmap[r.slot] = cr
        for rep, nr in zip(self.replicas, c.replicas):
            rep.clone_into(nr, reqmap, nominal=nominal, now=self.now,
                           energy_factor=c.noise.energy_factor if isinstance(c.noise, NominalModel) else 1.0)
            if nr.seg:
                nr.version += 1
                c._push(nr.t1, EV_SEG, nr.index, nr.version)
            if nr.state == WAKING:
                nr.wake_t = rep.wake_t
                c._push(nr.wake_t, EV_WAKE, nr.index, nr.version)
            elif nr.state == LOADING and not nr.load_ready and not nr.load_wait:
                c._push(nr.load_t, EV_LOAD, nr.index, nr.version)
        c.transit = {}
        for slot, (land, r) in self.transit.items():
            c.transit[slot] = (land, reqmap[slot])
            c._push(land, EV_LAND, slot, 0)
        c.moves = c.cold_starts = c.migrated = 0
        c.migration_bytes = c.migration_j = 0.0
        for g in c.gpus:
            if g.pending_clock is not None:
                c._push(g.pending_t, EV_CLOCK, g.index, g.version)
        if isinstance(c.noise, NominalModel):
            for g in c.gpus:
                g.power_factor = c.noise.energy_factor
        if nominal:
            for g in c.gpus:
                g.floor_w = g.floor_power()
        c.routable = [[r for r in c.replicas if r.model == m and r.state == ACTIVE] for m in range(c.n_models)]
        c.unrouted = [reqmap[r.slot] for r in self.unrouted]
        c.live, c.completed, c.events = len(reqmap), 0, 0
        c._pending = []
        c._arr, c._cursor, c._n = [], 0, 0
        c._hashes = None
        c.table = None
        c.pred_out = None  # the copy's requests carry the lengths and deadlines it runs to
        c.dispatch, c.dispatch_s, c.dispatch_calls = self.dispatch, 0.0, 0
        c.local_s, c.local_calls = 0.0, 0
        c._slot_base, c._n_results, c._capture_arrivals = 0, 0, False
        c.captured_left, c.captured_finish = 0, {}
        return c

    def capture_all(self) -> list[Req]:
        """Mark every live request as captured (what-if runs report their completion times)."""
        reqs = self.live_requests()
        for r in reqs:
            r.captured = True
        self.captured_left = len(reqs)
        self.captured_finish = {}
        return reqs

    def attach_replay(self, table: RequestTable) -> None:
        """Add hypothetical arrivals (absolute times >= now, lengths as the controller assumes them)."""
        if self._ks is not None:
            self._leave_kernel()
        if len(table) and table.arrival_s[0] < self.now - 1e-9:
            raise ValueError(f"replay arrivals start at {table.arrival_s[0]} before the snapshot time {self.now}")
        n = len(table)
        self._arr = table.arrival_s.tolist()
        self._prompt = table.prompt_tokens.tolist()
        self._n = n
        model_of = np.zeros(n, dtype=np.int64)
        for ten, m in self.tenant_model.items():
            model_of[table.tenant == ten] = m
        self._model = model_of.tolist()
        self._cursor = 0
        self._slot_base = REPLAY_SLOT_BASE
        self._hashes = None  # replayed arrivals carry no prefix blocks
        lim = np.array([p.scheduler.context_limit for p in self.profiles])[model_of]
        self.rejected = np.asarray(table.prompt_tokens >= lim)
        out, lref = _capped_lref(self.profiles, table, model_of, table.output_tokens)
        self._out = out.tolist()
        self._deadline = (table.arrival_s + self.opt.alpha * lref).tolist()

    def _local_order(self, rep: Replica, t: float) -> tuple[int, ...] | None:
        """Ask ``rep``'s local policy for its next step (timed): the plan's order (None: the vLLM scheduler); a
        clock in the plan is requested for the replica's GPU."""
        if not rep.has_work():
            return None
        c0 = time.perf_counter()
        tv = self._task_view
        tasks = [tv(r, True) for r in rep.running] + [tv(r, False) for r in rep.waiting]
        gpu, levels = rep.gpu, rep.clock_levels
        view = LocalView(t, rep.index, gpu.index, rep.model, levels[gpu.clock_idx], levels, rep.share, rep.free_blocks,
                         rep.bs, rep.budget, rep.max_seqs, tuple(tasks))
        plan = rep.local.plan(view)
        self.local_s += time.perf_counter() - c0
        self.local_calls += 1
        if plan is None:
            return None
        mhz = plan.clock_mhz
        if mhz is not None:
            if mhz not in levels:
                raise ValueError(f"local policy {rep.local.name!r}: clock {mhz} MHz is not one of the "
                                 f"GPU's levels {list(levels)}")
            # (the replica's own levels are its GPU's when it set the GPU's profile, the common case)
            self._request_clock(gpu, levels.index(mhz) if gpu.profile is rep.profile else gpu.profile.clock_index(mhz),
                                t)
        return tuple(plan.order)

    def _seen(self, r: Req) -> tuple[int, float]:
        """What a policy may know of ``r``'s length and deadline: the predicted output and the visible deadline (in
        a what-if copy or a replay, the request already carries the ones it runs to)."""
        if self._slot_base == 0 and self.pred_out is not None:
            return int(self.pred_out[r.slot]), float(self.visible_deadline[r.slot])
        return r.out, r.deadline

    def _task_view(self, r: Req, running: bool) -> TaskView:
        left = r.prompt + r.generated - r.computed
        pred, deadline = self._seen(r)
        return TaskView(r.slot, running, left == 1 and r.generated >= 1, left, r.computed, r.prompt, r.generated,
                        pred, r.arrival, deadline, r.blocks)

    def set_local_policy(self, policy: LocalPolicy | None, replicas: list[int] | None = None) -> None:
        """Plan every step of ``replicas`` (all by default) with ``policy`` (None: the vLLM scheduler)."""
        for i in range(len(self.replicas)) if replicas is None else replicas:
            self.replicas[i].local = policy

    def _dispatched(self, r: Req, t: float, cands: list[Replica]) -> Replica:
        """The replica ``self.dispatch`` chooses for ``r`` among ``cands``, from views of both (timed)."""
        c0 = time.perf_counter()
        pol = self.dispatch
        hashes = r.hashes or ()
        req = ArrivalView(r.slot, t, r.prompt, *self._seen(r), r.model, len(hashes))
        want = pol.wants_prefix and bool(hashes)
        load = pol.wants_load
        views = tuple(
            CandidateView(rep.index, rep.gpu.index, rep.unf, len(rep.running), len(rep.waiting), rep.free_blocks,
                          rep.cap_blocks, rep.profile.clocks[rep.gpu.clock_idx].mhz, rep.share,
                          len(rep.pcache.lookup(hashes)[0]) if want and rep.pcache is not None else 0, rep.bs,
                          *(_token_loads(rep) if load else (0, 0)))
            for rep in cands)
        pick = pol.choose(req, views)
        self.dispatch_s += time.perf_counter() - c0
        self.dispatch_calls += 1
        for rep in cands:
            if rep.index == pick:
                return rep
        raise ValueError(f"dispatch policy {pol.name!r} chose replica {pick!r}, not one of the active replicas "
                         f"{[rep.index for rep in cands]} of model {r.model}")

    # ================================================================================ state views
    def counts(self) -> dict[str, int]:
        """Queue and running counts across the pool (what a controller may observe)."""
        if self._ks is not None:
            w, run = self._ks.queue_counts()
            return {"waiting": w, "running": run, "live": self.live, "arrived": self._cursor,
                    "completed": self.completed}
        w = sum(len(r.waiting) for r in self.replicas) + len(self.unrouted) + len(self.transit)
        run = sum(len(r.running) for r in self.replicas)
        return {"waiting": w, "running": run, "live": self.live, "arrived": self._cursor, "completed": self.completed}

    def live_state(self) -> tuple[np.ndarray, np.ndarray]:
        """(slot, tokens left to compute before its next output token) of every live request, in the order of
        `live_requests`: what the environment's observation summarizes."""
        if self._ks is not None:
            return self._ks.live_state()
        return live_state(self.live_requests())

    def live_deadlines(self) -> tuple[np.ndarray, np.ndarray]:
        """The live requests' workload rows and deadlines (`Req.deadline`: the true ones in the ground truth), in no
        set order."""
        if self._ks is not None:
            rows, dl = self._ks.live_deadlines()
            return rows - self._slot_base, dl
        live = self.live_requests()
        return (np.array([r.slot - self._slot_base for r in live], dtype=np.int64),
                np.array([r.deadline for r in live], dtype=np.float64))

    def late_hours(self) -> int:
        """Entries of `late_done`: one per hour of the workload's arrivals (hour = arrival // 3600 s)."""
        arr = self.table.arrival_s
        return int(arr.max() // 3600.0) + 1 if len(arr) else 1

    def arrival_hour(self, row: int) -> int:
        """The hour (arrival // 3600 s) in which workload row ``row`` arrives."""
        return int(self._arr[row] // 3600.0)

    def count_late(self, rows: np.ndarray) -> None:
        """Add workload ``rows`` (late or rejected) to `late_done` by arrival hour."""
        if len(rows):
            self.late_done += np.bincount((self.table.arrival_s[rows] // 3600.0).astype(np.int64),
                                          minlength=len(self.late_done))

    def live_requests(self) -> list[Req]:
        out: list[Req] = []
        for rep in self.replicas:
            out.extend(rep.running)
            out.extend(rep.waiting)
        out.extend(self.unrouted)
        out.extend(r for _, r in self.transit.values())
        return out

    captured_left = 0
