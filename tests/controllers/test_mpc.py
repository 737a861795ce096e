"""MPC controller (cvxpy): the plan on hand-built two-interval cases with known optima (relaxed and integer
forms), the risk shift under asymmetric settlement rates, the forecast-error tracker on synthetic sequences,
the selection rule, argument checks, and short end-to-end runs (valid actions, finite cost, determinism)."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("cvxpy", reason="the mpc controller needs cvxpy (a core dependency): pip install commitenv")

import commitenv  # noqa: F401  (registers the scenario ids)
from commitenv.control import ControllerContext
from commitenv.envs import CommitServeEnv
from commitenv.evaluation import evaluate
from commitenv_controllers import check_kwargs, make, resolve
from commitenv_controllers.epact.selection import Evaluation
from commitenv_controllers.mpc import (ErrorTracker, MPCController, PlanProblem, candidate_configs, choose,
                                       commitment_shape, interval_energy, late_fraction, scenario_multipliers,
                                       solve_plan)
from commitenv_controllers.mpc.forecast import normal_nodes
from helpers.scenarios import HOUR_SCENARIO, toy_miss

KWH = 3.6e6


# ------------------------------------------------------------------------------------------ hand-built plans
def two_intervals(commitment_j: float, *, penalty: float = 0.015, W=(150.0, 250.0), Q=(3000.0, 5000.0),
                  requests=(15.0, 25.0), xi=((1.0, 1.0),), pi=(1.0,), lp: float = 2.0, lm: float = 1.0) -> PlanProblem:
    """N = 4 replicas, Delta = 100 s, one clock with P = 10 W active-idle, P_sb = 5 W standby, M = 1000 J
    consumed, u = 1. Interval energy E_j(n) = (Q_j - P W_j) + P Delta n + P_sb Delta (4 - n)
    = D_j + 2000 + 500 n with D = Q - 10 W; capacity needs n_j >= W_j / Delta."""
    return PlanProblem(interval_s=100.0, n_replicas=4, idle_w=np.array([10.0]), standby_w=5.0,
                       busy_s=np.array(W)[:, None], work_j=np.array(Q)[:, None], requests=np.array(requests),
                       consumed_j=1000.0, commitment_j=commitment_j, lambda_plus=lp, lambda_minus=lm,
                       miss_penalty_kwh=penalty, multipliers=np.array(xi, dtype=float),
                       probabilities=np.array(pi, dtype=float), late_frac=np.zeros(1))


def test_energy_model_by_hand():
    p = two_intervals(10500.0)
    # D = (3000 - 1500, 5000 - 2500) = (1500, 2500): E_0(n) = 3500 + 500 n, E_1(n) = 4500 + 500 n
    assert [interval_energy(p, 0, n, 0) for n in (1, 2, 4)] == [4000.0, 4500.0, 5500.0]
    assert [interval_energy(p, 1, n, 0) for n in (1, 2, 4)] == [5000.0, 5500.0, 6500.0]


def test_two_intervals_capacity_binds_known_optimum():
    """E* = 10500 J, M = 1000 J: 9500 J left, but carrying the work needs n >= (1.5, 2.5), i.e. at least
    E = (3500 + 750, 4500 + 1250) = (4250, 5750) = 10000 J: 500 J over. Each replica-interval short of
    capacity leaves 100 replica-s of work unserved = 10 misses (requests per replica-second 15/150 =
    25/250 = 0.1), costing 10 x 0.015 = 0.15 kWh-eq, against 500 J x lambda_plus 2 = 2.8e-4 kWh-eq of
    overuse it would save: keep capacity. Optimum n = (1.5, 2.5), E = (4250, 5750), cost 2 x 500 J."""
    r = solve_plan(two_intervals(10500.0), "relaxed")
    assert r.ok
    assert r.active == pytest.approx([1.5, 2.5], abs=1e-4)
    assert r.energy_j == pytest.approx([4250.0, 5750.0], abs=0.1)
    assert r.cost_kwh == pytest.approx(2 * 500 / KWH, rel=1e-3)
    assert r.misses == pytest.approx([0.0, 0.0], abs=1e-3)


def test_two_intervals_cheap_misses_cut_capacity_instead():
    """Same, with a miss costing 1e-6 kWh-eq: cutting one replica-interval (500 J = 2.8e-4 kWh-eq of
    overuse) for 10 misses (1e-5) pays, down to zero overuse (n_0 + n_1 = 3; lower would underuse). With
    n_0 <= 1.5 the shortfall, hence the misses, is 1 replica-interval = 10 misses whatever the split; the
    tie-break toward the equal split (4750, 4750) then takes the largest n_0 = 1.5: n = (1.5, 1.5),
    E = (4250, 5250), misses (0, 10), cost 10 x 1e-6."""
    r = solve_plan(two_intervals(10500.0, penalty=1e-6), "relaxed")
    assert r.active == pytest.approx([1.5, 1.5], abs=1e-3)
    assert r.energy_j == pytest.approx([4250.0, 5250.0], abs=1.0)
    assert r.misses == pytest.approx([0.0, 10.0], abs=0.01)
    assert r.cost_kwh == pytest.approx(10 * 1e-6, rel=1e-2)


def test_two_intervals_exact_fit_split_by_the_tie_break():
    """E* = 12000 J: 11000 J to spend with E_0 in [4250, 5500] and E_1 in [5750, 6500]: zero cost for any
    split, and the tie-break toward the equal split (5500, 5500) takes E_1 at its floor: E = (5250, 5750),
    n = (3.5, 2.5)."""
    r = solve_plan(two_intervals(12000.0), "relaxed")
    assert r.cost_kwh == pytest.approx(0.0, abs=1e-9)
    assert r.energy_j == pytest.approx([5250.0, 5750.0], abs=0.5)
    assert r.active == pytest.approx([3.5, 2.5], abs=1e-3)


@pytest.mark.parametrize("commitment, active, energy, cost", [
    # whole replicas: (2, 3) carries the work with E = (4500, 6000), 1000 J over E* - M = 9500; the
    # alternatives at 500 J over, (1, 3) or (2, 2), leave half a replica-interval short = 5 misses (0.075)
    (10500.0, [2, 3], [4500.0, 6000.0], 2 * 1000 / KWH),
    # 11000 J to spend: (3, 3) = 5000 + 6000 and (2, 4) = 4500 + 6500 both fit exactly; the tie-break
    # toward (5500, 5500) prefers (3, 3)
    (12000.0, [3, 3], [5000.0, 6000.0], 0.0),
])
def test_two_intervals_milp_known_optimum(commitment, active, energy, cost):
    r = solve_plan(two_intervals(commitment), "milp")
    assert r.ok and r.solver in ("HIGHS", "SCIPY", "GLPK_MI", "CBC", "SCIP")
    assert r.active.tolist() == pytest.approx(active, abs=1e-6)
    assert r.energy_j == pytest.approx(energy, abs=1e-3)
    assert r.cost_kwh == pytest.approx(cost, abs=1e-9)


def test_milp_integer_horizon_keeps_later_intervals_relaxed():
    """integer_horizon=1: interval 0 takes whole replicas (2 >= 1.5), interval 1 stays relaxed (2.5):
    E = (4500, 5750), 750 J over."""
    r = solve_plan(two_intervals(10500.0), "milp", integer_horizon=1)
    assert r.active == pytest.approx([2.0, 2.5], abs=1e-6)
    assert r.cost_kwh == pytest.approx(2 * 750 / KWH, rel=1e-6)


@pytest.mark.parametrize("lp, lm, hour", [(2.0, 1.0, (9500.0, 11500.0)), (1.0, 2.0, (11500.0, 13500.0))])
def test_asymmetric_rates_shift_the_planned_energy(lp, lm, hour):
    """Two equally likely work levels xi = 0.75 / 1.25 common to both intervals; W = 10 replica-s (capacity
    never binds), D = Q - P W = 2000 J per interval. Hour energy S = M + 4000 xi + 4000 + 500 (n_0 + n_1)
    = a + 4000 xi with a = 5000 + 500 (n_0 + n_1) in [6000, 9000]; E* = 11500. The expected cost is piecewise linear in a with kinks
    where a scenario meets E*; between them one scenario over- and the other underuses, slope
    (lambda_plus - lambda_minus) / 2. Overuse dearer (2:1): move down until the high scenario meets E*
    (a = 6500, n_0 + n_1 = 3): S = (9500, 11500), planned mean 10500 < E*. Underuse dearer (1:2): the low
    scenario meets E* (a = 8500): S = (11500, 13500), mean 12500 > E*."""
    p = two_intervals(11500.0, W=(10.0, 10.0), Q=(2100.0, 2100.0), requests=(1.0, 1.0),
                      xi=((0.75, 0.75), (1.25, 1.25)), pi=(0.5, 0.5), lp=lp, lm=lm)
    r = solve_plan(p, "relaxed")
    assert r.hour_energy_j == pytest.approx(hour, abs=1.0)
    mean_total = 1000.0 + r.energy_j.sum()
    assert (mean_total < 11500.0) == (lp > lm)
    # expected cost: half the time 2000 J on the cheap side
    assert r.cost_kwh == pytest.approx(0.5 * min(lp, lm) * 2000 / KWH, rel=1e-3)


def test_plan_rejects_bad_shapes_and_values():
    with pytest.raises(ValueError, match="work_j"):
        PlanProblem(interval_s=1.0, n_replicas=1, idle_w=np.ones(1), standby_w=0.5, busy_s=np.ones((2, 1)),
                    work_j=np.ones((3, 1)), requests=np.ones(2), consumed_j=0.0, commitment_j=1.0, lambda_plus=1.0,
                    lambda_minus=1.0, miss_penalty_kwh=0.0, multipliers=np.ones((1, 2)), probabilities=np.ones(1),
                    late_frac=np.zeros(1))
    with pytest.raises(ValueError, match="probabilities"):
        two_intervals(1.0, xi=((1.0, 1.0), (1.0, 1.0)), pi=(0.5, 0.6))
    with pytest.raises(ValueError, match="form"):
        solve_plan(two_intervals(1.0), "exact")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ forecast error
def test_error_tracker_constant_bias():
    tr = ErrorTracker(weight=0.1, prior_sigma=0.25, prior_n=3.0)
    for _ in range(40):
        tr.update(100.0, 120.0)
    assert tr.mean == pytest.approx(math.log(1.2))
    assert tr.var == pytest.approx(0.0, abs=1e-12)
    assert tr.bias() == pytest.approx(40 / 43 * math.log(1.2))
    assert tr.sigma == pytest.approx(0.25 * math.sqrt(3 / 43))  # only the prior's share is left


def test_error_tracker_alternating_errors():
    """e = +-0.2 alternately: mean near 0, sigma near 0.2, lag-1 correlation -1 clipped to 0."""
    tr = ErrorTracker(weight=0.1, prior_n=0.0)
    for i in range(400):
        tr.update(100.0, 100.0 * math.exp(0.2 if i % 2 else -0.2))
    assert abs(tr.mean) < 0.02
    assert tr.sigma == pytest.approx(0.2, rel=0.05)
    assert tr.rho == 0.0
    assert tr.sigma_of_mean(4) == pytest.approx(tr.sigma / 2)


def test_error_tracker_noise_and_persistence():
    rng = np.random.default_rng(3)
    iid, ar = ErrorTracker(weight=0.02, prior_n=0.0), ErrorTracker(weight=0.02, prior_n=0.0)
    e_ar = 0.0
    for _ in range(3000):
        iid.update(50.0, 50.0 * math.exp(0.3 * rng.standard_normal()))
        e_ar = 0.9 * e_ar + 0.1 * rng.standard_normal()
        ar.update(50.0, 50.0 * math.exp(e_ar))
    assert iid.sigma == pytest.approx(0.3, rel=0.2)
    assert iid.rho < 0.15
    assert ar.rho > 0.6  # persistent errors: the mean over R intervals stays uncertain
    assert ar.sigma_of_mean(30) > 0.8 * ar.sigma


def test_error_tracker_edge_cases():
    tr = ErrorTracker()
    assert tr.update(0.0, 0.0) is None and tr.n == 0
    assert tr.update(10.0, 0.0) == pytest.approx(math.log(0.05))  # floored, not -inf
    with pytest.raises(ValueError):
        ErrorTracker(weight=0.0)


def test_scenarios_shape_prior_and_late_fraction():
    z, pi = normal_nodes(5)
    assert z == pytest.approx(-z[::-1]) and pi.sum() == pytest.approx(1.0) and z[2] == 0.0
    xi, pi = scenario_multipliers(3, 5, 0.2, bias=0.1)
    assert xi.shape == (5, 3) and np.all(np.diff(xi[:, 0]) > 0)
    assert xi[2, 0] == pytest.approx(math.exp(0.1 - 0.02))
    assert commitment_shape([5e6], 0, 10, 60, 50).tolist() == [1.0] * 50
    sh = commitment_shape([1.0, 2.0], 0, 0, 2, 2)  # interval midpoints at 0.25 h, 0.75 h; hours at 0.5, 1.5
    assert sh == pytest.approx([1.0, 1.25 / 1.0])
    from commitenv_controllers.dynamollm import ClockLaws
    from helpers.profiles import toy_profile

    laws = ClockLaws.of(toy_profile())
    # a prompt of 8 tokens, 5 output tokens: at the low clock it is ~1.2-1.4x slower than at the top one
    q = late_fraction([8], [5], laws, alpha=1.0, latency_frac=1.1)
    assert q.tolist() == [1.0, 0.0]
    assert late_fraction([8], [5], laws, alpha=3.0, latency_frac=0.6).tolist() == [0.0, 0.0]


# ------------------------------------------------------------------------------------------ plan -> action
def ev(energy: float, misses: int = 0, active: int = 1, clock: int = 1000, margin: float = 5.0) -> Evaluation:
    return Evaluation(active, clock, energy, misses, margin, True)


def test_choose_trades_deviation_against_misses():
    t = 10_000.0  # J
    # 3.6 kJ over at lambda_plus 2 = 0.002 kWh-eq < one miss at 0.015: the fuller candidate wins
    a, b = ev(t + 3600.0, 0, active=2), ev(t, 1, active=1)
    assert choose([a, b], t, 2.0, 1.0, 0.015, n_captured=100, epsilon=0.01) is a
    # with misses free the exact match wins
    assert choose([a, b], t, 2.0, 1.0, 0.0, n_captured=100, epsilon=0.01) is b
    # the gate: 2 predicted misses of 100 captured at epsilon 0.01 is not admitted, whatever its cost
    c = ev(t, 2, active=3)
    assert choose([a, c], t, 2.0, 1.0, 0.0, 100, 0.01) is a
    # none admitted: fewest misses first (ePACT's service-first fallback)
    d = ev(t + 50_000.0, 3, active=4)
    assert choose([c, d], t, 2.0, 1.0, 0.0, 100, 0.01) is c
    # the calibration scale applies to the predicted energy
    e, f = ev(9_000.0, active=5), ev(10_000.0, active=6)
    assert choose([e, f], t, 2.0, 1.0, 0.0, 100, 0.01, energy_scale=1.1) is e
    assert choose([Evaluation(1, 1000, t, 0, 1.0, False)], t, 2.0, 1.0, 0.0, 100, 0.01) is None


def test_candidates_bracket_the_target():
    p = two_intervals(12000.0)
    r = solve_plan(p, "relaxed")
    cands = candidate_configs(p, r, 5250.0, (1000,), current=(4, 1000), per_clock=2)
    # 3500 + 500 n = 5250 at n = 3.5: the counts 3 and 4, then the plan's rounded 3.5 -> 4, the current (4)
    assert cands == [(3, 1000), (4, 1000)]


# ------------------------------------------------------------------------------------------ controller
def test_registered_with_its_entry_point():
    ctrl = make("mpc")
    assert isinstance(ctrl, MPCController) and ctrl.name == "mpc"
    assert resolve("mpc").name == "mpc" and resolve("mpc").target is MPCController


@pytest.mark.parametrize("kwargs, match", [
    ({"form": "exact"}, "form"), ({"scenarios": 0}, "scenarios"), ({"smoothing": 0.0}, "smoothing"),
    ({"max_util": 1.5}, "max_util"), ({"solver": "NO_SUCH_SOLVER"}, "not installed"),
    ({"candidates_per_clock": 0}, "candidates_per_clock"), ({"miss_penalty_kwh": -1.0}, "miss_penalty"),
    ({"shape_prior": "weekly"}, "shape_prior"), ({"workers": -1}, "workers"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MPCController(**kwargs)


def test_arguments_checked_from_type_hints():
    with pytest.raises(ValueError, match="form"):
        check_kwargs(resolve("mpc"), {"form": "exact"})
    assert check_kwargs(resolve("mpc"), {"form": "milp", "scenarios": 3}) == {"form": "milp", "scenarios": 3}


def test_needs_probe_and_profile():
    ctx = ControllerContext(scenario="x", n_replicas=2, clocks_mhz=(500, 1000), reference_clock_mhz=1000,
                            interval_s=60.0, intervals_per_hour=60, horizon_hours=1, commitments_j=(1e6,),
                            lambda_plus=2.0, lambda_minus=1.0, alpha=3.0, epsilon=0.01, actuation_delay_s=0.0)
    with pytest.raises(ValueError, match="probe"):
        MPCController().reset(ctx, 0)


_TIMING = ("wall_s", "plan_s_mean", "plan_s_max", "whatif_s_mean", "decision_s_mean", "decision_s_p95")


def test_end_to_end_toy_valid_finite_and_deterministic(tmp_path):
    """Two toy hours (2 replicas, 600-s intervals, bursts): every action valid, finite cost, and the same
    seed gives the same summary (timings aside) and the same actions."""
    path = str(toy_miss(tmp_path))
    runs = [evaluate("mpc", path, seed=3, controller_kwargs={"miss_penalty_kwh": 0.01}) for _ in range(2)]
    a, b = runs
    assert all(1 <= d["active"] <= 2 and d["clock_mhz"] in (500, 1000) for d in a.decisions)
    assert len(a.decisions) == 12
    assert math.isfinite(a.summary["cost_kwh_eq"]) and a.summary["plan_failures"] == 0
    strip = lambda s: {k: v for k, v in s.items() if k not in _TIMING}  # noqa: E731
    assert strip(a.summary) == strip(b.summary)
    assert [(d["active"], d["clock_mhz"]) for d in a.decisions] == [(d["active"], d["clock_mhz"]) for d in b.decisions]


def test_first_intervals_on_the_shipped_hour():
    """Five decisions on the 32-GPU hour: valid actions, a solved plan each time and targets near the equal
    split of the remainder (how long planning takes is the machine's: docs/, not a test)."""
    env = CommitServeEnv(HOUR_SCENARIO)
    obs, info = env.reset(seed=0)
    ctrl = make("mpc")
    ctrl.reset(ControllerContext.from_env(env), 0)
    try:
        for _ in range(5):
            act = ctrl.act(obs, info)
            assert 1 <= act["active"] <= 32 and 0 <= act["clock"] < len(env.clocks_mhz)
            d = ctrl.decisions[-1]
            assert d.plan_status in ("optimal", "optimal_inaccurate")
            equal = (info["commitment_j"] - info["hour_energy_j"]) / (60 - info["interval"])
            assert abs(d.target_j - equal) < 0.2 * equal
            obs, _, _, _, info = env.step(act)
    finally:
        ctrl.close()
