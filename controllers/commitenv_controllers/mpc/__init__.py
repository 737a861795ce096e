r"""MPC: a receding-horizon controller on cvxpy for hourly energy commitments (issue 10, part 3).

Every interval k of hour h (K intervals of Delta seconds, R = K - k of them left, the current one first) the
controller (1) learns from the interval that just ended, (2) forecasts the work of the rest of the hour,
(3) solves the program below, and (4) maps the planned energy of interval k to a configuration (replicas,
clock) through what-if runs of the engine on the causal snapshot. Only the first interval's plan is applied;
the next decision plans again from the new meter reading and snapshot.

What it knows (causal only)
---------------------------
* arrivals of the past intervals, with *predicted* output lengths (``probe.recent_arrivals``), and the
  snapshot's live requests (backlog), through `commitenv_controllers.dynamollm`'s closed forms
  (``arrivals_work``: replica-seconds W_f and step energy Q_f of a set of requests at each clock f from the
  profile's step laws; ``estimate_queue``: the same for the snapshot's unfinished work);
* the public scenario terms of `ControllerContext`: E*_h, lambda_plus, lambda_minus, alpha, epsilon, the
  nominal profile and the miss penalty p (kWh-eq per miss, ``ctx.miss_penalty_kwh``) unless given as an
  argument;
* seasonal shape: nothing within an hour is public, so the only shape prior is the hourly commitments E*_h
  (they scale with the expected load): the load of interval j relative to now is E*(t_j) / E*(t_k), with E*
  linearly interpolated between hour midpoints (flat in single-hour scenarios; ``shape_prior="flat"`` drops
  it). It is a ratio of energies, so it understates load swings (the idle floor does not scale): a
  deliberately weak prior.

Forecast and its error (`forecast`)
-----------------------------------
The level L = (W, Q, c) of one interval's arrival work is an exponentially weighted mean of the observed
intervals (weight ``smoothing`` on the newest). Forecast of interval j: L x shape_j, plus the backlog in the
current interval. After each interval the log error e = log(W_obs / W_forecast) (top clock) feeds an
`ErrorTracker`: EW mean (bias b), EW variance sigma^2 (blended with ``prior_sigma`` while few errors are in)
and lag-1 autocorrelation rho. The plan prices S equally likely work scenarios with a common level error
over the remaining intervals:

    xi_s = exp(b + sigma_R z_s - sigma_R^2 / 2),   sigma_R = sigma sqrt((1 + (R - 1) rho) / R),

z_s the medians of S equal-probability bins of N(0, 1) (sigma_R: the error of a mean of R equicorrelated
interval errors). The backlog is known work and is not scaled.

The program (`plan.solve_plan`)
-------------------------------
Variables per remaining interval j and clock level f: the clock weight z_jf in [0, 1] with sum_f z_jf = 1
and the replicas n_jf in [0, N] with z_jf <= n_jf <= N z_jf (``form="relaxed"``, a convex combination of
configurations), or z_jf binary and n_jf integer (``form="milp"``: one clock and whole replicas per
interval, for the first ``integer_horizon`` intervals; the later ones stay relaxed, which keeps HiGHS within
its time limit on a 60-interval hour); per scenario s the unserved work sigma_sjf >= 0 (in replica-intervals). Energy of interval j in
scenario s (J), from the profile's laws (P_f active-idle power, P_sb standby power; step energy includes the
idle floor during the steps, so busy time is charged Q and idle time P_f):

    E_sj = kappa [ sum_f xi_sj (Q_jf - P_f W_jf) z_jf + sum_f P_f Delta n_jf + P_sb Delta (N - sum_f n_jf) ]

(kappa: the learned metered/model energy ratio). Capacity: sigma_sjf >= xi_sj W_jf / Delta z_jf - u n_jf
(busy time fills at most u = ``max_util`` of the active replicas' time). Expected misses of interval j:
unserved work times requests per replica-second, plus the requests q_f a clock makes late whatever the
capacity (`forecast.late_fraction`: standalone latency above ``latency_frac`` x alpha x L_ref):

    m_sj = sum_f [ (c_j / W_jf) Delta sigma_sjf + xi_sj c_j q_f z_jf ].

Objective (kWh-eq), with M the hour's metered energy so far and S_s = M + sum_j E_sj:

    min  sum_s pi_s [ lambda_plus [S_s - E*]_+ + lambda_minus [E* - S_s]_+ + p sum_j m_sj ]
         + tie_weight min(lambda_plus, lambda_minus) sum_j ((Ebar_j - e-bar_j) / U)^2 U

where Ebar_j = sum_s pi_s E_sj, e-bar_j = (E* - M) / R (ePACT's equal split) and U the nominal interval
energy. The settlement terms only see the hour total, so many splits across intervals are optimal; the small
tie-break spreads the planned total evenly (a quadratic: the relaxed form is a QP, solved by Clarabel; in
the milp form a piecewise-linear chord approximation of it keeps the program a MILP for HiGHS). With
lambda_plus > lambda_minus and uncertain work the expected cost puts the planned total below E* (a
newsvendor quantile lambda_minus / (lambda_plus + lambda_minus) of the scenarios' hour energy), and above
it in the converse case; capacity shortfalls trade misses (p each) against overuse.

From plan to action
-------------------
The target T_k is the planned expected energy of interval k (ePACT's equal split if the solve fails).
Candidates (`controller.candidate_configs`): at each clock the whole replica counts around the count whose
modelled energy equals T_k, the plan's own rounded configuration and the current one. Each is simulated from
the snapshot with the last interval's arrivals replayed and followed (``snapshot.simulate(...,
track_arrivals=True)``, as ePACT's ``captured+forecast`` gate). `controller.choose` keeps those that pass
ePACT's SLO gate (predicted misses <= epsilon x captured) and picks the least

    lambda_plus [k_w E_hat - T_k]_+ + lambda_minus [T_k - k_w E_hat]_+ + p x predicted misses

(k_w: the learned metered / what-if energy ratio); with none admitted the full pool at the top clock is
also simulated and ePACT's service-first fallback applies. Before anything has arrived the forecast is zero
work (the plan then sees only the snapshot's backlog, as ePACT's replay does).
"""

from commitenv_controllers.mpc.controller import MPCController, candidate_configs, choose
from commitenv_controllers.mpc.forecast import ErrorTracker, Work, commitment_shape, late_fraction, scenario_multipliers
from commitenv_controllers.mpc.plan import PlanProblem, PlanResult, interval_energy, solve_plan

__all__ = ["ErrorTracker", "MPCController", "PlanProblem", "PlanResult", "Work", "candidate_configs", "choose",
           "commitment_shape", "interval_energy", "late_fraction", "scenario_multipliers", "solve_plan"]
