"""`SiteEnv`: one step = one decision interval of every pool of a site (`commitenv.site.loader.Site`), settled
together on the site meter.

Each pool is a `commitenv.envs.CommitServeEnv` (the one engine), stepped in lockstep; the site adds the meter, the
settlement and the reward. Action: ``Dict`` {pool name: that pool's action}, plus ``"routes"`` ({route: a weight per
pool}, `commitenv.site.router`) when a route's split is under ``control: action``. Observation: ``Dict`` with ``"site"``
(``SITE_FEATURES``, the site meter's hour against the site's commitment, scaled as the pools' features are) and
``"pools"`` ({pool name: that pool's 16 features}). Reward: minus the change of the open hour's site settlement cost,
and at the end minus the tail (the energy all pools drew after the last hour) at lambda_plus, so that an episode's
return is minus the site's settlement cost up to ``reward_offset_kwh`` (as for one pool). The site meter is the sum
of the pools' settlement meters; the pools' own commitments are not settled (``info["pools"][name]["settlement"]``
says what each would have cost alone).

``info["site"]`` holds the site's ``t``, ``hour``, ``interval``, ``commitment_j``, ``hour_energy_j`` (the pools'
controller meters summed), ``cost`` (the constraint signal: misses that became known in the step, all pools),
``misses`` and, when an hour closes, ``settlement`` (the site's bill) with ``pool_cost_share_kwh_eq`` (each pool's
Shapley share of the hour's cost above C(0), `commitenv.site.shares`) and ``pool_cost_share_se_kwh_eq`` (None:
exact). With ``pool_rewards=True`` every step's ``info["site"]["pool_reward"]`` holds each pool's part of the step's
reward (they sum to it): the agents' rewards of `commitenv.site.agents`.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from commitenv.envs import CommitServeEnv
from commitenv.envs.actions import check_action, check_shared_action
from commitenv.envs.observation import energy_features
from commitenv.settlement import HourlySettlement, remaining_per_interval
from commitenv.site.loader import Site, load_site
from commitenv.site.meter import SiteMeter
from commitenv.site.pools import pool_reset, route_seed
from commitenv.site.router import Router

SITE_FEATURES = ("time_in_hour", "hour_of_horizon", "commitment", "hour_energy", "target")
_R = 20.0
SITE_LOW = np.array([0, 0, 0, 0, -_R], dtype=np.float32)
SITE_HIGH = np.array([1, 1, _R, _R, _R], dtype=np.float32)


class SiteEnv(gym.Env):
    """Gymnasium environment over a site's pools; see the module docstring for spaces, reward and ``info``."""

    metadata = {"render_modes": []}

    def __init__(self, site: str | Site = "site-4pool-day", pool_rewards: bool = False) -> None:
        self.site = site if isinstance(site, Site) else load_site(site)
        st = self.site
        self.names = st.pool_names
        self.envs = {p.name: CommitServeEnv(p.scenario) for p in st.pools}
        self.H, self.K, self.dt = st.horizon_hours, st.intervals_per_hour, st.interval_s
        self.commit_j = st.commit_j
        self.lp, self.lm = st.lambda_plus, st.lambda_minus
        self.pool_rewards = bool(pool_rewards)
        # routes under control: action: their routers, and the pools they feed (which take requests as they come)
        self.routers = [Router(r) for r in st.spec.routes if r.control == "action"]
        self._streamed = {p for r in self.routers for p in r.pools}
        act = {n: e.action_space for n, e in self.envs.items()}
        if self.routers:
            act["routes"] = spaces.Dict({r.name: r.space for r in self.routers})
        self.action_space = spaces.Dict(act)
        self.observation_space = spaces.Dict({
            "site": spaces.Box(SITE_LOW, SITE_HIGH, dtype=np.float32),
            "pools": spaces.Dict({n: e.observation_space for n, e in self.envs.items()})})
        self._e_scale = math.fsum(e._e_scale for e in self.envs.values())  # the site's full-power hour, J
        self.reward_offset_kwh = HourlySettlement(self.commit_j, self.lp, self.lm, self.K).reward_offset_kwh
        self.k = -1

    # ------------------------------------------------------------------------------------------ episode
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.run_seed = int(seed) if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        obs, infos = {}, {}
        for i, (n, e) in enumerate(self.envs.items()):
            obs[n], infos[n] = e.reset(**pool_reset(self.site, self.run_seed, i, streamed=n in self._streamed))
        for r in self.routers:
            r.reset(self.envs[r.pools[0]].scenario, route_seed(self.run_seed, r.name))
        self.k = 0
        self.meter = SiteMeter(self.names, self.commit_j, self.lp, self.lm, self.K, seed=self.run_seed,
                               pool_rewards=self.pool_rewards)
        self.misses = 0
        self.pool_returns = dict.fromkeys(self.names, 0.0)
        return self._obs(obs), self._info(infos, new_misses=0)

    def _check(self, action: Any) -> list[np.ndarray]:
        """Every pool's action, checked before any pool steps (the site is unchanged when this raises); the routers'
        splits."""
        if not isinstance(action, Mapping):
            raise ValueError(f"action: expected a dict {{pool name: pool action}} with keys {list(self.names)}, "
                             f"got {type(action).__name__}")
        keys = list(self.names) + (["routes"] if self.routers else [])
        unknown = sorted(str(k) for k in action if k not in keys)
        missing = [n for n in keys if n not in action]
        if unknown or missing:
            raise ValueError(f"action: expected exactly the keys {keys}"
                             + (f"; unknown: {unknown}" if unknown else "") + (f"; missing: {missing}" if missing else ""))
        splits = []
        if self.routers:
            ra = action["routes"]
            names = [r.name for r in self.routers]
            if not isinstance(ra, Mapping) or sorted(ra) != sorted(names):
                raise ValueError(f"action['routes']: expected a dict {{route: weights}} with keys {names}, got "
                                 f"{sorted(ra) if isinstance(ra, Mapping) else type(ra).__name__}")
            splits = [r.split(ra[r.name]) for r in self.routers]
        for n, e in self.envs.items():
            try:
                if e.shared:
                    check_shared_action(e, action[n])
                else:
                    check_action(action[n], e.n_replicas, e.clocks_mhz)
            except ValueError as err:
                raise ValueError(f"action['{n}']: {err}") from None
        return splits

    def step(self, action: Any):
        if self.k < 0:
            raise RuntimeError("step() called before reset()")
        if self.k >= self.H * self.K:
            raise RuntimeError("step() called after the episode ended; call reset()")
        splits = self._check(action)
        for r, split in zip(self.routers, splits):  # the coming interval's arrivals, to the pools the split says
            for p, rows in r.hand_out(self.k, self.H * self.K, self.dt, split).items():
                self.envs[p].extend_workload(rows)
        obs, infos = {}, {}
        terminated = False
        for n, e in self.envs.items():
            obs[n], r_pool, terminated, _, infos[n] = e.step(action[n])
            self.pool_returns[n] += r_pool  # the pool's return had it settled alone
        booked = self.meter.record(np.array([e.settlement_meter_j for e in self.envs.values()]))
        self.k += 1
        reward = booked.reward
        new_misses = sum(int(i["new_misses"]) for i in infos.values())
        self.misses += new_misses
        info = self._info(infos, new_misses=new_misses, settlement=booked.settlement)
        pool_reward = booked.pool_reward
        if terminated:
            tail_cost, tail_shares = self.meter.finish(np.array([e.tail_energy_j for e in self.envs.values()]))
            reward -= tail_cost
            info["site"]["tail_energy_j"] = self.meter.tail_energy_j
            info["site"]["tail_cost_kwh_eq"] = tail_cost
            if pool_reward is not None:
                pool_reward = pool_reward - tail_shares
        if pool_reward is not None:
            info["site"]["pool_reward"] = dict(zip(self.names, pool_reward.tolist()))
        return self._obs(obs), float(reward), terminated, False, info

    # ------------------------------------------------------------------------------------------ views
    @property
    def hour_cost_kwh(self) -> np.ndarray:
        """The site's settlement cost of every closed hour (kWh-eq)."""
        return self.meter.settlement.cost_kwh

    @property
    def hour_energy_j(self) -> np.ndarray:
        """The site meter's energy of every closed hour (J)."""
        return self.meter.settlement.energy_j

    @property
    def tail_energy_j(self) -> float:
        """The energy all pools drew after the last hour (J; 0 until the episode ends)."""
        return self.meter.tail_energy_j

    @property
    def tail_cost_kwh(self) -> float:
        return self.meter.tail_cost_kwh

    def _hour_state(self) -> tuple[int, int, float, float]:
        k, K = self.k, self.K
        h = min(k // K, self.H - 1)
        meter = math.fsum(e.meter_prev - e.meter_hour_start for e in self.envs.values())  # controllers' meters
        return h, k - h * K, float(self.commit_j[h]), meter

    def _obs(self, pools: dict[str, np.ndarray]) -> dict[str, Any]:
        h, kin, ec, m = self._hour_state()
        commitment, hour_energy, _, target = energy_features(ec, m, 0.0, kin, self.K, self._e_scale)  # the pools' own
        x = np.array([kin / self.K, h / self.H, commitment, hour_energy, target], dtype=np.float32)
        return {"site": np.clip(x, SITE_LOW, SITE_HIGH), "pools": pools}

    def _info(self, pools: dict[str, dict], *, new_misses: int, settlement: dict | None = None) -> dict[str, Any]:
        h, kin, ec, m = self._hour_state()
        site: dict[str, Any] = {"t": self.k * self.dt, "hour": h, "interval": kin, "commitment_j": ec,
                                "hour_energy_j": m, "target_j": remaining_per_interval(ec, m, kin, self.K),
                                "cost": float(new_misses), "misses": self.misses,
                                "reward_offset_kwh": self.reward_offset_kwh}
        if settlement is not None:
            site["settlement"] = settlement
        return {"site": site, "pools": pools}

    def close(self) -> None:
        for e in self.envs.values():
            e.close()
        super().close()
