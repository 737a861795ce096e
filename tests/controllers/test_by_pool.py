"""`ByPool` (the learned leaderboard submissions' controller): the episode's pool picks the policy trained on it, and
acting through it is acting as that policy does; a pool no policy was trained on is refused at reset."""

from __future__ import annotations

import pytest

pytest.importorskip("stable_baselines3")

from commitenv.control import ControllerContext  # noqa: E402
from commitenv.envs import CommitServeEnv  # noqa: E402
from commitenv_controllers.by_pool import ByPool  # noqa: E402
from commitenv_controllers.sb3_policy import SB3Policy  # noqa: E402


@pytest.mark.parametrize("scenario, policy", [("bench-h200-hour-fixed-a30", "bc-mpc-h200-family"),
                                              ("bench-h20-hour-decreasing-a30", "bc-mpc-h20-family")])
def test_the_pool_picks_its_own_clone_and_acts_as_it(scenario, policy):
    ctrl, alone = ByPool(("bc-mpc-h200-family", "bc-mpc-h20-family")), SB3Policy(policy)
    env = CommitServeEnv(scenario)
    obs, info = env.reset(seed=100000)
    ctx = ControllerContext.from_env(env)
    ctrl.reset(ctx, 0)
    alone.reset(ctx, 0)
    assert ctrl.inner.path == alone.path
    for _ in range(5):
        a = ctrl.act(obs, info)
        assert a == alone.act(obs, info)
        obs, _, _, _, info = env.step(a)


def test_a_pool_without_a_policy_is_refused():
    env = CommitServeEnv("bench-h20-hour-fixed-a30")
    env.reset(seed=100000)
    with pytest.raises(ValueError, match="no policy trained on profile 'h20-qwen3.8-27b-fp8'"):
        ByPool(("bc-mpc-h200-family",)).reset(ControllerContext.from_env(env), 0)
