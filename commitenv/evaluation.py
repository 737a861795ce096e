"""Evaluate a controller on a scenario: hourly table, request table and the paper's Table 1 summary, computed
from the engine's records (never from rewards), written as CSV/JSON/PNG without half-written outputs.

With ``evaluate(..., attribution=True)`` the run also bills every request (StepSplit closed form, see
`commitenv.attribution.online`): ``EvalResult.bills`` and ``bills.csv`` with one row per request,

=================  ===========================================================================================
request_id         the trace's request id
tenant             tenant index (as in requests.csv; names in the table's ``tenant_names``)
prompt_tokens      prompt length
output_tokens      output tokens served (capped at the context limit, as in requests.csv)
own_j              the request's own energy (its prefill and decode terms of the energy law), J
shared_j           its part of the per-step shared energy (a / m of every step it was in), J
total_j            own_j + shared_j: its Shapley share of the metered busy energy, J
token_split_j      the Token baseline: the run's busy energy split by prompt + 5 x output tokens, J
=================  ===========================================================================================

Every step's metered energy is split (tail after the horizon included), so ``total_j`` sums to the run's busy
energy; idle energy (the floor while no step runs) is billed to no request. A run folder without bills gets
them from ``commitenv attribute RUN_DIR``, which re-runs the deterministic episode (scenario, controller and seed
and the controller's arguments from summary.json) and checks that it reproduces the recorded scores, rather than storing a step log.

Every run also records its decisions (``EvalResult.decisions``, ``decisions.csv``), one row per interval:

=================  ===========================================================================================
interval           interval index k (0-based, over the whole episode)
t_start_s          the interval's start, s
active             the action's active replicas
clock_mhz          the action's clock, MHz
applied_s          when the environment applied the change (start + actuation delay + planning delay), s;
                   empty when nothing changed or the decision was stale (it would have applied after the
                   interval's end)
stale              1 when the decision came too late for its interval
planning_delay_s   the planning delay charged: the decision applied this long after the interval started (plus the
                   actuation delay); ``realism.planning_delay`` says how it is set (`commitenv.planning`)
reported_delay_s   what the controller reported (``probe.report_planning_delay``; 0 when it said nothing)
measured_s         what the runner measured around ``act()`` (wall or CPU of the controller and its workers,
                   whichever is larger); empty where the scenario does not charge it (``ideal``, ``fixed``)
energy_j           the settled energy of the interval, J (the settlement meter; the hours' sum is summary.json's
                   ``energy_mj``, the completion tail after the last interval is ``tail_energy_mj``)
commitment_pace_j  the interval's even share of its hour's commitment (commitment / intervals per hour), J; empty
                   on an energy-only hour
arrivals           requests that arrived in the interval
misses             those of them that missed their deadline (late, unfinished or rejected), wherever they were
                   served; the episode's sum is summary.json's ``misses``
=================  ===========================================================================================

A controller's optional ``stats()`` dict adds its numeric entries to summary.json. ``"hindsight": true`` marks a
run whose controller declared ``hindsight = True`` (the ``oracle``): it was given the episode's true workload and
ground-truth forks (`commitenv.hindsight`), so its numbers are a bound, never a competitor; the leaderboard refuses
such controllers and results (`refuses_hindsight`). summary.json also records
``controller_origin`` (``builtin``, ``entry_point:<dist>``, ``module:<mod>:<Class>`` or ``path:<file>:<Class>``,
see `commitenv_controllers.registry`), from which ``commitenv attribute`` rebuilds the controller, and
``settlement``: ``"commitment"``, or ``"energy_only"`` for a scenario without commitment (``commitment: {energy_only:
true}``: the cost is lambda_plus x energy in kWh, and the deviation fields, ``mean_abs_dev_pct``,
``hours_within_5pct`` and hourly.csv's ``deviation_pct``, are None / empty).
"""

from __future__ import annotations

import csv
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from commitenv.hindsight import uses_hindsight
from commitenv.latency_slo import CLASS_NAMES, LatencyOutcome, attainment_by, latency_outcome
from commitenv.metrics import (deviation_cost_kwh, deviation_pct_or_none, settlement_kind, slo_gate, slo_outcome,
                               summarize)
from commitenv.planning import PlanningClock
from commitenv.scenarios.build import derived_seed
from commitenv.scenarios.schema import Scenario
from commitenv.scoring import score
from commitenv.sim.migration import MIGRATE_MODES

log = logging.getLogger("commitenv")


@dataclass
class EvalResult:
    """Everything one evaluation produced."""

    scenario: str
    controller: str
    seed: int
    hourly: list[dict[str, Any]]
    requests: dict[str, np.ndarray]
    summary: dict[str, Any]
    history: list[dict[str, float]] = field(default_factory=list)
    bills: dict[str, np.ndarray] | None = None  # per-request energy bills (BILL_COLUMNS) when attributed
    decisions: list[dict[str, Any]] = field(default_factory=list)  # one row per interval (DECISION_COLUMNS)

    def write(self, out_dir: str | Path, *, requests: bool = True, figure: bool = True, bills: bool = True,
              decisions: bool = True) -> Path:
        """Write summary.json, hourly.csv, decisions.csv, requests.csv, bills.csv (when the run was attributed)
        and overview.png into ``out_dir`` atomically: files are built in a temporary folder beside it and moved
        in only when all succeeded, summary.json last (a folder with summary.json is complete)."""
        out = Path(out_dir)
        if out.exists() and not out.is_dir():
            raise NotADirectoryError(f"{out}: exists and is not a folder")
        parent = out.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=parent))
        except OSError as e:  # name the folder asked for, not the temporary one beside it
            raise _out_error(e, out) from None
        try:
            (tmp / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
            _write_csv(tmp / "hourly.csv", self.hourly)
            if decisions and self.decisions:
                write_decisions(tmp / "decisions.csv", self.decisions)
            if requests:
                _write_columns(tmp / "requests.csv", self.requests)
            if bills and self.bills is not None:
                write_bills(tmp / "bills.csv", self.bills)
            if figure:
                from commitenv.plots import overview_figure

                overview_figure(tmp / "overview.png", scenario=self.scenario, controller=self.controller,
                                seed=self.seed, hourly=self.hourly, intervals=self.interval_rows(),
                                summary=self.summary)
            out.mkdir(exist_ok=True)
            for f in tmp.iterdir():
                dest = out / f.name
                if dest.is_dir():
                    raise IsADirectoryError(f"{dest}: a folder is in the way of the output file")
            for f in sorted(tmp.iterdir(), key=lambda f: f.name == "summary.json"):
                os.replace(f, out / f.name)
        except IsADirectoryError:
            raise
        except OSError as e:
            raise _out_error(e, out) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return out


    def interval_rows(self) -> list[dict[str, Any]]:
        """One row per interval with its decision, energy, commitment pace, arrivals and misses: the decision rows
        (decisions.csv), or for a result scored from an env directly (no decision rows) the same from its history
        (the controller's meter), hourly commitments and request table."""
        if self.decisions and "energy_j" in self.decisions[0]:
            return self.decisions
        n = len(self.history)
        per_hour = max(n // max(len(self.hourly), 1), 1)
        dt = float(self.history[0]["t"]) if n else 60.0
        rows = []
        for k, h in enumerate(self.history):
            commit = self.hourly[min(k // per_hour, len(self.hourly) - 1)]["commitment_mj"] * 1e6
            rows.append({"t_start_s": k * dt, "active": h["active"], "clock_mhz": h["clock_mhz"],
                         "energy_j": h["interval_j"], "commitment_pace_j": commit / per_hour if commit > 0 else None})
        add_interval_outcomes(rows, self.requests["arrival_s"], self.requests["met"], dt)
        return rows


def _out_error(e: OSError, out: Path) -> OSError:
    """``e`` restated about the output folder ``out`` (the errno, hence the OSError subclass, is kept)."""
    reason = e.strerror or str(e)
    msg = f"{out}: cannot write the results there ({reason})"
    return OSError(e.errno, msg) if e.errno is not None else OSError(msg)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


DECISION_COLUMNS = ("interval", "t_start_s", "active", "clock_mhz", "applied_s", "stale", "planning_delay_s",
                    "reported_delay_s", "measured_s", "energy_j", "commitment_pace_j", "arrivals", "misses")


SHARED_DECISION_COLUMNS = ("active_by_model", "clocks_mhz", "shares", "placement", "migrate")  # a shared pool's (space-separated lists)


def write_decisions(path: Path, rows: list[dict[str, Any]]) -> None:
    """``decisions.csv``: `DECISION_COLUMNS` (and, on a shared pool, `SHARED_DECISION_COLUMNS`: empty where the
    action did not give them); times with up to microsecond precision, empty when None."""
    cols = DECISION_COLUMNS + (SHARED_DECISION_COLUMNS if any("active_by_model" in r for r in rows) else ())
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for r in rows:
            w.writerow(["" if r.get(c) is None else (f"{r[c]:.6f}".rstrip("0").rstrip(".") if isinstance(r[c], float)
                                                     else r[c]) for c in cols])


BILL_COLUMNS = ("request_id", "tenant", "prompt_tokens", "output_tokens", "own_j", "shared_j", "total_j",
                "token_split_j")


def write_bills(path: Path, bills: dict[str, np.ndarray]) -> None:
    """``bills.csv``: `BILL_COLUMNS` first, then any extra columns (e.g. the replay correction)."""
    cols = {k: bills[k] for k in BILL_COLUMNS}
    cols.update({k: v for k, v in bills.items() if k not in cols})
    _write_columns(path, cols)


def _write_columns(path: Path, cols: dict[str, np.ndarray]) -> None:
    names = list(cols)
    fmt = []
    for n in names:
        fmt.append("%d" if np.issubdtype(cols[n].dtype, np.integer) or cols[n].dtype == bool else "%.6f")
    data = np.column_stack([cols[n].astype(np.float64) if cols[n].dtype != bool else cols[n].astype(np.int64) for n in names])
    np.savetxt(path, data, fmt=fmt, delimiter=",", header=",".join(names), comments="")


def evaluate(
    controller: Any,
    scenario: str | Scenario,
    seed: int = 0,
    *,
    progress: bool = False,
    controller_kwargs: dict[str, Any] | None = None,
    attribution: bool = False,
) -> EvalResult:
    """Run ``controller`` (a name or an instance) on ``scenario`` for one episode and score it; with
    ``attribution`` also bill every request (``EvalResult.bills``, written as bills.csv)."""
    return run_episode(controller, scenario, seed, progress=progress, controller_kwargs=controller_kwargs,
                       attribution=attribution)[1]


def run_episode(
    controller: Any,
    scenario: str | Scenario,
    seed: int = 0,
    *,
    progress: bool = False,
    controller_kwargs: dict[str, Any] | None = None,
    attribution: bool = False,
    backend: Any = None,
    charge_planning: bool = True,
) -> tuple[Any, EvalResult]:
    """`evaluate`, also returning the finished environment (its pool, table, actions and attributor).

    ``controller`` is an instance or a spec string (a registered or entry-point name, ``module:Class`` or
    ``path/to/file.py:Class``; see `commitenv_controllers.registry.resolve`). ``backend``: None for the simulator,
    or a pool factory (`commitenv.backends.pool.fake_backend`, or one of real GPUs); the run is marked
    ``"backend": "hardware"``. ``charge_planning`` False leaves the runner's measurement out where the scenario
    asks for it (the delay is then what the controller reports; for tests that compare two runs of a slow planner
    bit for bit)."""
    from commitenv.envs import CommitServeEnv
    from commitenv.control import Controller
    from commitenv.registry import controller_name, origin_of, resolve

    recorded = _jsonable(controller_kwargs) if controller_kwargs else None
    if isinstance(controller, str):
        spec = resolve(controller)
        ctrl, origin = spec.make(**(controller_kwargs or {})), spec.origin
    else:
        ctrl, origin = controller, origin_of(controller)
    if not isinstance(ctrl, Controller):
        raise TypeError(f"controller: expected a commitenv.control.Controller, got {type(ctrl).__name__}")
    name = controller_name(ctrl)
    env = CommitServeEnv(scenario, attribution=attribution, backend=backend)
    t_start = time.perf_counter()
    obs, info = env.reset(seed=seed)
    # hindsight door: only for a controller whose class declares it (the oracle); the run is marked below
    hindsight = start_controller(ctrl, env, seed)
    steps = env.H * env.K
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=steps, unit="interval", desc=f"{env.scenario.name} / {name}", leave=False)
    ret = 0.0
    terminated = False
    decisions: list[dict[str, Any]] = []
    charge = env.charges_planning and charge_planning  # the runner measures each decision (realism paper, hard)
    clock = PlanningClock()
    settled_prev = 0.0  # the settlement meter at the last boundary (each interval's energy_j is its change)
    try:
        while not terminated:
            if charge:
                with clock:
                    action = ctrl.act(obs, info)
                env.charge_planning(clock.seconds)
            else:
                action = ctrl.act(obs, info)
            reported = env.reported_planning_delay_s  # what the controller reported for this action
            n_changes = len(env.actions)
            obs, reward, terminated, truncated, info = env.step(action)
            decisions.append(_decision(env, action, env.actions[n_changes:], env.applied_planning_delay_s,
                                       bool(info.get("stale_decision")), reported, clock.seconds if charge else None))
            settled_prev = _add_interval_energy(decisions[-1], env, settled_prev)
            ret += reward
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        ctrl.close()
        if backend is not None:
            env.close()  # the workers stop and the GPUs' clocks are reset; the records stay readable
    wall = time.perf_counter() - t_start
    res = score_episode(env, name, seed, wall, ret)
    add_interval_outcomes(decisions, res.requests["arrival_s"], res.requests["met"], env.dt)
    res.decisions = decisions
    charged = [d["planning_delay_s"] for d in decisions]
    mode = env.realism.planning_delay.mode
    res.summary.update(planning_delay_mode=mode if charge or mode != "measured" else "measured, not charged",
                       planning_delay_s_mean=float(np.mean(charged)) if charged else 0.0,
                       planning_delay_s_max=float(max(charged, default=0.0)))  # (measured times: decisions.csv)
    if hindsight:
        res.summary["hindsight"] = True  # a bound, not a competitor: the leaderboard refuses it
    if backend is not None:
        res.summary["backend"] = "hardware"
        lag = getattr(env.pool, "lag", None)  # how far the replay fell behind real time (`commitenv.backends.lag`)
        if lag is not None:
            res.summary.update(lag.summary())
    if getattr(env, "shared", False):  # placement changes of a shared pool
        pool = env.pool
        res.summary.update(moves=pool.moves, cold_starts=pool.cold_starts, migrated_requests=pool.migrated,
                           migration_j=pool.migration_j)
    if origin is not None:
        res.summary["controller_origin"] = origin
    if recorded:
        res.summary["controller_kwargs"] = recorded
    for k, v in (ctrl.stats() or {}).items():  # the lifecycle's stats(): numbers only, never over a score
        if k in res.summary or isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.number)):
            continue
        res.summary[k] = v.item() if isinstance(v, np.generic) else v
    return env, res


def start_controller(ctrl: Any, env: Any, seed: int) -> bool:
    """Begin ``ctrl``'s episode on ``env`` (just reset with run seed ``seed``): its context (with the hindsight door
    only for a controller whose class declares it, the oracle), a controller seed derived one way from the run seed
    (the run seed would regenerate the trace), and its dispatch and local policies installed. Returns whether the
    controller uses hindsight (the run is then marked)."""
    from commitenv.control import ControllerContext

    hindsight = uses_hindsight(ctrl)
    ctrl.reset(ControllerContext.from_env(env, hindsight=hindsight), derived_seed(seed, "controller"))
    policy = ctrl.dispatch_policy()
    if policy is not None:
        env.set_dispatch(policy)
    local = ctrl.local_policy()
    if local is not None:
        env.set_local_policy(local)
    return hindsight


# ------------------------------------------------------------------------------------------ hindsight marking
def refuses_hindsight(controller_or_summary: Any) -> bool:
    """True when the leaderboard must refuse this: a controller (instance or class) whose class declares
    ``hindsight = True``, or a run's summary dict marked ``"hindsight": true`` (see `commitenv.hindsight`)."""
    if isinstance(controller_or_summary, dict):
        return controller_or_summary.get("hindsight") is True
    return uses_hindsight(controller_or_summary)


def _decision(env: Any, action: Any, changes: list[tuple], delay_s: float, stale: bool, reported_s: float = 0.0,
              measured_s: float | None = None) -> dict[str, Any]:
    """One row of decisions.csv: the (validated) action of interval ``env.k - 1``, when it was applied and the
    planning delay charged, reported and measured."""
    k = env.k - 1
    act = np.asarray(action["active"])
    clock = int(np.asarray(action["clock"]).item())
    row = {
        "interval": k,
        "t_start_s": float(k * env.dt),
        "active": int(act.sum()),  # a shared pool: every model's instances (per model in active_by_model)
        "clock_mhz": int(env.clocks_mhz[clock]),
        "applied_s": float(changes[0][1]) if changes else None,
        "stale": int(stale),
        "planning_delay_s": delay_s,
        "reported_delay_s": reported_s,
        "measured_s": measured_s,
    }
    if getattr(env, "shared", False):
        row["active_by_model"] = " ".join(str(int(a)) for a in act.reshape(-1))
        if "clocks" in action:
            row["clocks_mhz"] = " ".join(str(env.clocks_mhz[int(c)]) for c in np.asarray(action["clocks"]))
        if "shares" in action or "share_weights" in action:  # (the shares applied, from either form)
            row["shares"] = " ".join(f"{float(x):g}" for x in env.shared_cfg.shares)
        if "placement" in action or "gpu_request" in action:  # (the placement granted)
            row["placement"] = " ".join(str(int(g)) for g in env.shared_cfg.gpus)
        if "migrate" in action:
            row["migrate"] = MIGRATE_MODES[int(np.asarray(action["migrate"]).item())]
    return row


def _add_interval_energy(row: dict[str, Any], env: Any, settled_prev: float) -> float:
    """Set ``row``'s ``energy_j`` (the settlement meter's change over the interval just stepped) and
    ``commitment_pace_j`` (its hour's commitment over the intervals per hour; None on an energy-only hour);
    return the meter's reading, the next interval's start."""
    settled = float(env.settlement.e_prev)
    commit = float(env.settlement.commit_j[row["interval"] // env.K])
    row["energy_j"] = settled - settled_prev
    row["commitment_pace_j"] = commit / env.K if commit > 0 else None
    return settled


def add_interval_outcomes(rows: list[dict[str, Any]], arrival_s: np.ndarray, met: np.ndarray, dt: float) -> None:
    """Set every decision row's ``arrivals`` and ``misses``: the requests arriving in its interval
    [k dt, (k + 1) dt), and how many of those did not meet their deadline."""
    n = len(rows)
    if n == 0:
        return
    k = np.floor_divide(np.asarray(arrival_s, dtype=np.float64), dt).astype(np.int64)
    if len(k) and (k.min() < 0 or k.max() >= n):  # the env replays no arrival outside its horizon
        raise ValueError(f"decisions: an arrival at {float(arrival_s[np.argmax((k < 0) | (k >= n))])} s lies "
                         f"outside the episode's {n} intervals of {dt} s")
    arrivals = np.bincount(k, minlength=n)
    misses = np.bincount(k, weights=~np.asarray(met, dtype=bool), minlength=n)
    for row, a, m in zip(rows, arrivals, misses):
        row["arrivals"] = int(a)
        row["misses"] = int(m)


def _jsonable(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Controller arguments as recorded in summary.json (refused when they are not plain JSON values, since
    `commitenv attribute` must be able to pass them back)."""
    try:
        return json.loads(json.dumps(kwargs))
    except (TypeError, ValueError) as e:
        raise ValueError(f"controller_kwargs: expected plain JSON values to record with the run ({e})") from None


def score_episode(env: Any, controller_name: str, seed: int, wall_s: float, episode_return: float) -> EvalResult:
    """Score a finished episode of ``env`` from the engine's records."""
    pool = env.pool
    table = env.table
    sc = env.scenario
    H = env.H
    energy = env.settlement.energy_j.copy()
    commit = np.asarray(env.settlement.commit_j, dtype=np.float64)
    rejected = np.asarray(pool.rejected, dtype=bool)
    slo = slo_outcome(table.arrival_s, pool.finish_t, pool.deadline, H, rejected=rejected)
    cost = deviation_cost_kwh(energy, commit, sc.lambda_plus, sc.lambda_minus)
    att = slo.by_hour_pct
    gate, gate0 = slo_gate(slo, sc.epsilon), slo_gate(slo, 0.0)
    hourly = [
        {
            "hour": h,
            "arrivals": int(slo.arrivals[h]),
            "energy_mj": float(energy[h] / 1e6),
            "commitment_mj": float(commit[h] / 1e6),
            "deviation_pct": deviation_pct_or_none(energy[h], commit[h]),  # None: energy-only hour
            "cost_kwh_eq": float(cost[h]),
            "attainment_pct": float(att[h]),
            "late": int(slo.late[h]),
            "unfinished": int(slo.unfinished[h]),
            "rejected": int(slo.rejected[h]),
        }
        for h in range(H)
    ]
    n_rejected = int(rejected.sum())
    reason = rejection_reason(pool, rejected) if n_rejected else None
    if n_rejected:
        log.warning("%s / %s: %d of %d requests rejected (%s); they never ran and count as SLO misses",
                    sc.name, controller_name, n_rejected, len(table), reason)
    summary: dict[str, Any] = {"scenario": sc.name, "controller": controller_name, "seed": seed}
    src = _scenario_file(sc)
    if src is not None:
        summary["scenario_file"] = src  # a scenario not shipped: where `commitenv attribute` finds it again
    summary.update(summarize(energy, commit, sc.lambda_plus, sc.lambda_minus, slo))
    tail_cost = float(getattr(env, "tail_cost_kwh", 0.0))  # the completion tail, settled as overuse (the env's reward)
    summary["hours_cost_kwh_eq"] = summary["cost_kwh_eq"]
    summary["tail_cost_kwh_eq"] = tail_cost
    summary["cost_kwh_eq"] = summary["hours_cost_kwh_eq"] + tail_cost
    summary["settlement"] = settlement_kind(commit)  # "energy_only": no commitment, deviations None
    summary["objective"] = {"gate": sc.objective.gate.model_dump(exclude={"reason"}), "epsilon": sc.epsilon,
                            "lower": sc.objective.lower, "upper": sc.objective.upper}
    summary.update(
        {
            "misses": int(len(table) - slo.met.sum()),
            "late": int(slo.late.sum()),
            "unfinished": int(slo.unfinished.sum()),
            "rejected": n_rejected,
            "rejected_reason": reason,
            "requests": int(len(table)),
            "slo_gate_pass": gate.passed,  # (a relative gate: None here, set once the reference is known)
            "slo_gate_epsilon": gate.epsilon,
            "slo_gate_worst_hour_pct": gate.worst_hour_pct,
            "slo_gate_worst_hour": gate.worst_hour,
            "slo_gate_pass_eps0": gate0.passed,
            "slo_arrivals_by_hour": slo.arrivals.tolist(),
            "slo_misses_by_hour": (slo.arrivals - slo.met).tolist(),
            "tail_energy_mj": float(env.tail_energy_j / 1e6),
            "episode_return": float(episode_return),  # the env's reward: -cost + reward_offset_kwh
            "penalised_return": float(episode_return - sc.miss_penalty_kwh * int(len(table) - slo.met.sum())),
            "reward_offset_kwh": float(env.reward_offset_kwh),
            "wall_s": round(float(wall_s), 3),
        }
    )
    if sc.objective.gate.kind == "absolute":  # the scoring function's gate, with the same fields as once scored
        summary.update({k: v for k, v in score(summary).fields().items() if k.startswith("slo_gate")})
    else:  # a relative gate is judged against the reference run of the same episode (`commitenv.scoring`)
        summary.update(slo_gate_kind="relative", slo_gate_pass=None, slo_gate_shortfall_pct=None,
                       slo_gate_failed_hours=None)
    lat = latency_outcome(table.arrival_s, pool.first_t, pool.finish_t, pool.max_tbt_s, table.prompt_tokens,
                          pool.out_tokens, ~rejected)
    summary.update(latency_summary(lat, getattr(pool, "model_of", np.zeros(len(table), dtype=np.int64)),
                                   list(getattr(env, "model_names", ())) or [p.model.name for p in pool.profiles]))
    ttft = lat.ttft_s
    requests = {
        "request_id": table.request_id,
        "tenant": table.tenant.astype(np.int64),
        "arrival_s": table.arrival_s,
        "prompt_tokens": table.prompt_tokens,
        "output_tokens": pool.out_tokens,
        "ttft_s": ttft,
        "tbt_s": lat.tbt_s,  # the longest gap between consecutive tokens (the per-token TBT SLO's measure)
        "tbt_mean_s": lat.tbt_mean_s,
        "slo_class": lat.cls,
        "ttft_met": lat.ttft_met,
        "tbt_met": lat.tbt_met,
        "tbt_mean_met": lat.tbt_mean_met,
        "finish_s": pool.finish_t,
        "deadline_s": pool.deadline,
        "met": (pool.finish_t <= pool.deadline) & ~rejected,
        "rejected": rejected.copy(),
        "preemptions": pool.preemptions.astype(np.int64),
    }
    bills = bill_table(env) if getattr(env, "attributor", None) is not None else None
    return EvalResult(sc.name, controller_name, seed, hourly, requests, summary, list(env.history), bills)


def latency_summary(lat: LatencyOutcome, model_of: np.ndarray, model_names: list[str]) -> dict[str, Any]:
    """Summary fields of the TTFT/TBT SLOs (`commitenv.latency_slo`): pooled, per class (flat keys, so multi-seed
    runs aggregate them) and per model."""
    n = max(len(lat.cls), 1)
    out: dict[str, Any] = {
        "ttft_attainment_pct": 100.0 * float(lat.ttft_met.sum()) / n,
        "tbt_attainment_pct": 100.0 * float(lat.tbt_met.sum()) / n,  # per token: every gap within the bound
        "tbt_mean_attainment_pct": 100.0 * float(lat.tbt_mean_met.sum()) / n,  # the mean gap (reported only)
        "latency_attainment_pct": 100.0 * float(lat.met.sum()) / n,
    }
    for name, v in attainment_by(lat.cls, lat.met, CLASS_NAMES).items():
        out[f"latency_attainment_{name}_pct"] = v["attainment_pct"]
        out[f"requests_{name}"] = v["requests"]
    out["latency_by_model"] = attainment_by(model_of, lat.met, model_names)
    return out


def rejection_reason(pool: Any, rejected: np.ndarray) -> str:
    """Why the engine refused the ``rejected`` requests of ``pool``: their prompt reached the context limit of
    the profile serving them (`Pool.attach`: prompt >= ``scheduler.context_limit``)."""
    profiles = list(getattr(pool, "profiles", []) or [])
    limits = sorted({int(p.scheduler.context_limit) for p in profiles})
    if len(limits) == 1:
        return f"prompt >= context limit {limits[0]} tokens"
    if limits:
        return f"prompt >= the serving model's context limit ({', '.join(map(str, limits))} tokens)"
    return "prompt >= context limit"


def bill_table(env: Any) -> dict[str, np.ndarray]:
    """Per-request bills of an attributed episode of ``env`` (`BILL_COLUMNS`, aligned with the table's rows)."""
    from commitenv.attribution.online import token_split_bills

    table, pool = env.table, env.pool
    b = env.bills()
    served = pool.replica_of >= 0
    return {
        "request_id": table.request_id.astype(np.int64),
        "tenant": table.tenant.astype(np.int64),
        "prompt_tokens": table.prompt_tokens.astype(np.int64),
        "output_tokens": pool.out_tokens.astype(np.int64),
        "own_j": b["own_j"],
        "shared_j": b["shared_j"],
        "total_j": b["total_j"],
        "token_split_j": token_split_bills(table.prompt_tokens, pool.out_tokens, float(b["total_j"].sum()), served),
    }


def _scenario_file(sc: Scenario) -> str | None:
    """The file ``sc`` was read from when it is not a shipped scenario (None for shipped or in-memory ones)."""
    src = sc._source
    if not src:
        return None
    try:
        from commitenv.scenarios.loader import resolve_scenario

        path, shipped = resolve_scenario(sc.name)
        if shipped and Path(path).resolve() == Path(src).resolve():
            return None
    except (ValueError, OSError):  # no shipped scenario of that name
        pass
    return str(Path(src).resolve())
