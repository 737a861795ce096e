"""StepSplit's prefix split (section 6.7): a hand-computed static batch, exact Shapley of the engine's replay
game with the prefix cache (all coalitions served by the engine) against the closed form plus the equal block
split, efficiency, and blocks cached before a window."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers.profiles import attn_toy_profile, toy_profile

from commitenv.sim.kernel.prefix import P_HIT
from commitenv.attribution import (
    PrefixModelGame,
    ReplayGame,
    StepLaw,
    closed_form_for,
    exact_shapley,
    l1_distance,
    model_game_for,
    sample_shapley,
)
from commitenv.attribution.prefix import block_prefill_terms, prefix_split, shareable_hashes
from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
from commitenv.workload.table import make_table

SCHED = dict(token_budget=512, max_seqs=16, context_limit=128, block_size=4, kv_capacity_tokens=4096)


def attn_profile():
    return attn_toy_profile(scheduler=SCHED)


def table_with(arrivals, prompts, outputs, hashes):
    offs = np.concatenate([[0], np.cumsum([len(h) for h in hashes])]).astype(np.int64)
    flat = np.asarray([x for h in hashes for x in h], dtype=np.int64)
    return dataclasses.replace(make_table(arrivals, prompts, outputs), prefix_offsets=offs, prefix_hashes=flat)


def serve(table, profile, bt=4):
    pool = Pool(profile, PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True,
                                                             prefix_block_tokens=bt))
    pool.attach(table)
    pool.run_until(1e6)
    assert pool.completed == len(table)
    return pool


def test_hand_computed_static_batch():
    # toy law at the top clock: a = 1, c1 = 0.1, c2 = 0; blocks of 4 tokens cost 0.4 J each.
    # A [1,2] p=10, B [1,2] p=10, C [1,3] p=12, one output token each: one step of 10 + 2 + 8 tokens = 3.0 J.
    prof = toy_profile(scheduler=SCHED)
    table = table_with([0, 0, 0], [10, 10, 12], [1, 1, 1], [[1, 2], [1, 2], [1, 3]])
    pool = serve(table, prof)
    assert len(pool.log) == 1 and pool.log[0].new_tokens == (10, 2, 8)
    assert pool.log[0].energy_j == pytest.approx(3.0)
    law = StepLaw.from_profiles(prof)
    att = prefix_split(pool.log, table, law, 4)
    # shared a/3 each; block 1 (A,B,C) 0.4/3 each; block 2 (A,B) 0.2 each; block 3 (C) 0.4; residual tokens
    a3, b1 = 1 / 3, 0.4 / 3
    expect = [a3 + b1 + 0.2 + 0.2, a3 + b1 + 0.2 + 0.2, a3 + b1 + 0.4 + 0.4]
    np.testing.assert_allclose(att.shares, expect, rtol=1e-12)
    np.testing.assert_allclose(att.own, [0.2, 0.2, 0.4], rtol=1e-12)
    # "First" (step sharing on the logged steps) charges each block to whoever computed it
    first = closed_form_for(pool.log, table, law)
    np.testing.assert_allclose(first.shares, [a3 + 1.0, a3 + 0.2, a3 + 0.8], rtol=1e-12)
    assert att.total_j == pytest.approx(3.0)


def test_block_terms_telescope_like_chunks():
    c1, c2 = 0.1, 1e-4
    whole = block_prefill_terms(c1, c2, 0, 20)
    assert whole == pytest.approx(c1 * 20 + c2 * 20 * 21 / 2)
    parts = block_prefill_terms(c1, c2, 0, 7) + block_prefill_terms(c1, c2, 7, 16) + block_prefill_terms(c1, c2, 16, 20)
    assert parts == pytest.approx(whole, rel=1e-14)


def _tree_group(rng, n, bt=4, depth=6):
    """``n`` requests whose hash blocks come from two prefix trees (ids name whole prefixes)."""
    roots = [[1000 * k + j for j in range(depth)] for k in range(2)]
    prompts, hashes = [], []
    for i in range(n):
        root = roots[int(rng.integers(2))]
        keep = int(rng.integers(0, depth + 1))
        hs = root[:keep] + [50_000 + 100 * i + j for j in range(depth - keep)]
        p = int(rng.integers(1, depth * bt + 3))
        prompts.append(p)
        hashes.append(hs[: -(-p // bt)])
    return prompts, hashes


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("spacing", [0.0, 0.5])
def test_prefix_split_equals_exact_shapley_of_the_engine_game(seed, spacing):
    # static batch (all at t = 0, one prefill step) or requests served one after another (0.5 s apart): in both
    # the engine's game is the model game, so the closed form plus the block split is its exact Shapley value
    rng = np.random.default_rng(seed)
    n = 8
    prompts, hashes = _tree_group(rng, n)
    outputs = rng.integers(1, 20, n)
    table = table_with(np.arange(n) * spacing, prompts, outputs, hashes)
    prof = attn_profile()
    pool = serve(table, prof)
    assert pool._ks.pfx[0][0, P_HIT] > 0  # (replica 0's cache was hit)
    law = StepLaw.from_profiles(prof)
    att = prefix_split(pool.log, table, law, 4, players=range(n), scale="none")
    game = ReplayGame(table, prof, prefix_block_tokens=4)
    assert game.own_mode == "replayed"
    phi = exact_shapley(game)
    np.testing.assert_allclose(att.shares, phi, rtol=1e-9)
    assert phi.sum() == pytest.approx(sum(e.energy_j for e in pool.log), rel=1e-12)  # v(N): the busy energy
    # and step sharing on the logged steps alone ("First") is not the Shapley value here
    first = closed_form_for(pool.log, table, law, scale="none")
    assert l1_distance(first, phi) > 1e-3


def test_shares_add_up_to_logged_busy_energy_with_noise():
    rng = np.random.default_rng(5)
    n = 12
    prompts, hashes = _tree_group(rng, n)
    table = table_with(np.sort(rng.uniform(0, 0.3, n)), prompts, rng.integers(1, 20, n), hashes)
    prof = attn_profile()
    pool = Pool(prof, PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0.05, 0.05), log_steps=True,
                                                          prefix_block_tokens=4, seed=3))
    pool.attach(table)
    pool.run_until(1e6)
    logged = sum(e.energy_j for e in pool.log)
    att = prefix_split(pool.log, table, StepLaw.from_profiles(prof), 4)
    assert att.total_j == pytest.approx(logged, rel=1e-12)
    assert np.all(att.shares > 0)
    assert prefix_split(pool.log, table, StepLaw.from_profiles(prof), 4, total_j=7.0).total_j == pytest.approx(7.0)


def test_block_cached_before_the_window_costs_the_window_nothing():
    # A computes blocks 1, 2 before the window; the window holds only B, which hits them
    prof = toy_profile(scheduler=SCHED)
    table = table_with([0.0, 1.0], [10, 10], [1, 1], [[1, 2], [1, 2]])
    pool = serve(table, prof)
    window = [e for e in pool.log if 1 in e.slots]
    att = prefix_split(window, table, StepLaw.from_profiles(prof), 4, players=[1])
    assert att.shares[0] == pytest.approx(1.0 + 0.1 * 2)  # a + the 2 tokens it computed
    assert list(shareable_hashes(table, 1, 4)) == [1, 2]


def test_entries_without_decode_flags_are_refused():
    prof = toy_profile(scheduler=SCHED)
    table = table_with([0.0], [10], [1], [[1, 2]])
    pool = serve(table, prof)
    bare = [dataclasses.replace(e, decode=()) for e in pool.log]
    with pytest.raises(ValueError, match="decode flags"):
        prefix_split(bare, table, StepLaw.from_profiles(prof), 4)


@pytest.mark.parametrize("seed", range(3))
def test_prefix_model_game_closed_form_marginals_and_control_variate(seed):
    # overlapping arrivals (continuous batching): the model game's enumerated Shapley value is prefix_split,
    # its marginals along an order match value differences, and as control variate of the replay game it
    # leaves an unbiased estimate close to the exact replay Shapley value
    rng = np.random.default_rng(100 + seed)
    n = 8
    prompts, hashes = _tree_group(rng, n)
    table = table_with(np.sort(rng.uniform(0, 0.05, n)), prompts, rng.integers(5, 30, n), hashes)
    prof = attn_profile()
    pool = serve(table, prof)
    law = StepLaw.from_profiles(prof)
    game = model_game_for(pool.log, table, law, prefix_block_tokens=4)
    assert isinstance(game, PrefixModelGame)
    np.testing.assert_allclose(exact_shapley(game), game.shapley(), rtol=1e-9)
    np.testing.assert_allclose(game.values_all()[[1, 5, 255]], [game.value(1), game.value(5), game.value(255)])
    perm = rng.permutation(n)
    mask, prev, marg = 0, 0.0, np.zeros(n)
    for i in perm:
        mask |= 1 << int(i)
        v = game.value(mask)
        marg[i] = v - prev
        prev = v
    np.testing.assert_allclose(game.marginals(perm), marg, rtol=1e-9, atol=1e-12)
    replay = ReplayGame(table, prof, prefix_block_tokens=4)
    exact = exact_shapley(replay)
    est = sample_shapley(replay, 30, seed=seed, control=game)
    plain = sample_shapley(replay, 30, seed=seed)
    l1_cf, l1_est = l1_distance(game.shapley(), exact), l1_distance(est.phi, exact)
    assert l1_cf > 0.005  # continuous batching: the closed form alone is off the replay game ...
    assert l1_est < 0.6 * l1_cf  # ... and 30 replayed pairs with the control variate correct it,
    assert l1_est < 0.25 * l1_distance(plain.phi, exact)  # far better than the same pairs without it
