"""Copies of a pool: `Pool.clone` (a what-if snapshot of the serving state), a serving state placed from outside (a
hardware pool's mirror), captured requests and replayed arrivals."""

from __future__ import annotations

from dataclasses import replace
from typing import Self

import numpy as np

from commitenv.sim.kernel.fresh import place_requests
from commitenv.sim.kernel.rows import _Rows
from commitenv.sim.request import Req
from commitenv.sim.terms import _capped_lref
from commitenv.sim.truth import NominalModel
from commitenv.workload.table import RequestTable

REPLAY_SLOT_BASE = 1 << 40  # slot of the i-th replayed (hypothetical) arrival in a what-if copy: base + i


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
        c = type(self).__new__(type(self))
        c.profiles = [p.model_copy(deep=True) for p in self.profiles] if own_profiles else list(self.profiles)
        c.layout, c.n_models, c.replica_models = self.layout, self.n_models, self.replica_models
        c.tenant_model = dict(self.tenant_model)
        c.opt = replace(self.opt, log_steps=False, truth=None, seed=0)  # the run seed would regenerate the trace
        nominal = self.truth is not None
        c.now = self.now
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
        c._arr, c._cursor, c._n = [], 0, 0
        c._hashes = None
        c.table = None
        c.pred_out = None
        c.dispatch, c.dispatch_s, c.dispatch_calls = self.dispatch, 0.0, 0
        c.local_s, c.local_calls = 0.0, 0
        c.local_policies = list(self.local_policies)  # a what-if copy plans its steps as the original does
        c._slot_base, c._n_results, c._capture_arrivals = 0, 0, False
        c.captured_left, c.captured_finish = 0, {}
        self._clone_state(c, hide_lengths, nominal)
        return c

    def _clone_state(self, c: Self, hide_lengths: bool, nominal: bool) -> None:
        """`clone`'s serving state made from the kernel's arrays (`KernelState.whatif_copy`), sharing nothing with
        this pool."""
        ks = self._ks
        if not ks.can_clone():  # (a pool takes every result and log entry after each kernel call)
            raise RuntimeError("clone: the kernel state holds results or log entries not yet taken, or a pending start")
        ef = c.noise.energy_factor if isinstance(c.noise, NominalModel) else 1.0
        hide = (self.pred_out, self.visible_deadline, self._n_results) if hide_lengths and self._n_results else None
        c._ks = ks.whatif_copy(hide=hide, nominal=nominal, energy_factor=ef, profiles=c.profiles)
        c.sync_from_kernel(c._ks)  # (clock and counters)

    def place(self, running: list[list[Req]], waiting: list[list[Req]], unrouted: list[Req], states: list[int]) -> None:
        """A serving state assembled outside the engine (a hardware pool's mirror) written into this new pool at its
        clock: per replica its lifecycle state (ACTIVE, DRAINING or STANDBY), running requests (holding their KV
        blocks) and waiting ones, in order; the requests no replica took. `resume` then starts what has work."""
        place_requests(self._ks, self, running, waiting, unrouted, states)
        self.sync_from_kernel(self._ks)

    def resume(self, t: float) -> None:
        """Start, at ``t``, every active or draining replica that holds work but runs no segment: a serving state
        assembled outside the engine (a hardware pool's mirror for what-if runs, `place`) continues from there."""
        self._ks.resume(t, self)
        self.sync_from_kernel(self._ks)

    def capture_all(self, *, arrivals: bool = False) -> None:
        """Mark every live request as captured (what-if runs report their completion times); with ``arrivals`` the
        requests arriving from now on too."""
        self.captured_finish = {}
        self._capture_arrivals = arrivals
        self._ks.capture_live(arrivals)
        self.captured_left = self._ks.captured_left

    def attach_replay(self, table: RequestTable) -> None:
        """Add hypothetical arrivals (absolute times >= now, lengths as the controller assumes them)."""
        if len(table) and table.arrival_s[0] < self.now - 1e-9:
            raise ValueError(f"replay arrivals start at {table.arrival_s[0]} before the snapshot time {self.now}")
        n = len(table)
        self._arr = table.arrival_s
        self._prompt = table.prompt_tokens
        self._n = n
        model_of = np.zeros(n, dtype=np.int64)
        for ten, m in self.tenant_model.items():
            model_of[table.tenant == ten] = m
        self._model = model_of
        self._cursor = 0
        self._slot_base = REPLAY_SLOT_BASE
        self._hashes = None  # replayed arrivals carry no prefix blocks
        lim = np.array([p.scheduler.context_limit for p in self.profiles])[model_of]
        self.rejected = np.asarray(table.prompt_tokens >= lim)
        out, lref = _capped_lref(self.profiles, table, model_of, table.output_tokens)
        self._out = out
        self._deadline = table.arrival_s + self.opt.alpha * lref
        self._attach_replay_rows()

    def _attach_replay_rows(self) -> None:
        self._ks.attach_rows(_Rows.of(self), REPLAY_SLOT_BASE)
