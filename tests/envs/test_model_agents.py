"""The models of a shared pool as PettingZoo agents: the GPU clock rule, rewards that add up to the pool's reward and
telescope to a brute-force Shapley share of the hour's cost, every joule given to a model, and bad actions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

pytest.importorskip("pettingzoo")

from commitenv.envs.model_agents import PoolModelsEnv  # noqa: E402
from commitenv.metrics import J_PER_KWH  # noqa: E402

SCENARIO = "festina-h100-shared"  # GPUs 0-1: mistral-24b alone; GPUs 2-7: qwen-7b with llama2-13b


def brute_shapley(e, commit_j, lp, lm):
    def cost(x):
        d = (x - commit_j) / J_PER_KWH
        return lp * d if d > 0 else -lm * d

    n = len(e)
    phi = np.zeros(n)
    orders = list(itertools.permutations(range(n)))
    for order in orders:
        acc = 0.0
        for i in order:
            phi[i] += cost(acc + e[i]) - cost(acc)
            acc += e[i]
    return phi / len(orders)


def test_a_gpu_runs_at_the_highest_clock_its_models_ask_for():
    env = PoolModelsEnv(SCENARIO)
    env.reset(seed=1)
    top = len(env.env.clocks_mhz) - 1
    acts = {"qwen-7b": {"active": 6, "clock": 0}, "llama2-13b": {"active": 6, "clock": 1},
            "mistral-24b": {"active": 2, "clock": top}}
    _, _, _, _, infos = env.step(acts)
    clocks = infos["qwen-7b"]["clocks_mhz"]
    c = env.env.clocks_mhz
    assert clocks == [c[top]] * 2 + [c[1]] * 6


def test_rewards_add_up_to_the_pools_and_telescope_to_the_shapley_share():
    env = PoolModelsEnv(SCENARIO)
    env.reset(seed=7)
    rng = np.random.default_rng(0)
    total = np.zeros(3)
    while env.agents:
        acts = {m: {"active": int(rng.integers(1, n + 1)), "clock": int(rng.integers(0, len(env.env.clocks_mhz)))}
                for m, n in zip(env.possible_agents, env.env.replicas_per_model)}
        _, rewards, _, _, infos = env.step(acts)
        team = infos["qwen-7b"]["team_reward"]
        assert sum(rewards.values()) == pytest.approx(team, abs=1e-12)
        total += np.array([rewards[m] for m in env.possible_agents])
        if "settlement" in infos["qwen-7b"]:
            hour_e = env.closed_hour_j
            # every joule of the settled hour went to some model
            assert hour_e.sum() == pytest.approx(env.env.hour_energy_j[0], rel=1e-9)
            want = brute_shapley(hour_e, float(env.env.commit_j[0]), env.env.lp, env.env.lm)
    tail_share = -total - want  # what the last step paid beyond the hour: each model's own tail at lambda_plus
    assert tail_share.sum() == pytest.approx(env.env.tail_cost_kwh, abs=1e-9)
    assert np.all(tail_share >= -1e-12)


def test_parallel_api_and_bad_actions():
    from pettingzoo.test import parallel_api_test

    parallel_api_test(PoolModelsEnv(SCENARIO), num_cycles=30)
    env = PoolModelsEnv(SCENARIO)
    env.reset(seed=0)
    ok = {m: {"active": 1, "clock": 0} for m in env.possible_agents}
    with pytest.raises(ValueError, match=r"unknown agent\(s\): \['gpt'\]"):
        env.step({**ok, "gpt": {"active": 1, "clock": 0}})
    with pytest.raises(ValueError, match=r"actions\['mistral-24b'\]\['active'\]: expected an integer in 1..2"):
        env.step({**ok, "mistral-24b": {"active": 3, "clock": 0}})
    assert env.env.k == 0
    with pytest.raises(ValueError, match="serves one model"):
        PoolModelsEnv("bench-h200-hour-fixed-a30")
