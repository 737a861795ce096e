"""Wrappers: a flat action space for learners that cannot take ``Dict`` actions (stable-baselines3)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


def _shown(v: Any) -> str:
    """A flat-action element as the user wrote it, with its type (``40.5 (float64)``, ``True (bool)``)."""
    plain = v.item() if isinstance(v, np.generic) else v
    kind = v.dtype.name if isinstance(v, np.generic) else type(v).__name__
    return f"{plain!r} ({kind})"


class FlatActionWrapper(gym.ActionWrapper):
    """Expose the ``Dict`` action (active in 1..N, clock index) as ``MultiDiscrete([N, levels])``.

    Component 0 maps to ``active = a0 + 1`` and component 1 is the clock index, so every flat action is a
    valid configuration. The observation is already a flat ``Box``.

    An action is two integers, like a member of Gymnasium's ``MultiDiscrete`` (which holds int64 arrays and
    refuses float dtypes): an integer numpy array of size 2 (what stable-baselines3's ``predict`` and rollouts
    pass: int64, shape ``(2,)``) or a list/tuple of two ints. Floats (even whole ones such as ``3.0``), NaN,
    inf and bools raise ``ValueError`` naming the element, its meaning and the value as given; an index out of
    range is reported as given (not shifted to a replica count) with its valid range.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        act = env.action_space
        if not isinstance(act, spaces.Dict) or set(act.spaces) != {"active", "clock"}:
            raise TypeError(f"FlatActionWrapper expects a Dict(active, clock) action space, got {act}")
        self._n = int(act["active"].n)
        self._start = int(act["active"].start)
        self._levels = int(act["clock"].n)
        clocks = getattr(env.unwrapped, "clocks_mhz", None)
        self._clock_note = f" (levels {tuple(int(c) for c in clocks)} MHz)" if clocks is not None else ""
        self.action_space = spaces.MultiDiscrete([self._n, self._levels])

    def action(self, action: Any) -> dict[str, int]:
        """The ``Dict`` action of a flat ``[active index, clock index]``, checked element by element."""
        if isinstance(action, np.ndarray) and action.size == 2:
            values = list(action.reshape(-1))
        elif isinstance(action, (list, tuple)) and len(action) == 2:
            values = list(action)
        else:
            raise ValueError(f"flat action: expected 2 integers [active index, clock index], got {action!r}")
        meaning = (
            ("active index", self._n, f" (active = index + {self._start}: {self._start}..{self._start + self._n - 1}"
                                      " replicas)"),
            ("clock index", self._levels, self._clock_note),
        )
        out = []
        for i, (v, (what, n, note)) in enumerate(zip(values, meaning)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"flat action[{i}] ({what}): expected an integer in 0..{n - 1}, got {_shown(v)}; "
                                 "pass integers (e.g. an int64 array, as MultiDiscrete holds)")
            if not 0 <= v < n:
                raise ValueError(f"flat action[{i}] ({what}): expected 0..{n - 1}{note}, got {int(v)}")
            out.append(int(v))
        return {"active": out[0] + self._start, "clock": out[1]}
