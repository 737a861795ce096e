"""The reference engine: the pool's event loop on replica and GPU objects, one step at a time (no closed form, no
batched routing). The compiled loop (`commitenv.sim.kernel`) is held to it bit for bit on generated cases
(tests/sim/test_engine_reference.py); tests of serving semantics read its objects directly."""

from __future__ import annotations

import heapq
import math
from operator import attrgetter

import numpy as np

from commitenv.sim.pool import Pool
from commitenv.sim.prefix_cache import PrefixCache
from commitenv.sim.records import InFlightPart, SegmentLog, StepLogEntry
from commitenv.sim.request import Req, live_state
from commitenv.sim.states import (ACTIVE, DRAINING, EV_CLOCK, EV_LAND, EV_LOAD, EV_SEG, EV_WAKE, LOADING, MOVING,
                                  SEG_NONE, STANDBY, WAKING)
from commitenv.sim.kernel.fresh import placement_memory
from commitenv.workload.table import RequestTable

from helpers.reference.copies import ReferenceCopies
from helpers.reference.gpu import GPU
from helpers.reference.hooks import ReferenceHooks
from helpers.reference.placement import ReferencePlacement
from helpers.reference.replica import Replica

INF = math.inf
_UNFINISHED = attrgetter("unf")  # the router's load measure: running + waiting requests
_SLOT = attrgetter("slot")


class ReferencePool(ReferencePlacement, ReferenceHooks, ReferenceCopies, Pool):
    """`Pool` served by the object event loop: the same constructor, actions and reads, with its replicas, GPUs and
    event heap as objects a test may inspect (``replicas``, ``gpus``, ``heap``)."""

    _ks = None
    log = None
    on_step = None
    dispatch = None

    def __init__(self, profiles, layout, options=None, *, clock_mhz=None) -> None:
        super().__init__(profiles, layout, options, clock_mhz=clock_mhz)
        self._ks = None
        self.log = [] if self.opt.log_steps else None
        self.on_step = None
        self.heap: list[tuple] = []
        self._seq = 0
        power = tuple(float(f) for f in self.truth.power) if self.truth is not None else (1.0,) * len(self.layout.gpus)
        self._build_objects(self._clock0, *placement_memory(self.profiles, self.layout), power)
        self.routable = [[r for r in self.replicas if r.model == m] for m in range(self.n_models)]
        self.unrouted: list[Req] = []
        self._pending: list[Replica] = []
        self.transit: dict[int, tuple[float, Req]] = {}

    def stop_arrivals(self) -> None:
        self._n = self._cursor

    def attach(self, table: RequestTable, tenant_model: dict[int, int] | None = None, t_start: float = 0.0) -> None:
        """`Pool.attach`, with a prefix cache on every replica when the workload has hash blocks and caching is on."""
        self._bind_workload(table, tenant_model, t_start)
        if self._hashes is not None:
            for rep in self.replicas:
                rep.pcache = PrefixCache(self.opt.prefix_block_tokens, rep.bs, rep.free_blocks)

    def _push(self, t: float, kind: int, idx: int, version: int) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, kind, self._seq, idx, version))

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
            started = rep.start(t, self.noise, record, self._local_order(rep, t))
        else:
            started = rep.start(t, self.noise, record)
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

    def _flush(self, t: float) -> None:
        """Start the steps of replicas that received work at ``t``."""
        pend = self._pending
        self._pending = []
        for rep in pend:
            rep.pending_start = False
            if rep.seg == SEG_NONE:
                self._start(rep, t)

    def run_until(self, t_end: float, *, stop_when_captured_done: bool = False) -> None:
        """Advance the simulation through every event at or before ``t_end``."""
        heap = self.heap
        replicas = self.replicas
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
        r = Req(self._slot_base + i, t, int(self._prompt[i]), int(self._out[i]), float(self._deadline[i]),
                int(self._model[i]))
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
        if not cands and self.opt.scale_to_zero:
            self._demand_wake(r.model, t)
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

    def _demand_wake(self, model: int, t: float) -> None:
        """Models scale to zero: a request of ``model`` found no active replica. Unless one is waking, or moving or
        loading to become active, one wakes: a draining one resumes at once, else a standby one wakes after its
        activation latency, else a moving or loading one becomes active once loaded (the first of each kind)."""
        reps = self.replicas_of(model)
        if any(r.state == WAKING or (r.state in (MOVING, LOADING) and r.after_load == ACTIVE) for r in reps):
            return
        for kind in (DRAINING, STANDBY, MOVING):
            rep = next((r for r in reps if r.state == kind or (kind == MOVING and r.state == LOADING)), None)
            if rep is None:
                continue
            if kind == DRAINING:
                rep.state = ACTIVE
                self._floor_changed(rep.gpu, t)
                self._refresh_routable(model)
            elif kind == STANDBY:
                self._wake(rep, t)
            else:
                rep.after_load = ACTIVE
            return

    def _wake(self, rep: Replica, t: float) -> None:
        """A standby replica starts waking at ``t``: active after its profile's activation latency."""
        rep.state = WAKING
        rep.version += 1
        self._floor_changed(rep.gpu, t)
        rep.wake_t = t + rep.profile.latencies.activation_s
        self._push(rep.wake_t, EV_WAKE, rep.index, rep.version)

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
        self._book(rep, rep.t0, rep.t1, rep.seg_energy, rep.floor_part(rep.t1), rep.seg_log, 1)
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
            self.max_tbt_s[s] = r.max_gap
            if self.done_slots is not None:
                self.done_slots.append(s)
            self.replica_of[s] = r.replica
            self.preemptions[s] = r.preemptions
        if r.captured:
            self.captured_left -= 1
            self.captured_finish[r.slot] = t

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
        """Re-route every queued request of ``model`` that has not started, in arrival order, one at a time."""
        moved: list[Req] = []
        for rep in self.replicas:
            if rep.model != model or not rep.waiting:
                continue
            moved.extend(r for r in rep.waiting if not r.started)
            keep = [r for r in rep.waiting if r.started]
            rep.waiting.clear()
            rep.waiting.extend(keep)
            rep.unf = len(rep.running) + len(rep.waiting)
        moved.extend(r for r in self.unrouted if r.model == model)
        self.unrouted = [r for r in self.unrouted if r.model != model]
        moved.sort(key=_SLOT)
        for r in moved:
            self._route(r, t)
        for rep in self.replicas:
            if rep.model == model and rep.seg == SEG_NONE and not rep.has_work():
                if rep.state == DRAINING:
                    self._to_standby(rep, t)
                elif rep.state == MOVING:
                    self._detach(rep, t)

    def replicas_of(self, model: int) -> list[Replica]:
        return [r for r in self.replicas if r.model == model]

    def active_count(self, model: int = 0) -> int:
        """Replicas of ``model`` that are active or waking, or moving to become active (the configured count)."""
        return sum(1 for r in self.replicas if r.model == model and (
            r.state in (ACTIVE, WAKING) or (r.state in (MOVING, LOADING) and r.after_load == ACTIVE)))

    def set_active(self, t: float, count: int, model: int = 0) -> None:
        """Make the first ``count`` replicas of ``model`` active (waking from standby takes the profile's
        activation latency; a draining one resumes at once) and drain the rest."""
        reps = self.replicas_of(model)
        low = 0 if self.opt.scale_to_zero else 1
        if not low <= count <= len(reps):
            raise ValueError(f"active replicas: expected {low}..{len(reps)} for model {model}, got {count}")
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
                    self._wake(rep, t)
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
        """The clock becomes effective: a step in flight finishes under the law it started with, the next uses the
        new clock."""
        for rep in gpu.replicas:
            rep.invalidate_coeffs()
        gpu.clock_idx = gpu.pending_clock
        gpu.pending_clock = None
        gpu.update_floor(t)

    def settle(self, t: float) -> None:
        """Nothing to do: every segment here is a single step, already at most one in flight per replica (the
        compiled loop splits its decode runs here)."""

    def in_flight(self, t: float) -> list[InFlightPart]:
        """The logged segments in flight that started before ``t``, each with what the meter has counted of it by
        ``t`` (an online attribution prices them at a period's end), in replica order."""
        out = []
        for rep in self.replicas:
            if rep.seg != SEG_NONE and rep.t0 < t and rep.seg_log is not None:
                out.append(InFlightPart(rep.index, rep.gpu.index, rep.t0, 1,
                                        rep.energy_until(t), rep.floor_part(min(t, rep.t1)), rep.seg_log))
        return out

    def energy_j(self, t: float | None = None) -> float:
        """Pool energy (J) metered from the start to ``t`` (default: now)."""
        t = self.now if t is None else t
        return sum(g.meter(t) for g in self.gpus)

    def gpu_energy_j(self, t: float | None = None) -> np.ndarray:
        t = self.now if t is None else t
        return np.array([g.meter(t) for g in self.gpus])

    def counts(self) -> dict[str, int]:
        """Queue and running counts across the pool (what a controller may observe)."""
        w = sum(len(r.waiting) for r in self.replicas) + len(self.unrouted) + len(self.transit)
        run = sum(len(r.running) for r in self.replicas)
        return {"waiting": w, "running": run, "live": self.live, "arrived": self._cursor, "completed": self.completed}

    def live_state(self) -> tuple[np.ndarray, np.ndarray]:
        """(slot, tokens left to compute before its next output token) of every live request, in the order of
        `live_requests`: what the environment's observation summarizes."""
        return live_state(self.live_requests())

    def live_deadlines(self) -> tuple[np.ndarray, np.ndarray]:
        """The live requests' workload rows and deadlines (`Req.deadline`: the true ones in the ground truth), in no
        set order."""
        live = self.live_requests()
        return (np.array([r.slot - self._slot_base for r in live], dtype=np.int64),
                np.array([r.deadline for r in live], dtype=np.float64))

    def live_requests(self) -> list[Req]:
        out: list[Req] = []
        for rep in self.replicas:
            out.extend(rep.running)
            out.extend(rep.waiting)
        out.extend(self.unrouted)
        out.extend(r for _, r in self.transit.values())
        return out


