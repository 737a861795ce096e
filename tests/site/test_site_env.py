"""A site's pools settled on one meter: the pools run exactly as alone, the site's bill by hand, the pools' Shapley
rewards against a brute force over orders, the PettingZoo API, and bad site files and actions."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from commitenv.envs import CommitServeEnv
from commitenv.metrics import J_PER_KWH
from commitenv.site import SiteEnv, SiteError, load_site, pool_seed
from helpers.sites import actions_for, three_pools, write_site

LP, LM = 3.0, 0.5  # the toy scenario's rates


def cost(e_j: float, commit_j: float) -> float:
    d = (e_j - commit_j) / J_PER_KWH
    return LP * d if d > 0 else -LM * d


def test_commitment_pools_sum_is_the_sum_of_the_pools_commitments(tmp_path, toy):
    site = load_site(three_pools(tmp_path, toy))
    # a and c: 0.2 / 0.5 / 0.3 MJ (c's override changes only its GPUs), b: 0.4 / 0.1 / 0.3
    assert site.commit_j == pytest.approx(np.array([0.8, 1.1, 0.9]) * 1e6, rel=1e-12)
    assert site.pool_names == ("a", "b", "c")
    assert site.pools[2].scenario.pool.gpus == 1 and site.pools[0].scenario.pool.gpus == 2
    scaled = load_site(three_pools(tmp_path, toy, commitment={"pools": "sum", "scale": 0.5}))
    assert scaled.commit_j == pytest.approx(np.array([0.4, 0.55, 0.45]) * 1e6, rel=1e-12)


def test_pools_run_as_alone_and_the_site_settles_their_summed_meter(tmp_path, toy):
    site = load_site(three_pools(tmp_path, toy))
    env = SiteEnv(site)
    env.reset(seed=11)
    ret, k, done = 0.0, 0, False
    while not done:
        _, r, done, _, info = env.step(actions_for(k))
        ret += r
        k += 1
    # each pool alone: its own env, its derived seed, the same actions
    meters, tails, misses = [], [], []
    for i, p in enumerate(site.pools):
        alone = CommitServeEnv(p.scenario)
        alone.reset(seed=pool_seed(11, i))
        done, j, m, readings = False, 0, 0, []
        while not done:
            _, _, done, _, inf = alone.step(actions_for(j)[p.name])
            readings.append(alone.settlement_meter_j)
            m += inf["new_misses"]
            j += 1
        meters.append(readings)
        tails.append(alone.tail_energy_j)
        misses.append(m)
    assert k == 18
    total = np.sum(meters, axis=0)  # the site meter at every boundary
    hour_e = np.diff(np.concatenate([[0.0], total[5::6]]))
    assert env.hour_energy_j == pytest.approx(hour_e, rel=1e-12)
    by_hand = [cost(e, c) for e, c in zip(hour_e, site.commit_j)]
    assert env.hour_cost_kwh == pytest.approx(by_hand, rel=1e-12)
    assert env.tail_energy_j == pytest.approx(sum(tails), rel=1e-12)
    assert env.misses == sum(misses)
    expected = -(sum(by_hand) + LP * sum(tails) / J_PER_KWH) + LM * site.commit_j.sum() / J_PER_KWH
    assert ret == pytest.approx(expected, rel=1e-9)
    assert info["site"]["tail_cost_kwh_eq"] == pytest.approx(LP * sum(tails) / J_PER_KWH, rel=1e-12)


def brute_shapley(e: list[float], commit_j: float) -> list[float]:
    """Shapley values of v(S) = C(sum of S's energies) - C(0) by averaging marginals over every order."""
    n = len(e)
    phi = [0.0] * n
    orders = list(itertools.permutations(range(n)))
    for order in orders:
        acc = 0.0
        for i in order:
            phi[i] += cost(acc + e[i], commit_j) - cost(acc, commit_j)
            acc += e[i]
    return [p / len(orders) for p in phi]


@pytest.mark.parametrize("commit_mj", [0.05, 0.3, 2.0])  # site hours of ~0.74 MJ: far over, straddling, under
def test_pool_rewards_sum_to_the_site_reward_and_telescope_to_the_shapley_share(tmp_path, toy, commit_mj):
    site = load_site(three_pools(tmp_path, toy, commitment={"mj": commit_mj}))
    env = SiteEnv(site, pool_rewards=True)
    env.reset(seed=3)
    hour_rewards = np.zeros(3)
    prev = np.zeros(3)
    k, done = 0, False
    while not done:
        _, r, done, _, info = env.step(actions_for(k))
        pr = info["site"]["pool_reward"]
        assert math.fsum(pr.values()) == pytest.approx(r, abs=1e-12)
        hour_rewards += np.array([pr[n] for n in "abc"])
        k += 1
        if k % 6 == 0:
            meters = np.array([e.settlement_meter_j for e in env.envs.values()])
            e_hour = (meters - prev).tolist()
            prev = meters
            want = brute_shapley(e_hour, commit_mj * 1e6)
            if done:  # the last step also pays each pool's own tail at lambda_plus
                want = [w + LP * e.tail_energy_j / J_PER_KWH for w, e in zip(want, env.envs.values())]
            assert -hour_rewards == pytest.approx(want, abs=1e-9)
            got = info["site"]["settlement"]["pool_cost_share_kwh_eq"]
            assert [got[n] for n in "abc"] == pytest.approx(brute_shapley(e_hour, commit_mj * 1e6), abs=1e-9)
            hour_rewards[:] = 0.0


def test_check_env_and_pettingzoo_parallel_api(tmp_path, toy):
    from gymnasium.utils.env_checker import check_env
    from pettingzoo.test import parallel_api_test

    from commitenv.site.agents import SitePoolsEnv

    path = three_pools(tmp_path, toy)
    check_env(SiteEnv(path), skip_render_check=True)
    parallel_api_test(SitePoolsEnv(path), num_cycles=40)


def test_bad_actions_name_the_pool_and_leave_the_site_unchanged(tmp_path, toy):
    env = SiteEnv(three_pools(tmp_path, toy))
    env.reset(seed=0)
    good = actions_for(0)
    with pytest.raises(ValueError, match=r"unknown: \['d'\]"):
        env.step({**good, "d": {"active": 1, "clock": 0}})
    with pytest.raises(ValueError, match=r"missing: \['c'\]"):
        env.step({"a": good["a"], "b": good["b"]})
    with pytest.raises(ValueError, match=r"action\['c'\]: .*active"):
        env.step({**good, "c": {"active": 2, "clock": 0}})  # pool c has one GPU
    assert env.k == 0 and all(e.k == 0 for e in env.envs.values())
    env.step(good)
    assert env.k == 1


def test_bad_site_files_name_the_field(tmp_path, toy):
    def err(pools, **fields):
        with pytest.raises(SiteError) as e:
            load_site(write_site(tmp_path, pools, **fields))
        return str(e.value)

    one = [{"name": "a", "scenario": str(toy)}]
    assert "pool names must be distinct" in err(one + one)
    assert "unknown field" in err([{"name": "a", "scenario": str(toy), "gpus": 3}])
    assert "pools[0].scenario" in err([{"name": "a", "scenario": "no-such-scenario"}])
    msg = err(one + [{"name": "b", "scenario": str(toy), "overrides": {"interval_s": 300}}])
    assert "pool 'b' has interval_s 300" in msg
    assert "pool.gpus" in err([{"name": "a", "scenario": str(toy), "overrides": {"pool": {"gpus": 0}}}])
    assert "commitment" in err(one, commitment={"pools": "sum", "mj": 1.0})
    assert "commitment.mj: expected one value or 3" in err(one, commitment={"mj": [1.0, 2.0]})
    assert "at least 1 item" in err([])


def test_the_shipped_site_loads_and_registers_beside_the_scenarios():
    import gymnasium as gym

    from commitenv.scenarios import list_scenarios, load_scenario
    from commitenv.site import list_sites

    assert list_sites() == ["site-10k-gpu-day", "site-4pool-day", "site-4pool-hour", "site-routed-hour"]
    assert not set(list_sites()) & set(list_scenarios())  # one id namespace: a site may not shadow a scenario
    spec = gym.spec("commitenv/site-4pool-day-v0")
    assert spec.entry_point == "commitenv.site:SiteEnv" and spec.kwargs == {"site": "site-4pool-day"}
    site = load_site("site-4pool-day")
    assert [p.scenario.name for p in site.pools] == ["bench-h200-day"] * 2 + ["bench-h20-day"] * 2
    assert sum(p.scenario.pool.gpus for p in site.pools) == 128
    # the site commits to the sum of its pools' commitments (each pool's built from its own reference day)
    from commitenv.scenarios import commitments_mj

    want = 2 * np.asarray(commitments_mj(load_scenario("bench-h200-day"))) + \
        2 * np.asarray(commitments_mj(load_scenario("bench-h20-day")))
    assert site.commit_j == pytest.approx(want * 1e6, rel=1e-12)
    assert len({pool_seed(0, i) for i in range(4)}) == 4  # four different days
    big = load_site("site-10k-gpu-day")
    assert len(big.pools) == 312 and sum(p.scenario.pool.gpus for p in big.pools) == 9984
    assert big.pool_names[:2] == ("h200-0", "h200-1") and big.pool_names[-1] == "h20-155"
    assert big.commit_j == pytest.approx(78 * want * 1e6, rel=1e-12)  # 156 + 156 pools: 78 times the 4-pool site's
    hour = load_site("site-4pool-hour")
    assert [p.scenario.name for p in hour.pools] == ["bench-h200-hour-fixed-a30"] * 2 + ["bench-h20-hour-fixed-a30"] * 2


@pytest.mark.parametrize("site, cycles", [("site-4pool-hour", 70), ("site-4pool-day", 10)])
def test_pettingzoo_parallel_api_on_the_shipped_sites(site, cycles):
    from pettingzoo.test import parallel_api_test

    from commitenv.site.agents import SitePoolsEnv

    parallel_api_test(SitePoolsEnv(site), num_cycles=cycles)  # the hour's 70 cycles run it to its end (60 steps)
