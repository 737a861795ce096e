"""DynamoLLM: the energy-minimizing baseline of the ePACT paper, reimplemented for single-GPU replicas.

What the published design does (Stojkovic et al., "DynamoLLM: Designing LLM Inference Clusters for
Performance and Energy Efficiency", HPCA 2025), and how this package realises each part:

* **Nine request classes.** A request is short / medium / long in input (< 256, < 1024, else) and in
  output (< 100, < 350, else, on the *predicted* output length). `classify` gives the class index
  ``3 * input_bin + output_bin`` (0 = SS ... 8 = LL).
* **Profiled capacity.** For each class and clock level, the requests/s one replica sustains while its
  requests still finish within ``slo_frac`` of their SLO (`class_capacity`, computed once per profile,
  i.e. at reset). The profile's step laws stand in for DynamoLLM's offline profiling runs: at a steady
  concurrency of B class-representative requests (lengths `REP_PROMPT` / `REP_OUTPUT`: half the upper
  edge of the short bin, the middle of the medium bin, twice the lower edge of the long bin), every
  request needs k = ceil(p / budget) + (o - 1) steps whose fixed cost tau0 the B requests share, plus its
  own marginal work w (prefill tokens and attention, decode per-request and per-context terms); so by
  Little's law the latency is T(B) = B*w + k*tau0 (T(1) is the standalone latency, the same closed form as
  L_ref) and the throughput X(B) = B / T(B). The capacity is X(B*) for the largest B <= max_seqs (and KV
  capacity) with T(B*) <= slo_frac * alpha * L_ref(class); 0 when even B = 1 misses (the clock is too slow
  for that class). Energy per request comes from the step-energy law the same way (a shared over B).
* **Slow loop: instance count from an integer program** (public reimplementations re-plan every 30 min).
  Every ``replan_s`` of simulated time (first after ``warmup_s``), the load per class is forecast from the
  arrivals observed in the last ``forecast_window_s`` (`probe.recent_arrivals`; only arrived requests,
  predicted output lengths, never future trace data): the peak ``bucket_s`` rate of each class in the
  window (``forecast="peak"``, DynamoLLM provisions for the expected peak of the next period) or the window
  mean (``forecast="mean"``). `plan_replicas` then solves, with OR-Tools (SCIP through ``pywraplp``):

      min  sum_f x_f (P_idle(f) - P_standby) + sum_{c,f} y_cf e_dyn(c, f)        (pool power - N P_standby)
      s.t. sum_f y_cf >= headroom * lambda_c              every class c        (load is carried)
           sum_c y_cf / cap(c, f) <= x_f                  every clock f        (time-share of replicas)
           1 <= sum_f x_f <= N,  x_f integer >= 0,  y_cf >= 0,  y_cf = 0 where cap(c, f) = 0
           (pool_clock=True)  x_f <= N z_f, sum_f z_f = 1, z_f binary        (one clock for the pool)

  where x_f are replicas at clock f, y_cf the class-c load they carry, e_dyn the per-request energy above
  the idle floor. The plan's total replica count becomes the env's ``active``; its clock is only the
  starting point of the fast loop. When the forecast exceeds what N replicas carry at the top clock, the
  plan is N replicas.
* **Fast loop: per-step frequency.** DynamoLLM re-picks each replica's clock about every 5 s as the
  lowest-energy profiled clock at which every queued and running request still meets its deadline, and the
  top clock when no clock does. Here it runs once per env step on `probe.snapshot()` (`estimate_queue`):
  for each live request, its remaining prefill (prompt plus recompute after preemption) and predicted
  remaining decode steps give a predicted finish time at each clock level on its replica, by the profile's
  step laws (`_replica_estimate`): prefills run FCFS in queue order, and each prefill step also carries the
  decodes of the requests ahead that still decode then (fewer budget tokens for the chunk, plus their tau2
  and tau3 terms); a request's decode steps are shared with the other batch members for as long as they
  still decode, over a context growing one token per member per step; prefill chunks still pending behind
  a decoding request ride in its steps (at most one budget-sized chunk per step). A clock is
  admissible when every request not already past its deadline is predicted to finish in time and the
  last interval's arrivals (forecast of the next one) fit in ``max_util`` of the active replicas' time;
  among admissible clocks `choose_clock` picks the one with the least estimated interval energy (queued
  plus forecast work by the step-energy law, plus the idle floor of the remaining replica time).
* **Emergency escalation.** When the snapshot shows requests predicted to miss even at the top clock with
  the current replicas (at least ``urgent_min`` and ``urgent_frac`` of the live ones), or more than
  ``queue_per_replica`` queued requests per active replica, or the last interval's arrivals need more than
  the active replicas' full time at the top clock, the controller goes at once to the top clock and
  ``escalation_factor`` times the replicas (at least one more, at least what the recent load needs, at most
  N), and holds that count for ``escalation_hold_s`` (an emergency during the hold doubles again); then
  it returns to the plan, subject to the transition-cost check.
* **Start.** Before the first plan the count stays as configured (the scenario's initial state), and while
  nothing has been observed (no live request, no arrival) the clock stays too.
* **Transition cost.** A change of the replica count that is not needed for capacity (the current count
  can carry the forecast at some clock) is made only if the predicted energy saved until the next slow
  re-plan exceeds the transition energy. Estimate (`transition_energy_j`): every replica switched on, and
  every replica switched off (it must be woken again later), costs ``activation_s x P_active_idle(top)``:
  a waking replica draws active-idle power at the top clock while it cannot serve. Draining costs nothing
  extra (its running requests finish at the same floor power as on an active replica, and its unstarted
  ones are re-routed at once); a clock change (50 ms) is not charged. Saved energy is the plan power
  difference (same power model as the integer program, each count at its best clock) times the time left
  to the next re-plan.

Deviations forced by this environment (and by the ePACT paper's evaluated variant, which keeps ePACT's model,
workload and 32-GPU pool, sec. 5.1):
  1. Actions happen once per env step (60 s by default), not every 5 s: the fast loop and emergency
     checks run at each step, the slow loop every ``replan_s`` of simulated time.
  2. The env has one clock for the whole pool, not one per replica: the fast loop picks a single level at
     which every request on every replica meets its deadline, and the integer program is solved with a
     single pool clock by default (``pool_clock=False`` solves DynamoLLM's per-clock mix; the counts are
     then summed and the fast loop still chooses the one clock).
  3. Replicas are single-GPU (no tensor-parallel re-sharding) and one pool serves all nine classes
     through the env's least-loaded router: DynamoLLM's per-class instance pools become the time-share
     capacity constraint above, and there is no per-class routing.
  4. Capacity is derived from the profile's step laws instead of offline profiling runs, and the finish
     times of the fast loop come from a closed-form per-replica estimate, not from measurements; it
     ignores the max_seqs cap on admission and the noise of the ground truth.
  5. Only information a controller may have is used: the snapshot (arrived requests, predicted output
     lengths) and recent arrivals; the commitment is ignored (DynamoLLM minimizes energy).

Shared pools (several models co-hosting the GPUs) are this project's adaptation: the DynamoLLM paper manages one
model per pool. Here each model gets its own one-model DynamoLLM (`_reset_shared`), unchanged in its rules: its
profile's laws taken at the smallest SM share the placement gives the model, its own instances and the requests
routed to them (`model_view`), its own recent arrivals, and a count capped at its instance count; a model's first
``active`` instances in placement order are the active ones (the env's rule). Every GPU then runs at the highest
clock any of its active instances asks for, the lowest when none is active (`gpu_clocks_mhz`); SM shares stay as
placed. Arrivals go to a model by their tenant (the scenario's routing, `ControllerContext.model_of_tenants`). Also
adaptation: idle power stays the whole GPU's in each model's plan, and a model neither sees nor prices the clock its
co-hosts impose on it.
"""

from commitenv_controllers.dynamollm.capacity import (CLASS_NAMES, IN_EDGES, OUT_EDGES, REP_OUTPUT, REP_PROMPT,
                                                      ClassCapacity, ClockLaws, class_capacity, classify)
from commitenv_controllers.dynamollm.controller import DynamoLLMController
from commitenv_controllers.dynamollm.fast_loop import (QueueEstimate, arrivals_work, choose_clock, estimate_queue,
                                                       transition_energy_j)
from commitenv_controllers.dynamollm.shared import gpu_clocks_mhz, model_view
from commitenv_controllers.dynamollm.slow_loop import Plan, forecast_load, plan_replicas

__all__ = ["CLASS_NAMES", "IN_EDGES", "OUT_EDGES", "REP_OUTPUT", "REP_PROMPT", "ClassCapacity", "ClockLaws",
           "DynamoLLMController", "Plan", "QueueEstimate", "arrivals_work", "choose_clock", "class_capacity", "classify",
           "estimate_queue", "forecast_load", "gpu_clocks_mhz", "model_view", "plan_replicas", "transition_energy_j"]
