"""The serving pool: GPUs and replicas, the router, lifecycle and clock actuation, and the event loop.

One engine serves three uses (docs/architecture.md): ground truth inside the environment, the what-if
predictor (`commitenv.sim.whatif`, which runs this class on a snapshot copy), and scheduler replay.
The pool only ever holds requests that have arrived: the attached workload is read through a cursor.

`Pool` is assembled from sibling modules, one concern each: `commitenv.sim.handover` (running on the compiled loop
and handing back from it), `commitenv.sim.placement` (SM shares, moves, migration, loading), `commitenv.sim.hooks`
(dispatch and local policies), `commitenv.sim.copies` (clones, replay) and `commitenv.sim.terms` (per-request
terms fixed at attach time).
"""

from __future__ import annotations

import bisect
import heapq
import math
from itertools import compress
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from commitenv.profiles.schema import Profile
from commitenv.sim.copies import REPLAY_SLOT_BASE, Copies, DeviceSpec, _kernel_on, copy_devices  # noqa: F401
from commitenv.sim.dispatch import DispatchPolicy, make_dispatch
from commitenv.sim.gpu import GPU
from commitenv.sim.handover import KernelHandover, _KernelPolicy, _PythonLoopState, _StepSink
from commitenv.sim.hooks import PolicyHooks
from commitenv.sim.kernel.fresh import fresh_state, placement_caps
from commitenv.sim.local import LocalPolicy
from commitenv.sim.noise import NoiseSource
from commitenv.sim.placement import Placement
from commitenv.sim.prefix_cache import PrefixCache
from commitenv.sim.records import (EngineOptions, InFlightPart, Instance, PoolLayout, SegmentLog, StepLogBatch,  # noqa: F401
                                   StepLogEntry)
from commitenv.sim.replica import Replica
from commitenv.sim.request import Req, live_state
from commitenv.sim.states import (ACTIVE, DRAINING, EV_CLOCK, EV_LAND, EV_LOAD, EV_SEG, EV_WAKE, LOADING, MOVING, SEG_NONE,
                                  SEG_RUN, STANDBY, WAKING)
from commitenv.sim.terms import RequestTerms, request_terms  # noqa: F401
from commitenv.sim.truth import TruthSource
from commitenv.workload.table import RequestTable

if TYPE_CHECKING:
    from commitenv.sim.kernel import KernelState

INF = math.inf
_UNFINISHED = attrgetter("unf")  # the router's load measure: running + waiting requests
_SLOT = attrgetter("slot")
_STARTED = attrgetter("started")


class Pool(KernelHandover, Placement, PolicyHooks, Copies):
    """A pool of GPUs serving one or more models with vLLM scheduling semantics.

    A new pool runs on the compiled loop (`commitenv.sim.kernel`) from the start, its state built from its layout
    (`commitenv.sim.kernel.fresh`), with no replica or GPU object; snapshots, what-if copies, forks, step logs and
    `commitenv.sim.devices.device_state` are all read off its arrays. Reading ``replicas``, ``gpus`` or ``heap``
    (tests do) builds those objects and writes the kernel's state into them: the Python loop below then continues,
    with identical results, until `use_kernel` imports the state again. `COMMITENV_KERNEL=0` keeps every pool on the
    Python loop."""

    _ks = None  # the kernel's state while the kernel runs this pool (`_enter_kernel`, `_leave_kernel`)
    # a copy that keeps no per-request results (a hindsight fork) counts here, by arrival hour (int64, one entry per
    # hour of the workload, `late_hours`), the requests that finished after their deadline or were rejected; None:
    # results are recorded per request (`finish_t`, ...)
    late_done: np.ndarray | None = None
    replicas: list[Replica] = _PythonLoopState()
    gpus: list[GPU] = _PythonLoopState()
    heap: list[tuple] = _PythonLoopState()
    dispatch: DispatchPolicy | None = _KernelPolicy()
    # optional callable(StepLogEntry), called as each segment (or part) is booked (on the kernel: in booking order
    # when the engine call that booked it returns; a hook with a ``take_batch`` method gets them as a `StepLogBatch`)
    on_step = _StepSink()
    log: list[StepLogEntry] | None = _StepSink()  # every booked segment, with `EngineOptions.log_steps`

    def stop_arrivals(self) -> None:
        """No request arrives after the ones already in: the rest of the workload is dropped from this pool's future
        (a hindsight estimate's premise)."""
        self._n = self._cursor
        if self._ks is not None:
            self._ks.stop_arrivals()

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
        levels = {tuple(p.clock_mhz) for p in self.profiles}
        if len(levels) > 1:  # (a clock index means one level on every GPU; scenarios refuse such pools too)
            raise ValueError(f"profiles {[p.name for p in self.profiles]}: different clock levels "
                             f"{sorted(levels)}; a pool's profiles must share one set of clock levels")
        cidx = p0.reference_clock_index if clock_mhz is None else p0.clock_index(clock_mhz)
        self._clock0 = cidx  # (the clock level every GPU starts at)
        for g, insts in enumerate(layout.gpus):
            for inst in insts:
                if not 0 <= inst.model < len(self.profiles):
                    raise ValueError(f"layout.gpus[{g}]: model index {inst.model} has no profile")
            for inst in insts:
                mn = self.profiles[inst.model].sm_share.min_share
                if not mn <= inst.share <= 1.0:
                    raise ValueError(f"layout.gpus[{g}]: SM share {inst.share} outside [{mn}, 1.0] (profile sm_share.min_share)")
        caps = placement_caps(self.profiles, layout)  # (its memory share is its placement share, `memory`)
        # the model each replica serves, in index order (layout order; an instance keeps its model when it moves)
        self.replica_models: tuple[int, ...] = tuple(inst.model for insts in layout.gpus for inst in insts)
        n_gpus, n_reps = len(layout.gpus), len(caps)
        self.n_models = len(self.profiles)
        self.now = 0.0
        self.heap: list[tuple] = []
        self._seq = 0
        noise = self.opt.noise
        self.truth: TruthSource | None = None
        if self.opt.truth is not None:
            self.truth = TruthSource(self.opt.truth, self.opt.seed, n_gpus)
        power = tuple(float(f) for f in self.truth.power) if self.truth is not None else (1.0,) * n_gpus
        self.noise = self.truth if self.truth is not None else (None if noise.off else NoiseSource(noise, self.opt.seed, n_reps))
        self.log = [] if self.opt.log_steps else None
        self.on_step = None
        # each replica's local policy (`commitenv.sim.local`), planning its every step; None: the vLLM scheduler
        self.local_policies: list[LocalPolicy | None] = [None] * n_reps
        on_kernel = _kernel_on()
        if on_kernel:  # (device objects only if something asks for them: `KernelHandover.__getattr__`)
            self._devices_shared = DeviceSpec(tuple(insts[0].model for insts in layout.gpus), power)
        else:
            self._build_objects(cidx, caps, power)
        self.routable: list[list[Replica]] = [[] if on_kernel else [r for r in self.replicas if r.model == m]
                                              for m in range(self.n_models)]
        self.unrouted: list[Req] = []
        self.dispatch: DispatchPolicy | None = make_dispatch(self.opt.dispatch)  # None: least unfinished requests
        self.dispatch_s = 0.0  # wall time spent in the dispatch policy
        self.dispatch_calls = 0
        self.local_s = 0.0  # wall time spent in local scheduling policies
        self.local_calls = 0
        self.pred_out: np.ndarray | None = None
        self.visible_deadline: np.ndarray | None = None
        self.overhead_s: np.ndarray | None = None  # the truth's serving overhead per request row (`attach`)
        self.rejected = np.zeros(0, np.bool_)  # per request row: rejected by the context limit (`attach`)
        self.done_slots: list[int] | None = None
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
        if on_kernel:  # (actions before the workload is attached run there too; `attach` adds the rows)
            self._ks = fresh_state(self, power)

    # ================================================================================ workload and results
    def attach(self, table: RequestTable, tenant_model: dict[int, int] | None = None, t_start: float = 0.0) -> None:
        """Serve ``table`` (arrivals are read causally, as the clock passes them)."""
        ks = self._ks
        if ks is not None and not ks.unused:
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
        if self._ks is not None:  # (unused: a pool that has served was handed back above)
            self._ks.attach_workload(self)
        else:
            self._enter_kernel()

    def _attach_prefixes(self, table: RequestTable) -> None:
        """Give every replica a prefix cache when the workload has hash blocks and caching is on (on the kernel: its
        arrays, `KernelState.attach_workload`)."""
        self._hashes = None
        if not self.opt.prefix_caching or table.prefix_offsets is None or table.prefix_hashes is None:
            return
        bt = self.opt.prefix_block_tokens
        for rep in (() if self._ks is not None else self.replicas):
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
        local = self.local_policies[rep.index]
        if rep.state == ACTIVE and not rep.running and not rep.waiting and local is None:
            return  # nothing to schedule (the common end of a request on a lightly loaded replica)
        record = self.log is not None or self.on_step is not None
        if local is not None:
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
                self._kernel_now().advance(t_end, stop_when_captured_done, self)
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
        if self._ks is not None:
            return self._ks.active_count(model)
        return sum(1 for r in self.replicas if r.model == model and (
            r.state in (ACTIVE, WAKING) or (r.state in (MOVING, LOADING) and r.after_load == ACTIVE)))

    def set_active(self, t: float, count: int, model: int = 0) -> None:
        """Make the first ``count`` replicas of ``model`` active (waking from standby takes the profile's
        activation latency; a draining one resumes at once) and drain the rest."""
        if self._ks is not None:
            if t < self.now - 1e-9:
                raise ValueError(f"set_active at t={t} precedes the engine clock {self.now}")
            self._kernel_now().set_active(t, count, model, self)
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
        if self._ks is not None:
            self._ks.set_clock(t, mhz, gpus)
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
