"""festina-h100-serverless-day: the serverless family's pool over a whole coding day, at a tenth of its rate, with a
long tail that scales to zero.

Checked against figures computed here: the Zipf-3 popularity, the Azure Functions shape it claims (half the models at
most once an hour, 25 of 28 at most once a minute, at the day's mean rate from the built-in day's table), the placement
against the valley scenario's (the same instances, the head model on a third GPU), the memory of every GPU, and each
hour's request count against the table.
"""

from __future__ import annotations

import numpy as np
import pytest

from commitenv.scenarios import load_scenario, scenario_workload
from commitenv.workload.builtin import AZURE_CODE_DAY_HOURLY_COUNTS

NAME = "festina-h100-serverless-day"
VALLEY = "festina-h100-serverless-valley"
RATE = 0.1


def test_popularity_is_zipf_3_with_the_azure_functions_shape():
    sc = load_scenario(NAME)
    w = np.array(list(sc.workload.tenant_mix.values()))
    h = sum(k ** -3.0 for k in range(1, 29))
    assert w == pytest.approx([k ** -3.0 / h for k in range(1, 29)], abs=3e-6)
    assert abs(w.sum() - 1.0) < 1e-9
    mean_per_hour = RATE * sum(AZURE_CODE_DAY_HOURLY_COUNTS) / 24  # 4,041 requests an hour
    assert mean_per_hour == pytest.approx(4040.75, abs=0.01)
    assert int(np.sum(w * mean_per_hour <= 1.0)) == 14  # at most once an hour (Azure Functions: 45 % of apps)
    assert int(np.sum(w * mean_per_hour <= 60.0)) == 25  # at most once a minute (81 %)
    # the tail is rarely used all day: the last model's expected requests over the whole day
    assert w[-1] * RATE * sum(AZURE_CODE_DAY_HOURLY_COUNTS) < 4


def test_the_pool_is_the_valleys_with_the_head_model_on_a_third_gpu():
    day, valley = load_scenario(NAME), load_scenario(VALLEY)
    assert [m.model_dump() for m in day.pool.models] == [m.model_dump() for m in valley.pool.models]
    placed = [[(i.model, i.share, i.kv_tokens) for i in g] for g in day.pool.placement]
    before = [[(i.model, i.share, i.kv_tokens) for i in g] for g in valley.pool.placement]
    changed = [g for g in range(24) if placed[g] != before[g]]
    assert changed == [12] and placed[12] == [("qwen-7b-00", 1.0, 100000)] and before[12][0][0] == "qwen-7b-01"
    names = [i.model for g in day.pool.placement for i in g]
    assert names.count("qwen-7b-00") == 3 and names.count("qwen-7b-01") == 1
    assert list(day.workload.tenant_mix)[:2] == ["qwen-7b-00", "qwen-7b-01"]
    assert day.engine.scale_to_zero and not valley.engine.scale_to_zero
    assert day.horizon_hours == 24 and day.workload.start_hour == 0 and day.commitment.energy_only
    for key in ("pool", "memory", "workload", "slo", "realism", "scale_to_zero"):
        assert day.paper.get(key), f"paper.{key} missing"


def test_every_gpu_fits_its_instances_memory():
    from commitenv.envs import CommitServeEnv
    from commitenv.sim.devices import device_state

    env = CommitServeEnv(NAME)
    env.reset(seed=100000)
    d = device_state(env.pool)
    gpu_of = d.replica_gpu
    per_gpu = np.bincount(gpu_of, weights=d.replica_mem_share, minlength=24)
    assert per_gpu.max() <= 1.0 and len(gpu_of) == 30  # 28 models, the head model on two more GPUs


@pytest.mark.parametrize("seed", [100000, 100001])
def test_the_day_follows_the_tables_hours(seed):
    t = scenario_workload(load_scenario(NAME), seed)
    counts = np.bincount((t.arrival_s // 3600).astype(int), minlength=24)[:24]
    want = RATE * np.array(AZURE_CODE_DAY_HOURLY_COUNTS, dtype=float)
    # each hour's count x U(0.9, 1.1), with Poisson noise (4 standard deviations)
    assert np.all(np.abs(counts / want - 1.0) <= 0.1 + 4 / np.sqrt(want))
    assert int(np.argmin(counts)) in (9, 10) and counts.max() > 4 * counts.min()  # the night valley
