"""Copies of a pool: `Pool.clone` (a what-if snapshot of the serving state), the copies of its devices that a fork
or a hand-back from the kernel makes (`copy_devices`), captured requests and replayed arrivals."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Self

import numpy as np

from commitenv.sim.gpu import GPU
from commitenv.sim.kernel.layout import G_CLOCK, G_NHOST, R_CAP, R_GPU, R_MEM, R_MODEL, R_SHARE
from commitenv.sim.prefix_cache import PrefixCache
from commitenv.sim.replica import Replica
from commitenv.sim.request import Req
from commitenv.sim.states import ACTIVE, EV_CLOCK, EV_LAND, EV_LOAD, EV_SEG, EV_WAKE, LOADING, WAKING
from commitenv.sim.terms import _capped_lref
from commitenv.sim.truth import NominalModel
from commitenv.workload.table import RequestTable

REPLAY_SLOT_BASE = 1 << 40  # slot of the i-th replayed (hypothetical) arrival in a what-if copy: base + i


def _kernel_on() -> bool:
    """Whether the compiled loop is switched on (`commitenv.sim.kernel.ENABLED`): off, copies are made as the Python
    loop makes them."""
    from commitenv.sim.kernel import state

    return state.ENABLED


def copy_devices(gpus: list[GPU], replicas: list[Replica], c: "Copies", cr) -> dict[int, Replica]:
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


@dataclass(frozen=True)
class DeviceSpec:
    """What a pool the kernel runs from the start (a new pool, a what-if copy made on the kernel) needs to build device
    objects if anything asks for them (`Copies.build_devices`): the model whose profile sets each GPU's idle floor,
    each GPU's power factor."""

    gpu_model: tuple[int, ...]
    power: tuple[float, ...]


class Copies:
    """`Pool`'s copies and what-if replay (mixed into `Pool`)."""

    def clone(self, *, hide_lengths: bool, own_profiles: bool = False) -> Self:
        """A copy of the serving state at ``now`` holding only arrived, unfinished requests; with
        ``hide_lengths`` each request runs to its predicted output length (and carries its visible deadline)
        instead of the true one. The copy has no workload, no noise and no step log; its meters start at zero.
        It shares no mutable object with this pool; under a truth model (realism levels) it is nominal: the
        step in flight runs at nominal speed and power, and the GPUs draw the profile's idle power. With
        ``own_profiles`` (a controller's snapshot) the copy gets deep copies of the profiles, so nothing written
        into them can reach the truth or the process-wide profile cache."""
        ks = self._ks
        c = type(self).__new__(type(self))
        c.profiles = [p.model_copy(deep=True) for p in self.profiles] if own_profiles else list(self.profiles)
        c.layout, c.n_models, c.replica_models = self.layout, self.n_models, self.replica_models
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
        # no workload, counters from zero, the pool's policies (the copy's requests carry the lengths and deadlines
        # it runs to)
        c.moves = c.cold_starts = c.migrated = 0
        c.migration_bytes = c.migration_j = 0.0
        c._pending = []
        c._arr, c._cursor, c._n = [], 0, 0
        c._hashes = None
        c.table = None
        c.pred_out = None
        c.dispatch, c.dispatch_s, c.dispatch_calls = self.dispatch, 0.0, 0
        c.local_s, c.local_calls = 0.0, 0
        c.local_policies = list(self.local_policies)  # a what-if copy plans its steps as the original does
        c._slot_base, c._n_results, c._capture_arrivals = 0, 0, False
        c.captured_left, c.captured_finish = 0, {}
        if ks is not None and ks.can_clone() and _kernel_on():
            self._clone_on_kernel(c, ks, hide_lengths, nominal)
            return c
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
        return c

    def _clone_on_kernel(self, c: Self, ks, hide_lengths: bool, nominal: bool) -> None:
        """`clone`'s state made from the kernel's arrays (`KernelState.whatif_copy`): the copy runs on the compiled loop
        from the start and shares no object with this pool; its replica and GPU objects are built from its arrays only
        if it ever hands back to the Python loop (`build_devices`)."""
        ef = c.noise.energy_factor if isinstance(c.noise, NominalModel) else 1.0
        hide = (self.pred_out, self.visible_deadline, self._n_results) if hide_lengths and self._n_results else None
        c._ks = ks.whatif_copy(hide=hide, nominal=nominal, energy_factor=ef, profiles=c.profiles)
        own = self.__dict__.get("_devices_shared")
        if "_replicas" in self.__dict__ or not isinstance(own, DeviceSpec):
            gpu_model = tuple(next(m for m, p in enumerate(self.profiles) if p is g.profile) for g in self._gpus)
        else:  # (a pool without device objects: a new one, or a copy made on the kernel)
            gpu_model = own.gpu_model
        c._devices_shared = DeviceSpec(gpu_model, (ef,) * len(gpu_model))
        c.routable = [[] for _ in range(c.n_models)]
        c.unrouted, c.transit = [], {}
        c.sync_from_kernel(c._ks)  # (clock and counters)

    def _build_objects(self, cidx: int, caps: list[int], power: tuple[float, ...]) -> None:
        """The Python loop's GPU and replica objects of a new pool (`COMMITENV_KERNEL=0`): idle, at clock level
        ``cidx``, with KV blocks ``caps`` and power factors ``power``."""
        self.gpus, self.replicas = [], []
        for g, insts in enumerate(self.layout.gpus):
            gpu = GPU(g, cidx, self.profiles[insts[0].model])
            gpu.power_factor = power[g]
            for inst in insts:
                rep = Replica(len(self.replicas), gpu, self.profiles[inst.model], inst.model, inst.share)
                rep.cap_blocks = rep.free_blocks = caps[rep.index]
                gpu.replicas.append(rep)
                self.replicas.append(rep)
            self.gpus.append(gpu)
        for gpu in self.gpus:
            gpu.update_floor(0.0)

    def build_devices(self, ks, spec: "DeviceSpec") -> None:
        """A pool without device objects (a new pool, a what-if copy made on the kernel): its GPU and replica objects,
        new and idle (a hand-back writes their state), unless built already; a prefix cache on each when the kernel
        keeps them."""
        if "_replicas" in self.__dict__:
            if ks._pa is not None:
                for rep in self._replicas:
                    if rep.pcache is None:
                        rep.pcache = PrefixCache.__new__(PrefixCache)
                        rep.pcache.entries = {}
            return
        gpus = [GPU(g, int(ks.gi[g, G_CLOCK]), self.profiles[m]) for g, m in enumerate(spec.gpu_model)]
        reps = []
        for x in range(ks.R):
            model = int(ks.ri[x, R_MODEL])
            rep = Replica(x, gpus[int(ks.ri[x, R_GPU])], self.profiles[model], model, float(ks.rf[x, R_SHARE]))
            rep.cap_blocks, rep.mem_share = int(ks.ri[x, R_CAP]), float(ks.rf[x, R_MEM])
            if ks._pa is not None:  # (filled by the hand-back)
                rep.pcache = PrefixCache.__new__(PrefixCache)
                rep.pcache.entries = {}
            reps.append(rep)
        for g, f in zip(gpus, spec.power):
            g.power_factor = f
            g.replicas = [reps[x] for x in ks.gh[g.index, : ks.gi[g.index, G_NHOST]].tolist()]
        self._gpus, self._replicas = gpus, reps

    def place(self, running: list[list[Req]], waiting: list[list[Req]], unrouted: list[Req], states: list[int]) -> None:
        """A serving state assembled outside the engine (a hardware pool's mirror) written into this new pool at its
        clock: per replica its lifecycle state (ACTIVE, DRAINING or STANDBY), running requests (holding their KV
        blocks) and waiting ones, in order; the requests no replica took. `resume` then starts what has work."""
        if self._ks is not None:
            from commitenv.sim.kernel.fresh import place_requests

            place_requests(self._ks, self, running, waiting, unrouted, states)
            self.sync_from_kernel(self._ks)
            return
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
        if self._ks is not None:
            self._ks.resume(t, self)
            self._sync_kernel()
            return
        for rep in self.replicas:
            if rep.has_work():
                self._poke(rep, t)
        self._flush(t)

    def capture_all(self, *, arrivals: bool = False) -> None:
        """Mark every live request as captured (what-if runs report their completion times); with ``arrivals`` the
        requests arriving from now on too."""
        self.captured_finish = {}
        self._capture_arrivals = arrivals
        if self._ks is not None:
            self._ks.capture_live(arrivals)
            self.captured_left = self._ks.captured_left
            return
        reqs = self.live_requests()
        for r in reqs:
            r.captured = True
        self.captured_left = len(reqs)

    def attach_replay(self, table: RequestTable) -> None:
        """Add hypothetical arrivals (absolute times >= now, lengths as the controller assumes them)."""
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
        if self._ks is not None:
            from commitenv.sim.kernel.rows import _Rows

            self._ks.attach_rows(_Rows.of(self), REPLAY_SLOT_BASE)
