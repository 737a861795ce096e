"""A policy shared by a site's pools (parameter sharing), trained with stable-baselines3 PPO on the pools as agents
(SuperSuit turns the PettingZoo env into a vectorised env whose entries are the agents), and its evaluation on site
episodes with the summaries and gates of `commitenv.site.runner`. Needs the ``rl`` and ``agents`` extras.

Training reward: each pool's Shapley share of the step's site reward (`commitenv.site.agents`) minus its own
constraint signal (the misses that became known in the step) at the pool scenario's ``miss_penalty_kwh``, the
Lagrangian of the one-pool env at its fixed multiplier. Training episodes use site run seeds drawn from
``TRAIN_SEEDS`` by the training seed's generator; evaluation uses any others (0, 1, ... by default).

    python -m commitenv.site.learn train --site site-4pool-hour --steps 100000 --out runs/site-ppo
    commitenv site site-4pool-hour --controllers epact_plus,shared:runs/site-ppo --seeds 0-4
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from commitenv.planning import PlanningClock
from commitenv.site.agents import SitePoolsEnv
from commitenv.site.loader import Site, load_site
from commitenv.site.pools import pool_seed
from commitenv.site.runner import SiteRun, site_summary

try:
    from pettingzoo.utils import BaseParallelWrapper
except ImportError as e:  # pragma: no cover - the message says what to install
    raise ImportError("commitenv.site.learn needs PettingZoo and SuperSuit: pip install 'commitenv[rl,agents]'") from e

TRAIN_SEEDS = (1_000_000, 2_000_000)
META = "site-policy.json"


class FlatPoolActions(BaseParallelWrapper):
    """The pools' ``{"active", "clock"}`` actions as ``MultiDiscrete([active levels, clock levels])`` (SB3 has no
    Dict actions), rewards less ``miss_penalty_kwh`` x the agent's new misses when ``penalise`` (training), and
    every reset without a seed on a seed drawn from ``TRAIN_SEEDS`` by a generator seeded with ``seed``."""

    def __init__(self, env: SitePoolsEnv, *, seed: int = 0, penalise: bool = True) -> None:
        super().__init__(env)
        self.render_mode = None
        self._rng = np.random.default_rng(seed)
        self.penalise = penalise
        self._start = {a: env.action_space(a)["active"].start for a in env.possible_agents}
        self._spaces = {a: spaces.MultiDiscrete([env.action_space(a)["active"].n, env.action_space(a)["clock"].n])
                        for a in env.possible_agents}
        self._penalty = {n: float(e.scenario.miss_penalty_kwh) for n, e in env.site_env.envs.items()}

    def action_space(self, agent: str) -> spaces.Space:
        return self._spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is None:
            seed = int(self._rng.integers(*TRAIN_SEEDS))
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: dict[str, Any]):
        acts = {a: {"active": int(v[0]) + self._start[a], "clock": int(v[1])} for a, v in actions.items()}
        obs, rew, term, trunc, info = self.env.step(acts)
        if self.penalise:
            rew = {a: r - self._penalty[a] * float(info[a]["cost"]) for a, r in rew.items()}
        return obs, rew, term, trunc, info


def make_vec_env(site: str | Site, seed: int = 0):
    """The SB3 vectorised env of the site's pools (one entry per pool; their spaces must be alike)."""
    import supersuit as ss

    env = FlatPoolActions(SitePoolsEnv(site), seed=seed)
    vec = ss.pettingzoo_env_to_vec_env_v1(env)
    return ss.concat_vec_envs_v1(vec, 1, num_cpus=0, base_class="stable_baselines3")


def train(site: str, *, steps: int, seed: int, out: str | Path, **ppo: Any) -> Path:
    """Train the shared policy for ``steps`` agent steps; writes ``model.zip`` and `META` into ``out``."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.utils import set_random_seed

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    set_random_seed(seed)  # (SuperSuit's vectorised env has no seed() for SB3's own seeding)
    vec = make_vec_env(site, seed)
    kw = {"n_steps": 240, "batch_size": 240, "n_epochs": 5, "learning_rate": 3e-4, "gamma": 0.99, "ent_coef": 0.01,
          **ppo}
    model = PPO("MlpPolicy", vec, verbose=0, **kw)
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    model.save(out / "model.zip")
    (out / META).write_text(json.dumps({"site": str(site), "steps": steps, "seed": seed, "algo": "ppo",
                                        "ppo": kw, "train_seeds": TRAIN_SEEDS,
                                        "wall_s": round(time.perf_counter() - t0, 1)}, indent=1))
    return out


def evaluate(site: str | Site, model_dir: str | Path, seed: int) -> SiteRun:
    """One site episode with the shared policy acting for every pool (deterministic), each pool charged the
    measured time of its own decision where its scenario measures planning time."""
    from stable_baselines3 import PPO

    from commitenv.evaluation import score_episode

    model = PPO.load(Path(model_dir) / "model.zip", device="cpu")
    st = site if isinstance(site, Site) else load_site(site)
    env = FlatPoolActions(SitePoolsEnv(st), penalise=False)
    site_env = env.env.site_env
    t0 = time.perf_counter()
    obs, _ = env.reset(seed=seed)
    clock = PlanningClock()
    ret = 0.0
    while env.agents:
        acts = {}
        for a in env.agents:
            pool = site_env.envs[a]
            with clock:
                acts[a], _ = model.predict(obs[a], deterministic=True)
            if pool.charges_planning:
                pool.charge_planning(clock.seconds)
        obs, rew, _, _, _ = env.step(acts)
        ret += sum(rew.values())
    wall = time.perf_counter() - t0
    pools = {n: score_episode(e, f"shared:{Path(model_dir).name}", pool_seed(seed, i), wall,
                              site_env.pool_returns[n]).summary
             for i, (n, e) in enumerate(site_env.envs.items())}
    summary = site_summary(st, site_env.meter, pools, controller=f"shared:{model_dir}", budget="-", seed=seed,
                           episode_return=ret, wall_s=wall, shards=1, usage=[])
    return SiteRun(summary, pools, [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m commitenv.site.learn", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train the shared PPO policy of a site's pools")
    t.add_argument("--site", default="site-4pool-hour")
    t.add_argument("--steps", type=int, default=100_000, help="agent steps (a site step is one per pool)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.steps < 1:
        raise SystemExit("--steps: expected an integer >= 1")
    out = train(args.site, steps=args.steps, seed=args.seed, out=args.out)
    print(json.loads((out / META).read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
