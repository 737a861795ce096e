"""Defects found while checking the benchmark (issue: a sound benchmark), each with the behaviour it must have."""

from __future__ import annotations

import gymnasium as gym
import pytest

from commitenv.envs import CommitServeEnv
from helpers.scenarios import HOUR_SCENARIO


def test_render_before_reset_says_reset_is_needed():
    env = CommitServeEnv(HOUR_SCENARIO, render_mode="rgb_array")
    with pytest.raises(gym.error.ResetNeeded, match="before reset"):
        env.render()  # was: AttributeError on a missing history


@pytest.mark.parametrize("extra", [{"sm_share": 0.5}, {"Active": 3}, {0: 1}])
def test_extra_action_keys_are_refused_by_name(extra):
    env = CommitServeEnv(HOUR_SCENARIO)
    env.reset(seed=0)
    action = {"active": 32, "clock": 3, **extra}
    with pytest.raises(ValueError, match=f"unknown key\\(s\\) {list(extra)[0]}"):
        env.step(action)
    assert env.k == 0  # nothing moved: the same step can be taken with a valid action
    env.step({"active": 32, "clock": 3})
    assert env.k == 1
