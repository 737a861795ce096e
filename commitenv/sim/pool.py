"""The serving pool: GPUs and replicas serving one or more models, driven by actions (active replicas, clocks, SM
shares, placement) and advanced by the compiled event loop (`commitenv.sim.kernel`).

One engine serves three uses (docs/architecture.md): ground truth inside the environment, the what-if
predictor (`commitenv.sim.whatif`, which runs this class on a snapshot copy), and scheduler replay.
The pool only ever holds requests that have arrived: the attached workload is read through a cursor.

`Pool` is assembled from sibling modules, one concern each: `commitenv.sim.results` (what each kernel call hands
back), `commitenv.sim.placement` (SM shares, moves), `commitenv.sim.hooks` (dispatch and local policies),
`commitenv.sim.copies` (clones, replay) and `commitenv.sim.terms` (per-request terms fixed at attach time).
"""

from __future__ import annotations

import math

import numpy as np

from commitenv.profiles.schema import Profile
from commitenv.sim.copies import REPLAY_SLOT_BASE, Copies  # noqa: F401
from commitenv.sim.dispatch import DispatchPolicy, make_dispatch
from commitenv.sim.hooks import PolicyHooks
from commitenv.sim.kernel.fresh import fresh_state, placement_caps
from commitenv.sim.kernel.state import KernelState
from commitenv.sim.local import LocalPolicy
from commitenv.sim.noise import NoiseSource
from commitenv.sim.placement import Placement
from commitenv.sim.records import (EngineOptions, InFlightPart, Instance, PoolLayout, StepLogBatch,  # noqa: F401
                                   StepLogEntry)
from commitenv.sim.results import KernelResults, _KernelPolicy, _StepSink
from commitenv.sim.terms import RequestTerms, prediction_rng, request_terms  # noqa: F401
from commitenv.sim.truth import TruthSource
from commitenv.workload.table import RequestTable
from commitenv.workload.transforms import concat_tables

INF = math.inf


class Pool(KernelResults, Placement, PolicyHooks, Copies):
    """A pool of GPUs serving one or more models with vLLM scheduling semantics, run by the compiled event loop
    (`commitenv.sim.kernel`): its state is the kernel's arrays, built from the layout (`commitenv.sim.kernel.fresh`);
    snapshots, what-if copies, forks and step logs are read off them."""

    # a copy that keeps no per-request results (a hindsight fork) counts here, by arrival hour (int64, one entry per
    # hour of the workload, `late_hours`), the requests that finished after their deadline or were rejected; None:
    # results are recorded per request (`finish_t`, ...)
    late_done: np.ndarray | None = None
    dispatch: DispatchPolicy | None = _KernelPolicy()
    # optional callable(StepLogEntry), called as each segment (or part) is booked (in booking order when the engine
    # call that booked it returns; a hook with a ``take_batch`` method gets them as a `StepLogBatch`)
    on_step = _StepSink()
    log: list[StepLogEntry] | None = _StepSink()  # every booked segment, with `EngineOptions.log_steps`

    def stop_arrivals(self) -> None:
        """No request arrives after the ones already in: the rest of the workload is dropped from this pool's future
        (a hindsight estimate's premise)."""
        self._n = self._cursor
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
        placement_caps(self.profiles, layout)  # (raises for an instance that cannot hold one request, a GPU overfull)
        # the model each replica serves, in index order (layout order; an instance keeps its model when it moves)
        self.replica_models: tuple[int, ...] = tuple(inst.model for insts in layout.gpus for inst in insts)
        n_gpus, n_reps = len(layout.gpus), len(self.replica_models)
        self.n_models = len(self.profiles)
        self.now = 0.0
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
        self.moves = 0  # instance moves ordered (`move`)
        self.cold_starts = 0  # instance loads begun
        self.migrated = 0  # running requests sent to another instance with their KV
        self.migration_bytes = 0.0
        self.migration_j = 0.0  # link energy of those transfers (metered on the source GPUs)
        self.events = 0  # processed events (arrivals and heap events), for benchmarks
        self.live = 0  # arrived, unfinished requests
        self.completed = 0
        # workload cursor
        self._arr: np.ndarray = np.empty(0)  # arrival times of the attached rows
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
        self._ks: KernelState = fresh_state(self, power)  # (actions before the workload is attached run there too)

    # ================================================================================ workload and results
    def attach(self, table: RequestTable, tenant_model: dict[int, int] | None = None, t_start: float = 0.0) -> None:
        """Serve ``table`` (arrivals are read causally, as the clock passes them); once per pool, before it serves."""
        self._bind_workload(table, tenant_model, t_start)
        self._ks.attach_workload(self)

    def _bind_workload(self, table: RequestTable, tenant_model: dict[int, int] | None, t_start: float) -> None:
        """The workload's rows and per-request terms (routing, lengths, deadlines, overheads, prefix blocks), the
        result arrays, and the cursor at ``t_start``."""
        n = len(table)
        self.table = table
        self._arr = table.arrival_s  # (arrays, not lists: a day's lists held 130 MB per pool)
        self._prompt = table.prompt_tokens
        self._n = n
        if tenant_model:
            for ten, m in tenant_model.items():
                if not 0 <= m < self.n_models:
                    raise ValueError(f"tenant_model: tenant {ten} mapped to model {m}, but the pool has {self.n_models}")
        self.tenant_model = dict(tenant_model or {})  # the scenario's routing of tenants to models (public)
        # the random terms' generators, kept so that rows added later (`extend`) continue their draws
        self._terms_rng = prediction_rng(self.opt)
        self._oh_rng = self.truth.overhead_rng() if self.truth is not None else None
        for name, a in self._row_arrays(table).items():
            setattr(self, name, a)
        self._alias_rows()
        self.done_slots: list[int] | None = None  # a list when the environment tracks completions (misses)
        self._n_results = n
        self._hashes = None  # prefix blocks, when the workload has them and caching is on
        if self.opt.prefix_caching and table.prefix_offsets is not None and table.prefix_hashes is not None:
            self._hashes = table.prefix_hashes.tolist()
            self._hoff = table.prefix_offsets.tolist()
        self._cursor = int(np.searchsorted(table.arrival_s, t_start, side="left"))
        self.now = max(self.now, t_start)

    # the per-request arrays, one entry per workload row (`_row_arrays`)
    _ROW_ARRAYS = ("model_of", "rejected", "out_tokens", "lref", "deadline", "pred_out", "visible_deadline",
                   "overhead_s", "finish_t", "first_t", "max_tbt_s", "replica_of", "preemptions")

    def _row_arrays(self, table: RequestTable) -> dict[str, np.ndarray | None]:
        """``table``'s per-request arrays (`_ROW_ARRAYS`): its model by tenant, its terms (drawing on the pool's
        generators), its truth overheads and empty results."""
        n = len(table)
        tm = np.zeros(n, dtype=np.int64)
        for ten, m in self.tenant_model.items():
            tm[table.tenant == ten] = m
        terms = request_terms(self.profiles, self.opt, table, tm, rng=self._terms_rng)
        return {"model_of": tm, "rejected": terms.rejected, "out_tokens": terms.out_tokens, "lref": terms.lref,
                "deadline": terms.deadline, "pred_out": terms.pred_out, "visible_deadline": terms.visible_deadline,
                "overhead_s": self.truth.request_overheads(n, self._oh_rng) if self.truth is not None else None,
                "finish_t": np.full(n, np.nan), "first_t": np.full(n, np.nan),
                "max_tbt_s": np.full(n, np.nan),  # the longest gap between consecutive output tokens (per-token TBT)
                "replica_of": np.full(n, -1, dtype=np.int32), "preemptions": np.zeros(n, dtype=np.int32)}

    def _alias_rows(self) -> None:
        self._model, self._out, self._deadline = self.model_of, self.out_tokens, self.deadline

    def extend(self, rows: RequestTable) -> None:
        """Serve ``rows`` too: requests that arrive no earlier than the pool's clock and its last request (a router's
        next share, a streamed hour). Their terms continue the attached rows' random draws, so a workload attached
        whole or in arrival-ordered parts, each before the clock reaches it, is served alike."""
        if self.table is None or self._slot_base != 0 or self.late_done is not None:
            raise RuntimeError("extend: only a pool serving its own attached workload (not a copy) takes more rows")
        if self._hashes is not None or rows.prefix_offsets is not None:
            raise ValueError("extend: rows with prefix blocks cannot be added to a running pool (attach them whole)")
        if not len(rows):
            return
        first = float(rows.arrival_s[0])
        last = float(self.table.arrival_s[-1]) if len(self.table) else -INF
        if first < last or first < self.now:
            raise ValueError(f"extend: the rows start arriving at {first} s, before the pool's last request "
                             f"({last} s) or its clock ({self.now} s); expected later arrivals")
        table = concat_tables(self.table, rows)
        for name, a in self._row_arrays(rows).items():
            old = getattr(self, name)
            setattr(self, name, None if a is None else np.concatenate([old, a]))
        self._alias_rows()
        self.table, self._arr, self._prompt = table, table.arrival_s, table.prompt_tokens
        self._n = self._n_results = len(table)
        self._ks.extend_rows(self)

    @property
    def arrived(self) -> int:
        """Number of requests whose arrival has been processed."""
        return self._cursor

    # ================================================================================ the event loop
    def _kernel_now(self) -> KernelState:
        """The kernel's state with `EngineOptions.closed_form` as it is now: a caller may change it after attach, and
        the segments that start from then on follow it."""
        ks = self._ks
        ks.closed_form = self.opt.closed_form
        return ks

    def run_until(self, t_end: float, *, stop_when_captured_done: bool = False) -> None:
        """Advance the simulation through every event at or before ``t_end`` (with ``stop_when_captured_done``: or
        until every captured request has finished, which under a truth model needs a finite ``t_end``)."""
        if stop_when_captured_done and t_end == INF and self.truth is not None:
            raise ValueError("run_until: stopping at the captured requests under a truth model needs a finite t_end")
        self._kernel_now().advance(t_end, stop_when_captured_done, self)
        self.sync_from_kernel(self._ks)

    def active_count(self, model: int = 0) -> int:
        """Replicas of ``model`` that are active or waking, or moving to become active (the configured count)."""
        return self._ks.active_count(model)

    def set_active(self, t: float, count: int, model: int = 0) -> None:
        """Make the first ``count`` replicas of ``model`` active (waking from standby takes the profile's
        activation latency; a draining one resumes at once) and drain the rest."""
        if t < self.now - 1e-9:
            raise ValueError(f"set_active at t={t} precedes the engine clock {self.now}")
        self._kernel_now().set_active(t, count, model, self)
        self.sync_from_kernel(self._ks)

    def set_clock(self, t: float, mhz: int, gpus: list[int] | None = None) -> None:
        """Request clock ``mhz`` on ``gpus`` (all by default); it applies after the profile's clock-change
        latency, and a step already running finishes at the old clock."""
        if t < self.now - 1e-9:
            raise ValueError(f"set_clock at t={t} precedes the engine clock {self.now}")
        self._ks.set_clock(t, mhz, gpus)

    # ================================================================================ metering
    def settle(self, t: float) -> None:
        """Cut every decode run at the first step end >= ``t`` and apply the steps that ended before, so each
        replica has at most one step in flight. The environment calls this at every decision boundary
        (whether or not a controller looks), so observation never changes the ground truth."""
        self._ks.settle(t)
        self._take_log(self._ks)

    def in_flight(self, t: float) -> list[InFlightPart]:
        """The logged segments in flight that started before ``t``, each with what the meter has counted of it by
        ``t`` (an online attribution prices them at a period's end), in replica order."""
        return self._ks.in_flight(t)

    def energy_j(self, t: float | None = None) -> float:
        """Pool energy (J) metered from the start to ``t`` (default: now)."""
        return sum(self.gpu_energy_j(t).tolist())  # (summed in GPU order)

    def gpu_energy_j(self, t: float | None = None) -> np.ndarray:
        """Each GPU's energy (J) metered from the start to ``t`` (default: now)."""
        return self._ks.meter(self.now if t is None else t)

    # ================================================================================ state views
    def counts(self) -> dict[str, int]:
        """Queue and running counts across the pool (what a controller may observe)."""
        w, run = self._ks.queue_counts()
        return {"waiting": w, "running": run, "live": self.live, "arrived": self._cursor, "completed": self.completed}

    def live_state(self) -> tuple[np.ndarray, np.ndarray]:
        """(slot, tokens left to compute before its next output token) of every live request, in replica order
        (each replica's running, then waiting requests; then the unrouted and migrating ones): what the
        environment's observation summarizes."""
        return self._ks.live_state()

    def live_deadlines(self) -> tuple[np.ndarray, np.ndarray]:
        """The live requests' workload rows and deadlines (the true ones in the ground truth), in no set order."""
        rows, dl = self._ks.live_deadlines()
        return rows - self._slot_base, dl

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

    captured_left = 0
