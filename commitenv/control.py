"""The control API (part of the library, so that it never needs its plug-ins): the controller protocol with its
declared lifecycle ``reset(ctx, seed)``, then ``act(observation, info) -> action`` every interval, then ``close()``;
``stats()`` reports numbers for summary.json. The built-in controllers (package ``controllers``) implement it
like any third-party one.

The same class runs in ``commitenv run``, in a plain Gymnasium loop and in the leaderboard sandbox. What a
controller may know: the observation and ``info`` of every step, the scenario's public terms and the nominal
profile in `ControllerContext`, and through ``ctx.probe`` (an `EnvProbe`) the read-only `Snapshot` of the
serving state (arrived requests with predicted lengths and visible deadlines, replica states, clocks, the
controller's meter; ``snapshot.simulate(active, clock_mhz, horizon_s)`` predicts a configuration with the
engine) and ``recent_arrivals(window_s)``.

Hindsight (bounds only): a controller whose class declares ``hindsight = True`` (the ``oracle``) is given
``ctx.hindsight``, a `commitenv.hindsight.HindsightAccess` (the true trace and forks of the ground-truth engine);
every other controller gets None there. Runs that use it are marked, and the leaderboard refuses them.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from commitenv.profiles.schema import Profile
from commitenv.scenarios.schema import GateSpec
from commitenv.sim.dispatch import ArrivalView, CandidateView, DispatchPolicy
from commitenv.sim.interval import per_model_counts
from commitenv.sim.local import LocalPolicy, LocalView, StepPlan, TaskView
from commitenv.sim.migration import MIGRATE_MODES
from commitenv.sim.view import ReplicaView, RequestView, Snapshot
from commitenv.sim.whatif import WhatIf

if TYPE_CHECKING:  # pragma: no cover
    from commitenv.hindsight import HindsightAccess

__all__ = ["ArrivalView", "CandidateView", "Controller", "ControllerContext", "DispatchPolicy", "EnvProbe",
           "LocalPolicy", "LocalView", "MIGRATE_MODES", "Probe", "ReplicaView", "RequestView", "Snapshot", "StepPlan", "TaskView",
           "WhatIf"]


class Probe(Protocol):
    """What a controller may ask the environment for, beyond observation and info."""

    def snapshot(self) -> Snapshot: ...

    def recent_arrivals(self, window_s: float) -> Any: ...

    def report_planning_delay(self, seconds: float) -> None: ...


class EnvProbe:
    """The only door from a controller to the environment: ``snapshot()`` and ``recent_arrivals(window_s)``
    (both causal) and ``report_planning_delay(seconds)``. It keeps the environment in closures, not attributes, so the trace, the true lengths and
    the live engine are not among the probe's attributes (docs/architecture.md, "Truth and view")."""

    __slots__ = ("snapshot", "recent_arrivals", "report_planning_delay")

    def __init__(self, env: Any) -> None:
        def snapshot() -> Snapshot:
            """The read-only causal view of the serving state (`Snapshot`)."""
            return env.snapshot()

        def recent_arrivals(window_s: float) -> Any:
            """Arrivals of the last ``window_s`` seconds with predicted lengths, shifted to replay from now."""
            return env.recent_arrivals(window_s)

        def report_planning_delay(seconds: float) -> None:
            """The coming action was computed in ``seconds``: it applies that much after the interval starts."""
            env.report_planning_delay(seconds)

        self.snapshot = snapshot
        self.recent_arrivals = recent_arrivals
        self.report_planning_delay = report_planning_delay


@dataclass(frozen=True)
class ControllerContext:
    """Static facts of the scenario a controller runs in (no trace content, no future arrivals). ``profile`` is
    the pool's nominal profile (clock levels, step-time and power laws, scheduler limits): the controller's own
    copy, so writing into it changes nothing in the environment."""

    scenario: str
    n_replicas: int
    clocks_mhz: tuple[int, ...]
    reference_clock_mhz: int
    interval_s: float
    intervals_per_hour: int
    horizon_hours: int
    commitments_j: tuple[float, ...]
    lambda_plus: float
    lambda_minus: float
    alpha: float
    epsilon: float
    actuation_delay_s: float
    miss_penalty_kwh: float = 0.0  # the scenario's price of one deadline miss in the reward (kWh-eq)
    gate: GateSpec = GateSpec()  # the objective's SLO gate (absolute: epsilon; relative: vLLM's attainment - tolerance)
    n_gpus: int = 0  # GPUs in the pool (one replica each unless shared; 0: not given)
    profile: Profile | None = None
    probe: Probe | None = None
    # --- hindsight door (oracle only): None unless built with from_env(env, hindsight=True) -----------------
    hindsight: "HindsightAccess | None" = None
    # --- shared pools (several models on the GPUs): empty for one model ---------------------------------------
    models: tuple[str, ...] = ()  # model names, in the order of the action's per-model entries
    replicas_per_model: tuple[int, ...] = ()
    placement: tuple[tuple[tuple[int, float], ...], ...] = ()  # per GPU: (model index, SM share) of its instances
    profiles: tuple[Profile, ...] = ()  # per model (the controller's own copies)
    model_tenants: tuple[tuple[str, ...], ...] = ()  # per model: the tenants it serves (the scenario's routing)
    scale_to_zero: bool = False  # a model may have no active instance; a request that finds none wakes one

    def model_of_tenants(self, tenant_names: tuple[str, ...]) -> np.ndarray:
        """The model serving each of ``tenant_names`` (a table's tenants, by index; -1 for a tenant no model serves)."""
        by_name = {t: m for m, ts in enumerate(self.model_tenants) for t in ts}
        return np.array([by_name.get(n, -1) for n in tenant_names], dtype=np.int64)

    @property
    def shared(self) -> bool:
        """Several models share the pool's GPUs (the action then holds per-model active counts)."""
        return bool(self.models)

    @property
    def all_active(self) -> int | tuple[int, ...]:
        """``active`` with every replica on: ``n_replicas``, or per model on a shared pool."""
        return self.replicas_per_model if self.shared else self.n_replicas

    def spread_active(self, total: int) -> tuple[int, ...]:
        """A shared pool's per-model active counts for ``total`` instances: one each, the rest in proportion to each
        model's other instances (largest remainders, ties to the earlier model). For controllers that plan a pool-wide
        count (ePACT's catalog)."""
        n = self.replicas_per_model
        if not n:
            raise ValueError("spread_active: only for shared pools (several models)")
        if isinstance(total, (bool, np.bool_)) or not len(n) <= total <= sum(n):
            raise ValueError(f"spread_active: expected a total in {len(n)}..{sum(n)} (one instance per model at "
                             f"least), got {total!r}")
        extra, cap = int(total) - len(n), [x - 1 for x in n]
        if extra == 0:
            return (1,) * len(n)
        raw = [extra * c / sum(cap) for c in cap]
        base = [math.floor(r) for r in raw]
        for m in sorted(range(len(n)), key=lambda m: (base[m] - raw[m], m))[: extra - sum(base)]:
            base[m] += 1
        return tuple(1 + b for b in base)

    def action(self, active, clock_mhz: int, *, clocks_mhz=None, shares=None, placement=None,
               migrate: str | None = None) -> dict:
        """The env action for ``active`` replicas (a whole number in 1..n_replicas, as the env accepts; bools,
        NaN and fractions are refused) at ``clock_mhz`` (one of ``clocks_mhz``); raises ValueError otherwise.
        On a shared pool ``active`` gives each model's count, and ``clocks_mhz`` (per GPU), ``shares`` and
        ``placement`` (the GPU of each replica, in placement order; a change moves the instance) and ``migrate``
        (one of `commitenv.sim.migration.MIGRATE_MODES`, for this action's moves) may be added."""
        if self.shared:
            return self._shared_action(active, clock_mhz, clocks_mhz, shares, placement, migrate)
        if clocks_mhz is not None or shares is not None or placement is not None or migrate is not None:
            raise ValueError("action: per-GPU clocks, SM shares and placement are for shared pools (several models) only")
        whole = isinstance(active, (int, np.integer)) or (
            isinstance(active, (float, np.floating)) and float(active).is_integer()
        )
        if isinstance(active, (bool, np.bool_)) or not whole:
            raise ValueError(f"action: active must be a whole number of replicas in 1..{self.n_replicas}, "
                             f"got {active.item() if isinstance(active, np.generic) else active!r}")
        if not 1 <= active <= self.n_replicas:
            raise ValueError(f"action: active must be in 1..{self.n_replicas} (the pool's replicas), got {int(active)}")
        if clock_mhz not in self.clocks_mhz:
            raise ValueError(f"clock {clock_mhz} MHz not one of {self.clocks_mhz}")
        return {"active": int(active), "clock": self.clocks_mhz.index(clock_mhz)}

    def _shared_action(self, active, clock_mhz: int, clocks_mhz, shares, placement, migrate) -> dict:
        try:
            act = per_model_counts(active, self.replicas_per_model, self.models, 0 if self.scale_to_zero else 1)
        except ValueError as e:
            raise ValueError(f"action: {e}") from None
        for c in [clock_mhz, *(clocks_mhz or ())]:
            if c not in self.clocks_mhz:
                raise ValueError(f"clock {c} MHz not one of {self.clocks_mhz}")
        out: dict = {"active": list(act), "clock": self.clocks_mhz.index(clock_mhz)}
        if clocks_mhz is not None:
            if len(clocks_mhz) != len(self.placement):
                raise ValueError(f"action: clocks_mhz needs one clock per GPU ({len(self.placement)}), got {len(clocks_mhz)}")
            out["clocks"] = [self.clocks_mhz.index(c) for c in clocks_mhz]
        if shares is not None:
            out["shares"] = [float(x) for x in shares]
        if placement is not None:
            out["placement"] = [int(g) for g in placement]
        if migrate is not None:
            if migrate not in MIGRATE_MODES:
                raise ValueError(f"action: migrate must be one of {MIGRATE_MODES}, got {migrate!r}")
            out["migrate"] = MIGRATE_MODES.index(migrate)
        return out

    @staticmethod
    def from_env(env: Any, hindsight: bool = False) -> "ControllerContext":
        """Context of a `CommitServeEnv` (unwrapped automatically), with an `EnvProbe` on it. ``hindsight=True``
        also opens the hindsight door (`commitenv.hindsight.HindsightAccess`: the episode's true workload and
        ground-truth forks), for hindsight bounds only; call it after ``env.reset()``."""
        if not isinstance(hindsight, bool):
            raise ValueError(f"hindsight: expected True or False, got {hindsight!r}")
        e = env.unwrapped
        access = None
        if hindsight:
            from commitenv.hindsight import HindsightAccess

            access = HindsightAccess(e)
        sc = e.scenario
        return ControllerContext(
            scenario=sc.name,
            n_replicas=e.n_replicas,
            clocks_mhz=tuple(e.clocks_mhz),
            reference_clock_mhz=e.profile.reference_clock_mhz,
            interval_s=e.dt,
            intervals_per_hour=e.K,
            horizon_hours=e.H,
            commitments_j=tuple(float(x) for x in np.asarray(e.commit_j)),
            lambda_plus=sc.lambda_plus,
            lambda_minus=sc.lambda_minus,
            alpha=sc.alpha,
            epsilon=sc.epsilon,
            miss_penalty_kwh=sc.miss_penalty_kwh,
            gate=sc.objective.gate,
            n_gpus=sc.pool.gpus,
            actuation_delay_s=sc.actuation_delay_s,
            profile=e.profile.model_copy(deep=True),
            probe=EnvProbe(e),
            hindsight=access,
            **({"models": tuple(e.model_names), "replicas_per_model": tuple(e.replicas_per_model),
                "placement": tuple(tuple((i.model, float(i.share)) for i in g) for g in e.layout.gpus),
                "model_tenants": tuple(tuple(m.tenants) for m in sc.pool.models),
                "scale_to_zero": bool(e.scale_to_zero),
                "profiles": tuple(p.model_copy(deep=True) for p in e.profiles)} if e.shared else {}),
        )


class Controller(ABC):
    """Base class: subclasses implement `act`; `reset` stores the context; `close` and `stats` are optional."""

    name = "base"
    hindsight = False  # True only for hindsight bounds (the oracle): gets ctx.hindsight; refused by the leaderboard

    def reset(self, ctx: ControllerContext, seed: int | None = None) -> None:
        """Start an episode: the scenario's public terms and probe in ``ctx``; ``seed`` for the controller's own
        randomness (derived one way from the run seed)."""
        self.ctx = ctx
        self.seed = seed

    @abstractmethod
    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict[str, int]:
        """The configuration for the coming interval (see `ControllerContext.action`)."""

    def dispatch_policy(self) -> DispatchPolicy | None:
        """A policy the engine calls at every arrival to choose the request's replica (`commitenv.sim.dispatch`),
        installed after `reset`; None (the default) keeps the scenario's router."""
        return None

    def local_policy(self) -> LocalPolicy | None:
        """A policy the engine calls whenever a replica can start a step, to choose the step's tasks and the GPU
        clock (`commitenv.sim.local`), installed on every replica after `reset`; None (the default) keeps vLLM's
        scheduler."""
        return None

    def close(self) -> None:
        """Release what the controller holds (worker processes, files) at the end of an episode."""

    def stats(self) -> dict[str, float]:
        """Numbers about the controller's own work (e.g. planning time) to record in summary.json."""
        return {}
