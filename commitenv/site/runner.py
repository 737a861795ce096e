"""Run a site episode with one controller per pool, each pool tracking its own commitment (``budget="own"``) or a
share of the site's (``budget="site"``: a coordinator reallocates the site's remaining commitment among the pools
at every interval), and summarise it: the site's bill, each pool's outcome and gate.

The coordinator (``budget="site"``). Only the site meter is settled, so a pool that is ahead of its own commitment
need not catch up while another is behind. Before every decision it gives each pool the hour's budget

    B_i = M_i + w_i (E*_site - M_site),   w_i = max(E*_i - M_i, 0) / sum_j max(E*_j - M_j, 0)

(M: the hour's energy so far on the controllers' meters, E*_i: the pool's own commitment, its forecast share of
the site's; equal weights when every pool is past its own): the site's remaining commitment split in proportion to
what each pool still planned to use. The pool's controller sees ``B_i`` as ``info["commitment_j"]`` (and the
matching ``target_j``); nothing else changes, and it sees nothing of the other pools but its budget.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from commitenv.control import Controller, ControllerContext
from commitenv.evaluation import score_episode
from commitenv.planning import PlanningClock
from commitenv.scenarios.build import derived_seed
from commitenv.scoring import gate_outcome
from commitenv.site.env import SiteEnv, pool_seed
from commitenv.site.loader import Site

BUDGETS = ("own", "site")


@dataclass
class SiteRun:
    """A finished site episode: the site's summary and every pool's (`commitenv.evaluation.score_episode`'s, on
    the pool's own commitment as if it settled alone)."""

    summary: dict[str, Any]
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)


def _budgets(env: SiteEnv, infos: dict[str, dict]) -> dict[str, float]:
    """Each pool's hour budget under the site coordinator (see the module docstring)."""
    names = env.names
    own = np.array([float(infos[n]["commitment_j"]) for n in names])
    used = np.array([float(infos[n]["hour_energy_j"]) for n in names])
    left = np.maximum(own - used, 0.0)
    w = left / left.sum() if left.sum() > 0 else np.full(len(names), 1.0 / len(names))
    _, _, site_commit, site_used = env._hour_state()
    site_left = site_commit - site_used
    return {n: float(used[i] + w[i] * site_left) for i, n in enumerate(names)}


def run_site_episode(site: str | Site, controller: str, seed: int = 0, *, budget: str = "own",
                     controller_kwargs: dict[str, Any] | None = None, charge_planning: bool = True,
                     progress: bool = False) -> tuple[SiteEnv, SiteRun]:
    """One site episode, ``controller`` (a registered name or spec) running each pool; see the module docstring."""
    from commitenv.registry import controller_name, resolve

    if budget not in BUDGETS:
        raise ValueError(f"budget: expected one of {BUDGETS}, got {budget!r}")
    env = SiteEnv(site)
    spec = resolve(controller)
    t0 = time.perf_counter()
    obs, info = env.reset(seed=seed)
    ctrls: dict[str, Controller] = {}
    for i, (n, e) in enumerate(env.envs.items()):
        c = spec.make(**(controller_kwargs or {}))
        if not isinstance(c, Controller):
            raise TypeError(f"controller: expected a commitenv.control.Controller, got {type(c).__name__}")
        c.reset(ControllerContext.from_env(e), derived_seed(pool_seed(seed, i), "controller"))
        if (p := c.dispatch_policy()) is not None:
            e.set_dispatch(p)
        if (p := c.local_policy()) is not None:
            e.set_local_policy(p)
        ctrls[n] = c
    name = controller_name(next(iter(ctrls.values())))
    clock = PlanningClock()
    ret, terminated = 0.0, False
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=env.H * env.K, unit="interval", desc=f"{env.site.name} / {name}", leave=False)
    try:
        while not terminated:
            pools_info = info["pools"]
            if budget == "site":
                for n, b in _budgets(env, pools_info).items():
                    pi = pools_info[n]
                    left = env.K - int(pi["interval"])
                    pools_info[n] = {**pi, "commitment_j": b,
                                     "target_j": (b - float(pi["hour_energy_j"])) / left if left > 0 else 0.0}
            action = {}
            for n, c in ctrls.items():
                e = env.envs[n]
                if charge_planning and e.charges_planning:
                    with clock:
                        action[n] = c.act(obs["pools"][n], pools_info[n])
                    e.charge_planning(clock.seconds)
                else:
                    action[n] = c.act(obs["pools"][n], pools_info[n])
            obs, r, terminated, _, info = env.step(action)
            ret += r
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        for c in ctrls.values():
            c.close()
    wall = time.perf_counter() - t0
    pools = {}
    for i, (n, e) in enumerate(env.envs.items()):
        pools[n] = score_episode(e, name, pool_seed(seed, i), wall, env.pool_returns[n]).summary
    cost_h = env.hour_cost_kwh
    summary = {
        "site": env.site.name, "controller": name, "budget": budget, "seed": seed,
        "cost_kwh_eq": float(math.fsum(cost_h.tolist()) + env.tail_cost_kwh),
        "hours_cost_kwh_eq": float(cost_h.sum()), "tail_cost_kwh_eq": env.tail_cost_kwh,
        "tail_energy_mj": env.tail_energy_j / 1e6,
        "energy_mj": float(env.hour_energy_j.sum() / 1e6),
        "commitment_mj": float(env.commit_j.sum() / 1e6),
        "mean_abs_dev_pct": float(np.mean(np.abs(env.hour_energy_j / env.commit_j - 1.0)) * 100.0),
        "pools_alone_cost_kwh_eq": float(sum(p["cost_kwh_eq"] for p in pools.values())),
        "misses": int(sum(p["misses"] for p in pools.values())),
        "requests": int(sum(p["requests"] for p in pools.values())),
        "episode_return": ret, "wall_s": wall,
        "hourly_cost_kwh_eq": cost_h.tolist(),
    }
    summary["attainment_pct"] = 100.0 * (1 - summary["misses"] / max(summary["requests"], 1))
    return env, SiteRun(summary, pools)


def site_gates(run: SiteRun, lower: SiteRun | None) -> dict[str, Any]:
    """The site's gate: every pool passes its own scenario's gate (a relative one against the pool's run in
    ``lower``, the vLLM site run of the same seed). Returns {pool: {passed, failed_hours, shortfall_pct}} and
    ``passed`` overall."""
    out: dict[str, Any] = {}
    for n, s in run.pools.items():
        g = gate_outcome(s, None if lower is None else lower.pools[n])
        out[n] = {"passed": g.passed, "failed_hours": list(g.failed_hours), "shortfall_pct": g.shortfall_pct}
    return {"passed": all(v["passed"] for v in out.values()), "pools": out}
