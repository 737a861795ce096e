"""The shared policy of a site's pools: the flat action map and the training penalty by hand, a tiny PPO run that
trains, saves, loads and evaluates deterministically on a site of alike pools."""

from __future__ import annotations

import pytest

pytest.importorskip("supersuit")
pytest.importorskip("stable_baselines3")

from commitenv.site.agents import SitePoolsEnv  # noqa: E402
from commitenv.site.learn import TRAIN_SEEDS, FlatPoolActions, evaluate, train  # noqa: E402
from commitenv.site.runner import site_gates  # noqa: E402
from helpers.sites import write_site  # noqa: E402


def alike(tmp_path, toy):
    return write_site(tmp_path, [{"name": "a", "scenario": str(toy)}, {"name": "b", "scenario": str(toy)}],
                      commitment={"mj": 0.5})


def test_flat_actions_and_the_training_penalty_by_hand(tmp_path, toy):
    raw = SitePoolsEnv(alike(tmp_path, toy))
    env = FlatPoolActions(raw, seed=3)
    assert env.action_space("a").nvec.tolist() == [2, 2]  # active 1..2, two clocks
    env.reset()
    assert TRAIN_SEEDS[0] <= raw.site_env.run_seed < TRAIN_SEEDS[1]  # a training seed, not an evaluation one
    _, rew, _, _, info = env.step({"a": [1, 0], "b": [0, 1]})
    assert raw.site_env.envs["a"].cfg == (2, 0) and raw.site_env.envs["b"].cfg == (1, 1)
    penalty = raw.site_env.envs["a"].scenario.miss_penalty_kwh
    for a in ("a", "b"):
        assert rew[a] == pytest.approx(info[a]["site"]["pool_reward"][a] - penalty * info[a]["cost"], abs=1e-15)


def test_a_tiny_shared_policy_trains_saves_and_evaluates_deterministically(tmp_path, toy):
    site = alike(tmp_path, toy)
    out = train(str(site), steps=48, seed=0, out=tmp_path / "ppo", n_steps=12, batch_size=12, n_epochs=1)
    assert (out / "model.zip").is_file()
    one, two = evaluate(site, out, 5), evaluate(site, out, 5)
    assert one.summary["cost_kwh_eq"] == two.summary["cost_kwh_eq"] and one.summary["misses"] == two.summary["misses"]
    assert set(one.pools) == {"a", "b"} and one.summary["requests"] == 2 * one.pools["a"]["requests"]
    assert site_gates(one, None)["pools"].keys() == {"a", "b"}
