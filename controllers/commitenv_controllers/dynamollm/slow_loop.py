"""DynamoLLM's slow loop: forecast each class's load and choose the instance count and clocks with an integer
programme (OR-Tools)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from commitenv_controllers.dynamollm.capacity import classify

_OPT_HINT = 'pip install "commitenv[opt]"'


def _require_ortools():
    try:
        from ortools.linear_solver import pywraplp
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise ImportError(
            f"controller 'dynamollm' solves its instance-count integer program with OR-Tools, which is not "
            f"installed: {_OPT_HINT} (or pip install ortools)"
        ) from e
    return pywraplp


@dataclass(frozen=True)
class Plan:
    """Result of the instance-count integer program."""

    counts: tuple[int, ...]  # replicas per clock level
    active: int  # total replicas to keep active
    clock_idx: int  # clock of the plan (pool_clock) or the highest clock used
    power_w: float  # predicted pool power, standby replicas included
    feasible: bool  # False: the forecast exceeds N replicas at the top clock (plan = N at the top clock)


def plan_replicas(load: Any, cap: np.ndarray, dyn_j: np.ndarray, idle_w: Any, standby_w: float, n_max: int, *,
                  headroom: float = 1.1, pool_clock: bool = True, fixed_total: int | None = None,
                  top: int | None = None) -> Plan:
    """Minimum-power replica counts per clock with capacity >= load x headroom (OR-Tools SCIP MIP).

    ``load`` (requests/s per class, shape (C,)), ``cap`` and ``dyn_j`` (shape (C, F): requests/s one replica
    carries at clock f, energy per request above idle), ``idle_w`` (F,) active-idle power per clock.
    ``fixed_total`` pins the total count (used to price a given count for the transition check).
    """
    pywraplp = _require_ortools()
    load = np.asarray(load, dtype=np.float64)
    cap = np.asarray(cap, dtype=np.float64)
    dyn_j = np.asarray(dyn_j, dtype=np.float64)
    idle_w = np.asarray(idle_w, dtype=np.float64)
    C, F = cap.shape
    top = F - 1 if top is None else top
    need = load * headroom
    solver = pywraplp.Solver.CreateSolver("SCIP") or pywraplp.Solver.CreateSolver("CBC")
    if solver is None:  # pragma: no cover
        raise ImportError(f"OR-Tools has no MIP backend (SCIP/CBC) in this build: {_OPT_HINT}")
    lo_total = 1 if fixed_total is None else fixed_total
    hi_total = n_max if fixed_total is None else fixed_total
    x = [solver.IntVar(0, n_max, f"x{f}") for f in range(F)]
    y = [[solver.NumVar(0, solver.infinity() if cap[c, f] > 0 else 0.0, f"y{c}_{f}") for f in range(F)] for c in range(C)]
    for c in range(C):
        if need[c] > 0:
            solver.Add(sum(y[c][f] for f in range(F)) >= float(need[c]))
    for f in range(F):
        solver.Add(sum(y[c][f] * (1.0 / cap[c, f]) for c in range(C) if cap[c, f] > 0) <= x[f])
    solver.Add(sum(x) >= lo_total)
    solver.Add(sum(x) <= hi_total)
    if pool_clock:
        z = [solver.BoolVar(f"z{f}") for f in range(F)]
        for f in range(F):
            solver.Add(x[f] <= n_max * z[f])
        solver.Add(sum(z) == 1)
    obj = sum(x[f] * float(idle_w[f] - standby_w) for f in range(F))
    obj += sum(y[c][f] * float(dyn_j[c, f]) for c in range(C) for f in range(F) if cap[c, f] > 0)
    solver.Minimize(obj)
    status = solver.Solve()
    if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        n = n_max if fixed_total is None else fixed_total
        counts = [0] * F
        counts[top] = n
        dyn_top = np.where(np.isfinite(dyn_j[:, top]), dyn_j[:, top], 0.0)
        power = n * (idle_w[top] - standby_w) + float(np.sum(need * dyn_top)) + n_max * standby_w
        return Plan(tuple(counts), n, top, power, False)
    counts = [int(round(v.solution_value())) for v in x]
    used = [f for f in range(F) if counts[f] > 0]
    clock = max(used) if used else top
    power = float(solver.Objective().Value()) + n_max * standby_w
    return Plan(tuple(counts), int(sum(counts)), clock, power, True)


def forecast_load(recent: Any, window_s: float, t: float, *, bucket_s: float = 300.0, mode: str = "peak") -> np.ndarray:
    """Requests/s per class expected over the next period, from ``recent`` = `probe.recent_arrivals(window_s)`
    taken at time ``t`` (arrival times shifted by ``window_s``, i.e. in [t, t + window_s]; predicted output
    lengths). ``mode="peak"``: the highest rate of each class over the whole ``bucket_s`` buckets of the
    window, counted back from its newest end; ``"mean"``: the window mean."""
    if mode not in ("peak", "mean"):
        raise ValueError(f"dynamollm forecast: expected 'peak' or 'mean', got {mode!r}")
    lam = np.zeros(9)
    if recent is None or len(recent) == 0 or window_s <= 0:
        return lam
    cls = classify(recent.prompt_tokens, recent.output_tokens)
    if mode == "mean":
        return np.bincount(cls, minlength=9) / window_s
    bucket = min(bucket_s, window_s)
    nb = max(1, int(math.floor(window_s / bucket + 1e-9)))
    age = (t + window_s) - np.asarray(recent.arrival_s, dtype=np.float64)  # 0 = newest
    pos = np.floor(np.maximum(age, 0.0) / bucket).astype(np.int64)
    keep = pos < nb
    counts = np.zeros((nb, 9))
    np.add.at(counts, (pos[keep], cls[keep]), 1.0)
    return counts.max(axis=0) / bucket
