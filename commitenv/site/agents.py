"""`SitePoolsEnv`: a site's pools as agents (a PettingZoo ``ParallelEnv``; needs the ``agents`` extra).

Each pool is an agent: it observes its pool's 16 features followed by the site's 5 (``SITE_FEATURES``: the site
meter's hour against the site commitment, which every pool settles on), acts with its pool's action, and is rewarded
by its Shapley share of the step's site reward (`commitenv.site.shares`): the agents' rewards sum to the site's
reward at every step, so the team's return is the site's. ``infos[agent]`` is the pool's info with its constraint
signal ``cost`` (its misses that became known in the step) and the site's under ``"site"``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from commitenv.site.env import SITE_HIGH, SITE_LOW, SiteEnv
from commitenv.site.loader import Site

try:
    from pettingzoo import ParallelEnv
except ImportError as e:  # pragma: no cover - the message says what to install
    raise ImportError("commitenv.site.agents needs PettingZoo: pip install 'commitenv[agents]'") from e


class SitePoolsEnv(ParallelEnv):
    """The pools of a site as agents (see the module docstring)."""

    metadata = {"name": "commitenv_site_pools_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, site: str | Site = "site-4pool-day") -> None:
        self.render_mode = None  # (nothing to render)
        self.site_env = SiteEnv(site, pool_rewards=True)
        self.possible_agents = list(self.site_env.names)
        self.agents: list[str] = []
        self._obs_spaces = {}
        for n, e in self.site_env.envs.items():
            box = e.observation_space
            self._obs_spaces[n] = spaces.Box(np.concatenate([box.low, SITE_LOW]), np.concatenate([box.high, SITE_HIGH]),
                                             dtype=np.float32)
        self._act_spaces = {n: e.action_space for n, e in self.site_env.envs.items()}

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self._act_spaces[agent]

    def _split(self, obs: dict[str, Any], info: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
        site_x = obs["site"]
        o = {n: np.concatenate([obs["pools"][n], site_x]).astype(np.float32) for n in self.possible_agents}
        i = {n: {**info["pools"][n], "site": info["site"]} for n in self.possible_agents}
        return o, i

    def reset(self, seed: int | None = None, options: dict | None = None):
        obs, info = self.site_env.reset(seed=seed, options=options)
        self.agents = list(self.possible_agents)
        return self._split(obs, info)

    def step(self, actions: dict[str, Any]):
        if not self.agents:
            raise RuntimeError("step() called with no live agents; call reset()")
        unknown = sorted(str(a) for a in actions if a not in self.possible_agents)
        if unknown:
            raise ValueError(f"actions: unknown agent(s) {unknown}; the agents are {self.possible_agents}")
        env = self.site_env
        if env.routers:  # (the pools are the agents; a route under control: action keeps its file's split)
            actions = {**actions, "routes": {r.name: np.zeros(len(r.pools), np.float32) for r in env.routers}}
        obs, _, terminated, truncated, info = env.step(actions)
        o, i = self._split(obs, info)
        rewards = {n: float(r) for n, r in info["site"]["pool_reward"].items()}
        terms = {n: bool(terminated) for n in self.agents}
        truncs = {n: bool(truncated) for n in self.agents}
        if terminated or truncated:
            self.agents = []
        return o, rewards, terms, truncs, i

    def close(self) -> None:
        self.site_env.close()
