"""The ``oracle`` controller: plans the whole episode at reset on the ground truth (`forks.plan_engine`), then
replays the plan; registered as ``oracle``."""

from __future__ import annotations

import math
import os
import time
from typing import Any, Literal

import numpy as np

from commitenv.metrics import arrival_hours
from commitenv_controllers.base import Controller, ControllerContext
from commitenv_controllers.epact.search import Catalog
from commitenv_controllers.oracle.budgets import hour_miss_pace, miss_budget, miss_pace
from commitenv_controllers.oracle.dp import Plan, PlanTerms
from commitenv_controllers.oracle.forks import plan_engine, replay
from commitenv_controllers.registry import register


def _active_of(a: Any) -> int | tuple[int, ...]:
    """A configuration's active count as given: a whole number, or one per model (a shared pool)."""
    if isinstance(a, (list, tuple, np.ndarray)):
        return tuple(int(x) for x in a)
    return int(a)


@register("oracle")
class OracleController(Controller):
    """Hindsight bound: plans the whole episode at reset on the ground truth (true arrivals, lengths and
    deadlines), then replays the plan. Needs the hindsight door (evaluation opens it for this class only).

    Parameters: ``beam`` (DP states kept per interval), ``energy_grid`` (energy cell of the DP, as a fraction of the
    hour's per-interval commitment E*_h / K; 0, and always on an energy-only scenario: exact energies), ``estimate``
    (rank unfinished plans by their optimistic completion misses), ``screen_after`` / ``recheck`` (skip
    configurations over the miss budget from every state for that many intervals, re-trying them every ``recheck``
    intervals; 0: never skip),
    ``miss_weight_kwh`` (objective weight of a miss in kWh-eq; 0: the settlement cost alone, misses only within the
    constraint and as tie-break; None: the scenario's ``miss_penalty_kwh``), ``slo_rule`` and ``slo_slack`` (the
    miss budget of every arrival hour, see `miss_budget`; ``slo_slack`` replaces the scenario's epsilon there),
    ``max_misses`` (one pooled budget instead of the hourly ones), ``configs`` (the catalog as (active, clock MHz)
    pairs, the active count one per model on a shared pool; None: ePACT's catalog of ``replica_levels`` x
    ``clock_levels``, on a shared pool pool-wide totals spread over the models as ePACT spreads them,
    `ControllerContext.spread_active`), ``include_vllm`` (keep vLLM's schedule
    as an incumbent), ``pace_misses`` (pace each hour's budget within the hour, `hour_miss_pace`, or a pooled one
    over the episode, `miss_pace`: a state is kept as feasible while its estimated misses are within the budget's
    share of the requests arrived so far, or vLLM's misses by then; None: on for episodes of more than one hour),
    ``workers`` (processes expanding the DP; None: one per core; 0: this process; the plan does not depend on it),
    ``progress`` (print each planned interval)."""

    hindsight = True  # the door: this class's ctx carries hindsight; its runs are marked and the leaderboard refuses it

    def __init__(self, beam: int = 6, energy_grid: float = 0.02, estimate: bool = True, screen_after: int = 2,
                 recheck: int = 10, miss_weight_kwh: float | None = 0.0,
                 slo_rule: Literal["gate", "vllm_minus_epsilon"] = "gate", slo_slack: float | None = None,
                 max_misses: int | None = None, configs: list[tuple[int, int]] | None = None,
                 replica_levels: int = 8, clock_levels: int = 5, include_vllm: bool = True,
                 pace_misses: bool | None = None, workers: int | None = None, progress: bool = False) -> None:
        if beam < 1:
            raise ValueError(f"beam: expected at least 1 state per interval, got {beam}")
        if not (energy_grid >= 0 and math.isfinite(energy_grid)):
            raise ValueError(f"energy_grid: expected a fraction >= 0 of the per-interval commitment, got {energy_grid}")
        if screen_after < 0 or recheck < 1:
            raise ValueError(f"screen_after: expected >= 0 (0: no screening) and recheck >= 1, got {screen_after}, "
                             f"{recheck}")
        if miss_weight_kwh is not None and not (miss_weight_kwh >= 0 and math.isfinite(miss_weight_kwh)):
            raise ValueError(f"miss_weight_kwh: expected a weight >= 0 (or None), got {miss_weight_kwh}")
        if slo_rule not in ("gate", "vllm_minus_epsilon"):
            raise ValueError(f"slo_rule: expected 'gate' or 'vllm_minus_epsilon', got {slo_rule!r}")
        if slo_slack is not None and not 0 <= slo_slack <= 1:
            raise ValueError(f"slo_slack: expected a share in [0, 1] (or None), got {slo_slack}")
        if max_misses is not None and max_misses < 0:
            raise ValueError(f"max_misses: expected >= 0 (or None), got {max_misses}")
        if configs is not None and not configs:
            raise ValueError("configs: expected at least one (active, clock MHz) pair, or None for ePACT's catalog")
        if replica_levels < 1 or clock_levels < 1:
            raise ValueError(f"replica_levels, clock_levels: expected >= 1, got {replica_levels}, {clock_levels}")
        if workers is not None and workers < 0:
            raise ValueError(f"workers: expected >= 0 processes (0: plan in this process) or None, got {workers}")
        self.beam = beam
        self.energy_grid = energy_grid
        self.estimate = estimate
        self.screen_after = screen_after
        self.recheck = recheck
        self.miss_weight_kwh = miss_weight_kwh
        self.slo_rule = slo_rule
        self.slo_slack = slo_slack
        self.max_misses = max_misses
        self.configs_arg = [(_active_of(c[0]), int(c[1])) for c in configs] if configs is not None else None
        self.replica_levels = replica_levels
        self.clock_levels = clock_levels
        self.include_vllm = include_vllm
        self.pace_misses = pace_misses
        self.workers = (os.cpu_count() or 1) if workers is None else workers
        self.progress = progress
        self.plan: Plan | None = None
        self._stats: dict[str, float] = {}

    def _catalog(self, ctx: ControllerContext) -> list[tuple[int | tuple[int, ...], int]]:
        if self.configs_arg is not None:
            for a, c in self.configs_arg:
                ctx.action(a, c)  # raises ValueError naming the bad pair (a shared pool: per-model counts)
            return list(dict.fromkeys(self.configs_arg))
        if ctx.shared:  # as ePACT: pool-wide totals (one instance per model at least), spread over the models
            cat = Catalog.build(ctx.n_replicas, ctx.clocks_mhz, self.replica_levels, self.clock_levels,
                                min_replicas=len(ctx.models))
            return list(dict.fromkeys((ctx.spread_active(a), c) for a, c in map(cat.config, cat.all_ranks())))
        cat = Catalog.build(ctx.n_replicas, ctx.clocks_mhz, self.replica_levels, self.clock_levels)
        return [cat.config(r) for r in cat.all_ranks()]

    def reset(self, ctx: ControllerContext, seed: int | None = None) -> None:
        super().reset(ctx, seed)
        access = getattr(ctx, "hindsight", None)
        if access is None:
            raise ValueError("oracle: needs the hindsight door (ctx.hindsight); run it through commitenv.evaluation "
                             "(its class declares hindsight = True) or build ControllerContext.from_env(env, "
                             "hindsight=True) after env.reset()")
        t0 = time.perf_counter()
        self.configs = self._catalog(ctx)
        vllm_cfg = (ctx.all_active, ctx.reference_clock_mhz)  # (a shared pool: every instance of every model)
        root = access.fork()
        steps = ctx.horizon_hours * ctx.intervals_per_hour - root.k
        vllm = replay(root, [vllm_cfg], [0] * steps, PlanTerms(ctx.intervals_per_hour, ctx.commitments_j,
                                                                 ctx.lambda_plus, ctx.lambda_minus))
        eps = access.epsilon if self.slo_slack is None else self.slo_slack
        w = access.miss_penalty_kwh if self.miss_weight_kwh is None else self.miss_weight_kwh
        H = ctx.horizon_hours
        arrivals = access.workload.table.arrival_s
        paced = bool(self.pace_misses or (self.pace_misses is None and H > 1))
        pace = hour_budgets = hour_pace = None
        if self.max_misses is not None:  # one pooled budget
            budget = self.max_misses
            if paced:
                pace = miss_pace(budget, arrivals, ctx.interval_s, H * ctx.intervals_per_hour,
                                 (0,) * root.k + vllm.certain_misses)
        else:  # the gate's form: a budget per arrival hour
            n_h = np.bincount(arrival_hours(arrivals, H), minlength=H)
            gate = getattr(ctx, "gate", None)
            if self.slo_rule == "gate" and gate is not None and gate.kind == "relative" and self.slo_slack is None:
                # the scenario's relative gate: vLLM's own misses in the hour plus its tolerance
                hour_budgets = tuple(miss_budget(v, int(n), gate.tolerance_pp / 100.0, "vllm_minus_epsilon")
                                     for v, n in zip(vllm.misses_by_hour, n_h))
            else:
                hour_budgets = tuple(miss_budget(v, int(n), eps, self.slo_rule)
                                     for v, n in zip(vllm.misses_by_hour, n_h))
            budget = sum(hour_budgets)
            if paced:
                hour_pace = hour_miss_pace(hour_budgets, arrivals, ctx.interval_s, ctx.intervals_per_hour,
                                           ((0,) * H,) * root.k + vllm.certain_by_hour)
        terms = PlanTerms(ctx.intervals_per_hour, ctx.commitments_j, ctx.lambda_plus, ctx.lambda_minus, w, budget,
                          pace, hour_budgets, hour_pace)
        incumbents = []
        if self.include_vllm:
            if vllm_cfg not in self.configs:
                self.configs.append(vllm_cfg)
            incumbents.append([self.configs.index(vllm_cfg)] * steps)
        # energy cells scale with the per-interval commitment; energy-only hours (E* = 0) have none, so an energy-only
        # episode merges equal energies only (a mix of hours takes the smallest positive commitment)
        grid = self.energy_grid * min((c for c in ctx.commitments_j if c > 0), default=0.0) / ctx.intervals_per_hour

        def log(step: int, kept: int) -> None:
            if self.progress:
                print(f"oracle: interval {step + 1}/{steps} planned, {kept} states, "
                      f"{time.perf_counter() - t0:.1f} s", flush=True)

        # the most an interval can draw, estimated by vLLM's schedule (every replica at the reference clock)
        reach = (0.0,) * root.k + vllm.interval_j
        self.plan = plan_engine(root, self.configs, terms, beam=self.beam, energy_grid_j=grid,
                                estimate=self.estimate, screen_after=self.screen_after, recheck=self.recheck,
                                incumbents=incumbents, workers=self.workers, access=access, on_step=log,
                                reach_j=reach)
        self._k0 = root.k
        self._stats = {
            "plan_s": time.perf_counter() - t0,
            "planned_cost_kwh_eq": self.plan.cost_kwh,
            "planned_misses": float(self.plan.misses),
            "planned_objective_kwh": self.plan.objective_kwh,
            "planned_energy_mj": float(sum(self.plan.interval_j) / 1e6),
            "plan_feasible": float(self.plan.feasible),
            "max_misses": float(budget),
            "miss_weight_kwh": float(w),
            "vllm_misses_hindsight": float(vllm.misses),
            "vllm_cost_kwh_eq_hindsight": vllm.cost_kwh,
            "engine_steps": self.plan.stats.get("engine_steps", 0.0),
            "screened_out": self.plan.stats.get("screened_out", 0.0),
            "plan_workers": self.plan.stats.get("workers", 0.0),
            "incumbent_won": self.plan.stats.get("incumbent_won", 0.0),
            "catalog_size": float(len(self.configs)),
            "miss_paced": float(paced),
        }

    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict[str, int]:
        if self.plan is None:
            raise RuntimeError("oracle: act() before reset()")
        k = int(round(float(info["t"]) / self.ctx.interval_s)) - self._k0
        if not 0 <= k < len(self.plan.schedule):
            raise RuntimeError(f"oracle: interval {k} is outside the plan ({len(self.plan.schedule)} intervals)")
        a, c = self.configs[self.plan.schedule[k]]
        return self.ctx.action(a, c)

    def stats(self) -> dict[str, float]:
        """The plan's figures (``planned_*`` equal what the environment then settles: the forks are exact)."""
        return dict(self._stats)
