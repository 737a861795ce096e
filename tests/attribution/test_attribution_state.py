"""Windows of a continuous service with the engine state at their start held fixed (StepSplit section 7):
``v(S) = E(state + S) - E(state)``; the model games' closed form against enumeration, a hand-computed window
whose request only joins steps that run anyway, and the window-by-window correction using the state."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers.profiles import toy_profile

from commitenv.attribution import ReplayGame, StepLaw, exact_shapley, model_game_for, sample_shapley
from commitenv.attribution.shapley import FixedStateGame, TabularGame
from commitenv.attribution.windows import replay_correction
from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
from commitenv.workload.table import make_table

SCHED = dict(token_budget=64, max_seqs=16, context_limit=128, block_size=4, kv_capacity_tokens=4096)


def serve(table, prof):
    pool = Pool(prof, PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(table)
    pool.run_until(1e6)
    return pool


def test_fixed_state_game_is_the_difference_game():
    rng = np.random.default_rng(0)
    inner = TabularGame(np.concatenate([[0.0], rng.uniform(1, 5, 31)]))
    g = FixedStateGame(inner, 2)
    assert g.n == 3
    for mask in range(8):
        expect = 0.0 if mask == 0 else inner.values[(mask << 2) | 3] - inner.values[3]
        assert g.value(mask) == pytest.approx(expect)


@pytest.mark.parametrize("seed", range(3))
def test_model_game_with_fixed_state_closed_form_equals_enumeration(seed):
    rng = np.random.default_rng(seed)
    n = 9
    prof = toy_profile(scheduler=SCHED)
    table = make_table(np.sort(rng.uniform(0, 0.1, n)), rng.integers(1, 30, n), rng.integers(2, 25, n))
    pool = serve(table, prof)
    game = model_game_for(pool.log, table, StepLaw.from_profiles(prof))
    fixed = FixedStateGame(game, 3)
    np.testing.assert_allclose(fixed.shapley(), exact_shapley(fixed), rtol=1e-9)
    # marginals along an order agree with value differences
    perm = rng.permutation(fixed.n)
    mask, prev = 0, 0.0
    marg = np.zeros(fixed.n)
    for i in perm:
        mask |= 1 << int(i)
        v = fixed.value(mask)
        marg[i], prev = v - prev, v
    np.testing.assert_allclose(fixed.marginals(perm), marg, rtol=1e-9, atol=1e-12)


def test_fixed_state_closed_form_with_a_shared_energy_that_grows_with_the_step():
    # a(m) = 1 + 0.2 m (mixture-of-experts style): a cost's non-fixed members split what they add on top of
    # the fixed members, a(f + p) - a(f); checked against enumeration
    rng = np.random.default_rng(4)
    n = 9
    prof = toy_profile(scheduler=SCHED)
    table = make_table(np.sort(rng.uniform(0, 0.1, n)), rng.integers(1, 30, n), rng.integers(2, 25, n))
    pool = serve(table, prof)
    law = StepLaw.from_profiles(prof, shared_fn=lambda m: 1.0 + 0.2 * m)
    fixed = FixedStateGame(model_game_for(pool.log, table, law), 3)
    np.testing.assert_allclose(fixed.shapley(), exact_shapley(fixed), rtol=1e-9)


def test_request_joining_steps_that_run_anyway_pays_only_its_own_energy():
    # B (background) decodes 50 tokens from t = 0; P arrives at 0.1 s, prefills 4 tokens inside one of B's
    # steps and decodes 2 more tokens alongside B: it adds no step. Toy law: c1 = 0.1, b = 0.01, kappa = 0.001.
    prof = toy_profile(scheduler=SCHED)
    table = make_table([0.0, 0.1], [4, 4], [50, 3])
    inner = ReplayGame(table, prof)
    own_p = 0.1 * 4 + 2 * 0.01 + 0.001 * (5 + 6)
    assert FixedStateGame(inner, 1).value(1) == pytest.approx(own_p, abs=1e-12)
    # served alone on an idle engine it would also pay the shared energy of its 3 steps (a = 1 each)
    assert ReplayGame(table.take(np.array([1])), prof).value(1) == pytest.approx(own_p + 3.0, abs=1e-12)


def test_replay_correction_holds_the_running_requests_fixed():
    # windows of 2 on one replica: {X0, X1}, then {P, Q}. X1 decodes 200 tokens from t = 0.001 s; P arrives at
    # 0.5 s while X1 runs and finishes before it; Q arrives at 10 s on an idle replica. Toy law a = 1,
    # c1 = 0.1, b = 0.01, kappa = 0.001. Holding X1 fixed, P adds no step: v({P}) = own_P = 0.431 J; Q pays
    # its own energy and the shared energy of its 3 steps: 3.431 J; they never meet, so phi = v({i}).
    prof = toy_profile(scheduler=SCHED)
    table = make_table([0.0, 0.001, 0.5, 10.0], [4, 4, 4, 4], [2, 200, 3, 3])
    pool = serve(table, prof)
    assert pool.finish_t[2] < pool.finish_t[1] < 10.0
    bills = np.array([1.0, 1.0, 2.0, 3.0])
    held = replay_correction(table, bills, prof, pool.replica_of, finish_s=pool.finish_t, window=2, n_pairs=2)
    phi = np.array([0.431, 3.431])
    np.testing.assert_allclose(held.shares[2:], phi * 5.0 / phi.sum(), rtol=1e-9)
    # served from an idle engine instead, P also pays the shared energy of its 3 steps
    fresh = replay_correction(table, bills, prof, pool.replica_of, finish_s=pool.finish_t, window=2, n_pairs=2,
                              hold_state=False)
    np.testing.assert_allclose(fresh.shares[2:], [2.5, 2.5], rtol=1e-9)


def test_window_finds_the_prefixes_cached_before_it():
    # windows {A0, A1}, {B, C}; B holds A0's 7 blocks of 4 tokens, C holds none; all done before B and C
    # arrive together at 5 s. With A0 in the held state, B computes 2 tokens and C 30, in one prefill step
    # and one decode step (context 31) each: v(B) = 0.2 + 0.041 + 2 = 2.241, v(C) = 3.0 + 0.041 + 2 = 5.041,
    # v(BC) = 3.2 + 0.082 + 2 = 5.282, so phi = (1.241, 4.041), scaled to the window's bills.
    prof = toy_profile(scheduler=SCHED)
    hs = [[1, 2, 3, 4, 5, 6, 7], [], [1, 2, 3, 4, 5, 6, 7], [90, 91, 92, 93, 94, 95, 96]]
    offs = np.concatenate([[0], np.cumsum([len(h) for h in hs])]).astype(np.int64)
    table = dataclasses.replace(make_table([0.0, 0.0, 5.0, 5.0], [30, 8, 30, 30], [2, 2, 2, 2]),
                                prefix_offsets=offs, prefix_hashes=np.asarray(sum(hs, []), dtype=np.int64))
    pool = Pool(prof, PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True,
                                                          prefix_block_tokens=4))
    pool.attach(table)
    pool.run_until(1e6)
    bills = np.array([1.0, 1.0, 3.0, 4.0])
    wc = replay_correction(table, bills, prof, pool.replica_of, finish_s=pool.finish_t, window=2, n_pairs=2,
                           prefix_block_tokens=4)
    phi = np.array([1.241, 4.041])
    np.testing.assert_allclose(wc.shares[2:], phi * 7.0 / phi.sum(), rtol=1e-9)


def test_closed_form_of_a_replay_game_is_refused_clearly():
    prof = toy_profile(scheduler=SCHED)
    game = FixedStateGame(ReplayGame(make_table([0.0, 0.1], [4, 4], [3, 3]), prof), 1)
    with pytest.raises(TypeError, match="no closed-form"):
        game.shapley()


def test_sampled_estimate_with_state_uses_the_fixed_control():
    rng = np.random.default_rng(3)
    n = 10
    prof = toy_profile(scheduler=SCHED)
    table = make_table(np.sort(rng.uniform(0, 0.2, n)), rng.integers(1, 30, n), rng.integers(5, 40, n))
    pool = serve(table, prof)
    inner = ReplayGame(table, prof)
    game = FixedStateGame(inner, 4)
    control = FixedStateGame(model_game_for(pool.log, table, inner.law), 4)
    exact = exact_shapley(game)
    est = sample_shapley(game, 20, seed=1, control=control)
    plain = sample_shapley(game, 20, seed=1)
    err = lambda x: np.abs(x - exact).sum() / exact.sum()
    assert err(est.phi) < err(plain.phi)
    assert est.phi.sum() == pytest.approx(exact.sum(), rel=1e-9)  # efficiency holds per permutation


def test_sampled_window_with_state_agrees_with_the_exact_window():
    # 16 overlapping requests on one replica, windows of 8: the second starts while the first still runs.
    # 15 pairs take the sampled branch (with the held state in game and control), 16 the exact one.
    rng = np.random.default_rng(11)
    n = 16
    prof = toy_profile(scheduler=SCHED)
    table = make_table(np.sort(rng.uniform(0, 0.4, n)), rng.integers(1, 30, n), rng.integers(20, 60, n))
    pool = serve(table, prof)
    assert np.any(pool.finish_t[:8] > table.arrival_s[8])
    bills = np.linspace(1.0, 2.0, n)
    kw = dict(finish_s=pool.finish_t, window=8)
    sampled = replay_correction(table, bills, prof, pool.replica_of, n_pairs=15, **kw)
    exact = replay_correction(table, bills, prof, pool.replica_of, n_pairs=16, **kw)
    assert sampled.exact_windows == 0 and exact.exact_windows == 2
    for lo, hi in ((0, 8), (8, 16)):
        assert sampled.shares[lo:hi].sum() == pytest.approx(bills[lo:hi].sum())
        l1 = np.abs(sampled.shares[lo:hi] - exact.shares[lo:hi]).sum() / bills[lo:hi].sum()
        assert l1 < 0.05
        assert l1 <= 4 * np.sqrt(2 / np.pi) * sampled.se[lo:hi].sum() / bills[lo:hi].sum() + 1e-6
