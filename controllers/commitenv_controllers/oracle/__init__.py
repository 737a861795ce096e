"""The ``oracle``: the hindsight bound, the lower-bound row of every comparison ("how far from the best possible").

It is the one built-in controller that declares ``hindsight = True``: it reads the episode's true arrivals,
lengths and deadlines and steps forks of the ground-truth engine (`commitenv.hindsight`), through a door that the
evaluation marks (``"hindsight": true``) and the leaderboard refuses. It plans the whole episode at ``reset``, then
replays the plan.

Problem. Choose one catalog configuration u_k = (active, clock) per interval to minimize

    J(u) = sum_h C_h(E_h(u)) + lambda_plus T(u) + w * misses(u)   subject to   misses_h(u) <= M_h for every h,

with C_h = lambda_plus [E_h - E*_h]+ + lambda_minus [E*_h - E_h]+ (kWh-eq, the settlement), T the completion
tail's energy after the last hour (kWh, paid as overuse, as the environment settles it), h the arrival hours, ``w`` =
``miss_weight_kwh`` (default 0: the settlement cost alone, the leaderboard's score behind its SLO gate, misses only
breaking ties; None: the scenario's ``miss_penalty_kwh``, i.e. the environment's return), misses_h the misses among
the requests arriving in hour h (`TruthRun.misses_by_hour`, counted as the scores count them) and M_h that hour's
budget (`miss_budget`), the SLO gate's own form: by default floor(epsilon x the hour's requests), or vLLM's own
misses among them on the same truth (all replicas at the reference clock, simulated with hindsight) where vLLM
misses more (a scenario with a relative gate: vLLM's misses + floor(tolerance_pp / 100 x the hour's requests), the
gate itself); ``slo_rule="vllm_minus_epsilon"`` takes the issue's literal rule, attainment no lower than vLLM's minus
epsilon (vLLM's misses + floor(epsilon x requests), hour by hour), which can fail the gate. ``max_misses`` replaces
the hourly budgets by one pooled budget.

Method: dynamic programming over (interval, discretized open-hour energy), with the real engine. A DP state is a
node: a ground-truth fork (`commitenv.hindsight.TruthRun`) at a decision boundary with the open hour's energy, the
closed hours' cost and its misses by arrival hour. Every interval, each kept node is expanded by every catalog
configuration (fork, step one interval through the truth); children are merged per energy cell (``energy_grid`` x
E*_h/K wide; per cell the Pareto set in (J + the open hour's floor, misses) is kept); then at most ``beam`` nodes
survive, those within the budgets first: one per stratum of the hour-energy band that can still reach E*_h
(ties broken towards the even pace E*_h k/K), then in turns the cheapest by J plus the open hour's floor (the cost
of the reachable energy nearest E*_h, the most an interval can draw estimated by vLLM's schedule) and the safest (the
fewest estimated misses): a search on a tight budget needs the safe states, one on a commitment it cannot reach
the cheap ones (`_thin`). Before their misses are certain, children are ranked by an estimate: hour by hour, the
misses if from now no request arrived and every replica ran at the top clock (`TruthRun.optimistic_misses_by_hour`),
at least the misses already certain. The estimate never sees future arrivals, so an open hour's budget is paced
(`hour_miss_pace`, on by default for episodes of more than one hour): a state counts as within it while its estimate
is within the budget's share of the hour's requests arrived so far (or vLLM's own certain misses by then).
Configurations over the budgets from every state for two intervals in a row are skipped for up to ten (re-tried
then, in every hour's last interval, and from each hour's start: a new hour brings a new budget). The last interval
runs the completion tail, so every leaf's J and misses are exact; the plan is the best leaf within the budgets, or
vLLM's schedule (replayed as an incumbent) when that is better.

What is exact and what is not:

* exact: the evaluation of every schedule the search reaches (true workload, truth model and its noise, the
  environment's actuation and settlement): the replay meters the planned energies bit for bit (0 J difference,
  ``planned_*`` = the settled figures, checked in ``tests/controllers/test_oracle.py``), so the plan's reported cost is the
  cost the environment then settles;
* optimal: for per-interval tables that do not depend on the engine state (`plan_table` with ``energy_grid_j=0``
  and no beam: an exact DP, checked against brute force); with the engine, when the beam is wider than the number
  of schedules and cells are exact (checked against brute force over every schedule of a tiny pool);
* approximate: otherwise, with the engine, the best schedule *found* over the catalog, not a proven optimum:
  merging per energy cell and the beam drop states whose queues differ (a merge can cost up to the settlement
  value of one cell, 2 x 2 % of E*_h/K with the defaults), the ranking estimate is not a bound, and screening may
  skip a configuration that would have helped. The result is an *achievable* schedule: its cost is an upper bound
  on the true hindsight optimum over the catalog, and the catalog limits that optimum too (configurations off the
  catalog, mid-interval changes, SM shares, dispatch and scheduling are outside; on a shared pool the catalog's
  pool-wide counts are spread over the models as ePACT spreads them, `ControllerContext.spread_active`, with one clock
  for every GPU and the placement's shares and GPUs kept). Call it the hindsight bound with
  that caveat: no causal controller should beat it by much, and one that does shows where the search is short
  (raise ``beam``).

Budget: about ``beam`` x |catalog| ground-truth interval runs per interval (each with its estimate run), fewer with
screening; the defaults are beam 6, energy cells of 2 % of E*_h/K and ePACT's catalog of 8 x 5 (planning times in
docs/baselines.md).
"""

from commitenv_controllers.oracle.budgets import hour_miss_pace, miss_budget, miss_pace
from commitenv_controllers.oracle.controller import OracleController
from commitenv_controllers.oracle.dp import Node, Plan, PlanTerms, plan_table, search
from commitenv_controllers.oracle.forks import plan_engine, replay

__all__ = ["Node", "OracleController", "Plan", "PlanTerms", "hour_miss_pace", "miss_budget", "miss_pace", "plan_engine",
           "plan_table", "replay", "search"]
