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

A shared pool's ``Dict`` action (`commitenv.envs.actions.shared_action_space`) has no invalid points: its SM share
weights map onto each GPU's simplex and its GPU requests are granted as far as memory allows. Learners that take no
``Dict`` action (stable-baselines3) need it flat: `SharedFlatActionWrapper` makes it one ``MultiDiscrete`` of each
model's active count, each GPU's clock level, each instance's share weight on a grid (``share_levels``) and,
optionally, GPU requests and the migration mode; every draw is a legal action.
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
    """A shared pool's action as one ``MultiDiscrete`` whose every point is a legal action (PPO, A2C):

    ========================================  ==============================================================
    components (in this order)                env action (``action``)
    ========================================  ==============================================================
    ``n_m`` (+ 1) for each model m            ``active[m] = a + 1`` (``a`` where models scale to zero)
    ``levels`` for each GPU g                 ``clocks[g] = a`` (``clock`` = GPU 0's level)
    ``share_levels`` for each instance i      ``share_weights[i] = a / (share_levels - 1)`` (with ``shares``)
    ``G + 1`` for each instance i             ``gpu_request[i] = a``: 0 stays, g + 1 asks for GPU g (with
                                              ``placement``)
    ``len(MIGRATE_MODES)``                    ``migrate = a`` (with ``placement``)
    ========================================  ==============================================================

    The env maps the share weights onto each GPU's simplex of SM shares above the profiles' minimum shares and
    grants GPU requests only as far as memory allows (`commitenv.envs.actions.shares_from_weights`,
    `~commitenv.envs.actions.placement_from_request`, docs/env.md), so no draw is refused. ``shares=True`` (the
    default) exposes the SM split: with ``share_levels`` = 11, weights 0, 0.1, ..., 1 (all 0 on a GPU: an equal
    split). ``placement=True`` adds the moves (off by default: a move cold-starts the instance). ``shares=False``
    is the space of earlier versions (counts and clocks only; shares and placement stay as configured).

    Instances are numbered in the scenario's placement order (GPU by GPU), as in the env's ``info["shares"]``.
    """

    def __init__(self, env: gym.Env, shares: bool = True, share_levels: int = 11, placement: bool = False) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, shares=shares, share_levels=share_levels, placement=placement)
        gym.ActionWrapper.__init__(self, env)  # (the recorded arguments let gym.make rebuild it from the env's spec)
        for name, flag in (("shares", shares), ("placement", placement)):
            if not isinstance(flag, (bool, np.bool_)):
                raise ValueError(f"{type(self).__name__}: {name} must be True or False, got {flag!r}")
        if isinstance(share_levels, (bool, np.bool_)) or not isinstance(share_levels, (int, np.integer)) \
                or share_levels < 2:
            raise ValueError(f"{type(self).__name__}: share_levels must be an integer >= 2 (weights 0..1 in that many "
                             f"even steps), got {share_levels!r}")
        act = env.action_space
        need = {"active", "clocks"} | ({"share_weights"} if shares else set()) | ({"gpu_request"} if placement else set())
        if not isinstance(act, spaces.Dict) or not need <= set(act.spaces):
            raise TypeError(f"{type(self).__name__} expects a shared pool's Dict action (active per model, clocks "
                            f"per GPU, share_weights and gpu_request per instance), got {act}")
        self.shares, self.placement, self.share_levels = bool(shares), bool(placement), int(share_levels)
        self.n_models = len(act["active"].nvec)
        self.active_start = np.asarray(act["active"].start, dtype=np.int64)  # 1, or 0 where models scale to zero
        self.n_gpus = len(act["clocks"].nvec)
        self.n_replicas = int(act["share_weights"].shape[0]) if "share_weights" in act.spaces else 0
        nvec = list(act["active"].nvec) + list(act["clocks"].nvec)
        if self.shares:
            nvec += [self.share_levels] * self.n_replicas
        if self.placement:
            nvec += list(act["gpu_request"].nvec) + [int(act["migrate"].n)]
        self.action_space = spaces.MultiDiscrete(nvec)

    def _parts(self, a: np.ndarray) -> dict[str, np.ndarray]:
        m, g, n = self.n_models, self.n_gpus, self.n_replicas
        out = {"active": a[:m], "clocks": a[m:m + g]}
        i = m + g
        if self.shares:
            out["share_weights"], i = a[i:i + n], i + n
        if self.placement:
            out["gpu_request"], out["migrate"] = a[i:i + n], a[i + n:i + n + 1]
        return out

    def action(self, action: Any) -> dict[str, Any]:
        """The env's ``Dict`` action of a flat one (integers in range, as ``MultiDiscrete`` holds them)."""
        a = np.asarray(action)
        if a.shape != self.action_space.shape or a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{type(self).__name__}: expected {self.action_space.shape[0]} integers, got {action!r}")
        bad = np.flatnonzero((a < 0) | (a >= self.action_space.nvec))
        if len(bad):
            i = int(bad[0])
            raise ValueError(f"{type(self).__name__}: element {i} is {int(a[i])}, expected 0..{self.action_space.nvec[i] - 1}")
        p = self._parts(a)
        clocks = np.asarray(p["clocks"], dtype=np.int64)
        out: dict[str, Any] = {"active": np.asarray(p["active"], dtype=np.int64) + self.active_start,
                               "clock": int(clocks[0]),
                               "clocks": clocks}
        if self.shares:
            out["share_weights"] = np.asarray(p["share_weights"], dtype=np.float64) / (self.share_levels - 1)
        if self.placement:
            out["gpu_request"] = np.asarray(p["gpu_request"], dtype=np.int64)
            out["migrate"] = int(p["migrate"][0])
        return out

    def reverse_action(self, action: dict[str, Any]) -> np.ndarray:
        """The flat action of an env action: its per-GPU clocks (or its one clock on every GPU); its share weights
        on the nearest grid point, or, given exact ``shares``, weights proportional to each share's excess over its
        minimum on its GPU (what `shares_from_weights` maps back to those shares when they sum to 1 and the grid
        holds the ratios; the current shares when the action has none); its ``gpu_request``, or 0 / g + 1 for an
        exact ``placement`` (0 when absent); ``migrate`` (0 when absent)."""
        from commitenv.envs.actions import replica_terms

        clocks = action.get("clocks", [action["clock"]] * self.n_gpus)
        parts = [int(x) - 1 for x in action["active"]] + [int(x) for x in clocks]
        env = self.env.unwrapped
        current = list(env.shared_cfg.gpus) if getattr(env, "shared_cfg", None) is not None \
            else [g for g, insts in enumerate(env.layout.gpus) for _ in insts]
        top = self.share_levels - 1
        if self.shares:
            if "share_weights" in action:
                w = np.asarray(action["share_weights"], dtype=np.float64)
            else:
                exact = action.get("shares", env.shared_cfg.shares if getattr(env, "shared_cfg", None) is not None
                                   else [i.share for insts in env.layout.gpus for i in insts])
                gpus = action.get("placement", current)
                mins, _ = replica_terms(env)
                excess = np.maximum(np.asarray(exact, dtype=np.float64) - np.asarray(mins), 0.0)
                w = np.zeros(self.n_replicas)
                for g in set(int(x) for x in gpus):
                    on = [r for r, gg in enumerate(gpus) if int(gg) == g]
                    peak = max(excess[on])
                    if peak > 0:
                        w[on] = excess[on] / peak
            parts += [int(x) for x in np.floor(np.clip(w, 0.0, 1.0) * top + 0.5)]
        if self.placement:
            if "gpu_request" in action:
                parts += [int(x) for x in action["gpu_request"]]
            elif "placement" in action:
                parts += [0 if int(g) == c else int(g) + 1 for g, c in zip(action["placement"], current)]
            else:
                parts += [0] * self.n_replicas
            parts.append(int(np.asarray(action.get("migrate", 0)).item()))
        return np.asarray(parts, dtype=np.int64)
