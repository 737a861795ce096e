"""festina-h100-serverless-valley: 28 models (the two busiest with two instances) on 24 H100s through the coding day's
night valley.

Checked against figures computed here, not read back from the file's loader: each instance's memory from the profiles'
lone KV capacity and bytes per token (footprint = 72 GB usable - that cache, plus the declared KV budget), every GPU
within its memory and SMs, the Zipf popularity, and the hours' request counts from the built-in day's table.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.slow import slow_requested

from commitenv.profiles import load_profile
from commitenv.scenarios import load_scenario, scenario_workload
from commitenv.workload.builtin import AZURE_CODE_DAY_HOURLY_COUNTS

NAME = "festina-h100-serverless-valley"
USABLE = 0.9 * 80e9


def hand_memory(profile_name: str, kv_tokens: int) -> float:
    """Footprint (usable memory minus the profile's lone KV cache) plus the budget's whole blocks, over 72 GB."""
    p = load_profile(profile_name)
    per_token = p.model.kv_bytes_per_token
    footprint = USABLE - p.scheduler.kv_capacity_tokens * per_token
    blocks = kv_tokens // p.scheduler.block_size
    return (footprint + blocks * p.scheduler.block_size * per_token) / USABLE


def test_the_pool_has_28_models_on_24_gpus_the_busiest_two_twice():
    sc = load_scenario(NAME)
    assert sc.pool.gpus == 24 and len(sc.pool.placement) == 24 and len(sc.pool.models) == 28
    placed = [i.model for g in sc.pool.placement for i in g]
    twice = {m for m in placed if placed.count(m) == 2}
    assert twice == {"qwen-7b-00", "qwen-7b-01"} and set(placed) == {m.name for m in sc.pool.models}
    assert max(placed.count(m) for m in placed) == 2
    # the two busiest are the first two by popularity, the ten lone tail instances the last ten
    mix = list(sc.workload.tenant_mix)
    assert mix[:2] == ["qwen-7b-00", "qwen-7b-01"]
    assert [g[0].model for g in sc.pool.placement[14:]] == mix[-10:]
    assert sc.horizon_hours == 3 and sc.workload.start_hour == 9 and sc.commitment.energy_only
    for key in ("pool", "memory", "workload", "slo", "realism"):
        assert sc.paper.get(key), f"paper.{key} missing"


def test_every_gpu_fits_its_instances_memory_by_hand_and_the_engine_agrees():
    from commitenv.envs import CommitServeEnv
    from commitenv.sim.devices import device_state

    sc = load_scenario(NAME)
    prof = {m.name: m.profile for m in sc.pool.models}
    want = [[hand_memory(prof[i.model], i.kv_tokens) for i in g] for g in sc.pool.placement]
    assert {round(x, 3) for g in want for x in g} == {0.347, 0.604, 0.785}  # Qwen, Llama, Mistral
    for g, (mems, insts) in enumerate(zip(want, sc.pool.placement)):
        assert sum(mems) <= 1.0 and sum(i.share for i in insts) <= 1.0 + 1e-12, g
    env = CommitServeEnv(sc)
    env.reset(seed=100000)
    got = device_state(env.pool).replica_mem_share
    assert got.tolist() == pytest.approx([x for g in want for x in g], rel=1e-12)
    # the four lone Qwen GPUs could pair up (0.69 of the memory), a third Qwen never fits (1.04)
    assert 2 * want[-1][0] < 1.0 < 3 * want[-1][0]


def test_popularity_is_zipf_over_the_28_models():
    sc = load_scenario(NAME)
    mix = sc.workload.tenant_mix
    w = np.array(list(mix.values()))
    h = sum(1 / k for k in range(1, 29))
    assert w == pytest.approx([1 / k / h for k in range(1, 29)], abs=6e-4)
    assert abs(w.sum() - 1.0) < 1e-9 and set(mix) == {m.name for m in sc.pool.models}


@pytest.mark.parametrize("seed", [100000, 100001])
def test_the_three_hours_follow_the_days_valley(seed):
    sc = load_scenario(NAME)
    t = scenario_workload(sc, seed)
    counts = np.bincount((t.arrival_s // 3600).astype(int), minlength=3)[:3]
    want = np.array(AZURE_CODE_DAY_HOURLY_COUNTS[9:12], dtype=float)
    assert np.all(np.abs(counts / want - 1.0) <= 0.1 + 0.02)  # each hour's count x U(0.9, 1.1), Poisson-ish noise
    assert counts[1] < counts[0] and counts[1] < counts[2]  # hour 10 is the valley


@pytest.mark.slow
def test_festina_consolidates_in_the_valley_and_draws_less_energy_than_without(request):
    """Issue 36's check on the serverless family (two 3-hour Festina runs, ~4-8 min): consolidation moves instances
    and the run's energy is below the same run without it."""
    from commitenv.evaluation import run_episode

    if not slow_requested(request.config):
        pytest.skip("slow (two 3-hour Festina runs: minutes): run with -m slow or COMMITENV_RUN_SLOW=1")

    _, on = run_episode("festina", NAME, 100000)
    _, off = run_episode("festina", NAME, 100000, controller_kwargs={"consolidate": False})
    assert on.summary["festina_moved_instances"] > 0 and on.summary["moves"] > 0
    assert off.summary["moves"] == 0
    assert on.summary["energy_mj"] < off.summary["energy_mj"]
