"""GPU memory of co-located instances (`commitenv.sim.memory`): an instance reserves its placement share of the GPU's
usable memory, keeps its footprint and a fixed KV cache in it, and carries that reservation when it moves. Checked
by hand on the shipped H100 profiles, against a lone instance's profile capacity, and through the KV pressure it
creates (preemptions a lone instance does not have)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.reference import ReferencePool, reference_snapshot as take_snapshot
from helpers.profiles import COLOCATE, toy_profile

from commitenv.profiles import load_profile
from commitenv.sim import EngineOptions, NoiseSpec
from commitenv.sim.memory import PlacementMemoryError
from commitenv.sim.pool import Instance, PoolLayout
from commitenv.workload.table import make_table

QWEN, LLAMA, MISTRAL = "h100-qwen2.5-7b-festina", "h100-llama2-13b", "h100-mistral-small-24b"


def exact() -> EngineOptions:
    return EngineOptions(noise=NoiseSpec(0, 0))


def hand_blocks(kv_tokens: int, kv_bytes: float, block: int, share: float, memory_gb: float = 80.0) -> int:
    """KV blocks at ``share`` from the profile's figures alone: usable = 0.9 x 80 GB (vLLM's default utilization),
    footprint = usable - the lone KV cache, KV = share x usable - footprint, in whole blocks."""
    usable = 0.9 * memory_gb * 1e9
    footprint = usable - kv_tokens * kv_bytes
    return math.floor((share * usable - footprint) / (block * kv_bytes))


@pytest.mark.parametrize("name", [QWEN, LLAMA, MISTRAL, "h200-qwen3.8-27b-fp8", "h20-qwen3.8-27b-fp8"])
def test_a_lone_instance_keeps_its_profiles_kv_capacity(name):
    prof = load_profile(name)
    pool = ReferencePool(prof, PoolLayout.single(2), exact())
    assert [r.cap_blocks for r in pool.replicas] == [prof.scheduler.kv_capacity_tokens // prof.scheduler.block_size] * 2


def test_qwen_and_llama_split_an_h100_by_share_by_hand():
    q, ll = load_profile(QWEN), load_profile(LLAMA)
    pool = ReferencePool([q, ll], PoolLayout(((Instance(0, 0.4), Instance(1, 0.6)),)), exact())
    # Qwen: 920,224 tokens x 57,344 B alone; Llama: 51,232 x 819,200 B alone; blocks of 16 tokens
    want_q = hand_blocks(920224, 57344.0, 16, 0.4)
    want_l = hand_blocks(51232, 819200.0, 16, 0.6)
    assert [r.cap_blocks for r in pool.replicas] == [want_q, want_l]
    assert (want_q, want_l) == (10429, 1004)  # 166,864 and 16,064 tokens: Llama holds ~4 requests at 4,096
    assert all(r.free_blocks == r.cap_blocks for r in pool.replicas)
    # each reservation (footprint + KV) is its share of the 72 GB, less under one block of rounding
    for r, share, foot in zip(pool.replicas, (0.4, 0.6), (72e9 - 920224 * 57344.0, 72e9 - 51232 * 819200.0)):
        block = r.bs * r.profile.model.kv_bytes_per_token
        assert share * 72e9 - block < foot + r.cap_blocks * block <= share * 72e9


def test_mistral_cannot_share_an_h100_at_0_6_and_the_error_says_why():
    q, m = load_profile(QWEN), load_profile(MISTRAL)
    with pytest.raises(PlacementMemoryError, match=r"layout.gpus\[0\]\[1\]: Mistral.*context limit \(32768 tokens\)"):
        ReferencePool([q, m], PoolLayout(((Instance(0, 0.4), Instance(1, 0.6)),)), exact())


def test_an_instance_keeps_its_memory_share_when_its_sm_share_shrinks_and_moves():
    prof = toy_profile(scheduler=COLOCATE,
                       latencies=dict(clock_change_s=0.0, activation_s=1.0, load_s=5.0, load_w=70.0))
    pool = ReferencePool(prof, PoolLayout(((Instance(0, 0.5),), (Instance(0, 0.6),))), exact())
    pool.attach(make_table(np.zeros(0), np.zeros(0, int), np.zeros(0, int)))
    pool.set_share(0.0, 1, 0.4)  # GPU 1's SMs: 0.4 used, its memory still 0.6 reserved
    with pytest.raises(PlacementMemoryError, match="GPU 1 would reserve 1.100 > 1 of its memory"):
        pool.move(0.0, {0: 1})  # SMs would fit (0.5 + 0.4), memory would not (0.5 + 0.6)
    cap = pool.replicas[0].cap_blocks
    pool.move(0.0, {1: 0, 0: 1})  # a swap fits both: it carries its KV cache size along
    pool.run_until(100.0)
    assert [r.gpu.index for r in pool.replicas] == [1, 0] and pool.replicas[0].cap_blocks == cap
    snap = take_snapshot(pool)
    assert snap.replicas.memory_share.tolist() == [0.5, 0.6] and snap.replicas.kv_blocks.tolist() == [
        r.cap_blocks for r in pool.replicas]


def test_a_half_share_kv_cache_preempts_where_a_whole_gpu_does_not():
    # at share 1 the toy holds 1,024 tokens; at 0.5, 500: four 150-token requests growing to 210 fit only alone
    prof = toy_profile(scheduler=dict(COLOCATE, token_budget=64, max_seqs=8, context_limit=256))
    table = make_table(np.zeros(4), np.full(4, 150), np.full(4, 60))
    lone = ReferencePool(prof, PoolLayout(((Instance(0, 1.0),),)), exact())
    half = ReferencePool(prof, PoolLayout(((Instance(0, 0.5),),)), exact())
    assert half.replicas[0].cap_blocks * 4 == 500 and lone.replicas[0].cap_blocks * 4 == 1024
    for p in (lone, half):
        p.attach(table)
        p.run_until(np.inf)
        assert np.all(np.isfinite(p.finish_t)) and p.replicas[0].free_blocks == p.replicas[0].cap_blocks
    assert lone.preemptions.sum() == 0 and half.preemptions.sum() > 0


def test_a_scenario_placing_mistral_beside_qwen_is_refused_at_load_naming_the_entry(tmp_path):
    import yaml

    from commitenv._paths import data_dir
    from commitenv.scenarios import ScenarioError, load_scenario

    raw = yaml.safe_load((data_dir("scenarios") / "festina-h100-shared.yaml").read_text())
    raw["pool"]["placement"][0] = [{"model": "qwen-7b", "share": 0.4}, {"model": "mistral-24b", "share": 0.6}]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ScenarioError, match=r"bad.yaml: pool.placement\[0\]\[1\]: Mistral.*32768 tokens"):
        load_scenario(path)


# the footprints of the shipped H100 profiles, from their figures alone (72 GB usable less the lone KV cache)
QWEN_FOOT, LLAMA_FOOT = 72e9 - 920224 * 57344.0, 72e9 - 51232 * 819200.0


@pytest.mark.parametrize("engine", ["library", "reference"])
def test_a_declared_kv_budget_sets_the_memory_apart_from_the_sm_share_by_hand(engine):
    """Qwen-7B at 0.4 of the SMs declaring 100,000 KV tokens reserves its 19.23 GB footprint + 5.73 GB; Llama-2-13B at
    0.6 declaring 8,192 (two requests at its context limit) its 30.03 GB + 6.71 GB: 0.347 and 0.510 of 72 GB."""
    from commitenv.sim.devices import device_state
    from commitenv.sim.pool import Pool

    q, ll = load_profile(QWEN), load_profile(LLAMA)
    layout = PoolLayout(((Instance(0, 0.4, kv_tokens=100_000), Instance(1, 0.6, kv_tokens=8192)),))
    pool = (Pool if engine == "library" else ReferencePool)([q, ll], layout, exact())
    want_mem = [(QWEN_FOOT + 6250 * 16 * 57344.0) / 72e9, (LLAMA_FOOT + 512 * 16 * 819200.0) / 72e9]
    assert want_mem == pytest.approx([0.34674, 0.51030], abs=1e-5)
    if engine == "library":
        ds = device_state(pool)
        assert ds.replica_mem_share.tolist() == pytest.approx(want_mem, rel=1e-12)
        assert pool._ks.cap_blocks.tolist() == [6250, 512]
    else:
        assert [r.mem_share for r in pool.replicas] == pytest.approx(want_mem, rel=1e-12)
        assert [r.cap_blocks for r in pool.replicas] == [6250, 512]
        assert [r.share for r in pool.replicas] == [0.4, 0.6]  # the SM shares are the placement's


def test_memory_follows_the_declared_budget_on_a_move_not_the_sm_share():
    """GPU 1's Qwen holds 0.5 of the SMs but declares 600,000 KV tokens (0.745 of the memory): Qwen from GPU 0 (0.4 of
    the SMs, 0.347 of the memory) fits its SMs there (0.9), not its memory (1.09)."""
    q = load_profile(QWEN)
    pool = ReferencePool(q, PoolLayout(((Instance(0, 0.4, kv_tokens=100_000),),
                                        (Instance(0, 0.5, kv_tokens=600_000),))), exact())
    pool.attach(make_table(np.zeros(0), np.zeros(0, int), np.zeros(0, int)))
    with pytest.raises(PlacementMemoryError, match=r"GPU 1 would reserve 1\.09\d > 1 of its memory"):
        pool.move(0.0, {0: 1})


@pytest.mark.parametrize("insts, match", [
    ((Instance(0, 0.4, kv_tokens=4000),), r"layout.gpus\[0\]\[0\]: .*kv_tokens 4000 \(250 blocks of 16\), less than one "
                                          r"request at its context limit \(16384 tokens\)"),
    ((Instance(0, 0.4, kv_tokens=1_000_000),), r"layout.gpus\[0\]\[0\]: .*kv_tokens 1000000 needs 19.23 GB of footprint "
                                               r"plus 57.34 GB of KV cache, more than the 72.00 GB usable"),
    ((Instance(0, 0.3, kv_tokens=100_000), Instance(0, 0.3, kv_tokens=100_000), Instance(0, 0.3, kv_tokens=100_000)),
     r"layout.gpus\[0\]: its instances reserve 1.040 > 1 of its usable memory"),
])
def test_a_kv_budget_that_cannot_start_or_fit_is_refused_naming_the_instance(insts, match):
    from commitenv.sim.pool import Pool

    with pytest.raises(PlacementMemoryError, match=match):
        Pool(load_profile(QWEN), PoolLayout((insts,)), exact())


def test_a_scenario_kv_budget_is_checked_at_load_naming_the_entry(tmp_path):
    import yaml

    from commitenv._paths import data_dir
    from commitenv.scenarios import ScenarioError, load_scenario

    raw = yaml.safe_load((data_dir("scenarios") / "festina-h100-shared.yaml").read_text())
    raw["pool"]["placement"][2] = [{"model": "qwen-7b", "share": 0.4, "kv_tokens": 100000},
                                   {"model": "llama2-13b", "share": 0.6, "kv_tokens": 4000}]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ScenarioError, match=r"bad.yaml: pool.placement\[2\]\[1\]: .*kv_tokens 4000"):
        load_scenario(path)
    raw["pool"]["placement"][2] = [{"model": "qwen-7b", "share": 0.4, "kv_tokens": 600000},
                                   {"model": "llama2-13b", "share": 0.6, "kv_tokens": 8192}]
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ScenarioError, match=r"pool.placement\[2\]: its instances reserve 1.255 > 1"):
        load_scenario(path)
    raw["pool"]["placement"][2] = [{"model": "qwen-7b", "share": 0.4, "kv_tokens": -5}]
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ScenarioError, match=r"kv_tokens"):
        load_scenario(path)
