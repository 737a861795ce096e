"""The `festina` controller: Festina's three time scales on a commitenv pool (one model, or several sharing the
GPUs).

* per arrival: the global scheduler (`FestinaDispatch`, one per model, each on its model's LUT);
* per step: the local scheduler (`FestinaLocal`: task order, clock sweep);
* per interval: serverless scaling and SM partitions. A model keeps as many active instances as had work or were
  dispatched to during the last ``keep_alive_s`` (the paper's keep-alive trigger), plus one for every scale-out its
  dispatcher asked for since the last interval (an arrival no active instance could serve in time), at least one; each GPU's SM shares follow the shares its instances' local schedulers needed (the largest
  since the last interval, floored at the profile's minimum), scaled so the GPU's shares sum to 1.

What this environment does not offer yet, and so this controller does not do: moving a model instance to another
GPU (placement is the scenario's; the EWR-aware replacement of `consolidation` plans it but cannot apply it) and
migrating running requests. Deactivating every instance on a GPU lets it fall to standby power, which is where
consolidation saves its energy here. The interval's ``clock`` is left to the local schedulers (the action repeats
the clock the GPUs were set to at reset, so the environment changes nothing on its own).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from commitenv.control import ArrivalView, CandidateView, Controller, DispatchPolicy
from commitenv_controllers.festina.dispatch import FestinaDispatch
from commitenv_controllers.festina.local import FestinaLocal
from commitenv_controllers.festina.lut import FestinaLUT
from commitenv_controllers.registry import register


class _PerModel(DispatchPolicy):
    """Routes each arrival with its model's dispatcher."""

    name = "festina"
    wants_load = True

    def __init__(self, per_model: list[FestinaDispatch]) -> None:
        self.per_model = per_model
        self.last_pick: dict[int, float] = {}  # replica -> time a request was last dispatched to it

    def choose(self, req: ArrivalView, replicas: tuple[CandidateView, ...]) -> int:
        pick = self.per_model[req.model].choose(req, replicas)
        self.last_pick[pick] = req.t
        return pick


@register("festina")
class Festina(Controller):
    """Festina (shared GPUs, energy first, SLOs as constraints); see the module docstring."""

    def __init__(self, keep_alive_s: float = 120.0, beta: float = 0.1, pad: float = 0.05, tie: float = 0.02,
                 scale_shares: bool = True) -> None:
        if keep_alive_s < 0 or not math.isfinite(keep_alive_s):
            raise ValueError(f"keep_alive_s: expected a finite number of seconds >= 0, got {keep_alive_s}")
        self.keep_alive_s = float(keep_alive_s)
        self.beta, self.pad, self.tie = float(beta), float(pad), float(tie)
        self.scale_shares = bool(scale_shares)

    def reset(self, ctx, seed: int | None = None) -> None:
        super().reset(ctx, seed)
        profiles = list(ctx.profiles) if ctx.shared else [ctx.profile]
        self.luts = [FestinaLUT.from_profile(p) for p in profiles]
        self.dispatchers = [FestinaDispatch(lut, pad=self.pad, tie=self.tie) for lut in self.luts]
        self._dispatch = _PerModel(self.dispatchers)
        self._local = FestinaLocal(self.luts, beta=self.beta)
        if ctx.shared:
            self.model_of = [m for g in ctx.placement for m, _ in g]
            self.gpu_of = [g for g, insts in enumerate(ctx.placement) for _ in insts]
            self.shares = [s for g in ctx.placement for _, s in g]
            self.n_per_model = list(ctx.replicas_per_model)
        else:
            self.model_of = [0] * ctx.n_replicas
            self.gpu_of = list(range(ctx.n_replicas))
            self.shares = [1.0] * ctx.n_replicas
            self.n_per_model = [ctx.n_replicas]
        self.last_busy = [0.0] * len(self.model_of)
        self.active = list(self.n_per_model)
        self.scale_outs = 0

    def dispatch_policy(self) -> DispatchPolicy:
        return self._dispatch

    def local_policy(self) -> FestinaLocal:
        return self._local

    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict:
        ctx = self.ctx
        snap = ctx.probe.snapshot()
        t = snap.t
        reps = snap.replicas
        busy = (reps.running + reps.waiting) > 0
        for r in np.flatnonzero(busy).tolist():
            self.last_busy[r] = t
        picked = self._dispatch.last_pick
        warm = [t - max(self.last_busy[r], picked.get(r, -math.inf)) < self.keep_alive_s
                for r in range(len(self.model_of))]
        for m in range(len(self.n_per_model)):
            outs, _ = self.dispatchers[m].pop_requests()  # arrivals no active instance could serve in time
            self.scale_outs += outs
            need = sum(1 for r, mm in enumerate(self.model_of) if mm == m and warm[r]) + outs
            self.active[m] = max(1, min(self.n_per_model[m], need))
        clock = info.get("clock_mhz", ctx.reference_clock_mhz)
        if clock not in ctx.clocks_mhz:
            clock = ctx.reference_clock_mhz
        if not ctx.shared:
            return ctx.action(self.active[0], clock)
        shares = self._shares()
        return ctx.action(tuple(self.active), clock, shares=shares)

    def _shares(self) -> list[float]:
        """Each GPU's SM split: its instances' needed shares since the last interval (at least the profile's
        minimum; the placed share when nothing was measured), scaled to sum to 1 on the GPU."""
        peaks = self._local.reset_peaks()
        if not self.scale_shares:
            return list(self.shares)
        mins = [p.sm_share.min_share for p in self.ctx.profiles]
        want = [max(peaks.get(r, self.shares[r]), mins[self.model_of[r]]) for r in range(len(self.shares))]
        out = list(self.shares)
        for g in set(self.gpu_of):
            idx = [r for r in range(len(out)) if self.gpu_of[r] == g]
            lo = {r: mins[self.model_of[r]] for r in idx}
            tot = sum(want[r] for r in idx)
            w = {r: max(lo[r], want[r] / tot) for r in idx}  # proportional, at least each minimum
            over = sum(w.values()) - 1.0
            room = sum(w[r] - lo[r] for r in idx)
            if over > 0 and room > 0:  # take the excess from the shares above their minimum, in proportion
                w = {r: w[r] - over * (w[r] - lo[r]) / room for r in idx}
            for r in idx:  # on a 1/1000 grid, never below the minimum, never summing above 1
                out[r] = max(lo[r], math.floor(w[r] * 1000 + 1e-9) / 1000)
        self.shares = out
        return out

    def stats(self) -> dict[str, float]:
        d = {k: sum(x.decisions.get(k, 0) for x in self.dispatchers) for k in ("energy", "fallback_max_clock",
                                                                                "infeasible")}
        return {"festina_scale_outs": float(self.scale_outs), "festina_local_calls": float(self._local.calls),
                **{f"festina_dispatch_{k}": float(v) for k, v in d.items()}}
