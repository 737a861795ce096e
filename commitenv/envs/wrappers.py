"""Wrappers: a flat action space for learners that cannot take ``Dict`` actions (stable-baselines3)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class FlatActionWrapper(gym.ActionWrapper):
    """Expose the ``Dict`` action (active in 1..N, clock index) as ``MultiDiscrete([N, levels])``.

    Component 0 maps to ``active = a0 + 1`` and component 1 is the clock index, so every flat action is a
    valid configuration. The observation is already a flat ``Box``.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        act = env.action_space
        if not isinstance(act, spaces.Dict) or set(act.spaces) != {"active", "clock"}:
            raise TypeError(f"FlatActionWrapper expects a Dict(active, clock) action space, got {act}")
        self._n = int(act["active"].n)
        self._start = int(act["active"].start)
        self._levels = int(act["clock"].n)
        self.action_space = spaces.MultiDiscrete([self._n, self._levels])

    def action(self, action: Any) -> dict[str, int]:
        a = np.asarray(action).reshape(-1)
        if a.shape != (2,):
            raise ValueError(f"flat action: expected 2 integers [active index, clock index], got {action!r}")
        return {"active": int(a[0]) + self._start, "clock": int(a[1])}
