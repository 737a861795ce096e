"""The `festina` controller: Festina's three time scales on a commitenv pool (one model, or several sharing the
GPUs).

* per arrival: the global scheduler (`FestinaDispatch`, one per model, each on its model's LUT);
* per step: the local scheduler (`FestinaLocal`: task order, clock sweep);
* per interval: serverless scaling and SM partitions. A model keeps as many active instances as had work or were
  dispatched to during the last ``keep_alive_s`` (the paper's keep-alive trigger), plus one for every scale-out its
  dispatcher asked for since the last interval (an arrival no active instance could serve in time), at least one
  (none where the scenario scales to zero: the engine wakes an instance for a request that finds none); each GPU's
  SM shares follow the shares its instances' local schedulers needed (the largest
  since the last interval, floored at the profile's minimum), scaled so the GPU's shares sum to 1.

Consolidation (sec. 3.5) on keep-alive expiry: when an instance's keep-alive has just run out, the instances that stay
active (the engine activates each model's lowest-index instances) are planned with `consolidation.plan_and_place`
(capacity planning on CP-SAT with delta = 5 % margins, then EWR-aware placement; per instance over the last
interval: the means of the clocks and of the SM shares its local scheduler chose, weighted by busy time, as F_l and
SM_l, the share of its GPU's usable memory it reserved as memory (capacity 1), its busy time; reservations are static, so memory gets no
delta margin). If the plan needs fewer GPUs than the active instances occupy, the groups go to the GPUs already
holding most of them (`consolidation.consolidated_placement`), idle instances make room at their minimum share (the
move is dropped when any GPU's memory shares, idle instances' included, would exceed 1), and, when the idle power
saved over a keep-alive (freed GPUs x (active idle at the top clock - standby)) outweighs the moved instances'
cold-start energy (the paper's scale-in condition, sec. 1), the action moves them with latency-aware migration of
their running requests (the engine's cold start and KV transfer, `commitenv.sim.migration`); no new check for
``keep_alive_s`` after a move. A GPU whose instances are all inactive falls to standby power. The interval's
``clock`` is left to the local schedulers (the action repeats the clock the GPUs were set to at reset, so the environment changes nothing on its own).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from commitenv.control import ArrivalView, CandidateView, Controller, DispatchPolicy
from commitenv_controllers.festina.consolidation import (LlmDemand, consolidated_placement, plan_and_place,
                                                         should_consolidate)
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
                 scale_shares: bool = True, consolidate: bool = True, delta: float = 0.05, local: bool = True,
                 dispatch: bool = True, keep_alive: bool = True) -> None:
        """``local``, ``dispatch``, ``keep_alive``: the ablation switches (off: the engine's vLLM scheduler at the
        interval's clock; its least-unfinished router, so no scale-out requests; every instance kept active)."""
        if keep_alive_s < 0 or not math.isfinite(keep_alive_s):
            raise ValueError(f"keep_alive_s: expected a finite number of seconds >= 0, got {keep_alive_s}")
        self.keep_alive_s = float(keep_alive_s)
        self.beta, self.pad, self.tie = float(beta), float(pad), float(tie)
        self.scale_shares = bool(scale_shares)
        if not 0.0 <= delta < 1.0:
            raise ValueError(f"delta: expected a safety margin in [0, 1) of the GPU's SMs, got {delta}")
        self.consolidate, self.delta = bool(consolidate), float(delta)
        self.use_local, self.use_dispatch, self.keep_alive = bool(local), bool(dispatch), bool(keep_alive)

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
        self.was_warm = [True] * len(self.model_of)
        self.hold_until = 0.0  # no consolidation check before (a keep-alive after the last move)
        self.consolidations = self.moved = 0

    def dispatch_policy(self) -> DispatchPolicy | None:
        return self._dispatch if self.use_dispatch else None

    def local_policy(self) -> FestinaLocal | None:
        return self._local if self.use_local else None

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
            low = 0 if ctx.scale_to_zero else 1  # (the engine wakes an instance for a request that finds none)
            self.active[m] = max(low, min(self.n_per_model[m], need)) if self.keep_alive else self.n_per_model[m]
        clock = info.get("clock_mhz", ctx.reference_clock_mhz)
        if clock not in ctx.clocks_mhz:
            clock = ctx.reference_clock_mhz
        usage = self._local.reset_usage()
        expired = any(a and not b for a, b in zip(self.was_warm, warm))
        self.was_warm = warm
        if not ctx.shared:
            return ctx.action(self.active[0], clock)
        moved = None
        if self.consolidate and expired and t >= self.hold_until:
            moved = self._consolidated(usage, reps.memory_share.tolist())
        shares = self._shares()
        if moved is None:
            return ctx.action(tuple(self.active), clock, shares=shares)
        self.hold_until = t + self.keep_alive_s
        return ctx.action(tuple(self.active), clock, shares=shares, placement=self.gpu_of, migrate="latency_aware")

    def _consolidated(self, usage: dict[int, tuple[float, float, float]], mem_share: list[float]) -> list[int] | None:
        """Festina's replacement of the instances that stay active (module docstring); updates ``gpu_of`` and
        ``shares`` and returns the replicas that move, or None when the plan saves no GPU or does not fit."""
        profiles = self.ctx.profiles
        mins = [profiles[m].sm_share.min_share for m in self.model_of]
        keep = [r for m in range(len(self.n_per_model))
                for r in [r for r, mm in enumerate(self.model_of) if mm == m][: self.active[m]]]
        top = float(max(self.ctx.clocks_mhz))
        cap = 1.0 - self.delta
        want, demands = {}, []
        for r in keep:
            busy, f, sm = usage.get(r, (0.0, top, mins[r]))
            want[r] = min(max(sm, mins[r]), cap)
            demands.append(LlmDemand(str(r), f, want[r], mem_share[r], busy))  # memory in GPUs' usable memory
        try:  # a reservation does not fluctuate: the delta margin applies to SMs only
            _, res = plan_and_place(demands, gpu_mem_cap_gb=1.0 / (1.0 - self.delta), delta=self.delta,
                                    time_limit_s=2.0)
        except ValueError:
            return None
        now_gpus, planned = len({self.gpu_of[r] for r in keep}), len(res.placement.active_gpus)
        if not should_consolidate(now_gpus, planned):
            return None
        groups = [[int(i) for i in ids] for ids in res.placement.assignment.values() if ids]
        shares = [want.get(r, mins[r]) for r in range(len(self.model_of))]
        new = consolidated_placement(groups, self.gpu_of, shares, mins)
        if new is None or any(sum(mem_share[r] for r in range(len(new)) if new[r] == g) > 1.0 + 1e-9 for g in set(new)):
            return None
        moved = [r for r, (a, b) in enumerate(zip(self.gpu_of, new)) if a != b]
        # scale in only when the idle power saved over a keep-alive outweighs the moves' cold starts (sec. 1)
        p0 = profiles[0]
        saved_j = (now_gpus - planned) * (p0.clocks[-1].active_idle_w - p0.standby_w) * self.keep_alive_s
        cost_j = sum(profiles[self.model_of[r]].latencies.load_energy_j or 0.0 for r in moved)
        if not saved_j > cost_j:
            return None
        self.gpu_of, self.shares = new, shares
        self.consolidations += 1
        self.moved += len(moved)
        return moved

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
                "festina_consolidations": float(self.consolidations), "festina_moved_instances": float(self.moved),
                **{f"festina_dispatch_{k}": float(v) for k, v in d.items()}}
