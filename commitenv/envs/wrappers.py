"""Wrappers: flat action spaces for learners that cannot take ``Dict`` actions (stable-baselines3).

The env's action is ``{"active": 1..N, "clock": level index}``. Each learner family needs another space:

=========================  ==================================  ==============================================
wrapper                    space                               mapping (``codec.decode``)
=========================  ==================================  ==============================================
`FlatActionWrapper`        ``MultiDiscrete([N, levels])``      active = a0 + 1, clock = a1 (PPO, A2C)
`BoxActionWrapper`         ``Box(-1, 1, (2,), float32)``       active = 1 + round((u0 + 1) / 2 x (N - 1)),
                                                               clock = round((u1 + 1) / 2 x (levels - 1))
                                                               (SAC; round half up, so deterministic)
`DiscreteActionWrapper`    ``Discrete(N x levels)``            active = 1 + k // levels, clock = k % levels
                                                               (DQN)
=========================  ==================================  ==============================================

The mapping lives in one place, an `ActionCodec` per wrapper (``wrapper.codec``), with its inverse
``codec.encode(active, clock)``: training (the wrapper) and a trained policy run as a controller
(`commitenv_controllers.sb3_policy`) use the same object, so they cannot disagree.

A shared pool's ``Dict`` action also holds SM shares and placement, whose per-GPU sums (SMs, memory) a uniformly
drawn action almost never respects, so the env refuses most random actions. `SharedFlatActionWrapper` exposes the
part every draw of which is valid, ``MultiDiscrete([n_1, ..., n_M, levels x G])``: each model's active count
(a_m + 1) and each GPU's clock level; shares and placement stay as configured.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["ACTION_WRAPPERS", "ActionCodec", "BoxActionWrapper", "BoxCodec", "DiscreteActionWrapper", "DiscreteCodec",
           "FlatActionWrapper", "FlatCodec", "SharedFlatActionWrapper", "codec_for"]


def _shown(v: Any) -> str:
    """A flat-action element as the user wrote it, with its type (``40.5 (float64)``, ``True (bool)``)."""
    plain = v.item() if isinstance(v, np.generic) else v
    kind = v.dtype.name if isinstance(v, np.generic) else type(v).__name__
    return f"{plain!r} ({kind})"


# ================================================================================================ codecs
class ActionCodec(ABC):
    """A learner's action space and its two-way mapping to the env's ``Dict`` action, for a pool of ``n`` replicas
    (``active`` in ``start..start + n - 1``) and ``levels`` clock levels; ``clocks_mhz`` only words the errors."""

    kind: ClassVar[str]

    def __init__(self, n: int, levels: int, start: int = 1, clocks_mhz: Sequence[int] | None = None) -> None:
        if n < 1 or levels < 1:
            raise ValueError(f"{type(self).__name__}: expected at least 1 replica and 1 clock level, got {n}, {levels}")
        self.n, self.levels, self.start = int(n), int(levels), int(start)
        self.clocks_mhz = tuple(int(c) for c in clocks_mhz) if clocks_mhz is not None else None
        self.space = self._space()

    @classmethod
    def of_space(cls, space: gym.Space, clocks_mhz: Sequence[int] | None = None) -> "ActionCodec":
        """The codec of an env action space ``Dict(active: Discrete(N, start), clock: Discrete(levels))``."""
        if not isinstance(space, spaces.Dict) or set(space.spaces) != {"active", "clock"}:
            raise TypeError(f"{cls.__name__} expects a Dict(active, clock) action space, got {space}")
        return cls(int(space["active"].n), int(space["clock"].n), int(space["active"].start), clocks_mhz)

    @abstractmethod
    def _space(self) -> gym.Space: ...

    @abstractmethod
    def decode(self, action: Any) -> dict[str, int]:
        """The env action ``{"active", "clock"}`` of a learner's action (checked; ValueError when it is not one)."""

    @abstractmethod
    def encode(self, active: int, clock: int) -> Any:
        """The learner's action that `decode` maps to ``(active, clock)``: ``decode(encode(a, c)) == {a, c}``."""

    def _check_config(self, active: int, clock: int) -> tuple[int, int]:
        a, c = int(active), int(clock)
        if not self.start <= a < self.start + self.n or not 0 <= c < self.levels:
            raise ValueError(f"{type(self).__name__}.encode: expected active in "
                             f"{self.start}..{self.start + self.n - 1} "
                             f"and clock index in 0..{self.levels - 1}, got ({active}, {clock})")
        return a, c

    def same_shape(self, other: "ActionCodec") -> bool:
        """Whether ``other`` is the same mapping for the same pool shape (what a trained policy checks)."""
        return (type(self), self.n, self.levels, self.start) == (type(other), other.n, other.levels, other.start)


class FlatCodec(ActionCodec):
    """``MultiDiscrete([N, levels])``: component 0 is the active index (active = a0 + start), component 1 the clock
    index. Integers only, as Gymnasium's ``MultiDiscrete`` holds; floats (even whole), NaN, inf and bools raise
    ``ValueError`` naming the element, its meaning and the value as given; an index out of range is reported as
    given (not shifted to a replica count) with its valid range."""

    kind = "flat"

    def _space(self) -> gym.Space:
        return spaces.MultiDiscrete([self.n, self.levels])

    def decode(self, action: Any) -> dict[str, int]:
        if isinstance(action, np.ndarray) and action.size == 2:
            values = list(action.reshape(-1))
        elif isinstance(action, (list, tuple)) and len(action) == 2:
            values = list(action)
        else:
            raise ValueError(f"flat action: expected 2 integers [active index, clock index], got {action!r}")
        note = f" (levels {self.clocks_mhz} MHz)" if self.clocks_mhz is not None else ""
        meaning = (
            ("active index", self.n, f" (active = index + {self.start}: {self.start}..{self.start + self.n - 1}"
                                     " replicas)"),
            ("clock index", self.levels, note),
        )
        out = []
        for i, (v, (what, n, extra)) in enumerate(zip(values, meaning)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"flat action[{i}] ({what}): expected an integer in 0..{n - 1}, got {_shown(v)}; "
                                 "pass integers (e.g. an int64 array, as MultiDiscrete holds)")
            if not 0 <= v < n:
                raise ValueError(f"flat action[{i}] ({what}): expected 0..{n - 1}{extra}, got {int(v)}")
            out.append(int(v))
        return {"active": out[0] + self.start, "clock": out[1]}

    def encode(self, active: int, clock: int) -> np.ndarray:
        a, c = self._check_config(active, clock)
        return np.array([a - self.start, c], dtype=np.int64)


class BoxCodec(ActionCodec):
    """``Box(-1, 1, (2,), float32)`` for continuous-action learners (SAC): each component is spread evenly over its
    grid and rounded to the nearest point (half up: deterministic), active = start + round((u0 + 1) / 2 x (N - 1)),
    clock = round((u1 + 1) / 2 x (levels - 1)); the end points -1 and 1 are the smallest and largest setting, and the
    grid points ``encode`` returns decode exactly. Values within 1e-6 outside [-1, 1] count as the bound; NaN, inf
    and anything further out raise ``ValueError``."""

    kind = "box"
    TOLERANCE = 1e-6

    def _space(self) -> gym.Space:
        return spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)

    @staticmethod
    def _index(u: float, size: int) -> int:
        if size == 1:
            return 0
        return min(max(math.floor((u + 1.0) / 2.0 * (size - 1) + 0.5), 0), size - 1)

    def decode(self, action: Any) -> dict[str, int]:
        try:
            u = np.asarray(action, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise ValueError(f"box action: expected 2 numbers in [-1, 1], got {action!r}") from None
        if u.size != 2:
            raise ValueError(f"box action: expected 2 numbers in [-1, 1] (active, clock), got {action!r}")
        for i, (v, what) in enumerate(zip(u, ("active", "clock"))):
            if not (math.isfinite(v) and -1.0 - self.TOLERANCE <= v <= 1.0 + self.TOLERANCE):
                raise ValueError(f"box action[{i}] ({what}): expected a number in [-1, 1], got {v!r}")
        return {"active": self.start + self._index(float(u[0]), self.n), "clock": self._index(float(u[1]), self.levels)}

    def encode(self, active: int, clock: int) -> np.ndarray:
        a, c = self._check_config(active, clock)
        grid = [0.0 if size == 1 else 2.0 * i / (size - 1) - 1.0
                for i, size in ((a - self.start, self.n), (c, self.levels))]
        return np.array(grid, dtype=np.float32)


class DiscreteCodec(ActionCodec):
    """``Discrete(N x levels)`` for learners with one discrete action (DQN): action k is active = start + k // levels,
    clock = k % levels (every (active, clock) pair once; 160 actions for 32 replicas x 5 clocks)."""

    kind = "discrete"

    def _space(self) -> gym.Space:
        return spaces.Discrete(self.n * self.levels)

    def decode(self, action: Any) -> dict[str, int]:
        arr = np.asarray(action)
        if arr.size != 1 or arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"discrete action: expected one integer in 0..{self.n * self.levels - 1}, got {action!r}")
        k = int(arr.reshape(-1)[0])
        if not 0 <= k < self.n * self.levels:
            raise ValueError(f"discrete action: expected 0..{self.n * self.levels - 1} ({self.n} replica counts x "
                             f"{self.levels} clock levels), got {k}")
        i, c = divmod(k, self.levels)
        return {"active": self.start + i, "clock": c}

    def encode(self, active: int, clock: int) -> int:
        a, c = self._check_config(active, clock)
        return (a - self.start) * self.levels + c


CODECS: dict[str, type[ActionCodec]] = {c.kind: c for c in (FlatCodec, BoxCodec, DiscreteCodec)}


def codec_for(kind: str, n: int, levels: int, start: int = 1, clocks_mhz: Sequence[int] | None = None) -> ActionCodec:
    """The codec ``kind`` (``flat``, ``box`` or ``discrete``) for a pool of ``n`` replicas and ``levels`` clocks."""
    if kind not in CODECS:
        raise ValueError(f"action mapping '{kind}': expected one of {', '.join(CODECS)}")
    return CODECS[kind](n, levels, start, clocks_mhz)


# ================================================================================================ wrappers
class _CodecWrapper(gym.ActionWrapper, gym.utils.RecordConstructorArgs):
    """An action wrapper whose mapping is ``self.codec`` (see the module docstring); the observation is unchanged.
    Its constructor arguments are recorded, so that an env made by ``gym.make`` keeps a spec that rebuilds it
    (Gymnasium's ``check_env`` requires that)."""

    codec_class: ClassVar[type[ActionCodec]]

    def __init__(self, env: gym.Env) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.ActionWrapper.__init__(self, env)
        act = env.action_space
        if not isinstance(act, spaces.Dict) or set(act.spaces) != {"active", "clock"}:
            raise TypeError(f"{type(self).__name__} expects a Dict(active, clock) action space, got {act}")
        self.codec = self.codec_class.of_space(act, getattr(env.unwrapped, "clocks_mhz", None))
        self.action_space = self.codec.space

    def action(self, action: Any) -> dict[str, int]:
        """The ``Dict`` action of a learner's action (``codec.decode``), checked."""
        return self.codec.decode(action)

    def reverse_action(self, action: dict[str, int]) -> Any:
        """The learner's action of an env action (``codec.encode``)."""
        return self.codec.encode(action["active"], action["clock"])


class FlatActionWrapper(_CodecWrapper):
    """Expose the ``Dict`` action (active in 1..N, clock index) as ``MultiDiscrete([N, levels])`` (`FlatCodec`).

    Component 0 maps to ``active = a0 + 1`` and component 1 is the clock index, so every flat action is a
    valid configuration. The observation is already a flat ``Box``.

    An action is two integers, like a member of Gymnasium's ``MultiDiscrete`` (which holds int64 arrays and
    refuses float dtypes): an integer numpy array of size 2 (what stable-baselines3's ``predict`` and rollouts
    pass: int64, shape ``(2,)``) or a list/tuple of two ints. Floats (even whole ones such as ``3.0``), NaN,
    inf and bools raise ``ValueError`` naming the element, its meaning and the value as given; an index out of
    range is reported as given (not shifted to a replica count) with its valid range.
    """

    codec_class = FlatCodec


class BoxActionWrapper(_CodecWrapper):
    """Expose the ``Dict`` action as ``Box(-1, 1, (2,))`` for continuous-action learners such as SAC (`BoxCodec`:
    each component rounded to the nearest point of its evenly spread grid of replica counts / clock levels)."""

    codec_class = BoxCodec


class DiscreteActionWrapper(_CodecWrapper):
    """Expose the ``Dict`` action as ``Discrete(N x levels)``, one action per (active, clock) pair, for DQN
    (`DiscreteCodec`)."""

    codec_class = DiscreteCodec


ACTION_WRAPPERS: dict[str, type[_CodecWrapper]] = {
    "flat": FlatActionWrapper, "box": BoxActionWrapper, "discrete": DiscreteActionWrapper,
}


class SharedFlatActionWrapper(gym.ActionWrapper, gym.utils.RecordConstructorArgs):
    """A shared pool's action as ``MultiDiscrete([n_1, ..., n_M] + [levels] * G)``: model m's active count is
    a_m + 1, GPU g's clock level a_{M+g}; SM shares and placement are left as configured, so every draw of the
    space is a valid action (the module docstring says why the full ``Dict`` is not)."""

    def __init__(self, env: gym.Env) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)  # (so that gym.make can rebuild it from the env's spec)
        gym.ActionWrapper.__init__(self, env)
        act = env.action_space
        if not isinstance(act, spaces.Dict) or not {"active", "clocks"} <= set(act.spaces):
            raise TypeError(f"{type(self).__name__} expects a shared pool's Dict action (active per model, clocks "
                            f"per GPU), got {act}")
        self.n_models = len(act["active"].nvec)
        self.n_gpus = len(act["clocks"].nvec)
        self.action_space = spaces.MultiDiscrete(list(act["active"].nvec) + list(act["clocks"].nvec))

    def action(self, action: Any) -> dict[str, Any]:
        """The env's ``Dict`` action of a flat one (integers in range, as ``MultiDiscrete`` holds them)."""
        a = np.asarray(action)
        if a.shape != self.action_space.shape or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{type(self).__name__}: expected {self.action_space.shape[0]} integers, got {action!r}")
        bad = np.flatnonzero((a < 0) | (a >= self.action_space.nvec))
        if len(bad):
            i = int(bad[0])
            raise ValueError(f"{type(self).__name__}: element {i} is {int(a[i])}, expected 0..{self.action_space.nvec[i] - 1}")
        active = [int(x) + 1 for x in a[: self.n_models]]
        clocks = [int(x) for x in a[self.n_models:]]
        return {"active": np.asarray(active, dtype=np.int64), "clock": clocks[0],
                "clocks": np.asarray(clocks, dtype=np.int64)}

    def reverse_action(self, action: dict[str, Any]) -> np.ndarray:
        """The flat action of an env action (its per-GPU clocks, or its one clock on every GPU)."""
        clocks = action.get("clocks", [action["clock"]] * self.n_gpus)
        return np.asarray([int(x) - 1 for x in action["active"]] + [int(x) for x in clocks], dtype=np.int64)

