"""Vectorized environments: ``gym.make_vec`` in 'sync' and 'async' modes steps, resets with seeds, runs
through an episode end (autoreset), agrees across modes and closes cleanly."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest

import commitenv  # noqa: F401  (registers the scenario ids)
from helpers.scenarios import HOUR_SCENARIO, toy_three_hour

ENV_ID = f"commitenv/{HOUR_SCENARIO}-v0"


def _actions(n: int, active, clock) -> dict[str, np.ndarray]:
    return {"active": np.asarray(active, dtype=np.int64).reshape(n),
            "clock": np.asarray(clock, dtype=np.int64).reshape(n)}


def _rollout(mode: str, seeds: list[int], steps: int):
    envs = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode=mode)
    try:
        assert envs.num_envs == 2
        assert envs.single_observation_space.shape == (16,)
        assert set(envs.single_action_space.spaces) == {"active", "clock"}
        obs, info = envs.reset(seed=seeds)
        assert obs.shape == (2, 16) and obs.dtype == np.float32
        assert envs.observation_space.contains(obs)
        out_obs, out_rew = [obs], []
        for k in range(steps):
            act = _actions(2, [32, 24 + k % 8], [3, k % 5])
            obs, rew, term, trunc, info = envs.step(act)
            assert obs.shape == (2, 16) and rew.shape == (2,)
            assert not np.any(trunc)
            out_obs.append(obs)
            out_rew.append(rew)
        return np.array(out_obs), np.array(out_rew), info
    finally:
        envs.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_make_vec_steps_resets_and_closes(mode):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        envs = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode=mode)
        obs, info = envs.reset(seed=[1, 2])
        assert obs.shape == (2, 16)
        assert np.all(info["hour"] == 0) and np.all(info["interval"] == 0)
        obs, rew, term, trunc, info = envs.step(_actions(2, [32, 30], [3, 2]))
        assert list(info["active"]) == [32, 30]
        assert list(info["clock_mhz"]) == [1380, 1035]  # H200 levels 345, 690, 1035, 1380, 1710 MHz
        assert rew[0] != rew[1]  # different seeds and configurations
        obs2, info2 = envs.reset(seed=3)  # a single int seeds env i with seed + i
        assert obs2.shape == (2, 16)
        assert np.all(info2["interval"] == 0)
        envs.close()
    assert envs.closed
    if mode == "async":
        assert all(not p.is_alive() for p in envs.processes)
    envs.close()  # closing twice is harmless


def test_sync_and_async_agree_bit_for_bit():
    s_obs, s_rew, _ = _rollout("sync", [4, 5], 5)
    a_obs, a_rew, _ = _rollout("async", [4, 5], 5)
    np.testing.assert_array_equal(s_obs, a_obs)
    np.testing.assert_array_equal(s_rew, a_rew)
    # and match a single env stepped by hand
    env = gym.make(ENV_ID)
    obs, _ = env.reset(seed=5)
    rews = []
    for k in range(5):
        obs, r, *_ = env.step({"active": 24 + k % 8, "clock": k % 5})
        rews.append(r)
    np.testing.assert_array_equal(s_rew[:, 1], np.array(rews))
    np.testing.assert_array_equal(s_obs[-1, 1], obs)
    env.close()


def test_sync_vector_runs_through_episode_end_and_autoresets():
    envs = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="sync")
    try:
        envs.reset(seed=[0, 1])
        for k in range(60):
            obs, rew, term, trunc, info = envs.step(_actions(2, [32, 32], [3, 3]))
            assert np.all(term == (k == 59))
        assert np.all(info["misses"] >= 0) and "settlement" in info
        # autoreset (next-step mode): the step after termination starts a new episode
        obs, rew, term, trunc, info = envs.step(_actions(2, [32, 32], [3, 3]))
        assert np.all(rew == 0.0) and not np.any(term)
        assert np.all(info["interval"] == 0)
        obs, rew, term, trunc, info = envs.step(_actions(2, [32, 32], [3, 3]))
        assert np.all(info["interval"] == 1)
    finally:
        envs.close()


def test_vector_env_on_custom_scenario(tmp_path):
    """Any scenario file through a registered id with the ``scenario`` kwarg, in worker processes."""
    path = toy_three_hour(tmp_path)
    envs = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="async", scenario=str(path))
    try:
        envs.reset(seed=[0, 0])
        rews = []
        for _ in range(18):
            obs, rew, term, trunc, info = envs.step(_actions(2, [2, 1], [1, 0]))
            rews.append(rew)
        assert np.all(term)
        assert np.all(info["hour"] == 2)
        assert not np.array_equal(np.array(rews)[:, 0], np.array(rews)[:, 1])
    finally:
        envs.close()
