"""`PoolModelsEnv`: the models of a shared-GPU pool as agents (a PettingZoo ``ParallelEnv``; needs the ``agents``
extra).

Each model is an agent. It observes the pool's 16 features followed by three of its own (its active instances over
its instances, its clock request over the highest level, log1p of its live requests / 10) and acts with
``{"active": its instance count, "clock": a level index}``. A GPU runs at the highest clock requested by the models
it hosts (a model cannot slow a co-located one below its request; a GPU hosting nothing runs at the lowest level);
SM shares and placement stay as configured. Each agent is rewarded by its Shapley share of the step's pool reward
(`commitenv.site.shares`), the players' worths being the models' energies so far in the hour on the settlement meter:
each model's busy energy (StepSplit's shares of its steps, `commitenv.attribution.PoolAttributor`, summed over its
tenants) plus a part of the idle floor in proportion to its active instances (it holds them; all models equally when
none has one). Every joule goes to some model, so the agents' rewards sum to the pool's reward at every step.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from gymnasium import spaces

from commitenv.envs.commit_serve import CommitServeEnv
from commitenv.scenarios.schema import Scenario
from commitenv.site.shares import RunningShares

try:
    from pettingzoo import ParallelEnv
except ImportError as e:  # pragma: no cover - the message says what to install
    raise ImportError("commitenv.envs.model_agents needs PettingZoo: pip install 'commitenv[agents]'") from e

MODEL_FEATURES = ("own_active", "own_clock", "own_live")


class PoolModelsEnv(ParallelEnv):
    """The models of a shared pool as agents (see the module docstring)."""

    metadata = {"name": "commitenv_pool_models_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, scenario: str | Scenario = "festina-h100-shared") -> None:
        self.render_mode = None  # (nothing to render)
        self.env = CommitServeEnv(scenario, attribution=True)
        env = self.env
        if not env.shared:
            raise ValueError(f"PoolModelsEnv: scenario {env.scenario.name} serves one model; models as agents need a "
                             "shared pool (pool.models)")
        self.possible_agents = list(env.model_names)
        self.agents: list[str] = []
        low = 0 if env.scale_to_zero else 1
        levels = len(env.clocks_mhz)
        self._act = {m: spaces.Dict({"active": spaces.Discrete(n - low + 1, start=low), "clock": spaces.Discrete(levels)})
                     for m, n in zip(self.possible_agents, env.replicas_per_model)}
        box = env.observation_space
        self._obs = {m: spaces.Box(np.concatenate([box.low, [0, 0, 0]]).astype(np.float32),
                                   np.concatenate([box.high, [1, 1, 2]]).astype(np.float32), dtype=np.float32)
                     for m in self.possible_agents}
        model_of_instance = [i.model for g in env.layout.gpus for i in g]
        self._instance_model = np.array(model_of_instance, dtype=np.int64)
        tenant_model = {t: m for m, spec in enumerate(env.scenario.pool.models) for t in spec.tenants}
        self._tenant_model = tenant_model

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self._act[agent]

    # ------------------------------------------------------------------------------------------ episode
    def reset(self, seed: int | None = None, options: dict | None = None):
        """Reset the pool (of ``options``, only ``workload_seed`` reaches it; PettingZoo passes others freely)."""
        pool_opts = {k: v for k, v in (options or {}).items() if k == "workload_seed"}
        obs, info = self.env.reset(seed=seed, options=pool_opts or None)
        self.agents = list(self.possible_agents)
        self._clock_req = [self.env._init_clock] * len(self.possible_agents)
        self.shares = RunningShares(tuple(self.possible_agents), self.env.lp, self.env.lm, seed=self.env.run_seed)
        self._hour_j = np.zeros(len(self.possible_agents))
        return self._split(obs, info)

    def _pool_action(self, actions: dict[str, Any]) -> dict[str, Any]:
        env = self.env
        unknown = sorted(str(a) for a in actions if a not in self._act)
        missing = [m for m in self.possible_agents if m not in actions]
        if unknown or missing:
            raise ValueError(f"actions: expected one for each agent {self.possible_agents}"
                             + (f"; unknown agent(s): {unknown}" if unknown else "")
                             + (f"; missing: {missing}" if missing else ""))
        active, req = [], []
        for m in self.possible_agents:
            a = actions[m]
            if not isinstance(a, dict) or set(a) != {"active", "clock"}:
                raise ValueError(f"actions['{m}']: expected a dict with keys 'active' and 'clock', got {a!r}")
            for key in ("active", "clock"):
                v, sp = a[key], self._act[m][key]
                if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) \
                        or not sp.start <= v < sp.start + sp.n:
                    raise ValueError(f"actions['{m}']['{key}']: expected an integer in {sp.start}..{sp.start + sp.n - 1}, "
                                     f"got {v!r}")
            active.append(int(a["active"]))
            req.append(int(a["clock"]))
        gpu_of = np.asarray(env.shared_cfg.gpus)
        clocks = np.zeros(env.n_gpus, dtype=np.int64)
        for inst, g in enumerate(gpu_of):
            clocks[g] = max(clocks[g], req[self._instance_model[inst]])
        self._clock_req = req
        return {"active": np.array(active, dtype=np.int64), "clock": int(clocks.max()), "clocks": clocks}

    def step(self, actions: dict[str, Any]):
        if not self.agents:
            raise RuntimeError("step() called with no live agents; call reset()")
        pool_action = self._pool_action(actions)
        hour = self.env.k // self.env.K  # the hour the stepped interval belongs to
        obs, reward, terminated, truncated, info = self.env.step(pool_action)
        attr = info["attribution"]
        self._hour_j += self._model_energy(attr["interval"])
        change = self.shares.update(self._hour_j, float(self.env.commit_j[hour]))
        if "settlement" in info:
            self.shares.close_hour()
            self.closed_hour_j = self._hour_j.copy()  # each model's energy of the hour just settled (J)
            self._hour_j[:] = 0.0
        if terminated:
            change = change + self.shares.tail(self._model_energy(attr["tail"]))
        rewards = dict(zip(self.possible_agents, (-change).tolist()))
        o, i = self._split(obs, info)
        for m in self.possible_agents:
            i[m]["team_reward"] = float(reward)
        terms = {m: bool(terminated) for m in self.agents}
        truncs = {m: bool(truncated) for m in self.agents}
        if terminated or truncated:
            self.agents = []
        return o, rewards, terms, truncs, i

    # ------------------------------------------------------------------------------------------ views
    def _model_energy(self, period: dict[str, Any]) -> np.ndarray:
        """Each model's energy of an attribution period on the settlement meter (J): its tenants' busy energy plus
        its part of the idle floor (by active instances)."""
        f = self.env._settle_factor
        n = len(self.possible_agents)
        busy = np.zeros(n)
        for tenant, j in period["tenant_j"].items():
            busy[self._tenant_model[tenant]] += j
        active = np.asarray(self.env.shared_cfg.active, dtype=np.float64)
        w = active / active.sum() if active.sum() > 0 else np.full(n, 1.0 / n)
        return f * (busy + w * float(period["idle_j"]))

    def _split(self, obs: np.ndarray, info: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
        env = self.env
        slots, _ = env.pool.live_state()
        live = np.bincount(env.pool.model_of[slots - env.pool._slot_base], minlength=len(self.possible_agents)) \
            if len(slots) else np.zeros(len(self.possible_agents), dtype=np.int64)
        top = max(len(env.clocks_mhz) - 1, 1)
        o, i = {}, {}
        for m, name in enumerate(self.possible_agents):
            own = np.array([env.shared_cfg.active[m] / env.replicas_per_model[m], self._clock_req[m] / top,
                            min(math.log1p(int(live[m])) / 10, 2.0)], dtype=np.float32)
            o[name] = np.concatenate([obs, own]).astype(np.float32)
            i[name] = info
        return o, i

    def close(self) -> None:
        self.env.close()
