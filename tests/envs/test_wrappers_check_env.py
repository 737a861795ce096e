"""Gymnasium's ``check_env`` on every wrapper a learner trains through (`commitenv.envs.wrappers`, `LagrangianReward`,
the trainer's `SeedSchedule`), over envs made by ``gym.make`` from a shipped scenario: the wrappers record their
constructor arguments, so the wrapped env's spec rebuilds it."""

from __future__ import annotations

import inspect
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import commitenv  # noqa: F401  (registers the scenarios' env ids)
from commitenv.envs import wrappers
from commitenv.envs.lagrangian import LagrangianReward
from commitenv.train.envs import SeedSchedule

HOUR = "commitenv/bench-h200-hour-fixed-a30-v0"
SHARED = "commitenv/festina-h100-shared-v0"
CASES = {
    "FlatActionWrapper": (HOUR, lambda env: wrappers.FlatActionWrapper(env)),
    "BoxActionWrapper": (HOUR, lambda env: wrappers.BoxActionWrapper(env)),
    "DiscreteActionWrapper": (HOUR, lambda env: wrappers.DiscreteActionWrapper(env)),
    "SharedFlatActionWrapper": (SHARED, lambda env: wrappers.SharedFlatActionWrapper(env)),
    "LagrangianReward": (HOUR, lambda env: LagrangianReward(env, 0.02)),
    # (as evaluation uses it: training's schedule ignores a seed given to reset on purpose, which check_env refuses)
    "SeedSchedule": (HOUR, lambda env: SeedSchedule(wrappers.FlatActionWrapper(env), 0, 100, 5, stride=2,
                                                    honor_given=True)),
}


def test_every_wrapper_of_the_module_is_checked():
    public = {name for name, obj in inspect.getmembers(wrappers, inspect.isclass)
              if issubclass(obj, gym.Wrapper) and obj.__module__ == wrappers.__name__ and not name.startswith("_")}
    assert public <= set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_wrapper_passes_check_env_and_its_spec_rebuilds_it(name):
    env_id, wrap = CASES[name]
    env = wrap(gym.make(env_id))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (check_env's note that the env is wrapped)
        check_env(env, skip_render_check=True)
    spec = env.spec
    assert spec is not None and spec.additional_wrappers[-1].name == name
    rebuilt = gym.make(spec)
    assert type(rebuilt).__name__ == name and rebuilt.action_space == env.action_space
    env.close()
    rebuilt.close()
