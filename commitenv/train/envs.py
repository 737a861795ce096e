"""The environments a learner trains and is evaluated on: the scenario's env behind the algorithm's action wrapper,
reset with run seeds from one of the scenario's declared ranges (a new trace per episode), under SB3's ``Monitor``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from commitenv.scenarios.schema import Scenario

log = logging.getLogger("commitenv.train")

__all__ = ["SeedRanges", "SeedSchedule", "make_env", "seed_ranges"]

DEFAULT_TRAIN = (0, 100_000)
DEFAULT_TEST = (100_000, 100_100)


@dataclass(frozen=True)
class SeedRanges:
    """Half-open run-seed ranges [lo, hi) for training and testing, and where they come from (``scenario``: its
    ``seeds`` field; ``default``: the bench scenarios' ranges, for a scenario that declares none)."""

    train: tuple[int, int]
    test: tuple[int, int]
    source: str

    def eval_seeds(self, n: int) -> list[int]:
        """The last ``n`` seeds of the test range: evaluation during training picks the best model on them, so the
        first seeds (``--seeds test:N``, what reports use) stay unseen by model selection."""
        lo, hi = self.test
        if not 0 <= n <= hi - lo:
            raise ValueError(f"--eval-episodes {n}: the test range [{lo}, {hi}) holds {hi - lo} seeds")
        return list(range(hi - n, hi))


def seed_ranges(sc: Scenario) -> SeedRanges:
    """The scenario's declared seed ranges, else the defaults (logged)."""
    if sc.seeds is not None:
        return SeedRanges(tuple(sc.seeds.train), tuple(sc.seeds.test), "scenario")  # type: ignore[arg-type]
    log.info("scenario %s declares no seed ranges: training on [%d, %d), evaluating on [%d, %d)", sc.name,
             *DEFAULT_TRAIN, *DEFAULT_TEST)
    return SeedRanges(DEFAULT_TRAIN, DEFAULT_TEST, "default")


class SeedSchedule(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Reset with the run seeds ``first, first + stride, ...`` of [lo, hi) (wrapping around), one per episode, so each
    episode serves a new trace drawn from that range (``seeds_used`` lists them). With ``honor_given`` a seed passed
    to ``reset`` is used as given and the schedule continues after it (evaluation restarts its list this way);
    otherwise it is ignored, so nothing outside the range (e.g. an algorithm's own seed) can reach the env."""

    def __init__(self, env: gym.Env, lo: int, hi: int, first: int, stride: int = 1, honor_given: bool = False) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, lo=lo, hi=hi, first=first, stride=stride,
                                                 honor_given=honor_given)
        gym.Wrapper.__init__(self, env)
        if not lo <= first < hi or stride < 1:
            raise ValueError(f"seed schedule: expected lo <= first < hi and stride >= 1, got [{lo}, {hi}), first "
                             f"{first}, stride {stride}")
        self.lo, self.hi, self.stride, self.honor_given = int(lo), int(hi), int(stride), bool(honor_given)
        self._next = int(first)
        self.seeds_used: list[int] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        s = int(seed) if seed is not None and self.honor_given else self._next
        return self._reset_with(s, options)

    def _reset_with(self, s: int, options: dict[str, Any] | None = None):
        self._next = self.lo + (s - self.lo + self.stride) % (self.hi - self.lo)
        self.seeds_used.append(s)
        return self.env.reset(seed=s, options=options)

    @property
    def current_seed(self) -> int | None:
        """The seed of the episode under way (None before the first reset)."""
        return self.seeds_used[-1] if self.seeds_used else None

    def replay(self, seed: int, actions: list[Any]) -> Any:
        """Rebuild an episode under way (resuming a run): reset with ``seed`` (the schedule continues after it) and
        take ``actions``; returns the observation after the last. ValueError when the episode ends before them."""
        if not self.lo <= int(seed) < self.hi:
            raise ValueError(f"replay: seed {seed} is outside the schedule's range [{self.lo}, {self.hi})")
        obs, _ = self._reset_with(int(seed))
        for i, a in enumerate(actions):
            obs, _, terminated, truncated, _ = self.env.step(a)
            if (terminated or truncated) and i < len(actions) - 1:
                raise ValueError(f"replay: the episode of seed {seed} ended after {i + 1} of {len(actions)} actions")
        return obs


def make_env(scenario: str | Scenario, mapping: str, lo: int, hi: int, first: int, stride: int = 1,
             honor_given: bool = False, monitor: bool = True, multiplier: float | None = None) -> gym.Env:
    """One env for a learner: `CommitServeEnv` -> `LagrangianReward` at ``multiplier`` (None: the scenario's miss
    penalty; the learner's reward is the cost plus the priced misses) -> the action wrapper ``mapping`` -> ``Monitor`` -> `SeedSchedule`
    (a module-level function, so that SubprocVecEnv can send it to its workers)."""
    from commitenv.envs.commit_serve import CommitServeEnv
    from commitenv.envs.lagrangian import LagrangianReward
    from commitenv.envs.wrappers import ACTION_WRAPPERS

    env: gym.Env = ACTION_WRAPPERS[mapping](LagrangianReward(CommitServeEnv(scenario), multiplier))
    if monitor:
        from stable_baselines3.common.monitor import Monitor

        env = Monitor(env)
    return SeedSchedule(env, lo, hi, first, stride, honor_given)  # outermost: its replay goes through Monitor
