"""Action checks: `FlatActionWrapper` takes integer flat actions only (as Gymnasium's MultiDiscrete holds and
stable-baselines3 passes) and reports bad ones as given; `ControllerContext.action` checks the replica count."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from commitenv.envs import CommitServeEnv, FlatActionWrapper
from commitenv_controllers import ControllerContext
from helpers.scenarios import HOUR_SCENARIO

N, CLOCKS = 32, (345, 690, 1035, 1380, 1710)  # the shipped H200 hour scenario's pool


class PoolStub(gym.Env):
    """The env's action interface alone (Dict active 1..N, clock index), so the wrapper is tested in isolation."""

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Dict({"active": spaces.Discrete(N, start=1), "clock": spaces.Discrete(len(CLOCKS))})
    clocks_mhz = list(CLOCKS)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action)
        return np.zeros(4, np.float32), 0.0, False, False, {"active": action["active"]}


@pytest.fixture
def flat():
    return FlatActionWrapper(PoolStub())


# ------------------------------------------------------------------------------------------ FlatActionWrapper
def test_flat_space_is_the_pool(flat):
    assert flat.action_space.nvec.tolist() == [N, len(CLOCKS)]


@pytest.mark.parametrize("action", [
    np.array([7, 3], dtype=np.int64), np.array([7, 3], dtype=np.int32), np.array([7, 3], dtype=np.uint8),
    np.array([[7, 3]]), [7, 3], (np.int64(7), 3),
])
def test_flat_accepts_integers(flat, action):
    out = flat.action(action)
    assert out == {"active": 8, "clock": 3}
    assert type(out["active"]) is int and type(out["clock"]) is int


@pytest.mark.parametrize("action, index, meaning, shown", [
    (np.array([3.5, 1]), 0, "active index", "3.5 (float64)"),
    (np.array([np.nan, 1]), 0, "active index", "nan (float64)"),
    ([5, float("inf")], 1, "clock index", "inf (float)"),
    ([5, -np.inf], 1, "clock index", "-inf (float)"),
    ([True, 1], 0, "active index", "True (bool)"),
    (np.array([4, 1], dtype=bool), 0, "active index", "True (bool)"),
    (np.array([31.0, 0.0]), 0, "active index", "31.0 (float64)"),  # whole floats too: MultiDiscrete is integer
    ([2, 1.0], 1, "clock index", "1.0 (float)"),
    (["3", 1], 0, "active index", "'3' (str)"),
])
def test_flat_rejects_non_integers_naming_element_meaning_and_value(flat, action, index, meaning, shown):
    with pytest.raises(ValueError) as e:
        flat.action(action)
    upper = N - 1 if index == 0 else len(CLOCKS) - 1
    assert str(e.value).startswith(f"flat action[{index}] ({meaning}): expected an integer in 0..{upper}, got {shown}")


def test_flat_out_of_range_is_reported_as_given(flat):
    with pytest.raises(ValueError) as e:
        flat.action(np.array([40, 0]))
    msg = str(e.value)
    assert msg == f"flat action[0] (active index): expected 0..{N - 1} (active = index + 1: 1..{N} replicas), got 40"
    assert "41" not in msg
    with pytest.raises(ValueError, match=rf"^flat action\[0\] \(active index\): expected 0\.\.{N - 1} .*, got -1$"):
        flat.action([-1, 0])
    with pytest.raises(ValueError) as e:
        flat.action([0, len(CLOCKS)])
    assert str(e.value) == f"flat action[1] (clock index): expected 0..4 (levels {CLOCKS} MHz), got 5"


def test_flat_rejects_bad_shapes(flat):
    for bad in (np.array([1, 2, 3]), [1], 5, {"active": 1, "clock": 0}):
        with pytest.raises(ValueError, match=r"flat action: expected 2 integers \[active index, clock index\]"):
            flat.action(bad)


def test_flat_step_refuses_a_float_before_the_env_moves():
    env = FlatActionWrapper(CommitServeEnv(HOUR_SCENARIO))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"flat action\[0\]"):
        env.step(np.array([np.nan, 0.0]))
    _, _, _, _, info = env.step(np.array([N - 1, 4]))  # the env still takes a valid action afterwards
    assert info["active"] == N and info["clock_mhz"] == CLOCKS[4]
    env.close()


def test_flat_takes_what_stable_baselines3_predicts(flat):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", flat, n_steps=64, batch_size=64, seed=0, device="cpu")
    obs, _ = flat.reset(seed=0)
    for deterministic in (True, False):
        a, _ = model.predict(obs, deterministic=deterministic)
        assert np.issubdtype(a.dtype, np.integer) and a.shape == (2,)
        assert flat.action(a) == {"active": int(a[0]) + 1, "clock": int(a[1])}


# ------------------------------------------------------------------------------------------ ControllerContext
def context(n: int = N) -> ControllerContext:
    return ControllerContext(scenario="s", n_replicas=n, clocks_mhz=CLOCKS, reference_clock_mhz=1710,
                             interval_s=60.0, intervals_per_hour=60, horizon_hours=1, commitments_j=(1.0,),
                             lambda_plus=2.0, lambda_minus=1.0, alpha=3.0, epsilon=0.0, actuation_delay_s=0.0)


@pytest.mark.parametrize("active", [0, -3, N + 1, 40, np.int64(N + 1)])
def test_context_rejects_active_outside_the_pool(active):
    with pytest.raises(ValueError) as e:
        context().action(active, 1380)
    assert str(e.value) == f"action: active must be in 1..{N} (the pool's replicas), got {int(active)}"


@pytest.mark.parametrize("active, shown", [(2.5, "2.5"), (float("nan"), "nan"), (float("inf"), "inf"),
                                           (True, "True"), (np.bool_(True), "True"), ("3", "'3'"),
                                           (np.float64(4.5), "4.5"), (None, "None")])
def test_context_rejects_non_integer_active(active, shown):
    with pytest.raises(ValueError) as e:
        context().action(active, 1380)
    assert str(e.value) == f"action: active must be a whole number of replicas in 1..{N}, got {shown}"


@pytest.mark.parametrize("active", [1, N, np.int64(7), np.int32(7), 7.0])
def test_context_accepts_whole_numbers_in_the_pool(active):
    out = context().action(active, 1380)
    assert out == {"active": int(active), "clock": 3}
    assert type(out["active"]) is int


def test_context_still_names_an_unknown_clock():
    with pytest.raises(ValueError, match=r"clock 1000 MHz not one of \(345, 690, 1035, 1380, 1710\)"):
        context().action(5, 1000)
