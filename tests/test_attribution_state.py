"""Windows of a continuous service with the engine state at their start held fixed (StepSplit section 7):
``v(S) = E(state + S) - E(state)``; the model games' closed form against enumeration, a hand-computed window
whose request only joins steps that run anyway, and the window-by-window correction using the state."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import toy_profile

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
    # one replica; windows of 4: the second window starts while requests of the first still run
    rng = np.random.default_rng(7)
    n = 8
    prof = toy_profile(scheduler=SCHED)
    table = make_table(np.sort(rng.uniform(0, 0.3, n)), rng.integers(1, 30, n), rng.integers(20, 60, n))
    pool = serve(table, prof)
    bills = np.full(n, 1.0)
    kw = dict(finish_s=pool.finish_t, window=4, n_pairs=10)
    held = replay_correction(table, bills, prof, pool.replica_of, **kw)
    fresh = replay_correction(table, bills, prof, pool.replica_of, hold_state=False, **kw)
    # the first window has no earlier requests: the same either way; windows keep their totals
    np.testing.assert_allclose(held.shares[:4], fresh.shares[:4])
    assert held.shares[4:].sum() == pytest.approx(4.0) and fresh.shares[4:].sum() == pytest.approx(4.0)
    running = np.flatnonzero(pool.finish_t[:4] > table.arrival_s[4])
    assert len(running) > 0
    # by hand: the second window's exact game with the running requests always present
    sub = table.take(np.concatenate([running, np.arange(4, 8)]))
    phi = exact_shapley(FixedStateGame(ReplayGame(sub, prof), len(running)))
    np.testing.assert_allclose(held.shares[4:], phi * 4.0 / phi.sum(), rtol=1e-9)
    assert not np.allclose(held.shares[4:], fresh.shares[4:])


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
