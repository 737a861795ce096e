"""The optimization core of the MPC controller: one receding-horizon plan over the rest of the hour, as a pure
function of a `PlanProblem` (no env, no snapshot), solved with cvxpy. The formulation is written out in the
package docstring (`commitenv_controllers.mpc`); the symbols below follow it."""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

J_PER_KWH = 3.6e6
LP_SOLVERS = ("CLARABEL", "HIGHS", "ECOS", "SCS")  # relaxed form, a QP (HiGHS's QP solver stalled on a test case)
MILP_SOLVERS = ("HIGHS", "SCIPY", "GLPK_MI", "CBC", "SCIP")  # milp form (piecewise-linear tie-break, no QP)

Form = Literal["relaxed", "milp"]


@dataclass(frozen=True)
class PlanProblem:
    """Inputs of one plan: R remaining intervals (the current one first), F clock levels, S work scenarios.
    Energies in J, times in s, costs in kWh-equivalent (the settlement's unit)."""

    interval_s: float  # Delta
    n_replicas: int  # N
    idle_w: np.ndarray  # (F,) P_f: active-idle power at clock f
    standby_w: float  # P_sb
    busy_s: np.ndarray  # (R, F) W_jf: replica-seconds the forecast work of interval j needs at clock f
    work_j: np.ndarray  # (R, F) Q_jf: step energy of that work (idle floor during the steps included)
    requests: np.ndarray  # (R,) c_j: forecast requests of interval j
    consumed_j: float  # M: metered energy of the hour so far
    commitment_j: float  # E*: the hour's commitment
    lambda_plus: float
    lambda_minus: float
    miss_penalty_kwh: float  # p: cost of one deadline miss
    multipliers: np.ndarray  # (S, R) xi_sj: work multiplier of scenario s in interval j
    probabilities: np.ndarray  # (S,) pi_s
    late_frac: np.ndarray  # (F,) q_f: fraction of requests late at clock f whatever the capacity
    max_util: float = 1.0  # u: busy time may fill at most this fraction of the active replicas' time
    energy_scale: float = 1.0  # kappa: metered / modelled energy (calibration)
    min_active: int = 1
    nominal_j: np.ndarray | None = None  # (R,) e-bar_j, tie-break reference; default (E* - M) / R each
    tie_weight: float = 1e-2  # weight of the tie-break (see the formulation)

    def __post_init__(self) -> None:
        R, F = np.shape(self.busy_s) if np.ndim(self.busy_s) == 2 else (-1, -1)
        if R < 1 or F < 1:
            raise ValueError(f"PlanProblem.busy_s: expected a (R, F) array with R, F >= 1, got shape {np.shape(self.busy_s)}")
        checks = [("work_j", np.shape(self.work_j), (R, F)), ("requests", np.shape(self.requests), (R,)),
                  ("idle_w", np.shape(self.idle_w), (F,)), ("late_frac", np.shape(self.late_frac), (F,))]
        S = len(np.atleast_1d(self.probabilities))
        checks.append(("multipliers", np.shape(self.multipliers), (S, R)))
        if self.nominal_j is not None:
            checks.append(("nominal_j", np.shape(self.nominal_j), (R,)))
        for name, got, want in checks:
            if tuple(got) != want:
                raise ValueError(f"PlanProblem.{name}: expected shape {want}, got {tuple(got)}")
        for name in ("busy_s", "work_j", "requests", "multipliers", "probabilities", "late_frac", "idle_w"):
            a = np.asarray(getattr(self, name), dtype=np.float64)
            if not np.all(np.isfinite(a)) or np.any(a < 0):
                raise ValueError(f"PlanProblem.{name}: expected finite values >= 0")
        if abs(float(np.sum(self.probabilities)) - 1.0) > 1e-6:
            raise ValueError(f"PlanProblem.probabilities: expected a sum of 1, got {float(np.sum(self.probabilities))}")
        if not (self.interval_s > 0 and self.n_replicas >= 1 and 1 <= self.min_active <= self.n_replicas):
            raise ValueError("PlanProblem: expected interval_s > 0 and 1 <= min_active <= n_replicas")
        if not (0 < self.max_util <= 1 and self.energy_scale > 0 and self.tie_weight >= 0):
            raise ValueError("PlanProblem: expected max_util in (0, 1], energy_scale > 0, tie_weight >= 0")
        if not (self.lambda_plus > 0 and self.lambda_minus > 0 and self.miss_penalty_kwh >= 0):
            raise ValueError("PlanProblem: expected lambda_plus, lambda_minus > 0 and miss_penalty_kwh >= 0")

    @property
    def shape(self) -> tuple[int, int, int]:
        """(R, F, S)."""
        return (*np.shape(self.busy_s), len(np.atleast_1d(self.probabilities)))

    def nominal(self) -> np.ndarray:
        """e-bar_j: the tie-break reference (ePACT's equal split of the remainder by default)."""
        R = self.shape[0]
        if self.nominal_j is not None:
            return np.asarray(self.nominal_j, dtype=np.float64)
        return np.full(R, (self.commitment_j - self.consumed_j) / R)


@dataclass(frozen=True)
class PlanResult:
    """A solved plan: per remaining interval the configuration mix and its energy (J)."""

    status: str  # cvxpy status
    form: str
    solver: str
    cost_kwh: float  # expected settlement + miss cost of the plan (tie-break excluded)
    energy_j: np.ndarray  # (R,) expected interval energy, sum_s pi_s E_sj
    energy_by_scenario_j: np.ndarray  # (S, R)
    hour_energy_j: np.ndarray  # (S,) M + sum_j E_sj
    active: np.ndarray  # (R,) planned active replicas (fractional in the relaxed form)
    clock_idx: np.ndarray  # (R,) clock level with the largest weight z_jf
    clock_mix: np.ndarray  # (R, F) z_jf
    replicas_by_clock: np.ndarray  # (R, F) n_jf
    misses: np.ndarray  # (R,) expected misses
    solve_s: float  # wall time of building and solving
    info: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """A usable plan: solved to optimality, or (milp) stopped by the time limit with an incumbent."""
        return self.status in ("optimal", "optimal_inaccurate", "user_limit") and bool(np.all(np.isfinite(self.energy_j)))


def interval_energy(p: PlanProblem, j: int, active: float, clock: int, multiplier: float = 1.0) -> float:
    """Modelled energy (J) of interval ``j`` with ``active`` replicas at clock level ``clock`` under work
    multiplier ``multiplier``: kappa [xi (Q - P W) + P Delta n + P_sb Delta (N - n)]."""
    P = float(p.idle_w[clock])
    dyn = float(p.work_j[j, clock]) - P * float(p.busy_s[j, clock])
    d = p.interval_s
    return p.energy_scale * (multiplier * dyn + P * d * active + p.standby_w * d * (p.n_replicas - active))


def capacity_active(p: PlanProblem, j: int, clock: int, multiplier: float = 1.0) -> float:
    """Fewest (fractional) active replicas that carry interval ``j``'s work at ``clock``: xi W / (u Delta)."""
    return multiplier * float(p.busy_s[j, clock]) / (p.max_util * p.interval_s)


def installed_solver(form: Form, solver: str | None = None) -> str:
    """The cvxpy solver to use for ``form`` (``solver`` if given and installed)."""
    import cvxpy as cp

    have = set(cp.installed_solvers())
    if solver is not None:
        if solver.upper() not in have:
            raise ValueError(f"mpc solver: {solver!r} is not installed in cvxpy (installed: {', '.join(sorted(have))})")
        return solver.upper()
    for s in (MILP_SOLVERS if form == "milp" else LP_SOLVERS):
        if s in have:
            return s
    raise ValueError(f"mpc: no cvxpy solver for the {form} form is installed (want one of "
                     f"{MILP_SOLVERS if form == 'milp' else LP_SOLVERS}; installed: {', '.join(sorted(have))})")


def _pwl_square(d, scale: float):
    """Convex piecewise-linear over-approximation of (d/scale)^2 (elementwise) for the milp form: chords of the
    parabola between the breakpoints 0, 2^-6 ... 2^3 (in units of ``scale``). Returns (t, constraints)."""
    import cvxpy as cp

    t = cp.Variable(d.shape, nonneg=True)
    pts = [0.0] + [2.0 ** k for k in range(-6, 4)]
    cons = []
    for a, b in zip(pts[:-1], pts[1:]):
        slope = (a + b) / scale  # chord of x^2 between a and b, in units of d
        offset = a * b
        cons += [t >= slope * d - offset, t >= -slope * d - offset]
    return t, cons


def solve_plan(p: PlanProblem, form: Form = "relaxed", solver: str | None = None,
               time_limit_s: float = 1.0, integer_horizon: int | None = None) -> PlanResult:
    """Solve the plan (see the package docstring for the program). ``form="relaxed"``: replicas and clock
    weights continuous (an LP plus a small quadratic tie-break); ``"milp"``: whole replicas and one clock per
    interval (binary z, piecewise-linear tie-break), within ``time_limit_s`` (an incumbent found by then is
    used, status ``user_limit``); ``integer_horizon`` (milp): only the first that many intervals are integer,
    the later ones relaxed (None: all). Without ``solver`` the first installed of `LP_SOLVERS` /
    `MILP_SOLVERS` is used, and the next one if it fails."""
    import cvxpy as cp

    if form not in ("relaxed", "milp"):
        raise ValueError(f"mpc form: expected 'relaxed' or 'milp', got {form!r}")
    t0 = time.perf_counter()
    names = [installed_solver(form, solver)]
    if solver is None:
        have = set(cp.installed_solvers())
        names += [s for s in (MILP_SOLVERS if form == "milp" else LP_SOLVERS) if s in have and s not in names]
    prob, parts = _build(p, form, integer_horizon)
    status, used = "not solved", names[0]
    for name in names:
        used = name
        try:
            with warnings.catch_warnings():  # "solution may be inaccurate": the status says so
                warnings.simplefilter("ignore", UserWarning)
                prob.solve(solver=name, **_options(name, form, time_limit_s))
            status = str(prob.status)
        except cp.error.SolverError as e:
            status = f"solver error: {e}"
            continue
        if parts["z"].value is not None and parts["n"].value is not None:
            break
    wall = time.perf_counter() - t0
    if parts["z"].value is None or parts["n"].value is None:
        return _failed(p, form, used, status, wall)
    R, F, S = p.shape
    unit = parts["unit"]
    zv = np.clip(np.asarray(parts["z"].value), 0.0, 1.0)
    nv = np.clip(np.asarray(parts["n"].value), 0.0, float(p.n_replicas))
    Es = np.array([np.asarray(e.value, dtype=np.float64) for e in parts["E_s"]]) * unit  # (S, R), J
    miss = np.array([float(m.value) for m in parts["m_s"]])
    pi = np.asarray(p.probabilities, dtype=np.float64)
    hour = p.consumed_j + Es.sum(axis=1)
    exp_cost = float(pi @ (p.lambda_plus * np.maximum(hour - p.commitment_j, 0.0)
                           + p.lambda_minus * np.maximum(p.commitment_j - hour, 0.0))) / J_PER_KWH
    exp_cost += p.miss_penalty_kwh * float(pi @ miss)
    return PlanResult(status, form, used, exp_cost, pi @ Es, Es, hour, nv.sum(axis=1), np.argmax(zv, axis=1), zv, nv,
                      _interval_misses(p, zv, nv), wall)


def _options(name: str, form: str, time_limit_s: float) -> dict:
    if form != "milp":
        return {}
    if name == "HIGHS":
        return {"time_limit": float(time_limit_s)}
    if name == "SCIPY":
        return {"scipy_options": {"time_limit": float(time_limit_s)}}
    return {}


def _build(p: PlanProblem, form: str, integer_horizon: int | None = None):
    """The cvxpy problem of `solve_plan`. Energies in units of U = the nominal interval energy (E*/K-sized, so
    that every coefficient is O(1)), costs in units of lambda x U; variables z, n (R, F) and one slack (R, F)
    per scenario."""
    import cvxpy as cp

    R, F, S = p.shape
    milp = form == "milp"
    d = p.interval_s
    N = p.n_replicas
    W = np.asarray(p.busy_s, dtype=np.float64)
    Q = np.asarray(p.work_j, dtype=np.float64)
    P = np.asarray(p.idle_w, dtype=np.float64)
    xi = np.asarray(p.multipliers, dtype=np.float64)
    pi = np.asarray(p.probabilities, dtype=np.float64)
    c = np.asarray(p.requests, dtype=np.float64)
    q = np.asarray(p.late_frac, dtype=np.float64)
    unit = max(abs(p.commitment_j - p.consumed_j) / R, float(np.mean(P)) * d * N, 1.0)  # J
    D = p.energy_scale * (Q - P[None, :] * W) / unit  # dynamic energy above the idle floor
    per_rep = p.energy_scale * (P - p.standby_w) * d / unit  # (F,) per active replica over an interval
    base = p.energy_scale * p.standby_w * d * N / unit  # every replica in standby
    pen = p.miss_penalty_kwh * J_PER_KWH / unit  # cost of a miss in lambda-units x U
    miss_rate = np.where(W > 0, c[:, None] / np.maximum(W, 1e-12), 0.0) * d  # misses per interval-replica of slack

    # explicit finite bounds on every variable, and no `@` with them: cvxpy 1.9's bound propagation turns
    # inf * 0 into NaN in a matmul and HiGHS then reports a feasible integer problem as infeasible
    L = (R if integer_horizon is None else min(max(int(integer_horizon), 1), R)) if milp else 0  # integer rows
    zs, ns = [], []
    if L:
        zs.append(cp.Variable((L, F), boolean=True))
        ns.append(cp.Variable((L, F), integer=True, bounds=[0.0, float(N)]))
    if R - L:
        zs.append(cp.Variable((R - L, F), bounds=[0.0, 1.0]))
        ns.append(cp.Variable((R - L, F), bounds=[0.0, float(N)]))
    z = zs[0] if len(zs) == 1 else cp.vstack(zs)
    n = ns[0] if len(ns) == 1 else cp.vstack(ns)
    cons = [cp.sum(z, axis=1) == 1, n <= N * z, n >= p.min_active * z, cp.sum(n, axis=1) <= N]
    E_s, m_s, cost_s = [], [], []
    Ek = p.commitment_j / unit
    M = p.consumed_j / unit
    for s in range(S):
        need = xi[s][:, None] * W / d  # replicas the work occupies (interval-replicas)
        slack = cp.Variable((R, F), bounds=[0.0, float(need.max()) + 1.0])  # unserved work
        cons.append(slack >= cp.multiply(need, z) - p.max_util * n)
        e = cp.sum(cp.multiply(xi[s][:, None] * D, z), axis=1) + cp.sum(cp.multiply(n, per_rep[None, :]), axis=1) + base
        miss = cp.sum(cp.multiply(miss_rate, slack)) + cp.sum(cp.multiply(xi[s][:, None] * c[:, None] * q[None, :], z))
        total = M + cp.sum(e)
        E_s.append(e)
        m_s.append(miss)
        cost_s.append(p.lambda_plus * cp.pos(total - Ek) + p.lambda_minus * cp.pos(Ek - total) + pen * miss)
    cost = sum(pi[s] * cost_s[s] for s in range(S))
    e_mean = sum(pi[s] * E_s[s] for s in range(S))
    dev = e_mean - p.nominal() / unit
    lam = min(p.lambda_plus, p.lambda_minus)
    tie = 0.0
    if p.tie_weight > 0:
        if milp:
            tt, tcons = _pwl_square(dev, 1.0)
            cons += tcons
            tie = p.tie_weight * lam * cp.sum(tt)
        else:
            tie = p.tie_weight * lam * cp.sum_squares(dev)
    prob = cp.Problem(cp.Minimize(cost + tie), cons)
    return prob, {"z": z, "n": n, "E_s": E_s, "m_s": m_s, "unit": unit}


def _interval_misses(p: PlanProblem, z: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Expected misses per interval of a solved plan (recomputed from z, n: slack is not unique per interval)."""
    R, F, S = p.shape
    W = np.asarray(p.busy_s, dtype=np.float64)
    miss_rate = np.where(W > 0, p.requests[:, None] / np.maximum(W, 1e-12), 0.0) * p.interval_s
    out = np.zeros(R)
    for s in range(S):
        xi = p.multipliers[s][:, None]
        slack = np.maximum(xi * p.busy_s / p.interval_s * z - p.max_util * n, 0.0)
        out += p.probabilities[s] * ((miss_rate * slack).sum(axis=1) + (xi * p.requests[:, None] * p.late_frac[None, :] * z).sum(axis=1))
    return out


def _failed(p: PlanProblem, form: str, solver: str, status: str, wall: float) -> PlanResult:
    R, F, S = p.shape
    nan = np.full(R, math.nan)
    return PlanResult(status, form, solver, math.inf, nan, np.full((S, R), math.nan), np.full(S, math.nan), nan,
                      np.zeros(R, dtype=np.int64), np.zeros((R, F)), np.zeros((R, F)), nan, wall)
