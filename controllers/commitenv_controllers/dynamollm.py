"""DynamoLLM: the energy-minimizing baseline of the ePACT paper, reimplemented for single-GPU replicas.

What the published design does (Stojkovic et al., "DynamoLLM: Designing LLM Inference Clusters for
Performance and Energy Efficiency", HPCA 2025), and how this file realises each part:

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

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import numpy as np

from commitenv.control import ReplicaView, RequestView, Snapshot
from commitenv_controllers.base import Controller, ControllerContext
from commitenv_controllers.registry import register

IN_EDGES = (256, 1024)  # input-length bins: short < 256 <= medium < 1024 <= long
OUT_EDGES = (100, 350)  # output-length bins (predicted): short < 100 <= medium < 350 <= long
CLASS_NAMES = tuple(f"{i}{o}" for i in "SML" for o in "SML")  # input letter, output letter
REP_PROMPT = (128, 640, 2048)  # class-representative input lengths (S, M, L)
REP_OUTPUT = (50, 225, 700)  # class-representative output lengths (S, M, L)

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


# ============================================================================================= classes
def classify(prompt_tokens: Any, output_tokens: Any) -> np.ndarray:
    """Class index 3 * input_bin + output_bin (0..8) of each (prompt, predicted output) pair."""
    ib = np.digitize(np.asarray(prompt_tokens), IN_EDGES)
    ob = np.digitize(np.asarray(output_tokens), OUT_EDGES)
    return (3 * ib + ob).astype(np.int64)


# ============================================================================================= profile
@dataclass(frozen=True)
class ClockLaws:
    """Step-law coefficients of every clock level as arrays over levels (at one SM share, full by default)."""

    mhz: tuple[int, ...]
    tau0: np.ndarray
    tau1: np.ndarray
    tau2: np.ndarray
    tau3: np.ndarray
    tau4: np.ndarray
    a: np.ndarray
    c1: np.ndarray
    c2: np.ndarray
    b: np.ndarray
    kappa: np.ndarray
    idle_w: np.ndarray
    standby_w: float
    budget: int
    max_seqs: int
    kv_tokens: int
    activation_s: float
    top: int  # index of the reference (top) clock

    @staticmethod
    def of(profile: Any, share: float = 1.0) -> "ClockLaws":
        """The laws of ``profile`` for an instance holding ``share`` of its GPU's SMs, placed at that share (its KV
        cache is what that memory share leaves, `commitenv.sim.memory`; the profile's capacity at share 1)."""
        from commitenv.sim.coeffs import coeffs_for
        from commitenv.sim.memory import kv_blocks

        cs = [coeffs_for(profile, i, share) for i in range(len(profile.clocks))]

        def arr(name: str) -> np.ndarray:
            return np.array([getattr(c, name) for c in cs], dtype=np.float64)

        sch = profile.scheduler
        return ClockLaws(
            mhz=tuple(profile.clock_mhz),
            tau0=arr("tau0"), tau1=arr("tau1"), tau2=arr("tau2"), tau3=arr("tau3"), tau4=arr("tau4"),
            a=arr("a"), c1=arr("c1"), c2=arr("c2"), b=arr("b"), kappa=arr("kappa"), idle_w=arr("idle_w"),
            standby_w=float(profile.standby_w),
            budget=int(sch.token_budget),
            max_seqs=int(sch.max_seqs),
            kv_tokens=kv_blocks(profile, share, f"{profile.name} at share {share}") * sch.block_size,
            activation_s=float(profile.latencies.activation_s),
            top=profile.reference_clock_index,
        )

    @property
    def n_clocks(self) -> int:
        return len(self.mhz)


@dataclass(frozen=True)
class ClassCapacity:
    """Per class (rows, `CLASS_NAMES` order) and clock level (columns)."""

    rate: np.ndarray  # requests/s one replica sustains within slo_frac of the SLO (0: clock too slow)
    busy_s: np.ndarray  # replica-seconds per request at that concurrency (= 1 / rate)
    energy_j: np.ndarray  # step energy per request (idle floor during its steps included)
    dyn_j: np.ndarray  # energy per request above the active-idle floor
    batch: np.ndarray  # concurrency B* the capacity was taken at
    lref_s: np.ndarray  # reference latency of the class representative (top clock, alone)


def class_capacity(laws: ClockLaws, alpha: float, slo_frac: float = 0.5,
                   rep_prompt: tuple[int, ...] = REP_PROMPT, rep_output: tuple[int, ...] = REP_OUTPUT) -> ClassCapacity:
    """Profiled capacity of one replica per class and clock (see the module docstring for the model)."""
    F = laws.n_clocks
    rate = np.zeros((9, F))
    busy = np.full((9, F), np.inf)
    energy = np.full((9, F), np.inf)
    dyn = np.full((9, F), np.inf)
    batch = np.zeros((9, F), dtype=np.int64)
    lref = np.zeros(9)
    for c in range(9):
        p = float(rep_prompt[c // 3])
        o = float(rep_output[c % 3])
        d = o - 1.0
        k = math.ceil(p / laws.budget) + d  # steps per request
        A = p * (p + 1) / 2
        ctx = d * p + d * (d + 1) / 2  # summed context over the decode steps
        w = laws.tau1 * p + laws.tau4 * A + laws.tau2 * d + laws.tau3 * ctx  # marginal time per request (F,)
        e = laws.c1 * p + laws.c2 * A + laws.b * d + laws.kappa * ctx  # marginal energy per request (F,)
        lat1 = w + k * laws.tau0  # standalone latency at each clock
        lref[c] = lat1[laws.top]
        target = slo_frac * alpha * lref[c]
        bmax = max(1, min(laws.max_seqs, int(laws.kv_tokens // (p + o))))
        for f in range(F):
            bstar = math.floor((target - k * laws.tau0[f]) / w[f] + 1e-12) if w[f] > 0 else bmax
            bstar = min(bstar, bmax)
            if bstar < 1:
                continue
            t_busy = w[f] + k * laws.tau0[f] / bstar
            rate[c, f] = 1.0 / t_busy
            busy[c, f] = t_busy
            energy[c, f] = e[f] + k * laws.a[f] / bstar
            dyn[c, f] = energy[c, f] - laws.idle_w[f] * t_busy
            batch[c, f] = bstar
    return ClassCapacity(rate, busy, energy, dyn, batch, lref)


# ============================================================================================= slow loop
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


# ============================================================================================= fast loop
@dataclass(frozen=True)
class QueueEstimate:
    """Predicted completion of every live request at every clock level (from a snapshot)."""

    t: float
    slots: np.ndarray  # (R,)
    deadline: np.ndarray  # (R,)
    finish: np.ndarray  # (R, F) absolute predicted finish times
    busy_s: np.ndarray  # (F,) replica-seconds to finish the queued work
    energy_j: np.ndarray  # (F,) step energy of that work
    waiting: int  # requests not yet admitted (waiting queues and unrouted)

    def misses(self, clock: int, *, include_overdue: bool = False) -> int:
        live = np.ones(len(self.slots), bool) if include_overdue else self.deadline > self.t
        return int(np.count_nonzero(live & (self.finish[:, clock] > self.deadline)))

    def admissible(self) -> np.ndarray:
        """(F,) bool: every request not already past its deadline finishes in time at that clock."""
        live = self.deadline > self.t
        if not live.any():
            return np.ones(self.finish.shape[1], bool)
        return np.all(self.finish[live] <= self.deadline[live, None], axis=0)


def _replica_estimate(prompt: np.ndarray, gen: np.ndarray, comp: np.ndarray, out: np.ndarray, laws: ClockLaws,
                      t: float):
    """Finish times (m, F), busy time (F,) and energy (F,) of one replica's queue, in FCFS order (float arrays of
    its requests' prompt, generated, computed and predicted output tokens).

    Prefills run in queue order; a prefill step also carries the decodes of the requests ahead of it that are
    still decoding then (they take budget tokens, so the chunk is smaller, and add tau2 + tau3 * context).
    Request i's decode steps are shared with the other batch members for as long as they still decode
    (effective batch 1 + sum_j min(d_j, d_i) / d_i), and carry chunks of the prefills still pending behind it
    (at most one budget-sized chunk per step). Requests beyond ``max_seqs`` are treated like the others.
    """
    m = len(prompt)
    p_rem = np.maximum(prompt + gen - comp - (gen > 0), 0.0)
    pending = p_rem > 0
    d = np.maximum(out - gen - pending, 0.0)  # remaining decode steps (the last prefill chunk emits a token)
    base = prompt + gen + pending - 1.0  # context before the first remaining decode step (step s attends base + s)
    A = p_rem * comp + p_rem * (p_rem + 1) / 2
    pf_t = np.outer(p_rem, laws.tau1) + np.outer(A, laws.tau4)  # (m, F) prefill compute time
    pf_e = np.outer(p_rem, laws.c1) + np.outer(A, laws.c2)
    in_batch = np.arange(m) < laws.max_seqs
    # step index at which each prefill starts / ends (whole-budget chunks as a first guess)
    chunks0 = np.ceil(p_rem / laws.budget)
    s_end = np.cumsum(chunks0)
    s_start = s_end - chunks0
    dec_start = np.where(pending, s_end, 0.0)  # step from which request j decodes
    # j (ahead of i, in the batch) still decodes while i's prefill starts: d_j > s_start_i - dec_start_j >= 0
    lag = s_start[:, None] - dec_start[None, :]  # (i, j)
    ahead = np.tril(np.ones((m, m), bool), k=-1) & in_batch[None, :]
    alive = ahead & (lag >= 0) & (d[None, :] > lag)
    n_i = alive.sum(axis=1).astype(np.float64)
    L_i = np.where(alive, base[None, :] + 1.0 + lag, 0.0).sum(axis=1)
    chunks = np.where(pending, np.ceil(p_rem / np.maximum(laws.budget - n_i, 1.0)), 0.0)
    step_over = laws.tau0[None, :] + np.outer(n_i, laws.tau2) + np.outer(L_i, laws.tau3)  # (m, F)
    pcum = np.cumsum(chunks[:, None] * step_over + pf_t, axis=0)
    start = np.where(pending[:, None], pcum, 0.0)
    # decode: effective co-batch over request i's own decode steps
    bd = np.where(in_batch, d, 0.0)
    share = np.minimum(bd[None, :], d[:, None]) / np.maximum(d[:, None], 1.0)  # (i, j), 1 on the diagonal if d_i > 0
    b_eff = np.maximum(share.sum(axis=1), 1.0)
    l_eff = (share * base[None, :]).sum(axis=1)
    dec = (np.outer(d, laws.tau0) + np.outer(d * b_eff, laws.tau2) + np.outer(d * l_eff, laws.tau3)
           + np.outer(b_eff * d * (d + 1) / 2, laws.tau3))
    # prefill chunks still pending behind request i ride in its decode steps (one budget chunk per step at most)
    pf_pending = np.where(pending[:, None], pf_t, 0.0)
    total_pf = pf_pending.sum(axis=0)
    behind = total_pf[None, :] - np.cumsum(pf_pending, axis=0)  # prefill of pending requests after i
    riding = np.where(pending[:, None], behind, total_pf[None, :])  # a decoding request: every pending one
    extra = np.minimum(riding, d[:, None] * (laws.tau1 * laws.budget)[None, :])
    finish = t + start + dec + extra
    steps_dec = float(d.max()) if m else 0.0
    ctx = d * base + d * (d + 1) / 2
    busy = (chunks.sum() * laws.tau0 + pf_t.sum(axis=0) + laws.tau2 * d.sum() + laws.tau3 * ctx.sum()
            + laws.tau0 * steps_dec)
    energy = (chunks.sum() * laws.a + pf_e.sum(axis=0) + laws.b * d.sum() + laws.kappa * ctx.sum()
              + laws.a * steps_dec)
    return finish, busy, energy


def estimate_queue(snap: Any, laws: ClockLaws) -> QueueEstimate:
    """Per-request finish times at every clock for the live requests of a `Snapshot` (module docstring)."""
    t = float(snap.t)
    F = laws.n_clocks
    req = snap.requests
    n_rep = len(snap.replicas)
    queues = [np.flatnonzero(req.replica == i) for i in range(n_rep)]  # running, then waiting, in order
    unrouted = np.flatnonzero(req.replica < 0)
    if len(unrouted):  # nothing routable right now: they will land on the least-loaded replica
        i = min(range(n_rep), key=lambda j: (len(queues[j]), j))
        queues[i] = np.concatenate([queues[i], unrouted])
    cols = [np.asarray(a, dtype=np.float64) for a in
            (req.prompt_tokens, req.generated_tokens, req.computed_tokens, req.output_tokens)]
    order: list[np.ndarray] = []
    fins: list[np.ndarray] = []
    busy = np.zeros(F)
    energy = np.zeros(F)
    for q in queues:
        if not len(q):
            continue
        f, b, e = _replica_estimate(*(c[q] for c in cols), laws, t)
        fins.append(f)
        busy += b
        energy += e
        order.append(q)
    idx = np.concatenate(order) if order else np.zeros(0, dtype=np.int64)
    waiting = int(np.count_nonzero(~req.running))
    finish = np.vstack(fins) if fins else np.zeros((0, F))
    return QueueEstimate(t, np.asarray(req.slot[idx], dtype=np.int64), np.asarray(req.deadline_s[idx], dtype=np.float64),
                         finish, busy, energy, waiting)


def arrivals_work(table: Any, laws: ClockLaws, batch: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Replica-seconds and step energy (F,) to serve the requests of ``table`` (decode steps shared by
    ``batch`` requests)."""
    F = laws.n_clocks
    if table is None or len(table) == 0:
        return np.zeros(F), np.zeros(F)
    p = np.asarray(table.prompt_tokens, dtype=np.float64)
    o = np.asarray(table.output_tokens, dtype=np.float64)
    d = np.maximum(o - 1, 0)
    k = np.ceil(p / laws.budget).sum() + d.sum() / max(batch, 1.0)
    A = (p * (p + 1) / 2).sum()
    ctx = (d * p + d * (d + 1) / 2).sum()
    busy = k * laws.tau0 + laws.tau1 * p.sum() + laws.tau4 * A + laws.tau2 * d.sum() + laws.tau3 * ctx
    energy = k * laws.a + laws.c1 * p.sum() + laws.c2 * A + laws.b * d.sum() + laws.kappa * ctx
    return busy, energy


def choose_clock(est: QueueEstimate, laws: ClockLaws, active: int, interval_s: float, *,
                 fc_busy: np.ndarray | None = None, fc_energy: np.ndarray | None = None,
                 max_util: float = 0.85) -> tuple[int, np.ndarray, np.ndarray]:
    """The fast-loop rule: the least-energy clock at which every live request meets its deadline and the
    forecast work fits in ``max_util`` of the active replicas' time; the top clock when none qualifies.
    Returns (clock index, admissible mask (F,), estimated interval energy (F,))."""
    F = laws.n_clocks
    fc_busy = np.zeros(F) if fc_busy is None else fc_busy
    fc_energy = np.zeros(F) if fc_energy is None else fc_energy
    ok = est.admissible() & (fc_busy <= max_util * active * interval_s)
    work_t = est.busy_s + fc_busy
    e = est.energy_j + fc_energy + laws.idle_w * np.maximum(active * interval_s - work_t, 0.0)
    if not ok.any():
        return laws.top, ok, e
    cand = np.flatnonzero(ok)
    return int(cand[np.argmin(e[cand])]), ok, e


def transition_energy_j(n_from: int, n_to: int, laws: ClockLaws) -> float:
    """Energy of changing the active count: each replica switched on now, or switched off now (and so woken
    again later), draws active-idle power at the top clock for the activation latency without serving."""
    return abs(int(n_to) - int(n_from)) * laws.activation_s * float(laws.idle_w[laws.top])


# ============================================================================================= shared pools
def model_view(snap: Snapshot, model: int) -> Snapshot:
    """``snap`` restricted to the replicas of ``model`` (renumbered from 0, in index order) and the requests routed to
    them; ``active`` counts its active and waking replicas, ``clock_mhz`` is the fastest of their GPUs' clocks.
    Unrouted requests are left out (the snapshot does not say their model)."""
    reps, req = snap.replicas, snap.requests
    own = np.flatnonzero(reps.model == model)
    renum = np.full(len(reps), -1, dtype=np.int64)
    renum[own] = np.arange(len(own))
    routed = req.replica >= 0
    keep = np.flatnonzero(routed & (renum[np.where(routed, req.replica, 0)] >= 0))
    cols = {f.name: getattr(req, f.name)[keep] for f in fields(RequestView)}
    cols["replica"] = renum[req.replica[keep]]
    rep_cols = {f.name: getattr(reps, f.name)[own] for f in fields(ReplicaView) if f.name != "state"}
    view = ReplicaView(state=tuple(reps.state[i] for i in own), **rep_cols)
    active = sum(1 for st in view.state if st in ("active", "waking"))
    clock = int(view.clock_mhz.max()) if len(own) else snap.clock_mhz
    return replace(snap, active=active, clock_mhz=clock, requests=RequestView(**cols), replicas=view)


def gpu_clocks_mhz(placement: Any, decisions: Any, clocks_mhz: tuple[int, ...]) -> list[int]:
    """Per GPU, the highest clock any of its active instances needs (``decisions``: (active, clock MHz) per model;
    a model's first ``active`` instances in placement order are its active ones); the lowest clock if none is."""
    seen = [0] * len(decisions)
    out = []
    for gpu in placement:
        need = []
        for m, _ in gpu:
            if seen[m] < decisions[m][0]:
                need.append(decisions[m][1])
            seen[m] += 1
        out.append(max(need, default=min(clocks_mhz)))
    return out


class _ModelProbe:
    """One model's probe on a shared pool: the owner's current `model_view` and the model's recent arrivals."""

    def __init__(self, owner: "DynamoLLMController", model: int) -> None:
        self.owner, self.model = owner, model

    def snapshot(self) -> Snapshot:
        """The model's view of the snapshot the owner took this step."""
        return self.owner._views[self.model]

    def recent_arrivals(self, window_s: float) -> Any:
        """The pool's recent arrivals served by this model."""
        ctx = self.owner.ctx
        table = ctx.probe.recent_arrivals(window_s)
        rows = ctx.model_of_tenants(table.tenant_names)[np.asarray(table.tenant, dtype=np.int64)]
        return table.take(np.flatnonzero(rows == self.model))

    def report_planning_delay(self, seconds: float) -> None:
        """Not forwarded: the per-model decisions are combined into one action by the owner."""


# ============================================================================================= controller
@register("dynamollm")
class DynamoLLMController(Controller):
    """DynamoLLM (HPCA 2025) as the ePACT paper evaluates it: energy-minimizing instance count and clock;
    see the module docstring for the design and the deviations this environment imposes."""

    _share: float = 1.0  # SM share the profile's laws are taken at (a model's smallest placed share on a shared pool)

    def __init__(
        self,
        replan_s: float = 1800.0,
        warmup_s: float | None = None,
        forecast_window_s: float | None = None,
        forecast: Literal["peak", "mean"] = "peak",
        bucket_s: float = 300.0,
        headroom: float = 1.1,
        slo_frac: float = 0.5,
        pool_clock: bool = True,
        max_util: float = 0.85,
        urgent_frac: float = 0.05,
        urgent_min: int = 2,
        queue_per_replica: float = 8.0,
        escalation_factor: float = 2.0,
        escalation_hold_s: float = 300.0,
        rep_prompt: tuple[int, ...] = REP_PROMPT,
        rep_output: tuple[int, ...] = REP_OUTPUT,
        profile: Any = None,
    ) -> None:
        _require_ortools()
        if forecast not in ("peak", "mean"):
            raise ValueError(f"dynamollm forecast: expected 'peak' or 'mean', got {forecast!r}")
        if replan_s <= 0 or headroom <= 0 or not 0 < slo_frac <= 1 or not 0 < max_util <= 1:
            raise ValueError("dynamollm: replan_s, headroom > 0 and slo_frac, max_util in (0, 1] expected")
        self.replan_s = float(replan_s)
        self.warmup_s = warmup_s
        self.forecast_window_s = forecast_window_s
        self.forecast = forecast
        self.bucket_s = float(bucket_s)
        self.headroom = float(headroom)
        self.slo_frac = float(slo_frac)
        self.pool_clock = bool(pool_clock)
        self.max_util = float(max_util)
        self.urgent_frac = float(urgent_frac)
        self.urgent_min = int(urgent_min)
        self.queue_per_replica = float(queue_per_replica)
        self.escalation_factor = float(escalation_factor)
        self.escalation_hold_s = float(escalation_hold_s)
        self.rep_prompt = tuple(rep_prompt)
        self.rep_output = tuple(rep_output)
        self._profile_override = profile

    # ------------------------------------------------------------------------------------------ setup
    def reset(self, ctx: ControllerContext, seed: int | None = None) -> None:
        super().reset(ctx, seed)
        if ctx.probe is None:
            raise ValueError("dynamollm needs ctx.probe (the env): build the context with ControllerContext.from_env(env)")
        if ctx.shared:
            self._reset_shared(ctx, seed)
            return
        self.laws: ClockLaws | None = None
        self.cap: ClassCapacity | None = None
        prof = self._profile_override if self._profile_override is not None else ctx.profile
        if prof is None:
            raise ValueError("dynamollm needs the pool's profile: ControllerContext.profile (from_env sets it) "
                             "or the 'profile' argument")
        self._setup(prof)
        self.warmup = ctx.interval_s if self.warmup_s is None else float(self.warmup_s)
        self.window = self.replan_s if self.forecast_window_s is None else float(self.forecast_window_s)
        self.next_plan_t = self.warmup
        self.plan: Plan | None = None
        self.load = np.zeros(9)
        self.n_cmd: int | None = None
        self.esc_n = 0
        self.esc_until = -math.inf
        self.log: list[dict[str, Any]] = []

    def _setup(self, profile: Any) -> None:
        self.laws = ClockLaws.of(profile, self._share)
        if self.laws.mhz != tuple(self.ctx.clocks_mhz):
            raise ValueError(f"dynamollm: profile clocks {self.laws.mhz} differ from the scenario's {self.ctx.clocks_mhz}")
        self.cap = class_capacity(self.laws, self.ctx.alpha, self.slo_frac, self.rep_prompt, self.rep_output)

    def _reset_shared(self, ctx: ControllerContext, seed: int | None) -> None:
        """One one-model DynamoLLM per model of a shared pool, on its profile, instances and arrivals."""
        self._views: list[Snapshot] = []
        subs = []
        for m, prof in enumerate(ctx.profiles):
            sub = copy.copy(self)
            sub._profile_override = None
            sub._share = min(s for gpu in ctx.placement for mm, s in gpu if mm == m)
            sub.reset(replace(ctx, n_replicas=ctx.replicas_per_model[m], reference_clock_mhz=prof.reference_clock_mhz,
                              profile=prof, probe=_ModelProbe(self, m), hindsight=None, models=(),
                              replicas_per_model=(), placement=(), profiles=()), seed)
            subs.append(sub)
        self.subs: list[DynamoLLMController] = subs
        self.decisions: list[tuple[int, int]] = []  # (active, clock MHz) per model, from the last act
        self.log = []

    def _act_shared(self, observation: np.ndarray, info: dict[str, Any]) -> dict:
        """Each model's (active, clock) from its own DynamoLLM; each GPU at the highest clock its active instances
        need."""
        ctx = self.ctx
        snap = ctx.probe.snapshot()
        self._views = [model_view(snap, m) for m in range(len(ctx.models))]
        by_model = info.get("active_by_model")
        self.decisions = []
        for m, sub in enumerate(self.subs):
            sub_info = {"clock_mhz": self._views[m].clock_mhz, **({"active": by_model[m]} if by_model else {})}
            a = sub.act(observation, sub_info)
            self.decisions.append((a["active"], ctx.clocks_mhz[a["clock"]]))
        clocks = gpu_clocks_mhz(ctx.placement, self.decisions, ctx.clocks_mhz)
        self.log.append({"t": float(snap.t), "active": [a for a, _ in self.decisions],
                         "clock_mhz": [c for _, c in self.decisions], "gpu_clocks_mhz": clocks})
        return ctx.action(tuple(a for a, _ in self.decisions), max(clocks), clocks_mhz=clocks)

    # ------------------------------------------------------------------------------------------ helpers
    def _power(self, n: int) -> float:
        """Predicted pool power with ``n`` replicas at their best clock under the current forecast (inf if
        ``n`` cannot carry it)."""
        laws, cap = self.laws, self.cap
        p = plan_replicas(self.load, cap.rate, cap.dyn_j, laws.idle_w, laws.standby_w, self.ctx.n_replicas,
                          headroom=self.headroom, pool_clock=self.pool_clock, fixed_total=n, top=laws.top)
        return p.power_w if p.feasible else math.inf

    def _replan(self, t: float) -> None:
        laws, cap = self.laws, self.cap
        window = min(self.window, t)
        recent = self.ctx.probe.recent_arrivals(window) if window > 0 else None
        self.load = forecast_load(recent, window, t, bucket_s=self.bucket_s, mode=self.forecast)
        self.plan = plan_replicas(self.load, cap.rate, cap.dyn_j, laws.idle_w, laws.standby_w, self.ctx.n_replicas,
                                  headroom=self.headroom, pool_clock=self.pool_clock, top=laws.top)
        self.next_plan_t = t + self.replan_s

    def _transition_ok(self, cur: int, target: int, t: float) -> bool:
        """Change ``cur`` -> ``target`` replicas only if needed for capacity or if it pays for itself."""
        if target == cur:
            return False
        p_cur = self._power(cur)
        if not math.isfinite(p_cur):
            return True  # the current count cannot carry the forecast: capacity first
        p_tgt = self._power(target)
        saved = (p_cur - p_tgt) * max(self.next_plan_t - t, 0.0)
        return saved > transition_energy_j(cur, target, self.laws)

    # ------------------------------------------------------------------------------------------ act
    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict[str, int]:
        ctx = self.ctx
        if ctx.shared:
            return self._act_shared(observation, info)
        N = ctx.n_replicas
        snap = ctx.probe.snapshot()
        laws = self.laws
        t = float(snap.t)
        cur = int(info.get("active", self.n_cmd if self.n_cmd is not None else snap.active))  # as applied
        # slow loop
        if t + 1e-9 >= self.next_plan_t:
            self._replan(t)
        target = self.plan.active if self.plan is not None else cur
        if t < self.esc_until:
            target = max(target, self.esc_n)
        n = target if self._transition_ok(cur, target, t) else cur
        # fast loop on the current serving state
        est = estimate_queue(snap, laws)
        dt = ctx.interval_s
        recent = ctx.probe.recent_arrivals(dt) if t > 0 else None
        batch = max(1.0, len(est.slots) / max(snap.active, 1))
        fc_busy, fc_energy = arrivals_work(recent, laws, batch)
        # emergency escalation
        urgent = est.misses(laws.top)
        live = int(np.count_nonzero(est.deadline > t))
        need_now = math.ceil(fc_busy[laws.top] / (dt * self.max_util)) if fc_busy[laws.top] > 0 else 1
        emergency = (
            (urgent >= self.urgent_min and urgent >= self.urgent_frac * live)
            or est.waiting > self.queue_per_replica * max(cur, 1)
            or fc_busy[laws.top] > n * dt
        )
        if emergency:
            esc = max(n, cur + 1, math.ceil(cur * self.escalation_factor), need_now)
            n = min(N, esc)
            self.esc_n = n
            self.esc_until = t + self.escalation_hold_s
            clock = laws.top
        elif self.plan is None and not len(est.slots) and not fc_busy.any():
            clock = laws.mhz.index(int(info.get("clock_mhz", laws.mhz[laws.top])))  # nothing observed yet: hold
        else:
            clock, _, _ = choose_clock(est, laws, n, dt, fc_busy=fc_busy, fc_energy=fc_energy, max_util=self.max_util)
        self.n_cmd = n
        self.log.append({"t": t, "active": n, "clock_mhz": laws.mhz[clock], "emergency": bool(emergency),
                         "urgent": urgent, "live": live, "waiting": est.waiting,
                         "planned": self.plan.active if self.plan is not None else None})
        return ctx.action(n, laws.mhz[clock])
