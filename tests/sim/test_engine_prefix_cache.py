"""Engine prefix caching (vLLM automatic prefix caching at the workload's hash-block granularity), hand-computed
cases: hits skip cached prefill, registration at scheduling time (a request admitted later in the same pass
hits), the last-token rule, divergent prefixes, shared KV accounting, LRU eviction of freed blocks tail first,
and invariants on random workloads with preemption."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.prefix import SMALL_SCHED, tree_hashes, with_hashes
from helpers.profiles import attn_toy_profile, toy_profile
from helpers.reference import ReferencePool

from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
from commitenv.sim.kernel.layout import R_FREE
from commitenv.sim.kernel.prefix import P_HIT
from commitenv.workload.loaders import load_mooncake_jsonl
from commitenv.workload.table import WorkloadError, make_table

BIG = SMALL_SCHED


def serve(arrivals, prompts, outputs, hashes, *, bt=4, caching=True, sched=BIG, closed_form=True, t_end=100.0,
          profile=None, reference=False):
    """One replica serving the requests to ``t_end``: on the compiled loop, or (``reference``, for tests that read the
    caches' objects) on the step-by-step reference engine."""
    prof = profile or toy_profile(scheduler=sched)
    opts = EngineOptions(noise=NoiseSpec(0, 0), log_steps=True, prefix_caching=caching, prefix_block_tokens=bt,
                         closed_form=closed_form and not reference)
    pool = (ReferencePool if reference else Pool)(prof, PoolLayout.single(1), opts)
    pool.attach(with_hashes(make_table(arrivals, prompts, outputs), hashes))
    pool.run_until(t_end)
    return pool


def hit_tokens(pool) -> int:
    """Prompt tokens replica 0 skipped by cache hits (the reference's cache object, the compiled loop's arrays)."""
    if isinstance(pool, ReferencePool):
        return pool.replicas[0].pcache.hit_tokens
    return int(pool._ks.pfx[0][0, P_HIT])


def first_entry(pool, slot):
    return next(e for e in pool.log if slot in e.slots)


def chunk_of(pool, slot):
    e = first_entry(pool, slot)
    j = e.slots.index(slot)
    return e.new_tokens[j], e.computed_before[j]


def test_later_request_skips_cached_blocks():
    # A computes 10 tokens (blocks 1, 2 of 4 tokens registered); B, arriving after A finished, hits 8 tokens
    pool = serve([0.0, 1.0], [10, 10], [1, 1], [[1, 2], [1, 2]])
    assert chunk_of(pool, 0) == (10, 0)
    assert chunk_of(pool, 1) == (2, 8)
    eb = first_entry(pool, 1)
    assert eb.energy_j == pytest.approx(1.0 + 0.1 * 2, abs=1e-12)  # E = a + c1 P with P = 2
    assert eb.t1 - eb.t0 == pytest.approx(0.01 + 0.001 * 2, abs=1e-12)
    assert hit_tokens(pool) == 8


@pytest.mark.parametrize("reference", [False, True], ids=["compiled", "reference"])
def test_caching_off_computes_everything(reference):
    pool = serve([0.0, 1.0], [10, 10], [1, 1], [[1, 2], [1, 2]], caching=False, reference=reference)
    assert chunk_of(pool, 1) == (10, 0)
    assert (pool.replicas[0].pcache is None) if reference else (pool._ks._pa is None)


def test_same_pass_admission_hits_blocks_registered_when_scheduled():
    # A and B arrive together: A is scheduled first and registers its blocks; B hits them in the same step
    pool = serve([0.0, 0.0], [10, 10], [1, 1], [[1, 2], [1, 2]])
    e = pool.log[0]
    assert e.slots == (0, 1) and e.new_tokens == (10, 2) and e.computed_before == (0, 8)
    assert e.energy_j == pytest.approx(1.0 + 0.1 * 12, abs=1e-12)


def test_last_token_rule_and_divergent_prefix():
    # prompt 8 = two full blocks: only the first can be shared (at least one prompt token is computed)
    pool = serve([0.0, 1.0], [8, 8], [1, 1], [[1, 2], [1, 2]])
    assert chunk_of(pool, 1) == (4, 4)
    # prefixes diverge after the first block
    pool = serve([0.0, 1.0], [12, 12], [1, 1], [[1, 2, 3], [1, 5, 6]])
    assert chunk_of(pool, 1) == (8, 4)


def test_chunked_prefill_registers_blocks_chunk_by_chunk():
    # budget 8: A's 20-token prompt runs in chunks 8, 8, 4; B arrives while A's second chunk runs and is
    # admitted after A's third chunk was scheduled: blocks 1-4 are registered by then (block 5 ends at token
    # 20 = A's last token, so it is A's private block), and B hits 16 tokens of its 20
    sched = dict(BIG, token_budget=8)
    h = [1, 2, 3, 4, 5]
    pool = serve([0.0, 0.015], [20, 20], [1, 1], [h, h], sched=sched)
    assert [(e.slots, e.new_tokens, e.computed_before) for e in pool.log[:3]] == [
        ((0,), (8,), (0,)), ((0,), (8,), (8,)), ((0, 1), (4, 4), (16, 16))]


def test_hit_with_attention_term_prices_the_context():
    prof = attn_toy_profile(scheduler=BIG)
    pool = serve([0.0, 1.0], [10, 10], [1, 1], [[1, 2], [1, 2]], profile=prof)
    e = first_entry(pool, 1)
    # 2 new tokens after 8 cached ones: A = 2*8 + 2*3/2 = 19
    assert e.energy_j == pytest.approx(1.0 + 0.1 * 2 + 1e-4 * 19, abs=1e-12)
    assert e.t1 - e.t0 == pytest.approx(0.01 + 0.001 * 2 + 1e-6 * 19, abs=1e-12)


def test_shared_blocks_count_once_in_kv_memory():
    # A and B share 2 blocks; each holds 1 private block for tokens 9-10 -> 4 blocks in use of 16
    pool = serve([0.0, 0.0], [10, 10], [5, 5], [[1, 2], [1, 2]], t_end=0.001, reference=True)
    rep = pool.replicas[0]
    assert rep.free_blocks == 16 - 4
    assert [e.ref for e in rep.pcache.entries.values()] == [2, 2]
    pool.run_until(100.0)
    assert rep.free_blocks == 16 and rep.pcache.evictable == 2 and rep.pcache.free_entries() == [2, 1]


def test_freed_blocks_are_evicted_in_free_queue_order_tail_first():
    # vLLM's single FIFO free queue, traced by hand (16 blocks of 4 tokens, queue [0..15]):
    # A (p=9, hashes [1,2]) takes blocks 0,1,2 and frees them tail first -> [3..15, 2, 1(h2), 0(h1)];
    # C (p=52) takes 3..15 and frees them -> [2, 1(h2), 0(h1), 15..3]; D (p=8) takes 2 blocks: pops block 2
    # and block 1, evicting hash 2; B (hashes [1,2]) then hits only hash 1: 5 tokens after 4 cached.
    pool = serve([0.0, 1.0, 2.0, 3.0], [9, 52, 8, 9], [1, 1, 1, 1], [[1, 2], [], [], [1, 2]], reference=True)
    rep = pool.replicas[0]
    assert chunk_of(pool, 3) == (5, 4)
    assert rep.pcache.evictions == 1


def test_a_run_of_cached_blocks_is_evicted_deepest_first():
    # A (prompt 30, 7 shareable blocks) frees its tail block, then blocks 17..11; C (prompt 40) takes the 9
    # blocks before them and 1 more: the deepest cached block (hash 17). B hits A's first 6 blocks.
    ha = [11, 12, 13, 14, 15, 16, 17]
    pool = serve([0.0, 1.0, 2.0], [30, 40, 30], [1, 1, 1], [ha, [], ha])
    assert chunk_of(pool, 2) == (6, 24)


def _check_kv(rep):
    pc = rep.pcache
    live = rep.running
    private = sum(r.blocks - pc.per_entry * len(r.prefix) for r in live)
    held = {}
    for r in live:
        for e in r.prefix:
            held[e.h] = held.get(e.h, 0) + 1
    free = pc.free_entries()
    for h, e in pc.entries.items():
        assert e.ref == held.get(h, 0)
        assert (e.ref == 0) == (h in free)
    assert pc.evictable == pc.per_entry * len(free)
    assert rep.free_blocks == sum(pc.per_entry if k[0] == "e" else v for k, v in pc.queue.items())
    referenced = pc.per_entry * sum(1 for e in pc.entries.values() if e.ref > 0)
    assert rep.free_blocks + private + referenced == rep.cap_blocks
    assert 0 <= pc.evictable <= rep.free_blocks


@pytest.mark.parametrize("bt,budget", [(4, 16), (8, 12), (16, 12)])
@pytest.mark.parametrize("seed", range(4))
def test_random_prefix_trees_keep_kv_invariants_and_match_step_by_step(seed, bt, budget):
    # hash blocks of 1, 2 or 4 KV blocks; budgets that cap admitted chunks, tight KV: preemptions, evictions
    # inside closed-form decode runs, admissions that depend on which cached blocks survive
    rng = np.random.default_rng(seed)
    n = 40
    arrivals = np.sort(rng.uniform(0, 1.0, n))
    prompts = rng.integers(1, 40, n)
    outputs = rng.integers(1, 12, n)
    hashes = tree_hashes(rng, prompts, bt)  # three prefix trees, ids name prefixes
    sched = dict(BIG, token_budget=budget, kv_capacity_tokens=80)
    runs = []
    for cf in (True, False):  # the closed form on the compiled loop; the reference, step by step, checked every step
        prof = toy_profile(scheduler=sched)
        opts = EngineOptions(noise=NoiseSpec(0, 0), log_steps=True, prefix_block_tokens=bt, closed_form=cf)
        pool = (Pool if cf else ReferencePool)(prof, PoolLayout.single(1), opts)
        pool.attach(with_hashes(make_table(arrivals, prompts, outputs), hashes))
        if not cf:
            pool.on_step = lambda e, rep=pool.replicas[0]: _check_kv(rep)
        pool.run_until(1e6)
        assert pool.completed == n
        free = pool.replicas[0].free_blocks if not cf else int(pool._ks.ri[0, R_FREE])
        assert free == int(pool._ks.cap_blocks[0] if cf else pool.replicas[0].cap_blocks)
        runs.append(pool)
    a, b = runs
    np.testing.assert_allclose(a.finish_t, b.finish_t, rtol=0, atol=1e-9)
    assert a.energy_j() == pytest.approx(b.energy_j(), rel=1e-12)
    pc = b.replicas[0].pcache
    assert pc.hit_tokens > 0 and pc.evictions > 0 and a.preemptions.sum() > 0  # every path was exercised
    # caching only ever saves prefill: the same workload without it computes more tokens
    off = serve(arrivals, prompts, outputs, hashes, caching=False, sched=sched, t_end=1e6, bt=bt)
    computed = lambda p: sum(k for e in p.log for k, d in zip(e.new_tokens, e.decode) if not d)
    assert computed(off) > computed(a)


def test_clone_keeps_the_cache():
    # at t = 0.6, A (blocks 1-3 registered) is decoding and B (hit on them) too: both reference the entries
    ha = [1, 2, 3]
    sched = dict(BIG, context_limit=128, kv_capacity_tokens=256)
    pool = serve([0.0, 0.5], [13, 13], [100, 60], [ha, ha], t_end=0.6, sched=sched, reference=True)
    rp = pool.replicas[0].pcache
    assert [e.ref for e in rp.entries.values()] == [2, 2, 2]
    c = pool.clone(hide_lengths=False)
    rc = c.replicas[0].pcache
    assert rc is not rp and list(rc.entries) == [1, 2, 3] and [e.ref for e in rc.entries.values()] == [2, 2, 2]
    for r in c.replicas[0].running:  # the copies reference the copy's entries
        assert all(e is rc.entries[e.h] for e in r.prefix)
    c.capture_all()
    c.run_until(1e6)
    assert all(e.ref == 0 for e in rc.entries.values()) and c.replicas[0].free_blocks == c.replicas[0].cap_blocks
    assert [e.ref for e in rp.entries.values()] == [2, 2, 2]  # the original is untouched
    pool.run_until(1e6)
    for slot in (0, 1):
        assert c.captured_finish[slot] == pytest.approx(pool.finish_t[slot], abs=1e-9)


def test_prefix_block_size_must_be_a_multiple_of_the_engine_block():
    with pytest.raises(ValueError, match="prefix_block_tokens"):
        serve([0.0], [10], [1], [[1, 2]], bt=6)


def test_mooncake_hash_id_at_two_positions_is_rejected(tmp_path):
    p = tmp_path / "m.jsonl"
    rows = [{"timestamp": 0, "input_length": 900, "output_length": 3, "hash_ids": [1, 2]},
            {"timestamp": 5, "input_length": 900, "output_length": 3, "hash_ids": [2, 3]}]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(WorkloadError, match=r"m.jsonl: line 2: .*id 2 at block 0, but at block 1 on line 1"):
        load_mooncake_jsonl(p)


def test_decode_run_ends_before_an_eviction_that_changes_an_admission():
    # hash blocks of 16 tokens (4 KV blocks). A computes and frees blocks 1-3; D decodes 50 tokens; B (same
    # prefix as A, chunk capped by the budget of 12) waits for KV until D's growth evicts A's block 3, which
    # lowers the cost of B's hit: step by step B is admitted right then; a closed-form run must not skip it
    sched = dict(BIG, token_budget=12, max_seqs=8, context_limit=128, kv_capacity_tokens=128)
    runs = [serve([0.0, 1.0, 1.0], [49, 72, 61], [1, 50, 1], [[1, 2, 3], [], [1, 2, 3]], bt=16, sched=sched,
                  closed_form=cf, t_end=1e6) for cf in (True, False)]
    a, b = runs
    assert chunk_of(a, 2) == chunk_of(b, 2)
    np.testing.assert_allclose(a.finish_t, b.finish_t, rtol=0, atol=1e-9)
    assert a.energy_j() == pytest.approx(b.energy_j(), rel=1e-12)
