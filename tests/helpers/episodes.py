"""Episode loops and hand-computed costs for the env-level tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def run_episode(env, policy: Callable[[int], Any], seed: int = 0) -> tuple[list, list, list]:
    """Run one episode; ``policy(k) -> action``. Returns (rewards, infos, observations)."""
    obs, info = env.reset(seed=seed)
    rewards, infos, observations = [], [info], [obs]
    terminated = False
    k = 0
    while not terminated:
        obs, r, terminated, truncated, info = env.step(policy(k))
        assert truncated is False
        rewards.append(r)
        infos.append(info)
        observations.append(obs)
        k += 1
    return rewards, infos, observations


def hand_cost_kwh(e_j: float, c_j: float, lp: float, lm: float) -> float:
    """C = lp [E - E*]+ + lm [E* - E]+ with E, E* converted from J to kWh."""
    e, c = e_j / 3.6e6, c_j / 3.6e6
    return lp * max(e - c, 0.0) + lm * max(c - e, 0.0)


def varied_policy(k: int) -> dict[str, int]:
    """Changes the configuration across intervals and hours."""
    return {"active": 1 + (k // 2) % 2, "clock": (k // 3) % 2}
