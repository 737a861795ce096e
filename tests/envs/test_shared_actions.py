"""A shared pool's action space has no invalid points (issue 36, item 4): share weights mapped onto each GPU's
simplex of SM shares and GPU requests granted as far as memory allows, both by hand; gymnasium's ``check_env`` on
every shipped shared scenario, raw and through `SharedFlatActionWrapper`; hundreds of seeded random draws that all
step, keep every GPU's SM shares within 1 and above their minimums and its memory within 1; and the exact form
controllers pass (``shares``, ``placement``) still taken as given, or refused with an error naming the field."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml
from gymnasium.utils.env_checker import check_env

import commitenv  # noqa: F401  (registers the scenarios' env ids)
from commitenv.sim.devices import device_state
from commitenv.control import ControllerContext
from commitenv.envs import CommitServeEnv, SharedFlatActionWrapper
from commitenv.envs.actions import placement_from_request, shares_from_weights
from commitenv.scenarios import list_scenarios, load_scenario

SHARED_IDS = sorted(load_scenario(n).env_id for n in list_scenarios() if load_scenario(n).pool.shared)


# ================================================================================================ the share map
def test_two_instances_min_01_weights_1_3_by_hand():
    # floor 0.1 + 0.1 = 0.2, free 0.8 split 1 : 3 -> 0.1 + 0.2 = 0.3 and 0.1 + 0.6 = 0.7
    assert shares_from_weights([1.0, 3.0], [0, 0], [0.1, 0.1], 1) == pytest.approx([0.3, 0.7], abs=1e-15)
    # only the ratio on a GPU counts: (0.25, 0.75) is the same point
    assert shares_from_weights([0.25, 0.75], [0, 0], [0.1, 0.1], 1) == pytest.approx([0.3, 0.7], abs=1e-15)


def test_share_map_by_hand_on_three_gpus():
    # GPU 0: instances 0, 3 (min 0.1, 0.3; weights 0, 1)  -> 0.1 and 0.3 + 0.6 = 0.9
    # GPU 1: instance 1 alone (min 0.2, weight 0)          -> the whole GPU, 1.0
    # GPU 2: instances 2, 4 (min 0.1, 0.1; weights 0, 0)   -> all zero: equal split of 0.8, 0.5 each
    s = shares_from_weights([0.0, 0.0, 0.0, 1.0, 0.0], [0, 1, 2, 0, 2], [0.1, 0.2, 0.1, 0.3, 0.1], 3)
    assert s == pytest.approx([0.1, 1.0, 0.5, 0.9, 0.5], abs=1e-15)
    # mins 0.1 and 0.3, all weights 0: free 0.6 split evenly -> 0.4 and 0.6
    assert shares_from_weights([0.0, 0.0], [0, 0], [0.1, 0.3], 1) == pytest.approx([0.4, 0.6], abs=1e-15)
    # an empty GPU gets nothing to split; a GPU's minimums above 1 are refused naming the GPU
    assert shares_from_weights([0.5], [1], [0.1], 2) == [1.0]
    with pytest.raises(ValueError, match=r"on GPU 0 sum to 1.200 > 1"):
        shares_from_weights([1.0, 1.0], [0, 0], [0.6, 0.6], 1)


def test_an_alone_instance_gets_exactly_one_and_never_above():
    for m in (0.1, 0.3, 0.7, 1 / 3, 0.123456789):
        assert shares_from_weights([0.37], [0], [m], 1) == [1.0]


# ================================================================================================ the placement map
def test_a_legal_request_is_granted_whole_swaps_included():
    # two full GPUs (memory 0.7 each): a swap is legal as a whole, though neither move fits alone
    assert placement_from_request([2, 1], [0, 1], 2, [0.7, 0.7], [0.1, 0.1], [True, True]) == [1, 0]
    # 0 stays; g + 1 asks for GPU g
    assert placement_from_request([0, 0, 0], [0, 1, 2], 3, [0.4, 0.6, 0.4], [0.1] * 3, [True] * 3) == [0, 1, 2]
    assert placement_from_request([3, 0, 0], [0, 1, 2], 3, [0.4, 0.6, 0.4], [0.1] * 3, [True] * 3) == [2, 1, 2]


def test_an_illegal_request_is_granted_in_index_order_as_far_as_memory_allows():
    # memory 0.4 | 0.6 | 0.4. Instances 0 and 2 both ask for GPU 1: 0.6 + 0.4 + 0.4 = 1.4, not legal whole.
    # In index order: instance 0 -> GPU 1 (0.6 + 0.4 = 1.0 fits), instance 2 -> GPU 1 (1.0 + 0.4) does not: stays.
    assert placement_from_request([2, 0, 2], [0, 1, 2], 3, [0.4, 0.6, 0.4], [0.1] * 3, [True] * 3) == [1, 1, 2]
    # instance 1 (0.6) asks for GPU 2 (0.4 there) while instance 2 asks for GPU 1 and 0 for GPU 2:
    # whole: GPU 2 = 0.6 + 0.4 = 1.0, GPU 1 = 0.4, GPU 0 = 0 -> legal, granted whole
    assert placement_from_request([3, 3, 2], [0, 1, 2], 3, [0.4, 0.6, 0.4], [0.1] * 3, [True] * 3) == [2, 2, 1]


def test_sm_needs_and_immovable_instances_bound_the_placement():
    # memory is no bound (0.1 each), but the SM needs are: 0.7 cannot join 0.5
    assert placement_from_request([2, 0], [0, 1], 2, [0.1, 0.1], [0.7, 0.5], [True, True]) == [0, 1]
    assert placement_from_request([2, 0], [0, 1], 2, [0.1, 0.1], [0.5, 0.5], [True, True]) == [1, 1]
    # an instance whose profile has no cold-start figures stays whatever it asks
    assert placement_from_request([2, 0], [0, 1], 2, [0.1, 0.1], [0.1, 0.1], [False, True]) == [0, 1]


# ================================================================================================ gymnasium's checker
@pytest.mark.parametrize("env_id", SHARED_IDS)
def test_check_env_passes_on_every_shipped_shared_scenario_raw_made_and_wrapped(env_id):
    env = gym.make(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (check_env's notes that an env is wrapped)
        check_env(env.unwrapped, skip_render_check=True)
        check_env(env, skip_render_check=True)
        check_env(SharedFlatActionWrapper(env, placement=True), skip_render_check=True)
    space = env.unwrapped.action_space
    assert set(space.spaces) == {"active", "clock", "clocks", "share_weights", "gpu_request", "migrate"}
    n, g = env.unwrapped.n_replicas, env.unwrapped.n_gpus
    assert space["share_weights"].shape == (n,) and space["share_weights"].low.min() == 0.0
    assert space["share_weights"].high.max() == 1.0 and space["gpu_request"].nvec.tolist() == [g + 1] * n
    env.close()


@pytest.mark.parametrize("kw", [{}, {"placement": True}, {"share_levels": 3}])
def test_check_env_passes_on_the_flat_wrapper_with_shares_and_its_spec_rebuilds_it(kw):
    env = SharedFlatActionWrapper(gym.make("commitenv/festina-h100-shared-v0"), **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env, skip_render_check=True)
    rebuilt = gym.make(env.spec)
    assert rebuilt.action_space == env.action_space
    env.close()
    rebuilt.close()


# ================================================================================================ random draws
def _slack_scenario(folder: Path) -> Path:
    """Three H100s with spare memory (0.4 | 0.5 | 0.3 + 0.5 reserved), so GPU requests can move instances."""
    raw = {
        "name": "slack-shared",
        "description": "test: three H100s with spare memory, so GPU requests can move instances",
        "pool": {
            "gpus": 3,
            "models": [{"name": "qwen-7b", "profile": "h100-qwen2.5-7b-festina", "tenants": ["qwen-7b"]},
                       {"name": "llama2-13b", "profile": "h100-llama2-13b", "tenants": ["llama2-13b"]}],
            "placement": [[{"model": "qwen-7b", "share": 0.4}], [{"model": "llama2-13b", "share": 0.5}],
                          [{"model": "qwen-7b", "share": 0.3}, {"model": "llama2-13b", "share": 0.5}]],
        },
        "workload": {"builtin": "azure-conv-hour", "seed": 0, "rate_scale": 0.05,
                     "tenant_mix": {"qwen-7b": 0.6, "llama2-13b": 0.4}},
        "horizon_hours": 1,
        "interval_s": 300,
        "commitment": {"mj": [1.0]},
        "realism": "ideal",
    }
    path = folder / "slack-shared.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _assert_legal(env: CommitServeEnv) -> None:
    """The configuration the env runs: each GPU's SM shares sum to <= 1, each at least its minimum, and the memory
    its instances reserved fits (read from the engine's own replicas)."""
    cfg = env.shared_cfg
    mins = [env.profiles[i.model].sm_share.min_share for g in env.layout.gpus for i in g]
    d = device_state(env.pool)
    mem = d.replica_mem_share.tolist()
    for g in range(env.n_gpus):
        on = [r for r, gg in enumerate(cfg.gpus) if gg == g]
        assert math.fsum(cfg.shares[r] for r in on) <= 1.0 + 1e-9
        assert math.fsum(mem[r] for r in on) <= 1.0 + 1e-9
    assert all(s >= m for s, m in zip(cfg.shares, mins)) and all(s <= 1.0 for s in cfg.shares)
    assert d.replica_share.tolist() == list(cfg.shares)  # what the engine holds


def test_300_seeded_flat_draws_all_step_and_keep_every_gpu_within_its_simplex(tmp_path):
    env = SharedFlatActionWrapper(CommitServeEnv(str(_slack_scenario(tmp_path))), placement=True)
    env.action_space.seed(2024)
    steps = moved = 0
    seed = 0
    while steps < 300:
        env.reset(seed=seed)
        seed += 1
        done = False
        while not done and steps < 300:
            _, _, done, _, info = env.step(env.action_space.sample())
            steps += 1
            _assert_legal(env.unwrapped)
            for g in set(info["placement"]):  # the space's form hands out every occupied GPU whole
                assert math.fsum(s for s, gg in zip(info["shares"], info["placement"]) if gg == g) == pytest.approx(1.0)
        moved += info["moves"]
    assert moved > 0  # requests were granted: the placement part was exercised


def test_300_seeded_raw_draws_all_step_on_the_shipped_pool_and_a_pool_with_spare_memory(tmp_path):
    for scenario in ("festina-h100-shared", str(_slack_scenario(tmp_path))):
        env = CommitServeEnv(scenario)
        env.action_space.seed(7)
        env.reset(seed=100000)
        for k in range(150):
            a = env.action_space.sample()
            assert env.action_space.contains(a)
            _, _, done, _, _ = env.step(a)
            _assert_legal(env)
            if done:
                env.reset(seed=100001 + k)


def test_the_flat_wrapper_maps_share_levels_and_requests_by_hand(tmp_path):
    env = SharedFlatActionWrapper(CommitServeEnv(str(_slack_scenario(tmp_path))), share_levels=5, placement=True)
    # 2 models x 2 instances; 5 clock levels x 3 GPUs; 4 instances x 5 weight levels; 4 x (3 GPUs + stay); 3 modes
    assert env.action_space.nvec.tolist() == [2, 2] + [5] * 3 + [5] * 4 + [4] * 4 + [3]
    flat = np.array([1, 0, 4, 3, 2, 0, 4, 1, 3, 0, 0, 0, 0, 2], dtype=np.int64)
    act = env.action(flat)
    assert act["active"].tolist() == [2, 1] and act["clock"] == 4 and act["clocks"].tolist() == [4, 3, 2]
    assert act["share_weights"].tolist() == [0.0, 1.0, 0.25, 0.75] and act["gpu_request"].tolist() == [0, 0, 0, 0]
    assert act["migrate"] == 2
    assert env.reverse_action(act).tolist() == flat.tolist()
    env.reset(seed=0)
    env.step(flat)
    # instances: qwen (GPU 0), llama (GPU 1), qwen + llama (GPU 2), all min 0.1; alone -> 1.0;
    # GPU 2: 0.1 + 0.8 x 0.25 = 0.3 and 0.1 + 0.8 x 0.75 = 0.7
    assert env.unwrapped.shared_cfg.shares == pytest.approx((1.0, 1.0, 0.3, 0.7), abs=1e-15)
    # the exact form maps back onto the grid: (0.3, 0.7) with min 0.1 -> excesses 0.2 : 0.6 -> weights 1/3, 1
    # (alone instances: excess 0.9 of 0.9 -> weight 1 -> level 4; GPU 2: 1/3 x 4 = 1.33 -> level 1, 1 -> level 4)
    back = env.reverse_action({"active": [2, 1], "clock": 4, "shares": [1.0, 1.0, 0.3, 0.7]})
    assert back[5:9].tolist() == [4, 4, 1, 4]


def test_the_flat_wrapper_without_shares_is_the_earlier_space(tmp_path):
    env = SharedFlatActionWrapper(CommitServeEnv(str(_slack_scenario(tmp_path))), shares=False)
    assert env.action_space.nvec.tolist() == [2, 2, 5, 5, 5]
    assert set(env.action(np.array([0, 1, 2, 3, 4]))) == {"active", "clock", "clocks"}
    with pytest.raises(ValueError, match="share_levels must be an integer >= 2"):
        SharedFlatActionWrapper(CommitServeEnv(str(_slack_scenario(tmp_path))), share_levels=1)
    with pytest.raises(ValueError, match="element 4 is 5, expected 0..4"):
        env.action(np.array([0, 1, 2, 3, 5]))


# ================================================================================================ the exact form
def test_a_controllers_exact_shares_and_placement_apply_as_given():
    env = CommitServeEnv("festina-h100-shared")
    env.reset(seed=100000)
    ctx = ControllerContext.from_env(env)
    shares = [1.0, 1.0] + [0.25, 0.75] * 6
    env.step(ctx.action(ctx.all_active, 1980, shares=shares))  # as Festina builds it: no mapping, no rescaling
    assert list(env.shared_cfg.shares) == shares
    # below 1 in sum is fine in the exact form (the space's form always hands out the whole GPU)
    shares[2] = 0.2
    env.step(ctx.action(ctx.all_active, 1980, shares=shares))
    assert env.shared_cfg.shares[2] == 0.2


def _bad(env, **over):
    a = {"active": list(env.replicas_per_model), "clock": 0}
    a.update(over)
    return a


@pytest.mark.parametrize("over, says", [
    ({"shares": [1.0, 1.0, 0.05] + [0.5] * 11}, r"action\['shares'\]\[2\]: expected 0.1..1.0, got 0.05"),
    ({"shares": [1.0, 1.0, 0.6] + [0.6] * 11}, r"GPU 2 would get 1.200 > 1 of its SMs"),
    ({"shares": [0.5] * 13}, r"action\['shares'\]: expected 14 finite numbers"),
    ({"share_weights": [0.5] * 13 + [1.5]}, r"action\['share_weights'\]\[13\]: expected a weight in 0.0..1.0"),
    ({"share_weights": [0.5] * 13 + [-0.1]}, r"action\['share_weights'\]\[13\]: expected a weight in 0.0..1.0"),
    ({"share_weights": [0.5] * 13 + [float("nan")]}, r"action\['share_weights'\]: expected 14 finite numbers"),
    ({"share_weights": "even"}, r"action\['share_weights'\]: expected 14 finite numbers"),
    ({"gpu_request": [0] * 13 + [9]}, r"action\['gpu_request'\]\[13\]: expected 0 \(stay\) or 1..8"),
    ({"gpu_request": [0.0] * 14}, r"action\['gpu_request'\]: expected 14 integers"),
    ({"placement": [0, 1, 3] + [2] + [3, 3, 4, 4, 5, 5, 6, 6, 7, 7]}, r"GPU 3 would get 1.400 > 1 of its SMs"),
    ({"placement": [0] * 14}, r"action\['shares'/'placement'\]: the instances on GPU 0"),
    ({"placement": [0] * 14, "share_weights": [0.0] * 14}, r"action\['placement'\]: the minimum SM shares .* GPU 0 "
                                                             r"sum to 1.400 > 1"),
    ({"shares": [1.0] * 14, "share_weights": [1.0] * 14}, r"'shares' \(exact\) and 'share_weights'"),
    ({"placement": list(range(8)) + [0] * 6, "gpu_request": [0] * 14}, r"'placement' \(exact\) and 'gpu_request'"),
    ({"share": [1.0] * 14}, r"unknown key\(s\) share;"),
])
def test_malformed_explicit_actions_are_refused_naming_the_field_and_change_nothing(over, says):
    env = CommitServeEnv("festina-h100-shared")
    env.reset(seed=100000)
    before = env.shared_cfg
    with pytest.raises(ValueError, match=says):
        env.step(_bad(env, **over))
    assert env.shared_cfg == before and env.k == 0


def test_an_exact_placement_that_overcommits_memory_is_refused_with_the_figures():
    env = CommitServeEnv("festina-h100-shared")
    env.reset(seed=100000)
    placed = env.shared_cfg.gpus
    gpus = list(placed)
    gpus[2] = 3  # Qwen (0.4 of the memory) onto GPU 3, which holds 0.4 + 0.6 already; its SMs would fit at 0.2
    shares = list(env.shared_cfg.shares)
    shares[2] = shares[4] = 0.2
    with pytest.raises(ValueError, match="GPU 3 would reserve 1.400 > 1 of its memory"):
        env.step(_bad(env, shares=shares, placement=gpus))
    # the same wish as a GPU request is not granted (memory), and nothing is refused
    request = [0] * 14
    request[2] = 4
    env.step(_bad(env, share_weights=[0.5] * 14, gpu_request=request))
    assert env.shared_cfg.gpus == placed and env.pool.moves == 0
