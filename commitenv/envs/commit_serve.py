"""`CommitServeEnv`: one step = one decision interval of a simulated GPU pool serving an LLM trace against
hourly energy commitments (ePACT sections 4.1 and C.3).

Action (``Dict``): ``active`` replicas in 1..N and ``clock`` (index into the profile's clock levels),
applied ``actuation_delay_s`` after the interval starts. The shared-GPU variant extends this dict (it never
replaces these two) with per-GPU ``clocks``, ``share_weights`` (a Box the env maps onto each GPU's simplex of SM
shares), ``gpu_request`` (per instance: stay, or a GPU, granted as far as memory allows) and ``migrate``: every
point of that space is a legal action (`commitenv.envs.actions`, docs/env.md). Controllers may instead give exact
``shares`` and ``placement``, which are checked and refused with an error naming the field, never mapped.
Observation (``Box`` float32, 16 features, ``OBS_FEATURES``): a function of the controller's view alone,
each feature's formula, scale and bounds in `commitenv.envs.observation`.

Two meters (realism levels, docs/realism.md): observations and ``info`` energies are what the controller's
NVML-like counters read (`commitenv.envs.meters`); the settlement and the reward use the pool meter. At ``ideal``
they are the same number. ``info["settlement"]`` (once an hour closes) is the settled bill.

Planning time (``realism.planning_delay``): at ``paper`` and ``hard`` the runner measures each decision
(`commitenv.planning`) and hands the seconds to ``charge_planning``; the action then applies that much after the
interval starts (at least what the controller reports through its probe), and not at all once it would fall past
the interval (stale). At ``ideal`` only a controller's own report delays it (0 by default).

Reward and constraint (the scenario's objective: minimise the settlement cost subject to the SLO gate, ePACT eq. 1;
a constrained MDP as Safety-Gymnasium states one). Each step pays minus the change of the current hour's settlement
cost as its energy accrues, -(C(M_{k+1}) - C(M_k)) with C(M) = lambda_plus [M - E*]+ + lambda_minus [E* - M]+ in
kWh-equivalent. The episode runs until every request is served: the energy drawn after the last hour (the completion
tail) was bought by nobody, so the last step also pays it at the overuse rate, lambda_plus x tail kWh (`info
["tail_cost_kwh_eq"]`); starving the pool at the end to under-use the last hour never pays. Since C(0) = lambda_minus
E*, an episode's return is exactly

    return = -(sum_h C_h + lambda_plus * tail_kWh) + lambda_minus * sum_h E*_h

i.e. minus the episode's settlement cost (``cost_kwh_eq`` of `commitenv.scoring`) up to the constant
``reward_offset_kwh`` (0 for an energy-only scenario). The constraint is a separate signal: ``info["cost"]`` is the
number of deadline misses that became known in the step (a deadline passing unfinished, or at the end, after the
tail; at realism levels whose deadlines a controller sees only through predicted lengths, when the late answer
arrives), and ``info["miss_fraction_by_hour"]`` the running miss fraction of every arrival hour so far (known misses
/ arrivals). `commitenv.envs.LagrangianReward` turns the pair into one penalised reward (at the scenario's
``miss_penalty_kwh``: reward - miss_penalty_kwh x cost, the return of earlier versions). Scores themselves are
computed by `commitenv.scoring` from the engine's records, never from rewards.

Attribution (``CommitServeEnv(..., attribution=True)``; off by default: the engine must then report every step,
which costs time (docs/results/performance.md), and it adds a nested ``info`` entry): StepSplit's closed-form
Shapley shares of the metered energy, per request and per tenant (`commitenv.attribution.PoolAttributor`; on a
hardware backend `commitenv.attribution.hardware.HardwareAttributor`, which splits each GPU's counter energy above
the profile's idle floor among the logged steps' members by their law terms: docs/real-gpu.md).
Every step's ``info["attribution"]`` then holds

* ``"interval"``: ``start_s``, ``end_s``, ``energy_j`` (metered), ``busy_j`` (the energy of the steps run in the
  interval, split among the requests in them), ``idle_j`` (``energy_j - busy_j``: the idle floor of the time no
  step covers; billed to no request) and ``tenant_j`` ({tenant name: joules}, tenants seen so far; sums to
  ``busy_j``). A step in flight at the boundary is split where the meter splits it.
* ``"hour"`` (when an hour settles): the same for the hour, plus ``cost_kwh_eq`` (the hour's settlement cost),
  ``idle_cost_kwh_eq`` (the cost the idle energy alone would have settled at, the operator's part) and
  ``tenant_cost_kwh_eq`` ({tenant: its Shapley share of the rest}, negative = a credit: in an under-used hour a
  tenant's energy lowers the cost), by `commitenv.attribution.cost_split.hour_cost_shares` on the settlement
  meter's energies (docs/attribution-cost.md); tenant and idle costs add up to the settlement cost. Exact for up
  to 17 tenants (and more when the hour is on one side of E* or energies repeat); otherwise sampled, and
  ``tenant_cost_se_kwh_eq`` ({tenant: standard error}; None when exact) says how closely.
* ``"tail"`` (at the end): the same for the completion tail after the horizon (not settled).

A request's share spans the periods its steps ran in; ``env.bills()`` gives the per-request totals (final at the
end of the episode): own energy, shared energy, and their sum, which add up to the run's busy energy.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from commitenv.attribution.cost_split import hour_cost_shares
from commitenv.attribution.hardware import HardwareAttributor
from commitenv.attribution.online import PeriodSplit, PoolAttributor
from commitenv.metrics import arrival_hours, slo_outcome
from commitenv.planning import quantize
from commitenv.envs.actions import check_action, check_shared_action, shared_action_space
from commitenv.envs.meters import ControllerMeter
from commitenv.envs.observation import OBS_FEATURES, OBS_HIGH, OBS_LOW, observe  # noqa: F401  (OBS_FEATURES: re-exported)
from commitenv.scenarios import (commitments_mj, engine_options, load_scenario, scenario_layout, scenario_profiles,
                                 scenario_tenant_model, scenario_workload)
from commitenv.scenarios.build import realism_of
from commitenv.scenarios.schema import Scenario
from commitenv.settlement import HourlySettlement, remaining_per_interval
from commitenv.sim import Pool, Snapshot, observed_arrivals, take_snapshot
from commitenv.sim.dispatch import DispatchPolicy, make_dispatch
from commitenv.sim.interval import SharedConfig, run_interval, run_shared_interval
from commitenv.sim.local import LocalPolicy
from commitenv.workload.table import RequestTable, make_table

class CommitServeEnv(gym.Env):
    """Gymnasium environment over the serving engine; see the module docstring for spaces and reward."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, scenario: str | Scenario = "epact-h200-hour-fixed-a30", render_mode: str | None = None,
                 attribution: bool = False, backend: Callable[..., Any] | None = None) -> None:
        self.attribution = bool(attribution)
        if backend is not None and not callable(backend):
            raise ValueError(f"backend: expected None (the simulator) or a pool factory such as "
                             f"commitenv.backends.pool.fake_backend(), got {backend!r}")
        self.backend = backend  # None: the simulator; else (profile, replicas, options, clock MHz) -> a pool
        self.attributor: PoolAttributor | None = None
        self.scenario = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode: expected one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        self.render_mode = render_mode
        sc = self.scenario
        self.profiles = scenario_profiles(sc)
        self.profile = self.profiles[0]
        self.layout = scenario_layout(sc)
        self.shared = sc.pool.shared  # several models sharing the GPUs (see "Shared pools" in the module docstring)
        self.n_gpus = sc.pool.gpus
        self.n_replicas = sum(len(g) for g in self.layout.gpus)
        self.replicas_per_model = tuple(sum(1 for g in self.layout.gpus for i in g if i.model == m)
                                        for m in range(len(self.profiles)))
        self.model_names = tuple(m.name for m in sc.pool.models) if self.shared else (self.profile.model.name,)
        self.clocks_mhz = self.profile.clock_mhz
        self.K = sc.intervals_per_hour
        self.H = sc.horizon_hours
        self.dt = sc.interval_s
        self.commit_j = np.asarray(commitments_mj(sc), dtype=np.float64) * 1e6  # frozen before any run
        if len(self.commit_j) == 1:
            self.commit_j = np.full(self.H, self.commit_j[0])
        self.lp, self.lm = sc.lambda_plus, sc.lambda_minus
        self.realism = realism_of(sc)
        self._settle_factor = 1.0 + self.realism.meters.pool_overhead  # settlement meter / GPU boards
        self._misses_at_completion = self.realism.deadlines == "predicted"  # true deadlines are not known earlier
        self.reward_offset_kwh = HourlySettlement(self.commit_j, self.lp, self.lm, self.K).reward_offset_kwh
        self._e_scale = self.n_gpus * self.profile.gpu.tdp_w * 3600.0
        self.scale_to_zero = bool(sc.engine.scale_to_zero)  # a model may stand by whole (shared pools only)
        if self.shared:
            if backend is not None:
                raise ValueError("backend: a hardware pool serves one model; shared pools run on the simulator only")
            # every point legal: share weights mapped onto each GPU's simplex, GPU requests granted as far as memory
            # allows (`commitenv.envs.actions.shared_action_space`); exact "shares" / "placement" are also taken
            self.action_space = shared_action_space(self.replicas_per_model, len(self.clocks_mhz), self.n_gpus,
                                                    self.n_replicas, self.scale_to_zero)
        else:
            self.action_space = spaces.Dict(
                {"active": spaces.Discrete(self.n_replicas, start=1), "clock": spaces.Discrete(len(self.clocks_mhz))}
            )
        self.observation_space = spaces.Box(OBS_LOW, OBS_HIGH, dtype=np.float32)
        init = sc.initial
        self._init_active = init.active if init.active is not None else self.n_replicas
        self._init_clock = self.profile.clock_index(init.clock_mhz) if init.clock_mhz is not None else self.profile.reference_clock_index
        if not 1 <= self._init_active <= self.n_replicas:
            raise ValueError(f"scenario {sc.name}: initial.active must be in 1..{self.n_replicas}")
        self._init_shared = SharedConfig(self.replicas_per_model, (self._init_clock,) * self.n_gpus,
                                         tuple(i.share for g in self.layout.gpus for i in g),
                                         tuple(g for g, insts in enumerate(self.layout.gpus) for _ in insts)) \
            if self.shared else None
        self._tables: dict[int, RequestTable] = {}
        self.pool: Pool | None = None

    # ------------------------------------------------------------------------------------------ episode
    def set_local_policy(self, policy: LocalPolicy | None) -> None:
        """Plan every step of every replica with ``policy`` this episode (`commitenv.sim.local`; None: vLLM's
        scheduler). Call after `reset`; `commitenv.evaluation.run_episode` installs a controller's
        `local_policy()`."""
        self._check_policy("set_local_policy", policy, LocalPolicy, "a hardware pool's engines schedule their own steps")
        self.pool.set_local_policy(policy)

    def _check_policy(self, what: str, policy: Any, kind: type, hardware: str) -> None:
        """A policy can be installed once an episode's simulated pool exists, and must be of ``kind`` (or None)."""
        if self.pool is None:
            raise ValueError(f"{what}: call reset() first (the policy belongs to an episode's pool)")
        if self.backend is not None:
            raise ValueError(f"{what}: {hardware}")
        if policy is not None and not isinstance(policy, kind):
            raise TypeError(f"{what}: expected a {kind.__module__}.{kind.__name__}, got {type(policy).__name__}")

    def set_dispatch(self, policy: DispatchPolicy | None) -> None:
        """Route this episode's arrivals with ``policy`` (`commitenv.sim.dispatch`; None: the scenario's router).
        Call after `reset`; `commitenv.evaluation.run_episode` installs a controller's `dispatch_policy()`."""
        self._check_policy("set_dispatch", policy, DispatchPolicy, "a hardware pool routes its requests itself")
        self.pool.dispatch = policy if policy is not None else make_dispatch(self.pool.opt.dispatch)

    def _workload(self, seed: int) -> RequestTable:
        if self.scenario.workload.seed is None:
            return scenario_workload(self.scenario, seed)  # a new trace every episode
        key = self.scenario.workload.seed
        if key not in self._tables:
            self._tables = {key: scenario_workload(self.scenario, seed)}
        return self._tables[key]

    def _reset_options(self, options: dict[str, Any] | None) -> tuple[int, bool]:
        """The seed the episode's workload is drawn from (the run seed, or ``options["workload_seed"]``: a site's
        routed pools draw their route's one workload, each then serving its share; the engine keeps the run seed), and
        ``options["stream"]``: whether the pool starts with no requests, given them later by `extend_workload`."""
        opts = dict(options or {})
        unknown = sorted(set(opts) - {"workload_seed", "stream"})
        if unknown:
            raise ValueError(f"reset options: unknown {unknown}; expected 'workload_seed' and 'stream' only")
        ws = opts.get("workload_seed", self.run_seed)
        if isinstance(ws, bool) or not isinstance(ws, (int, np.integer)) or ws < 0:
            raise ValueError(f"reset options['workload_seed']: expected an integer >= 0, got {ws!r}")
        stream = opts.get("stream", False)
        if not isinstance(stream, bool):
            raise ValueError(f"reset options['stream']: expected true or false, got {stream!r}")
        if stream and (self.shared or self.attribution or self.backend is not None):
            raise ValueError("reset options['stream']: only a simulated one-model pool without attribution starts "
                             "empty and takes its requests as they come")
        return int(ws), stream

    def extend_workload(self, rows: RequestTable) -> None:
        """Serve ``rows`` too (after ``reset(options={"stream": True})``, or more of a workload): requests arriving no
        earlier than the pool's clock and its last request, e.g. a router's share of the coming interval."""
        if self.pool is None:
            raise RuntimeError("extend_workload() called before reset()")
        if self.attribution:
            raise ValueError("extend_workload: not with attribution (its bills are sized at reset)")
        n0 = len(self.table)
        self.pool.extend(rows)
        self.table = table = self.pool.table
        added = np.bincount(arrival_hours(rows.arrival_s, self.H), minlength=self.H)  # (the rows arrive in order)
        self._hour_rows = self._hour_rows + np.concatenate([[0], np.cumsum(added)])
        if not self._misses_at_completion:  # the new rows' deadlines merged into those not yet passed
            dl = self.pool.deadline
            tail = np.concatenate([self._dl_order[self._dl_ptr:], np.arange(n0, len(table))])
            tail = tail[np.argsort(dl[tail], kind="stable")]
            self._dl_order = np.concatenate([self._dl_order[:self._dl_ptr], tail])
            self._dl_sorted = dl[self._dl_order]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.run_seed = int(seed) if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        sc = self.scenario
        ws, stream = self._reset_options(options)
        # a streamed pool starts with no request (nothing drawn): its rows come by extend_workload
        table = make_table([], [], []) if stream else self._workload(ws)
        self.table = table
        if self.backend is None:
            pool = Pool(self.profiles, self.layout, engine_options(sc, self.run_seed),
                        clock_mhz=self.clocks_mhz[self._init_clock])
        else:  # a hardware pool (real or fake GPUs): the hardware is the truth, its counters are the meter
            self.close()
            pool = self.backend(self.profile, self.n_replicas, engine_options(sc, self.run_seed),
                                self.clocks_mhz[self._init_clock])
        if self._init_active != self.n_replicas:
            pool.set_active(0.0, self._init_active)
        tenant_model = scenario_tenant_model(sc, table)
        if tenant_model is None:
            pool.attach(table)  # one model (a hardware pool's attach takes the table alone)
        else:
            pool.attach(table, tenant_model)
        self.pool = pool
        meters = self.realism.meters if self.backend is None else type(self.realism.meters)()  # real counters
        self.meter = ControllerMeter(meters, self.n_gpus, pool.opt.seed)
        self.meter_prev = 0.0  # controller-meter reading at the last boundary, and at the hour's start
        self.meter_hour_start = 0.0
        self._pending_done: list[int] = []
        if self._misses_at_completion:
            pool.done_slots = []  # the engine reports completions: misses become known as late answers arrive
        self.actions: list[tuple] = []  # ("active" | "clock", t_apply, value): what the controller changed, when
        self.attributor = None
        if self.attribution:  # a hardware pool: its workers' step log and GPU counters (commitenv.attribution.hardware)
            self.attributor = PoolAttributor(pool) if self.backend is None else HardwareAttributor(pool)
        self._attr_hour: list[PeriodSplit] = []
        self._tenant_seen = np.zeros(len(table.tenant_names), dtype=bool)
        self.k = 0
        self.cfg = (self._init_active, self._init_clock)
        self.shared_cfg = self._init_shared  # a shared pool's full configuration (cfg then sums it up)
        self.settlement = HourlySettlement(self.commit_j, self.lp, self.lm, self.K)  # on the settlement meter
        self.last_interval_j = 0.0
        self.arrived_prev = 0
        self.misses = 0
        if not self._misses_at_completion:  # (misses known as deadlines pass: rows in deadline order)
            self._dl_order = np.argsort(pool.deadline, kind="stable")
            self._dl_sorted = pool.deadline[self._dl_order]
        self._dl_ptr = 0
        self.tail_energy_j = 0.0
        self.settlement_meter_j = 0.0  # the settlement meter's reading at the last boundary (a site sums them)
        self.tail_cost_kwh = 0.0
        # the first row of each arrival hour (the table is in arrival order; an hour per row is not kept: 8 B a request)
        self._hour_rows = np.searchsorted(arrival_hours(table.arrival_s, self.H), np.arange(self.H + 1))
        self.misses_by_hour = np.zeros(self.H, dtype=np.int64)
        self._planning_delay = 0.0
        self._charged_delay = 0.0
        self.applied_planning_delay_s = 0.0
        self.history: list[dict[str, float]] = []
        return self._obs(), self._info(0.0, new_misses=0)

    def _check_action(self, action: Any) -> tuple[int, int]:
        return check_action(action, self.n_replicas, self.clocks_mhz)

    def _check_shared_action(self, action: Any) -> SharedConfig:
        return check_shared_action(self, action)

    def step(self, action: Any):
        if self.pool is None:
            raise RuntimeError("step() called before reset()")
        if self.k >= self.H * self.K:
            raise RuntimeError("step() called after the episode ended; call reset()")
        if self.shared:
            return self._step_shared(self._check_shared_action(action))
        a, c = self._check_action(action)
        t1, t_apply, stale = self._interval_times()
        self.cfg, changes = run_interval(self.pool, self.cfg, (a, c), t_apply, t1, self.clocks_mhz)
        return self._after_interval(changes, stale, t1, (a, c))

    def _interval_times(self) -> tuple[float, float, bool]:
        """The coming interval's end, when its decision applies (actuation and planning delay after its start), and
        whether that is too late (stale); consumes the reported planning delay."""
        t0 = self.k * self.dt
        t1 = t0 + self.dt
        pd = self.realism.planning_delay
        if pd.mode == "fixed":
            delay = pd.seconds
        elif pd.mode == "measured":
            delay = quantize(max(self._charged_delay, self._planning_delay, pd.seconds), pd.resolution_s)
        else:
            delay = self._planning_delay
        self.applied_planning_delay_s = float(delay)
        t_apply = t0 + self.scenario.actuation_delay_s + delay
        self._planning_delay = 0.0
        self._charged_delay = 0.0
        return t1, t_apply, t_apply >= t1

    def _step_shared(self, new: SharedConfig):
        t1, t_apply, stale = self._interval_times()
        self.shared_cfg, changes = run_shared_interval(self.pool, self.shared_cfg, new, t_apply, t1, self.clocks_mhz)
        cf = self.shared_cfg
        self.cfg = (sum(cf.active), max(cf.clocks))  # the summary the observation and info report
        return self._after_interval(changes, stale, t1, (sum(new.active), max(new.clocks)))

    def _after_interval(self, changes: list[tuple], stale: bool, t1: float, asked: tuple[int, int]):
        """Meter, settle, attribute and observe once the interval's engine run has reached ``t1`` (``asked``: the
        decision's active replicas and clock index, as the history records them)."""
        pool = self.pool
        self.actions.extend(changes)
        split = self.attributor.close(t1) if self.attributor is not None else None
        e_now = pool.energy_j(t1) * self._settle_factor  # the settlement meter
        self.settlement_meter_j = e_now
        reading = self.meter.read(pool, t1, self.dt)  # what the controller's counters say
        interval_j = reading - self.meter_prev
        self.meter_prev = reading
        booked = self.settlement.record(e_now)
        d_cost = booked.cost_change_kwh
        self.last_interval_j = interval_j
        self.k += 1
        terminated = self.k >= self.H * self.K
        settlement = None
        if booked.closed is not None:
            settlement = booked.closed.as_dict()
            self.meter_hour_start = reading
        tail_cost = 0.0
        if terminated:  # the episode runs until drained: the tail counts for SLOs and is settled as overuse
            pool.run_until(math.inf)
            self.tail_energy_j = pool.energy_j() * self._settle_factor - e_now
            tail_cost = self.settlement.tail_cost(self.tail_energy_j)
            self.tail_cost_kwh = tail_cost
        attribution = None
        if split is not None:
            attribution = self._attribution(split, settlement, terminated)
        new_misses = self._count_misses(math.inf if terminated else t1)
        self.misses += new_misses
        reward = -d_cost - tail_cost
        self.history.append({"t": t1, "interval_j": interval_j, "active": asked[0], "clock_mhz": self.clocks_mhz[asked[1]]})
        info = self._info(interval_j, new_misses=new_misses, settlement=settlement)
        info["stale_decision"] = stale
        if attribution is not None:
            info["attribution"] = attribution
        if terminated:
            info["tail_energy_j"] = self.tail_energy_j
            info["tail_cost_kwh_eq"] = tail_cost
        return self._obs(), float(reward), terminated, False, info

    # ------------------------------------------------------------------------------------------ attribution
    def _period_info(self, splits: list[PeriodSplit]) -> dict[str, Any]:
        tj = np.sum([p.tenant_j for p in splits], axis=0)
        metered = math.fsum(p.metered_j for p in splits)
        busy = math.fsum(p.busy_j for p in splits)
        names = self.table.tenant_names
        return {
            "start_s": float(splits[0].start),
            "end_s": float(splits[-1].end),
            "energy_j": metered,
            "busy_j": busy,
            "idle_j": metered - busy,
            "tenant_j": {names[t]: float(tj[t]) for t in np.flatnonzero(self._tenant_seen)},
        }

    def _attribution(self, split: PeriodSplit, settlement: dict | None, terminated: bool) -> dict[str, Any]:
        n = self.pool.arrived
        if n and not self._tenant_seen.all():
            self._tenant_seen[np.unique(self.table.tenant[:n])] = True
        self._attr_hour.append(split)
        out: dict[str, Any] = {"interval": self._period_info([split])}
        if settlement is not None:
            hour = self._period_info(self._attr_hour)
            self._attr_hour = []
            hour["cost_kwh_eq"] = float(settlement["cost_kwh_eq"])
            f = self._settle_factor  # the GPU boards' energies on the settlement meter
            split_cost = hour_cost_shares({k: v * f for k, v in hour["tenant_j"].items()}, hour["idle_j"] * f,
                                          settlement["commitment_j"], self.settlement.lambda_plus,
                                          self.settlement.lambda_minus)
            hour["tenant_cost_kwh_eq"] = split_cost.tenant_kwh_eq
            hour["idle_cost_kwh_eq"] = split_cost.idle_kwh_eq
            hour["tenant_cost_se_kwh_eq"] = split_cost.se_kwh_eq  # None: exact (always for <= 17 tenants)
            out["hour"] = hour
        if terminated:
            tail = self.attributor.close(self.pool.now)
            out["tail"] = self._period_info([tail])
        return out

    @property
    def hour_energy_j(self) -> np.ndarray:
        """Settled energy of every closed hour (J; 0 while open), from the episode's `HourlySettlement`."""
        return self.settlement.energy_j

    @property
    def hour_cost_kwh(self) -> np.ndarray:
        """Settlement cost of every closed hour (kWh-eq)."""
        return self.settlement.cost_kwh

    def bills(self) -> dict[str, np.ndarray]:
        """Per-request energy shares so far (J, aligned with the table's rows): ``own_j``, ``shared_j``,
        ``total_j``; final once the episode has ended. Needs ``attribution=True``."""
        if self.attributor is None:
            raise RuntimeError("bills() needs CommitServeEnv(..., attribution=True) and reset()")
        a = self.attributor
        return {"own_j": a.own_j.copy(), "shared_j": a.shared_j.copy(), "total_j": a.bills_j}

    def _count_misses(self, t: float) -> int:
        """Misses that became known by ``t``. With visible (true) deadlines: deadlines that passed without
        completion by then. When the true deadline depends on the unknown output length (realism levels): late
        completions seen by ``t``, and at the end every request not finished in time."""
        if self._misses_at_completion:
            return self._count_misses_at_completion(t)
        q = int(np.searchsorted(self._dl_sorted, t, side="left")) if t < math.inf else len(self._dl_sorted)
        if q <= self._dl_ptr:
            return 0
        idx = self._dl_order[self._dl_ptr : q]
        self._dl_ptr = q
        ok = self.pool.finish_t[idx] <= self.pool.deadline[idx]
        return self._book_misses(idx[~ok])

    def _hours(self, rows: np.ndarray) -> np.ndarray:
        """The arrival hours of table ``rows`` (indices or a mask), as the SLO gate counts them."""
        return arrival_hours(self.table.arrival_s[rows], self.H)

    def _book_misses(self, missed: np.ndarray) -> int:
        """Count the requests ``missed`` (table rows) in their arrival hours; their number."""
        if len(missed):
            self.misses_by_hour += np.bincount(self._hours(missed), minlength=self.H)[: self.H]
        return int(len(missed))

    def _count_misses_at_completion(self, t: float) -> int:
        pool = self.pool
        if t == math.inf:
            fin, dl = pool.finish_t, pool.deadline
            missed = ~(fin <= dl)  # NaN (never finished) and rejected (inf) miss
            new = int(np.count_nonzero(missed)) - self.misses
            self.misses_by_hour = np.bincount(self._hours(missed), minlength=self.H)[: self.H].astype(np.int64)
            self._pending_done = []
            pool.done_slots.clear()
            return new
        cand = self._pending_done + pool.done_slots
        pool.done_slots.clear()
        if not cand:
            return 0
        idx = np.asarray(cand, dtype=np.int64)
        fin = pool.finish_t[idx]
        seen = fin <= t  # the client has the answer (overheads can carry it past the boundary)
        self._pending_done = idx[~seen].tolist()
        late = idx[seen][fin[seen] > pool.deadline[idx[seen]]]
        return self._book_misses(late)

    # ------------------------------------------------------------------------------------------ views
    def _obs(self) -> np.ndarray:
        return observe(self)

    def _info(self, interval_j: float, *, new_misses: int, settlement: dict | None = None) -> dict[str, Any]:
        k, K = self.k, self.K
        h = min(k // K, self.H - 1)
        m = self.meter_prev - self.meter_hour_start  # the controller's meter (settled energy comes with settlement)
        kin = k - h * K
        info: dict[str, Any] = {
            "t": self.pool.now,
            "hour": h,
            "interval": kin,
            "interval_energy_j": interval_j,
            "hour_energy_j": m,
            "commitment_j": float(self.commit_j[h]),
            "target_j": float(remaining_per_interval(float(self.commit_j[h]), m, kin, K)),
            "active": self.cfg[0],
            "clock_mhz": self.clocks_mhz[self.cfg[1]],
            **({"active_by_model": list(self.shared_cfg.active),
                "clocks_mhz": [self.clocks_mhz[c] for c in self.shared_cfg.clocks],
                "shares": list(self.shared_cfg.shares), "placement": list(self.shared_cfg.gpus),
                "moves": self.pool.moves, "cold_starts": self.pool.cold_starts,
                "migrated_requests": self.pool.migrated} if self.shared else {}),
            "new_misses": new_misses,
            "misses": self.misses,
            "cost": float(new_misses),  # the constraint signal (Safety-Gymnasium's name): misses known this step
            "miss_fraction_by_hour": self._miss_fractions(),
            "reward_offset_kwh": self.reward_offset_kwh,
        }
        if settlement is not None:
            info["settlement"] = settlement
            slo = slo_outcome(self.table.arrival_s[: self.pool.arrived], self.pool.finish_t[: self.pool.arrived],
                              self.pool.deadline[: self.pool.arrived], self.H)
            info["slo_by_hour"] = {"arrivals": slo.arrivals.tolist(), "met_so_far": slo.met.tolist()}
        return info

    def _miss_fractions(self) -> list[float]:
        """Known misses / arrivals so far of every arrival hour (0 for an hour without arrivals yet)."""
        lo, hi = self._hour_rows[:-1], self._hour_rows[1:]
        arrived = np.clip(self.pool.arrived - lo, 0, hi - lo)
        return np.divide(self.misses_by_hour, arrived, out=np.zeros(self.H), where=arrived > 0).tolist()

    # ------------------------------------------------------------------------------------------ controller API
    def snapshot(self) -> Snapshot:
        """The read-only causal view of the serving state (`commitenv.sim.view.Snapshot`): arrived requests only,
        output lengths and deadlines as the scenario lets a controller see them; ``.simulate(...)`` for what-if."""
        if self.pool is None:
            raise RuntimeError("snapshot() called before reset()")
        return take_snapshot(self.pool, meter_j=self.meter_prev)

    def report_planning_delay(self, seconds: float) -> None:
        """A controller's decision for the coming step takes ``seconds`` to compute (ePACT's asynchronous
        search): the action then applies at interval start + actuation delay + ``seconds``, or not at all
        if that is past the interval's end (a stale decision; the current configuration stays)."""
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"planning delay: expected a finite number of seconds >= 0, got {seconds}")
        self._planning_delay = float(seconds)

    def charge_planning(self, seconds: float) -> None:
        """The runner measured the coming action's decision at ``seconds`` (`commitenv.planning.PlanningClock`): at
        realism levels whose planning delay is ``measured`` the action applies that much after the interval starts
        (at least what the controller reported; rounded to ``resolution_s``); ignored in the other modes."""
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"planning time: expected a finite number of seconds >= 0, got {seconds}")
        self._charged_delay = float(seconds)

    @property
    def charges_planning(self) -> bool:
        """Whether the runner's measurement of each decision applies (``realism.planning_delay.mode: measured``)."""
        return self.realism.planning_delay.mode == "measured"

    @property
    def reported_planning_delay_s(self) -> float:
        """The planning delay reported for the coming step (0 until a controller reports one)."""
        return self._planning_delay

    def recent_arrivals(self, window_s: float) -> RequestTable:
        """Arrivals of the last ``window_s`` seconds (predicted output lengths), shifted to replay from now."""
        if self.pool is None:
            raise RuntimeError("recent_arrivals() called before reset()")
        return observed_arrivals(self.pool, window_s)

    def close(self) -> None:
        """Release a hardware pool's workers and reset its GPUs' clocks (nothing to do on the simulator)."""
        pool = getattr(self, "pool", None)
        if pool is not None and hasattr(pool, "close"):
            pool.close()
        super().close()

    # ------------------------------------------------------------------------------------------ render
    def render(self):
        if self.render_mode != "rgb_array":
            return None
        if self.pool is None:
            raise gym.error.ResetNeeded("render() called before reset(): there is no episode to draw yet")
        from commitenv.plots import render_progress

        return render_progress(self)
