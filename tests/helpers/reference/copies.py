"""The reference engine's copies: a what-if clone of its objects, its new objects, and a mirror's state placed."""

from __future__ import annotations

import numpy as np

from commitenv.sim.request import Req
from commitenv.sim.states import ACTIVE, EV_CLOCK, EV_LAND, EV_LOAD, EV_SEG, EV_WAKE, LOADING, WAKING
from commitenv.sim.truth import NominalModel

from helpers.reference.gpu import GPU
from helpers.reference.replica import Replica


class ReferenceCopies:
    """`ReferencePool`'s clone, object building, `place`, `resume` and `capture_all`."""

    def _clone_state(self, c, hide_lengths: bool, nominal: bool) -> None:
        """The object part of `Pool.clone` (its common part: `Pool._clone_base`)."""
        c.heap, c._seq, c._pending = [], 0, []
        c._ks = None
        c.gpus, c.replicas = [], []
        for g in self.gpus:
            ng = GPU(g.index, g.clock_idx, c.profiles[self.profiles.index(g.profile)])
            ng.pending_clock, ng.pending_t = g.pending_clock, g.pending_t
            ng.floor_w, ng.t_floor = g.floor_w, self.now
            c.gpus.append(ng)
            for rep in g.replicas:
                nr = Replica(rep.index, ng, c.profiles[rep.model], rep.model, rep.share)
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

    def _build_objects(self, cidx: int, mem: list[float], caps: list[int], power: tuple[float, ...]) -> None:
        """The GPU and replica objects of a new pool: idle, at clock level
        ``cidx``, with memory shares ``mem``, KV blocks ``caps`` and power factors ``power``."""
        self.gpus, self.replicas = [], []
        for g, insts in enumerate(self.layout.gpus):
            gpu = GPU(g, cidx, self.profiles[insts[0].model])
            gpu.power_factor = power[g]
            for inst in insts:
                rep = Replica(len(self.replicas), gpu, self.profiles[inst.model], inst.model, inst.share)
                rep.cap_blocks = rep.free_blocks = caps[rep.index]
                rep.mem_share = mem[rep.index]
                gpu.replicas.append(rep)
                self.replicas.append(rep)
            self.gpus.append(gpu)
        for gpu in self.gpus:
            gpu.update_floor(0.0)

    def place(self, running: list[list[Req]], waiting: list[list[Req]], unrouted: list[Req], states: list[int]) -> None:
        for rep, run, wait, state in zip(self.replicas, running, waiting, states):
            rep.state = state
            rep.running = list(run)
            rep.waiting.extend(wait)
            rep.free_blocks -= sum(r.blocks for r in run)
            rep.unf = len(rep.running) + len(rep.waiting)
            rep.gpu.floor_w = rep.gpu.floor_power()
        self.unrouted = list(unrouted)
        self.live = sum(rep.unf for rep in self.replicas) + len(self.unrouted)
        self.routable = [[r for r in self.replicas if r.state == ACTIVE and r.model == m] for m in range(self.n_models)]

    def resume(self, t: float) -> None:
        """Start, at ``t``, every active or draining replica that holds work but runs no segment: a serving state
        assembled outside the engine (a hardware pool's mirror for what-if runs, `place`) continues from there."""
        for rep in self.replicas:
            if rep.has_work():
                self._poke(rep, t)
        self._flush(t)

    def capture_all(self, *, arrivals: bool = False) -> None:
        """Mark every live request as captured (what-if runs report their completion times); with ``arrivals`` the
        requests arriving from now on too."""
        self.captured_finish = {}
        self._capture_arrivals = arrivals
        reqs = self.live_requests()
        for r in reqs:
            r.captured = True
        self.captured_left = len(reqs)

    def _attach_replay_rows(self) -> None:
        pass  # (arrivals are read from the rows `attach_replay` set)


def reference_snapshot(pool, model: int = 0, meter_j: float | None = None):
    """`commitenv.sim.view.take_snapshot` of a `ReferencePool`: the views built from its clone's objects (a pool on the
    compiled loop: the library's own)."""
    from commitenv.sim import view
    from commitenv.sim.states import STATE_NAMES
    from commitenv.sim.view import ReplicaView, RequestView, Snapshot, _frozen

    if pool._ks is not None:
        return view.take_snapshot(pool, model, meter_j)
    clone = pool.clone(hide_lengths=not pool.opt.oracle_lengths, own_profiles=True)
    reqs, where, running = [], [], []
    for i, rep in enumerate(clone.replicas):
        for queue, is_running in ((rep.running, True), (rep.waiting, False)):
            reqs.extend(queue)
            where.extend([i] * len(queue))
            running.extend([is_running] * len(queue))
    away = clone.unrouted + [r for _, r in clone.transit.values()]  # not yet routed, or migrating between GPUs
    reqs.extend(away)
    where.extend([-1] * len(away))
    running.extend([False] * len(away))
    requests = RequestView(
        slot=_frozen([r.slot for r in reqs], np.int64),
        arrival_s=_frozen([r.arrival for r in reqs], np.float64),
        prompt_tokens=_frozen([r.prompt for r in reqs], np.int64),
        output_tokens=_frozen([r.out for r in reqs], np.int64),
        generated_tokens=_frozen([r.generated for r in reqs], np.int64),
        computed_tokens=_frozen([r.computed for r in reqs], np.int64),
        deadline_s=_frozen([r.deadline for r in reqs], np.float64),
        replica=_frozen(where, np.int64),
        running=_frozen(running, bool),
    )
    reps = clone.replicas
    replicas = ReplicaView(
        state=tuple(STATE_NAMES[r.state] for r in reps),
        gpu=_frozen([r.gpu.index for r in reps], np.int64),
        model=_frozen([r.model for r in reps], np.int64),
        share=_frozen([r.share for r in reps], np.float64),
        clock_mhz=_frozen([r.profile.clocks[r.gpu.clock_idx].mhz for r in reps], np.int64),
        running=_frozen([len(r.running) for r in reps], np.int64),
        waiting=_frozen([len(r.waiting) for r in reps], np.int64),
        kv_blocks=_frozen([r.cap_blocks for r in reps], np.int64),
        free_kv_blocks=_frozen([r.free_blocks for r in reps], np.int64),
        memory_share=_frozen([r.mem_share for r in reps], np.float64),
    )
    active = clone.active_count(model)
    clock = clone.profiles[0].clocks[clone.gpus[0].clock_idx].mhz
    return Snapshot(pool.now, active, clock, requests, replicas, meter_j, clone)


def reference_device_state(pool):
    """`commitenv.sim.devices.device_state` of a `ReferencePool`, read off its objects (a pool on the compiled loop:
    the library's own)."""
    from commitenv.sim.devices import DeviceState, device_state

    if pool._ks is not None:
        return device_state(pool)
    reps, gpus = pool.replicas, pool.gpus
    i64, f64 = np.int64, np.float64
    return DeviceState(np.array([r.gpu.index for r in reps], i64), np.array([r.model for r in reps], i64),
                       np.array([r.share for r in reps], f64), np.array([r.mem_share for r in reps], f64),
                       np.array([r.state for r in reps], i64), np.array([r.seg for r in reps], i64),
                       np.array([r.t0 for r in reps], f64), np.array([len(g.replicas) for g in gpus], i64),
                       np.array([g.clock_idx for g in gpus], i64), np.array([g.floor_w for g in gpus], f64))


def free_blocks(pool) -> list[int]:
    """Each replica's free KV blocks, on either engine."""
    from commitenv.sim.kernel.layout import R_FREE

    if pool._ks is not None:
        return pool._ks.ri[: pool._ks.R, R_FREE].tolist()
    return [r.free_blocks for r in pool.replicas]
