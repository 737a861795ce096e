"""The prefix cache on the compiled loop (`kernel/cached.py` over `kernel/prefix.py`) against the reference engine's
`PrefixCache` (tests/helpers/reference) on the same requests, both step by step, exactly: three prefix trees over two
models and three GPUs, tight KV (preemptions, evictions), the vLLM scheduler or a local policy's plans, a prefix-aware
dispatch policy, instances moving with migration: the same events, completions, step log, meters and cache
counters."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from helpers.prefix import tree_hashes, with_hashes
from helpers.profiles import toy_profile
from helpers.reference import ReferencePool

from commitenv.sim import EngineOptions, NoiseSpec, Pool
from commitenv.sim.dispatch import PrefixAffinity
from commitenv.sim.kernel.layout import R_FREE
from commitenv.sim.kernel.prefix import P_EVICTIONS, P_HIT
from commitenv.sim.local import FcfsLocal
from commitenv.sim.pool import Instance, PoolLayout
from commitenv.workload.table import make_table

SCHED = dict(token_budget=16, max_seqs=4, context_limit=128, block_size=4, kv_capacity_tokens=320)
LAYOUT = ((Instance(0, 0.5), Instance(1, 0.5)), (Instance(0, 0.5), Instance(1, 0.5)), (Instance(0, 1.0),))


def _profile():
    return toy_profile(scheduler=SCHED, latencies=dict(clock_change_s=0.0, activation_s=1.0, load_s=2.0, load_w=70.0),
                       model=dict(name="toy-model", params_b=1, weight_gb=1, kv_bytes_per_token=1e5))


def _workload(seed: int, n: int, bt: int):
    """``n`` requests over 12 s on two tenants (one per model), each prompt's hash blocks a prefix of one of three
    trees then private blocks."""
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0, 12.0, n))
    prompts = rng.integers(1, 80, n)
    outputs = rng.integers(1, 40, n)
    table = with_hashes(make_table(arrivals, prompts, outputs), tree_hashes(rng, prompts, bt, depth=20))
    return dataclasses.replace(table, tenant=rng.integers(0, 2, n).astype(np.int32), tenant_names=("a", "b"))


def _run(on_kernel: bool, seed: int, mode: str) -> dict:
    bt = 8
    pool = (Pool if on_kernel else ReferencePool)(
        [_profile(), _profile()], PoolLayout(LAYOUT),
        EngineOptions(noise=NoiseSpec(0.03, 0.03), seed=seed, closed_form=False, log_steps=True,
                      prefix_block_tokens=bt))
    if mode in ("dispatch", "moves"):
        pool.dispatch = PrefixAffinity()
    if mode == "local":
        pool.set_local_policy(FcfsLocal())
    pool.attach(_workload(seed, 160, bt), {0: 0, 1: 1})
    seen = []
    rng = np.random.default_rng(seed + 7)
    where = [0, 0, 1, 1, 2]  # each instance's GPU
    for k in range(1, 16):
        t = 2.0 * k
        pool.run_until(t)
        if mode == "moves" and k % 2 == 0:  # two half-GPU instances on GPUs 0 and 1 swap (their memory fits)
            x, y = [(0, 2), (1, 3), (0, 3), (1, 2)][int(rng.integers(0, 4))]
            if where[x] != where[y]:
                pool.move(t, {x: where[y], y: where[x]}, migrate=("all", "latency_aware", "none")[k // 2 % 3])
                where[x], where[y] = where[y], where[x]
        seen.append((t, pool.counts(), pool.gpu_energy_j(t).tolist(), pool.cold_starts, pool.migrated))
    pool.run_until(math.inf)
    if on_kernel:
        pr, ri = pool._ks.pfx[0], pool._ks.ri
        caches = [(int(pr[x, P_HIT]), int(pr[x, P_EVICTIONS]), int(ri[x, R_FREE])) for x in range(pool._ks.R)]
    else:
        caches = [(r.pcache.hit_tokens, r.pcache.evictions, r.free_blocks) for r in pool.replicas]
    return {"seen": seen, "events": pool.events, "finish": pool.finish_t.tolist(),
            "first": pool.first_t.tolist(), "preempt": pool.preemptions.tolist(), "replica": pool.replica_of.tolist(),
            "log": [(e.gpu, e.replica, e.t0, e.t1, e.slots, e.new_tokens, e.computed_before, e.energy_j)
                    for e in pool.log], "caches": caches}


@pytest.mark.parametrize("mode", ["vllm", "local", "dispatch", "moves"])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_prefix_cache_on_the_compiled_loop_equals_the_reference(seed, mode):
    ref = _run(False, seed, mode)
    got = _run(True, seed, mode)
    for a, b in zip(ref["seen"], got["seen"]):
        assert a == b, f"at t={a[0]}"
    assert ref == got
    assert sum(h for h, _, _ in ref["caches"]) > 0 and sum(e for _, e, _ in ref["caches"]) > 0  # hits, evictions
    assert sum(ref["preempt"]) > 0 and all(f > 0 for f in ref["finish"])
    if mode == "moves":
        assert ref["seen"][-1][3] > 0 and ref["seen"][-1][4] > 0  # instances moved (fresh caches), requests migrated
