"""`MPCController`: each interval, learn from the last one (forecast error, energy calibration), forecast the
rest of the hour, solve the plan (`plan.solve_plan`), and map the first interval's planned energy to a
configuration through what-if runs of the engine on the causal snapshot (package docstring)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from commitenv_controllers.base import Controller, ControllerContext
from commitenv_controllers.dynamollm import ClockLaws, estimate_queue
from commitenv_controllers.epact.miss_margin import MissMargin
from commitenv_controllers.epact.selection import Evaluation, admitted, deviation_cost
from commitenv_controllers.epact.workers import WhatIfWorkers
from commitenv_controllers.mpc.forecast import (ErrorTracker, Work, commitment_shape, late_fraction,
                                                scenario_multipliers, table_work)
from commitenv_controllers.mpc.plan import (J_PER_KWH, PlanProblem, PlanResult, installed_solver, interval_energy,
                                            solve_plan)
from commitenv_controllers.registry import register



@dataclass(frozen=True)
class Decision:
    """One interval's record (also the source of `MPCController.stats`)."""

    t: float
    interval: int
    target_j: float  # planned energy of the interval (the selection's target)
    plan_status: str
    plan_cost_kwh: float
    plan_active: float
    plan_clock_mhz: int
    chosen: tuple[int, int] | None
    predicted_j: float | None  # what-if energy of the chosen configuration (calibrated)
    evaluated: int
    sigma: float  # forecast error std used (mean over the remaining intervals)
    bias: float
    energy_scale: float
    whatif_scale: float
    plan_s: float  # building and solving the program
    whatif_s: float
    decision_s: float


def choose(evals: list[Evaluation], target_j: float, lambda_plus: float, lambda_minus: float, miss_penalty_kwh: float,
           n_captured: int, epsilon: float, energy_scale: float = 1.0) -> Evaluation | None:
    """The configuration to apply: among candidates admitted by ePACT's SLO gate (eq. 2), the least
    deviation cost of the calibrated predicted energy against the plan's target plus the miss penalty of the
    predicted misses; if none is admitted, ePACT's service-first fallback (fewest misses, largest margin,
    lowest deviation cost). Final ties: fewer replicas, lower clock. None when no prediction is valid."""
    valid = [e for e in evals if e.valid]
    if not valid:
        return None

    def key(e: Evaluation) -> tuple:
        j = deviation_cost(energy_scale * e.energy_j, target_j, lambda_plus, lambda_minus) / J_PER_KWH
        m = -e.margin_s if math.isfinite(e.margin_s) else -math.inf
        if admitted(e, n_captured, epsilon):
            return (0, j + miss_penalty_kwh * e.misses, e.misses, m, e.active, e.clock_mhz)
        return (1, e.misses, m, j, e.active, e.clock_mhz)

    return min(valid, key=key)


def candidate_configs(p: PlanProblem, plan: PlanResult, target_j: float, clocks_mhz: tuple[int, ...],
                      current: tuple[int, int], per_clock: int = 2) -> list[tuple[int, int]]:
    """A few configurations near the plan: at every clock the ``per_clock`` whole replica counts around the
    count whose modelled energy (mean scenario) equals the target, the plan's own (rounded) configuration,
    and the current one; deduplicated, in that order."""
    N = p.n_replicas
    xi0 = float(np.asarray(p.probabilities) @ np.asarray(p.multipliers)[:, 0])
    out: list[tuple[int, int]] = []
    for f, mhz in enumerate(clocks_mhz):
        e_lo = interval_energy(p, 0, 0.0, f, xi0)
        slope = interval_energy(p, 0, 1.0, f, xi0) - e_lo
        n_star = (target_j - e_lo) / slope if slope > 0 else float(N)
        lo = math.floor(n_star) - (per_clock - 1) // 2
        for n in range(lo, lo + per_clock):
            out.append((min(max(n, 1), N), mhz))
    if plan.ok:
        out.append((min(max(int(round(float(plan.active[0]))), 1), N), clocks_mhz[int(plan.clock_idx[0])]))
    out.append(current)
    return list(dict.fromkeys(out))


@register("mpc")
class MPCController(Controller):
    """Receding-horizon controller on cvxpy: plans the rest of the hour under a tracked forecast and maps
    the current interval's planned energy to (replicas, clock) through what-if runs (package docstring).

    Parameters: ``form`` (``"relaxed"``: continuous replica counts and clock weights; ``"milp"``: whole
    replicas, one clock per interval), ``solver`` (a cvxpy solver name; default the first installed of
    `plan.LP_SOLVERS` / `plan.MILP_SOLVERS`), ``scenarios`` (S work scenarios), ``smoothing`` (weight of the
    newest interval in the forecast level), ``error_weight`` and ``prior_sigma`` (`ErrorTracker`),
    ``max_util`` (u), ``latency_frac`` (`forecast.late_fraction`), ``miss_penalty_kwh`` (default: the
    scenario's), ``tie_weight``, ``candidates_per_clock``, ``calibrate`` (learn metered / modelled energy
    ratios), ``shape_prior`` (``"commitments"`` or ``"flat"``), ``time_limit_s`` and ``integer_horizon`` (milp:
    solver time limit, and how many leading intervals are integer, the rest relaxed), ``workers`` (what-if
    processes: 0 = in this process, None = all cores), ``max_tail_s`` (what-if completion tail), ``miss_margin`` (the
    SLO gate counts predicted slacks below a margin calibrated on the misses observed after the applied candidates,
    `epact.miss_margin.MissMargin`; off: the predicted misses).
    """

    def __init__(
        self,
        form: Literal["relaxed", "milp"] = "relaxed",
        solver: str | None = None,
        scenarios: int = 5,
        smoothing: float = 0.3,
        error_weight: float = 0.1,
        prior_sigma: float = 0.25,
        max_util: float = 0.85,
        latency_frac: float = 0.6,
        miss_penalty_kwh: float | None = None,
        tie_weight: float = 0.01,
        candidates_per_clock: int = 2,
        calibrate: bool = True,
        shape_prior: Literal["commitments", "flat"] = "commitments",
        time_limit_s: float = 0.5,
        integer_horizon: int = 5,
        workers: int | None = 0,
        max_tail_s: float = 3600.0,
        miss_margin: bool = False,
    ) -> None:
        if not isinstance(miss_margin, bool):
            raise ValueError(f"mpc miss_margin: expected true or false, got {miss_margin!r}")
        if form not in ("relaxed", "milp"):
            raise ValueError(f"mpc form: expected 'relaxed' or 'milp', got {form!r}")
        if shape_prior not in ("commitments", "flat"):
            raise ValueError(f"mpc shape_prior: expected 'commitments' or 'flat', got {shape_prior!r}")
        if not (isinstance(scenarios, int) and scenarios >= 1):
            raise ValueError(f"mpc scenarios: expected an integer >= 1, got {scenarios!r}")
        for name, v in (("smoothing", smoothing), ("error_weight", error_weight), ("max_util", max_util)):
            if not (0 < v <= 1):
                raise ValueError(f"mpc {name}: expected a value in (0, 1], got {v!r}")
        if not (prior_sigma >= 0 and math.isfinite(prior_sigma)):
            raise ValueError(f"mpc prior_sigma: expected a finite value >= 0, got {prior_sigma!r}")
        if not (latency_frac > 0 and math.isfinite(latency_frac)):
            raise ValueError(f"mpc latency_frac: expected a finite value > 0, got {latency_frac!r}")
        if miss_penalty_kwh is not None and not (miss_penalty_kwh >= 0 and math.isfinite(miss_penalty_kwh)):
            raise ValueError(f"mpc miss_penalty_kwh: expected a finite value >= 0 or None, got {miss_penalty_kwh!r}")
        if not (tie_weight >= 0 and math.isfinite(tie_weight)):
            raise ValueError(f"mpc tie_weight: expected a finite value >= 0, got {tie_weight!r}")
        if not (isinstance(candidates_per_clock, int) and candidates_per_clock >= 1):
            raise ValueError(f"mpc candidates_per_clock: expected an integer >= 1, got {candidates_per_clock!r}")
        if not (isinstance(integer_horizon, int) and integer_horizon >= 1):
            raise ValueError(f"mpc integer_horizon: expected an integer >= 1, got {integer_horizon!r}")
        if not (time_limit_s > 0 and max_tail_s > 0):
            raise ValueError("mpc: time_limit_s and max_tail_s must be > 0")
        if workers is not None and workers < 0:
            raise ValueError(f"mpc workers: expected >= 0 or None, got {workers!r}")
        self.solver = installed_solver(form, solver)  # refuses a solver cvxpy lacks, now rather than mid-run
        self.solver_arg = solver
        self.form = form
        self.n_scenarios = scenarios
        self.smoothing = float(smoothing)
        self.error_weight = float(error_weight)
        self.prior_sigma = float(prior_sigma)
        self.max_util = float(max_util)
        self.latency_frac = float(latency_frac)
        self.miss_penalty_arg = miss_penalty_kwh
        self.tie_weight = float(tie_weight)
        self.per_clock = candidates_per_clock
        self.calibrate = bool(calibrate)
        self.shape_prior = shape_prior
        self.time_limit_s = float(time_limit_s)
        self.integer_horizon = integer_horizon
        self.workers_n = workers
        self.max_tail_s = float(max_tail_s)
        self.miss_margin = miss_margin
        self.workers: WhatIfWorkers | None = None

    # ------------------------------------------------------------------------------------------ setup
    def reset(self, ctx: ControllerContext, seed: int | None = None) -> None:
        super().reset(ctx, seed)
        if ctx.probe is None:
            raise ValueError("mpc needs ctx.probe (snapshots and recent arrivals): build the context with "
                             "ControllerContext.from_env(env)")
        if ctx.profile is None:
            raise ValueError("mpc needs the pool's nominal profile in ControllerContext.profile (from_env sets it)")
        self.laws = ClockLaws.of(ctx.profile)
        if tuple(self.laws.mhz) != tuple(ctx.clocks_mhz):
            raise ValueError(f"mpc: profile clocks {self.laws.mhz} differ from the scenario's {ctx.clocks_mhz}")
        self.miss_penalty_kwh = self._miss_penalty(ctx)
        self.tracker = ErrorTracker(weight=self.error_weight, prior_sigma=self.prior_sigma)
        self.level = Work.zero(self.laws.n_clocks)  # EW level of one interval's arrival work
        self._seen = False  # any arrival observed yet
        self.batch = 1.0
        self.energy_scale = 1.0  # metered / modelled interval energy (the plan's model)
        self.whatif_scale = 1.0  # metered / what-if predicted interval energy (applied candidates)
        self._last: dict[str, Any] | None = None
        self.gate = MissMargin(ctx.intervals_per_hour)
        self.decisions: list[Decision] = []
        self.whatif_errors: list[float] = []
        if self.workers is None:
            self.workers = WhatIfWorkers(self.workers_n)

    def _miss_penalty(self, ctx: ControllerContext) -> float:
        """The miss penalty the plan prices: the argument, else the scenario's (public, in the context)."""
        return float(self.miss_penalty_arg if self.miss_penalty_arg is not None else ctx.miss_penalty_kwh)

    # ------------------------------------------------------------------------------------------ learning
    def _learn(self, info: dict[str, Any], observed: Work) -> None:
        """Update the forecast error, the energy calibrations and the work level from the last interval."""
        last = self._last
        top = self.laws.top
        if last is not None:
            if self._seen:  # a forecast made before any arrival (zero work) is not a forecast error
                self.tracker.update(last["forecast_busy_top"], float(observed.busy_s[top]))
            metered = float(info.get("interval_energy_j", 0.0))
            if metered > 0:
                p: PlanProblem = last["problem"]
                a, f = last["config"]
                hind = _with_first(p, observed.plus(last["backlog"]), self.ctx.interval_s)
                model = interval_energy(hind, 0, a, f)  # uncalibrated model, hindsight work
                w = 0.2
                if self.calibrate and model > 0:
                    self.energy_scale = float(np.clip((1 - w) * self.energy_scale + w * metered / model, 0.75, 1.33))
                if last["whatif_j"] is not None and last["whatif_j"] > 0:
                    self.whatif_errors.append(abs(metered - last["whatif_j"] * last["whatif_scale"]) / metered)
                    if self.calibrate:
                        r = metered / last["whatif_j"]
                        self.whatif_scale = float(np.clip((1 - w) * self.whatif_scale + w * r, 0.75, 1.33))
        if self._seen or observed.count > 0:  # the level starts at the first arrivals (zero work until then)
            b = self.smoothing
            self.level = observed if not self._seen else self.level.scaled(1 - b).plus(observed.scaled(b))
            self._seen = True

    # ------------------------------------------------------------------------------------------ act
    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict[str, int]:
        ctx = self.ctx
        t_start = time.perf_counter()
        laws = self.laws
        dt = ctx.interval_s
        K = ctx.intervals_per_hour
        k = int(info["interval"])
        hour = int(info.get("hour", 0))
        snap = ctx.probe.snapshot()
        t = float(snap.t)
        current = (int(info["active"]), int(info["clock_mhz"]))
        running = int(np.count_nonzero(snap.requests.running))
        self.batch = 0.7 * self.batch + 0.3 * max(1.0, running / max(snap.active, 1))
        recent = ctx.probe.recent_arrivals(dt) if t > 0 else None
        self._learn(info, table_work(recent, laws, self.batch))
        if self.miss_margin:
            self.gate.observe(None if self._last is None else self._last["chosen"], info.get("new_misses"),
                              0 if recent is None else len(recent))
        # forecast of the remaining R intervals
        R = K - k
        shape = commitment_shape(ctx.commitments_j, hour, k, K, R) if self.shape_prior == "commitments" else np.ones(R)
        est = estimate_queue(snap, laws)
        backlog = Work(np.asarray(est.busy_s, dtype=np.float64), np.asarray(est.energy_j, dtype=np.float64),
                       float(snap.n_requests))
        sigma = self.tracker.sigma_of_mean(R)
        bias = self.tracker.bias()
        xi, pi = scenario_multipliers(R, self.n_scenarios, sigma, bias)
        busy = self.level.busy_s[None, :] * shape[:, None]
        work = self.level.energy_j[None, :] * shape[:, None]
        count = self.level.count * shape
        fc_top, bl_top = float(busy[0, laws.top]), float(backlog.busy_s[laws.top])
        if fc_top + bl_top > 0:  # the backlog is known work: the scenarios scale only the forecast part
            xi[:, 0] = (xi[:, 0] * fc_top + bl_top) / (fc_top + bl_top)
        busy[0] += backlog.busy_s
        work[0] += backlog.energy_j
        count = count.copy()
        count[0] += backlog.count
        window = min(t, 5 * dt)
        late_tab = ctx.probe.recent_arrivals(window) if window > 0 else None
        q = (late_fraction(late_tab.prompt_tokens, late_tab.output_tokens, laws, ctx.alpha, self.latency_frac)
             if late_tab is not None and len(late_tab) else np.zeros(laws.n_clocks))
        commitment = float(info["commitment_j"])
        consumed = float(info["hour_energy_j"])
        problem = PlanProblem(
            interval_s=dt, n_replicas=ctx.n_replicas, idle_w=laws.idle_w, standby_w=laws.standby_w,
            busy_s=busy, work_j=work, requests=count, consumed_j=consumed, commitment_j=commitment,
            lambda_plus=ctx.lambda_plus, lambda_minus=ctx.lambda_minus, miss_penalty_kwh=self.miss_penalty_kwh,
            multipliers=xi, probabilities=pi, late_frac=q, max_util=self.max_util, energy_scale=self.energy_scale,
            tie_weight=self.tie_weight)
        plan = solve_plan(problem, self.form, self.solver_arg, self.time_limit_s, self.integer_horizon)
        target = float(plan.energy_j[0]) if plan.ok else (commitment - consumed) / R
        # map the planned energy to a configuration through the what-if view
        t_w = time.perf_counter()
        configs = candidate_configs(problem, plan, target, tuple(ctx.clocks_mhz), current, self.per_clock)
        replay = ctx.probe.recent_arrivals(dt)
        self.workers.begin(snap, replay, dt, self.max_tail_s, True)
        evals = self._evaluate(configs)
        n_cap = snap.n_requests + self._forecast_n
        chosen = choose(evals, target, ctx.lambda_plus, ctx.lambda_minus, self.miss_penalty_kwh, n_cap, ctx.epsilon,
                        self.whatif_scale)
        top_cfg = (ctx.n_replicas, laws.mhz[laws.top])
        if (chosen is None or not admitted(chosen, n_cap, ctx.epsilon)) and top_cfg not in configs:
            evals += self._evaluate([top_cfg])  # service first: the full pool at the top clock
            configs.append(top_cfg)
            chosen = choose(evals, target, ctx.lambda_plus, ctx.lambda_minus, self.miss_penalty_kwh, n_cap,
                            ctx.epsilon, self.whatif_scale)
        whatif_s = time.perf_counter() - t_w
        config = chosen.config if chosen is not None else current
        self._last = {
            "config": (config[0], laws.mhz.index(config[1])), "problem": problem, "backlog": backlog,
            "chosen": chosen.config if chosen is not None else None,
            "forecast_busy_top": float(self.level.busy_s[laws.top] * shape[0]),
            "whatif_j": chosen.energy_j if chosen is not None else None, "whatif_scale": self.whatif_scale,
        }
        self.decisions.append(Decision(
            t, k, target, plan.status, plan.cost_kwh, float(plan.active[0]) if plan.ok else math.nan,
            laws.mhz[int(plan.clock_idx[0])], chosen.config if chosen is not None else None,
            self.whatif_scale * chosen.energy_j if chosen is not None else None, len(evals), sigma, bias,
            self.energy_scale, self.whatif_scale, plan.solve_s, whatif_s, time.perf_counter() - t_start))
        return ctx.action(*config)

    def _evaluate(self, configs: list[tuple[int, int]]) -> list[Evaluation]:
        preds = self.workers.evaluate(configs)
        self._forecast_n = preds[0].forecast_n if preds else 0
        return [Evaluation(a, c, w.energy_j,
                           self.gate.count((a, c), w) if self.miss_margin else w.misses + w.forecast_misses,
                           min(w.worst_margin_s, w.forecast_margin_s), w.complete) for (a, c), w in zip(configs, preds)]

    # ------------------------------------------------------------------------------------------ reporting
    def stats(self) -> dict[str, float]:
        """Timing and forecast figures of the run."""
        ds = self.decisions
        if not ds:
            return {"decisions": len(self.decisions)}
        plan_s = np.array([d.plan_s for d in ds])
        dec_s = np.array([d.decision_s for d in ds])
        return {
            "plan_s_mean": float(plan_s.mean()),
            "plan_s_max": float(plan_s.max()),
            "whatif_s_mean": float(np.mean([d.whatif_s for d in ds])),
            "decision_s_mean": float(dec_s.mean()),
            "decision_s_p95": float(np.percentile(dec_s, 95)),
            "evaluated_per_decision": float(np.mean([d.evaluated for d in ds])),
            "plan_failures": float(sum(d.plan_status not in ("optimal", "optimal_inaccurate", "user_limit") for d in ds)),
            "plan_time_limited": float(sum(d.plan_status == "user_limit" for d in ds)),
            "forecast_sigma_last": float(ds[-1].sigma),
            "energy_scale_last": float(self.energy_scale),
            "whatif_scale_last": float(self.whatif_scale),
            "whatif_rel_error_median": float(np.median(self.whatif_errors)) if self.whatif_errors else math.nan,
            "decisions": len(self.decisions),
        }

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
            self.workers = None


def _with_first(p: PlanProblem, work: Work, interval_s: float) -> PlanProblem:
    """``p`` with its first interval's work replaced by ``work`` and no calibration (for hindsight energy)."""
    busy = np.asarray(p.busy_s, dtype=np.float64).copy()
    energy = np.asarray(p.work_j, dtype=np.float64).copy()
    busy[0], energy[0] = work.busy_s, work.energy_j
    req = np.asarray(p.requests, dtype=np.float64).copy()
    req[0] = work.count
    from dataclasses import replace

    return replace(p, busy_s=busy, work_j=energy, requests=req, energy_scale=1.0)
