"""A group of a site's pools with their controllers, stepped one interval at a time: in this process, or as a Ray
actor holding its pools (`commitenv.site.runner`). Each boundary it reports per pool only what the site needs (its
meters, its own commitment, its new misses: `PoolReport`), so a driver of many actors holds per-interval aggregates,
never a pool's requests."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from commitenv.control import Controller
from commitenv.envs import CommitServeEnv
from commitenv.envs.observation import OBS_FEATURES, OBS_HIGH, OBS_LOW, energy_features
from commitenv.evaluation import start_controller
from commitenv.planning import PlanningClock
from commitenv.settlement import remaining_per_interval
from commitenv.site.loader import Site
from commitenv.workload import RequestTable

_OVERDUE = OBS_FEATURES.index("overdue_frac")


@dataclass(frozen=True)
class PoolReport:
    """One pool at an interval boundary: its settlement meter (cumulative J), the hour so far on its controller's
    meter (J), its own commitment for the hour (J), the hour and interval, the misses that became known in the
    step, and the energy it drew after the last hour (J; 0 until the end)."""

    settlement_meter_j: float
    hour_energy_j: float
    commitment_j: float
    hour: int
    interval: int
    new_misses: int
    tail_energy_j: float = 0.0
    miss_fraction: float = 0.0  # known misses / arrivals so far of the current arrival hour
    epsilon: float = 0.0  # the pool scenario's miss tolerance
    overdue_frac: float = 0.0  # live requests past their visible deadline / live requests (observation feature 12)
    arrived: int = 0  # requests arrived so far in the episode


GUARD = 0.5  # the guarded coordinator stops cutting a pool once its hour's known miss fraction reaches GUARD x epsilon


def at_risk(r: PoolReport, guard: float = GUARD) -> bool:
    """A pool the guarded coordinator keeps on its own budget: its current hour's known miss fraction has reached
    ``guard`` (default ``GUARD``) x its epsilon, or a live request is past its visible deadline (an early sign of misses to come: a miss
    is known only when its deadline passes unfinished)."""
    return r.miss_fraction >= guard * r.epsilon or r.overdue_frac > 0


def pool_seed(run_seed: int, index: int) -> int:
    """The run seed of the site's ``index``-th pool, derived one way from the site's run seed (31 bits)."""
    st = np.random.SeedSequence([int(run_seed), 0x706C, int(index)]).generate_state(1, dtype=np.uint32)
    return int(st[0]) & 0x7FFF_FFFF


def route_seed(run_seed: int, route: str) -> int:
    """The workload seed of route ``route`` in the episode of site run seed ``run_seed`` (the same for every pool of
    the route, derived one way from both, so each pool draws the route's one workload and keeps its share)."""
    key = int.from_bytes(hashlib.sha256(route.encode()).digest()[:8], "little")
    st = np.random.SeedSequence([int(run_seed), 0x7274, key]).generate_state(1, dtype=np.uint32)
    return int(st[0]) & 0x7FFF_FFFF


def pool_reset(site: Site, run_seed: int, index: int, *, streamed: bool = False) -> dict[str, Any]:
    """The ``reset`` arguments of the site's ``index``-th pool in the episode of site run seed ``run_seed``: its own
    derived seed and, for a routed pool, its route's workload seed (`route_seed`); ``streamed``: the pool starts empty
    and its router hands it its requests interval by interval (`SiteEnv` with a route under ``control: action``)."""
    seed = pool_seed(run_seed, index)
    route = site.pools[index].route
    if route is None:
        return {"seed": seed}
    return {"seed": seed, "options": {"workload_seed": route_seed(run_seed, route), "stream": bool(streamed)}}


def _report(env: CommitServeEnv, info: dict[str, Any], obs: np.ndarray) -> PoolReport:
    h = int(info["hour"])
    return PoolReport(float(env.settlement_meter_j), float(info["hour_energy_j"]), float(info["commitment_j"]), h,
                      int(info["interval"]), int(info["new_misses"]), float(env.tail_energy_j),
                      float(info["miss_fraction_by_hour"][h]), float(env.scenario.epsilon), float(obs[_OVERDUE]),
                      int(env.pool.arrived))


class PoolGroup:
    """Pools ``indices`` of ``site``, each run by its own instance of its controller (``specs[j]``, a registered
    name or spec, for pool ``indices[j]``)."""

    def __init__(self, site: Site, indices: list[int], specs: list[str], controller_kwargs: dict[str, Any] | None = None,
                 charge_planning: bool = True) -> None:
        from commitenv.registry import resolve

        self.site, self.indices = site, list(indices)
        self.names = [site.pools[i].name for i in self.indices]
        self.envs = [CommitServeEnv(site.pools[i].scenario) for i in self.indices]
        resolved = {s: resolve(s) for s in set(specs)}
        self.specs = [resolved[s] for s in specs]
        self.controller_kwargs = dict(controller_kwargs or {})
        self.charge_planning = charge_planning
        self.ctrls: list[Controller] = []
        self.hindsight = [False] * len(self.envs)  # a pool's controller uses the hindsight door: its run is marked

    def reset(self, seed: int, streamed: list[str] | None = None) -> list[PoolReport]:
        """Start the episode of site run seed ``seed``: every pool on its derived seed, its controller reset; the pools
        named in ``streamed`` start empty, fed by their router (`step`'s ``rows``)."""
        self.seed = seed
        self.obs, self.infos, self.ctrls = [], [], []
        self.returns = [0.0] * len(self.envs)
        for j, (i, e, spec) in enumerate(zip(self.indices, self.envs, self.specs)):
            o, info = e.reset(**pool_reset(self.site, seed, i, streamed=self.names[j] in (streamed or ())))
            c = spec.make(**self.controller_kwargs)
            if not isinstance(c, Controller):
                raise TypeError(f"controller: expected a commitenv.control.Controller, got {type(c).__name__}")
            self.hindsight[j] = start_controller(c, e, pool_seed(seed, i))
            self.obs.append(o)
            self.infos.append(info)
            self.ctrls.append(c)
        return [_report(e, i, o) for e, i, o in zip(self.envs, self.infos, self.obs)]

    def step(self, budgets: list[float] | None = None, rows: dict[str, RequestTable] | None = None) -> list[PoolReport]:
        """One interval of every pool: ``rows`` (by pool name) join their pools first (a router's share of the
        coming interval); its controller decides (seeing ``budgets[j]`` as the hour's commitment when given, with the
        matching target), the runner charges the decision's measured time, the pool steps."""
        for n, r in (rows or {}).items():
            self.envs[self.names.index(n)].extend_workload(r)
        clock = PlanningClock()
        for j, (e, c) in enumerate(zip(self.envs, self.ctrls)):
            info, obs = self.infos[j], self.obs[j]
            if budgets is not None:  # the budget replaces the pool's commitment wherever the controller reads it
                # (in the observation a budget <= 0, the site already over, reads as the energy-only regime: every
                # joule is overuse)
                k, used, b = int(info["interval"]), float(info["hour_energy_j"]), float(budgets[j])
                info = {**info, "commitment_j": b, "target_j": remaining_per_interval(b, used, k, e.K)}
                obs = obs.copy()
                obs[2:6] = np.clip(energy_features(b, used, float(info["interval_energy_j"]), k, e.K, e._e_scale),
                                   OBS_LOW[2:6], OBS_HIGH[2:6])
            if self.charge_planning and e.charges_planning:
                with clock:
                    action = c.act(obs, info)
                e.charge_planning(clock.seconds)
            else:
                action = c.act(obs, info)
            self.obs[j], r, _, _, self.infos[j] = e.step(action)
            self.returns[j] += r
        return [_report(e, i, o) for e, i, o in zip(self.envs, self.infos, self.obs)]

    def usage(self) -> dict[str, float]:
        """This process's CPU time (s) and peak resident memory (MB) so far: a shard's cost on its machine."""
        import resource
        import time

        return {"cpu_s": time.process_time(), "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}

    def summaries(self, wall_s: float) -> dict[str, dict[str, Any]]:
        """Every pool's summary (`commitenv.evaluation.score_episode`, on its own commitment as if it settled
        alone), once the episode has ended; the controllers are closed."""
        from commitenv.evaluation import score_episode
        from commitenv.registry import controller_name

        out = {}
        for j, (n, e, c) in enumerate(zip(self.names, self.envs, self.ctrls)):
            c.close()
            out[n] = score_episode(e, controller_name(c), pool_seed(self.seed, self.indices[j]), wall_s,
                                   self.returns[j]).summary
            if self.hindsight[j]:
                out[n]["hindsight"] = True  # a bound, not a competitor (as run_episode marks it)
        return out
