"""The ``dynamollm`` controller: the slow loop's instance plan and the fast loop's clocks, every interval;
registered as ``dynamollm``."""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from typing import Any, Literal

import numpy as np

from commitenv.control import Snapshot
from commitenv_controllers.base import Controller, ControllerContext
from commitenv_controllers.dynamollm.capacity import REP_OUTPUT, REP_PROMPT, ClassCapacity, ClockLaws, class_capacity
from commitenv_controllers.dynamollm.fast_loop import (arrivals_work, choose_clock, estimate_queue,
                                                       transition_energy_j)
from commitenv_controllers.dynamollm.shared import gpu_clocks_mhz, model_view
from commitenv_controllers.dynamollm.slow_loop import Plan, _require_ortools, forecast_load, plan_replicas
from commitenv_controllers.registry import register


class _ModelProbe:
    """One model's probe on a shared pool: the owner's current `model_view` and the model's recent arrivals."""

    def __init__(self, owner: "DynamoLLMController", model: int) -> None:
        self.owner, self.model = owner, model

    def snapshot(self) -> Snapshot:
        """The model's view of the snapshot the owner took this step."""
        return self.owner._views[self.model]

    def recent_arrivals(self, window_s: float) -> Any:
        """The pool's recent arrivals served by this model."""
        ctx = self.owner.ctx
        table = ctx.probe.recent_arrivals(window_s)
        rows = ctx.model_of_tenants(table.tenant_names)[np.asarray(table.tenant, dtype=np.int64)]
        return table.take(np.flatnonzero(rows == self.model))

    def report_planning_delay(self, seconds: float) -> None:
        """Not forwarded: the per-model decisions are combined into one action by the owner."""


@register("dynamollm")
class DynamoLLMController(Controller):
    """DynamoLLM (HPCA 2025) as the ePACT paper evaluates it: energy-minimizing instance count and clock;
    see the module docstring for the design and the deviations this environment imposes."""

    _share: float = 1.0  # SM share the profile's laws are taken at (a model's smallest placed share on a shared pool)

    def __init__(
        self,
        replan_s: float = 1800.0,
        warmup_s: float | None = None,
        forecast_window_s: float | None = None,
        forecast: Literal["peak", "mean"] = "peak",
        bucket_s: float = 300.0,
        headroom: float = 1.1,
        slo_frac: float = 0.5,
        pool_clock: bool = True,
        max_util: float = 0.85,
        urgent_frac: float = 0.05,
        urgent_min: int = 2,
        queue_per_replica: float = 8.0,
        escalation_factor: float = 2.0,
        escalation_hold_s: float = 300.0,
        rep_prompt: tuple[int, ...] = REP_PROMPT,
        rep_output: tuple[int, ...] = REP_OUTPUT,
        profile: Any = None,
    ) -> None:
        _require_ortools()
        if forecast not in ("peak", "mean"):
            raise ValueError(f"dynamollm forecast: expected 'peak' or 'mean', got {forecast!r}")
        if replan_s <= 0 or headroom <= 0 or not 0 < slo_frac <= 1 or not 0 < max_util <= 1:
            raise ValueError("dynamollm: replan_s, headroom > 0 and slo_frac, max_util in (0, 1] expected")
        self.replan_s = float(replan_s)
        self.warmup_s = warmup_s
        self.forecast_window_s = forecast_window_s
        self.forecast = forecast
        self.bucket_s = float(bucket_s)
        self.headroom = float(headroom)
        self.slo_frac = float(slo_frac)
        self.pool_clock = bool(pool_clock)
        self.max_util = float(max_util)
        self.urgent_frac = float(urgent_frac)
        self.urgent_min = int(urgent_min)
        self.queue_per_replica = float(queue_per_replica)
        self.escalation_factor = float(escalation_factor)
        self.escalation_hold_s = float(escalation_hold_s)
        self.rep_prompt = tuple(rep_prompt)
        self.rep_output = tuple(rep_output)
        self._profile_override = profile

    # ------------------------------------------------------------------------------------------ setup
    def reset(self, ctx: ControllerContext, seed: int | None = None) -> None:
        super().reset(ctx, seed)
        if ctx.probe is None:
            raise ValueError("dynamollm needs ctx.probe (the env): build the context with ControllerContext.from_env(env)")
        if ctx.shared:
            self._reset_shared(ctx, seed)
            return
        self.laws: ClockLaws | None = None
        self.cap: ClassCapacity | None = None
        prof = self._profile_override if self._profile_override is not None else ctx.profile
        if prof is None:
            raise ValueError("dynamollm needs the pool's profile: ControllerContext.profile (from_env sets it) "
                             "or the 'profile' argument")
        self._setup(prof)
        self.warmup = ctx.interval_s if self.warmup_s is None else float(self.warmup_s)
        self.window = self.replan_s if self.forecast_window_s is None else float(self.forecast_window_s)
        self.next_plan_t = self.warmup
        self.plan: Plan | None = None
        self.load = np.zeros(9)
        self.n_cmd: int | None = None
        self.esc_n = 0
        self.esc_until = -math.inf
        self.log: list[dict[str, Any]] = []

    def _setup(self, profile: Any) -> None:
        self.laws = ClockLaws.of(profile, self._share)
        if self.laws.mhz != tuple(self.ctx.clocks_mhz):
            raise ValueError(f"dynamollm: profile clocks {self.laws.mhz} differ from the scenario's {self.ctx.clocks_mhz}")
        self.cap = class_capacity(self.laws, self.ctx.alpha, self.slo_frac, self.rep_prompt, self.rep_output)

    def _reset_shared(self, ctx: ControllerContext, seed: int | None) -> None:
        """One one-model DynamoLLM per model of a shared pool, on its profile, instances and arrivals."""
        self._views: list[Snapshot] = []
        subs = []
        for m, prof in enumerate(ctx.profiles):
            sub = copy.copy(self)
            sub._profile_override = None
            sub._share = min(s for gpu in ctx.placement for mm, s in gpu if mm == m)
            sub.reset(replace(ctx, n_replicas=ctx.replicas_per_model[m], reference_clock_mhz=prof.reference_clock_mhz,
                              profile=prof, probe=_ModelProbe(self, m), hindsight=None, models=(),
                              replicas_per_model=(), placement=(), profiles=()), seed)
            subs.append(sub)
        self.subs: list[DynamoLLMController] = subs
        self.decisions: list[tuple[int, int]] = []  # (active, clock MHz) per model, from the last act
        self.log = []

    def _act_shared(self, observation: np.ndarray, info: dict[str, Any]) -> dict:
        """Each model's (active, clock) from its own DynamoLLM; each GPU at the highest clock its active instances
        need."""
        ctx = self.ctx
        snap = ctx.probe.snapshot()
        self._views = [model_view(snap, m) for m in range(len(ctx.models))]
        by_model = info.get("active_by_model")
        self.decisions = []
        for m, sub in enumerate(self.subs):
            sub_info = {"clock_mhz": self._views[m].clock_mhz, **({"active": by_model[m]} if by_model else {})}
            a = sub.act(observation, sub_info)
            self.decisions.append((a["active"], ctx.clocks_mhz[a["clock"]]))
        clocks = gpu_clocks_mhz(ctx.placement, self.decisions, ctx.clocks_mhz)
        self.log.append({"t": float(snap.t), "active": [a for a, _ in self.decisions],
                         "clock_mhz": [c for _, c in self.decisions], "gpu_clocks_mhz": clocks})
        return ctx.action(tuple(a for a, _ in self.decisions), max(clocks), clocks_mhz=clocks)

    # ------------------------------------------------------------------------------------------ helpers
    def _power(self, n: int) -> float:
        """Predicted pool power with ``n`` replicas at their best clock under the current forecast (inf if
        ``n`` cannot carry it)."""
        laws, cap = self.laws, self.cap
        p = plan_replicas(self.load, cap.rate, cap.dyn_j, laws.idle_w, laws.standby_w, self.ctx.n_replicas,
                          headroom=self.headroom, pool_clock=self.pool_clock, fixed_total=n, top=laws.top)
        return p.power_w if p.feasible else math.inf

    def _replan(self, t: float) -> None:
        laws, cap = self.laws, self.cap
        window = min(self.window, t)
        recent = self.ctx.probe.recent_arrivals(window) if window > 0 else None
        self.load = forecast_load(recent, window, t, bucket_s=self.bucket_s, mode=self.forecast)
        self.plan = plan_replicas(self.load, cap.rate, cap.dyn_j, laws.idle_w, laws.standby_w, self.ctx.n_replicas,
                                  headroom=self.headroom, pool_clock=self.pool_clock, top=laws.top)
        self.next_plan_t = t + self.replan_s

    def _transition_ok(self, cur: int, target: int, t: float) -> bool:
        """Change ``cur`` -> ``target`` replicas only if needed for capacity or if it pays for itself."""
        if target == cur:
            return False
        p_cur = self._power(cur)
        if not math.isfinite(p_cur):
            return True  # the current count cannot carry the forecast: capacity first
        p_tgt = self._power(target)
        saved = (p_cur - p_tgt) * max(self.next_plan_t - t, 0.0)
        return saved > transition_energy_j(cur, target, self.laws)

    # ------------------------------------------------------------------------------------------ act
    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict[str, int]:
        ctx = self.ctx
        if ctx.shared:
            return self._act_shared(observation, info)
        N = ctx.n_replicas
        snap = ctx.probe.snapshot()
        laws = self.laws
        t = float(snap.t)
        cur = int(info.get("active", self.n_cmd if self.n_cmd is not None else snap.active))  # as applied
        # slow loop
        if t + 1e-9 >= self.next_plan_t:
            self._replan(t)
        target = self.plan.active if self.plan is not None else cur
        if t < self.esc_until:
            target = max(target, self.esc_n)
        n = target if self._transition_ok(cur, target, t) else cur
        # fast loop on the current serving state
        est = estimate_queue(snap, laws)
        dt = ctx.interval_s
        recent = ctx.probe.recent_arrivals(dt) if t > 0 else None
        batch = max(1.0, len(est.slots) / max(snap.active, 1))
        fc_busy, fc_energy = arrivals_work(recent, laws, batch)
        # emergency escalation
        urgent = est.misses(laws.top)
        live = int(np.count_nonzero(est.deadline > t))
        need_now = math.ceil(fc_busy[laws.top] / (dt * self.max_util)) if fc_busy[laws.top] > 0 else 1
        emergency = (
            (urgent >= self.urgent_min and urgent >= self.urgent_frac * live)
            or est.waiting > self.queue_per_replica * max(cur, 1)
            or fc_busy[laws.top] > n * dt
        )
        if emergency:
            esc = max(n, cur + 1, math.ceil(cur * self.escalation_factor), need_now)
            n = min(N, esc)
            self.esc_n = n
            self.esc_until = t + self.escalation_hold_s
            clock = laws.top
        elif self.plan is None and not len(est.slots) and not fc_busy.any():
            clock = laws.mhz.index(int(info.get("clock_mhz", laws.mhz[laws.top])))  # nothing observed yet: hold
        else:
            clock, _, _ = choose_clock(est, laws, n, dt, fc_busy=fc_busy, fc_energy=fc_energy, max_util=self.max_util)
        self.n_cmd = n
        self.log.append({"t": t, "active": n, "clock_mhz": laws.mhz[clock], "emergency": bool(emergency),
                         "urgent": urgent, "live": live, "waiting": est.waiting,
                         "planned": self.plan.active if self.plan is not None else None})
        return ctx.action(n, laws.mhz[clock])
