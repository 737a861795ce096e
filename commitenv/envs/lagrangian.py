"""`LagrangianReward`: the constrained objective (cost subject to the SLO gate) as one penalised reward for learners
that take a scalar reward, as PPO-Lagrangian does (Ray et al. 2019, "Benchmarking Safe Exploration in Deep RL";
Safety-Gymnasium's ``cost`` in ``info``).

Each step's reward becomes ``reward - multiplier x info["cost"]`` (the env's reward is minus the settlement-cost
increment and ``info["cost"]`` the deadline misses that became known in the step). At a fixed multiplier equal to
the scenario's ``miss_penalty_kwh`` this is exactly the return the env paid before the constraint was split off.
With ``adaptive=True`` the multiplier is a dual variable: after each episode it moves by gradient ascent on the
measured violation, multiplier <- max(0, multiplier + lr x (worst arrival hour's miss fraction - limit)), with the
scenario's epsilon as the default limit, so a policy that keeps the gate sees its multiplier fall and one that
breaks it sees it rise."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym

__all__ = ["LagrangianReward"]


def _number(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"LagrangianReward: {name} must be a finite number >= 0, got {v!r}")
    return float(v)


class LagrangianReward(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """reward - multiplier x info["cost"]; ``multiplier`` None takes the scenario's ``miss_penalty_kwh`` (kWh-eq per
    miss); ``adaptive`` updates it after every episode from the violation of ``limit`` (None: the scenario's
    epsilon) at rate ``lr`` (kWh-eq per miss per unit of miss fraction). ``info["lagrange_multiplier"]`` reports it."""

    def __init__(self, env: gym.Env, multiplier: float | None = None, *, adaptive: bool = False, lr: float = 1.0,
                 limit: float | None = None) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, multiplier=multiplier, adaptive=adaptive, lr=lr, limit=limit)
        gym.Wrapper.__init__(self, env)
        sc = getattr(env.unwrapped, "scenario", None)
        if multiplier is None:
            if sc is None:
                raise ValueError("LagrangianReward: multiplier=None takes the scenario's miss_penalty_kwh; this env "
                                 "has no scenario: give the multiplier")
            multiplier = sc.miss_penalty_kwh
        self.multiplier = _number("multiplier", multiplier)
        if not isinstance(adaptive, bool):
            raise ValueError(f"LagrangianReward: adaptive must be True or False, got {adaptive!r}")
        self.adaptive = adaptive
        self.lr = _number("lr", lr)
        if limit is None:
            limit = sc.epsilon if sc is not None else 0.0
        self.limit = _number("limit", limit)
        if self.limit > 1:
            raise ValueError(f"LagrangianReward: limit is a miss fraction in [0, 1], got {limit!r}")
        self._fractions: list[float] = []

    def set_multiplier(self, value: float) -> None:
        """Set the multiplier (a trainer's dual update shared by its vectorised workers)."""
        self.multiplier = _number("multiplier", value)

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if "cost" not in info:
            raise ValueError("LagrangianReward: the env's info has no 'cost' (the constraint signal)")
        info = dict(info)
        info["lagrange_multiplier"] = self.multiplier
        penalised = float(reward) - self.multiplier * float(info["cost"])
        self._fractions = list(info.get("miss_fraction_by_hour") or [])
        if (terminated or truncated) and self.adaptive:
            violation = max(self._fractions, default=0.0) - self.limit
            self.multiplier = max(0.0, self.multiplier + self.lr * violation)
        return obs, penalised, terminated, truncated, info
