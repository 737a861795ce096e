"""ePACT (section 4): global planner + local decision maker with adaptive search over (replicas, clock).

Each decision: the planner turns measured hour energy into the interval target T_k; a causal snapshot and
the previous interval's observed arrivals (replayed as the forecast, never future trace arrivals) feed
what-if runs of the engine, one per candidate, evaluated in parallel by persistent workers; the adaptive
search proposes candidates; the selection rule (SLO admission, cost-weighted target matching,
service-first fallback) picks the configuration. ``static_target=True`` is the Static-Target ablation.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np

from controllers.base import Controller, ControllerContext
from controllers.epact.planner import check_allocation, equal_allocation, interval_target
from controllers.epact.search import Catalog, Rank, adaptive_search
from controllers.epact.selection import Evaluation, rank_key, select
from controllers.epact.workers import WhatIfWorkers
from controllers.registry import register


@register("epact")
class EPACT(Controller):
    """The paper's two-level controller.

    Parameters: ``workers`` (what-if processes; None = all cores, 0 = in-process), ``static_target``,
    ``planning_delay`` (0: the decision applies at the interval start; a number of seconds; or
    ``"measured"``: the search's wall time, as the paper's asynchronous decisions — not bit-reproducible),
    ``nominal`` (fractions b_k / E* per interval; default equal), ``warm_starts`` (previous choices seeded
    into the next search), ``replay_window_s`` (default: one interval), ``slo_scope``.

    ``slo_scope``: the paper's eq. 2 counts predicted misses over the snapshot's unfinished requests I_k
    (``"captured"``). Measured on epact-h20-hour-fixed-a30 (seed 0), that gate admits configurations whose
    capacity cannot absorb the next interval's bursts: attainment 98.67 % against vLLM's 100 %. The default
    ``"captured+forecast"`` also follows the replayed (forecast) arrivals to completion and counts their
    predicted misses (and margins) in the same check, with epsilon applied to the larger population:
    attainment 99.83 %, deviation 0.06 %. Set ``slo_scope="captured"`` for the paper-literal gate.
    """

    def __init__(
        self,
        workers: int | None = None,
        static_target: bool = False,
        planning_delay: float | str = 0.0,
        nominal: list[float] | None = None,
        warm_starts: int = 3,
        replay_window_s: float | None = None,
        max_tail_s: float = 3600.0,
        slo_scope: str = "captured+forecast",
    ) -> None:
        if slo_scope not in ("captured", "captured+forecast"):
            raise ValueError(f"slo_scope: expected 'captured' or 'captured+forecast', got {slo_scope!r}")
        self.slo_scope = slo_scope
        if isinstance(planning_delay, str) and planning_delay != "measured":
            raise ValueError(f"planning_delay: expected seconds or 'measured', got {planning_delay!r}")
        self.workers_n = workers
        self.static_target = static_target
        self.planning_delay = planning_delay
        self.nominal_fractions = nominal
        self.warm_n = warm_starts
        self.replay_window_s = replay_window_s
        self.max_tail_s = max_tail_s
        self.workers: WhatIfWorkers | None = None

    def reset(self, ctx: ControllerContext, seed: int | None = None) -> None:
        super().reset(ctx, seed)
        if ctx.probe is None:
            raise ValueError("epact needs a probe (ControllerContext.from_env) for snapshots")
        self.catalog = Catalog.build(ctx.n_replicas, ctx.clocks_mhz)
        K = ctx.intervals_per_hour
        if self.nominal_fractions is not None:
            if len(self.nominal_fractions) != K:
                raise ValueError(f"nominal: expected {K} fractions, got {len(self.nominal_fractions)}")
            check_allocation(1.0, self.nominal_fractions)
        if self.workers is None:
            self.workers = WhatIfWorkers(self.workers_n)
        self.warm: deque[Rank] = deque(maxlen=max(self.warm_n, 0) or 1)
        self.plan_times: list[float] = []
        self.evaluated_counts: list[int] = []
        self.decisions: list[dict[str, Any]] = []

    def _nominal(self, commitment: float) -> list[float]:
        K = self.ctx.intervals_per_hour
        if self.nominal_fractions is None:
            return equal_allocation(commitment, K)
        return [f * commitment for f in self.nominal_fractions]

    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict[str, int]:
        ctx = self.ctx
        t_start = time.perf_counter()
        k = int(info["interval"])
        commitment = float(info["commitment_j"])
        target = interval_target(commitment, float(info["hour_energy_j"]), self._nominal(commitment), k,
                                 static=self.static_target)
        snap = ctx.probe.snapshot()
        replay = ctx.probe.recent_arrivals(self.replay_window_s or ctx.interval_s)
        track = self.slo_scope == "captured+forecast"
        n_cap = snap.n_requests  # |I_k|; with the forecast in scope, plus the replayed arrivals followed
        current = self.catalog.nearest(int(info["active"]), int(info["clock_mhz"]))
        results: dict[Rank, Evaluation] = {}
        self.workers.begin(snap, replay, ctx.interval_s, self.max_tail_s, track)

        def evaluate(batch: list[Rank]) -> None:
            nonlocal n_cap
            configs = [self.catalog.config(r) for r in batch]
            preds = self.workers.evaluate(configs)
            if track:
                n_cap = snap.n_requests + preds[0].forecast_n
            for r, (a, c), w in zip(batch, configs, preds):
                if track:
                    results[r] = Evaluation(a, c, w.energy_j, w.misses + w.forecast_misses,
                                            min(w.worst_margin_s, w.forecast_margin_s), w.complete)
                else:
                    results[r] = Evaluation(a, c, w.energy_j, w.misses, w.worst_margin_s, w.complete)

        def key(r: Rank) -> tuple:
            return rank_key(results[r], target, ctx.lambda_plus, ctx.lambda_minus, n_cap, ctx.epsilon)

        search = adaptive_search(self.catalog, evaluate, key, lambda r: results[r].valid, current, list(self.warm))
        chosen = select(list(results.values()), target, ctx.lambda_plus, ctx.lambda_minus, n_cap, ctx.epsilon)
        wall = time.perf_counter() - t_start
        self.plan_times.append(wall)
        self.evaluated_counts.append(len(search.order))
        if chosen is None:  # no valid prediction: keep the current configuration
            action = ctx.action(int(info["active"]), int(info["clock_mhz"]))
        else:
            rank = self.catalog.nearest(chosen.active, chosen.clock_mhz)
            if rank in self.warm:
                self.warm.remove(rank)
            self.warm.append(rank)
            action = ctx.action(chosen.active, chosen.clock_mhz)
        delay = wall if self.planning_delay == "measured" else float(self.planning_delay)
        if delay > 0:
            ctx.probe.report_planning_delay(delay)
        self.decisions.append({
            "t": float(info["t"]), "target_j": target, "evaluated": len(search.order), "captured": n_cap,
            "chosen": None if chosen is None else chosen.config, "fallback": search.fallback, "plan_s": wall,
        })
        return action

    def stats(self) -> dict[str, float]:
        """Planning figures of the run (the paper reports a mean search time of 23.35 s per decision)."""
        t = np.asarray(self.plan_times) if self.plan_times else np.zeros(1)
        n = np.asarray(self.evaluated_counts) if self.evaluated_counts else np.zeros(1)
        return {
            "plan_s_mean": float(t.mean()),
            "plan_s_p95": float(np.percentile(t, 95)),
            "evaluated_per_decision": float(n.mean()),
            "decisions": len(self.plan_times),
        }

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
            self.workers = None
