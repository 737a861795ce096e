"""The scheduler-replay game on the real engine: coalition values are engine runs of the sub-workload, the full
coalition reproduces the logged run, exact enumeration (255 coalitions for 8 requests) against the sampled
estimate with the model-game control variate, the router replayed with several replicas, and baselines."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.profiles import toy_profile

from commitenv.attribution import (
    ReplayGame,
    StepLaw,
    closed_form_for,
    decompose,
    exact_shapley,
    l1_distance,
    model_game_for,
    replay_shapley,
    sample_shapley,
    solo_split,
    token_split,
)
from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
from commitenv.workload.table import make_table


def window(n=8, seed=1, span=0.15):
    rng = np.random.default_rng(seed)
    return make_table(np.sort(rng.uniform(0, span, n)), rng.integers(2, 12, n), rng.integers(2, 8, n))


def serve(table, n_gpus=1, profile=None):
    pool = Pool(profile or toy_profile(), PoolLayout.single(n_gpus), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(table)
    pool.run_until(np.inf)
    return pool


@pytest.fixture(scope="module")
def case():
    table = window()
    prof = toy_profile()
    pool = serve(table)
    law = StepLaw.from_profiles(prof)
    game = ReplayGame(table, prof)
    exact = exact_shapley(game)
    return table, prof, pool, law, game, exact


def test_full_coalition_reproduces_the_logged_run(case):
    table, prof, pool, law, game, _ = case
    logged = sum(e.energy_j for e in pool.log)
    assert game.value((1 << 8) - 1) == pytest.approx(logged, rel=1e-12)
    st = decompose(pool.log, table, law, players=range(8))
    assert game.own == pytest.approx(st.own_per_player(), rel=1e-12)


def test_coalition_value_is_an_engine_run_of_the_subworkload(case):
    table, prof, _, law, game, _ = case
    members = [1, 4, 5, 7]
    sub = serve(table.take(np.array(members)))
    want = sum(e.energy_j for e in sub.log)  # noise off: the engine's step energies are the law's
    assert game.value(sum(1 << i for i in members)) == pytest.approx(want, rel=1e-12)
    for i in range(8):
        alone = serve(table.take(np.array([i])))
        assert game.value(1 << i) == pytest.approx(sum(e.energy_j for e in alone.log), rel=1e-12)


def test_exact_enumeration_counts_and_efficiency(case):
    table, prof, pool, law, game, exact = case
    assert game.counters["replays"] >= 255
    assert exact.sum() == pytest.approx(sum(e.energy_j for e in pool.log), rel=1e-12)
    assert game.replay_ms > 0
    # the replay matters here: the logged timeline is not the coalitions' own (Figure 8)
    assert l1_distance(closed_form_for(pool.log, table, law).shares, exact) > 0.02


def test_sampled_replay_estimate_matches_exact(case):
    table, prof, pool, law, game, exact = case
    control = model_game_for(pool.log, table, law)
    est = sample_shapley(game, 20000, seed=7, control=control)
    assert est.l1_noise() < 0.001  # the stated error bar
    assert l1_distance(est.phi, exact) < 0.002
    assert est.phi.sum() == pytest.approx(exact.sum(), rel=1e-12)


def test_replay_shapley_dispatch_and_normalisation(case):
    table, prof, pool, law, game, exact = case
    res = replay_shapley(game, total_j=100.0)
    assert res.exact and res.law_phi == pytest.approx(exact, rel=1e-12)
    assert res.attribution.total_j == pytest.approx(100.0)
    assert res.attribution.players.tolist() == list(range(8))
    res2 = replay_shapley(game, control=model_game_for(pool.log, table, law), exact=False, n_pairs=50, seed=2)
    assert not res2.exact and res2.estimate is not None and res2.attribution.se is not None


def test_exact_enumeration_in_parallel_is_identical():
    table = window(6, 3)
    a = exact_shapley(ReplayGame(table, toy_profile()))
    g = ReplayGame(table, toy_profile())
    b = exact_shapley(g, workers=2)
    assert np.array_equal(a, b)
    assert g.counters["replays"] == 63  # every non-empty coalition once, counted back from the workers


def test_router_is_replayed_with_two_replicas():
    """Two GPUs behind the least-loaded router: every coalition's value is a two-replica engine run, and the
    full coalition reproduces the logged run's routing and energy."""
    table = window(7, 4, span=0.05)
    prof = toy_profile()
    layout = PoolLayout.single(2)
    pool = serve(table, n_gpus=2)
    assert len(set(pool.replica_of.tolist())) == 2
    game = ReplayGame(table, prof, layout)
    assert game.value((1 << 7) - 1) == pytest.approx(sum(e.energy_j for e in pool.log), rel=1e-12)
    members = [0, 2, 3, 6]
    sub = serve(table.take(np.array(members)), n_gpus=2)
    assert game.value(sum(1 << i for i in members)) == pytest.approx(sum(e.energy_j for e in sub.log), rel=1e-12)


def test_clock_action_is_replayed():
    table = window(5, 5)
    prof = toy_profile()
    game = ReplayGame(table, prof, actions=[("clock", 0.05, 500)], law=StepLaw.from_profiles(prof, clock_mhz=1000))
    pool = Pool(prof, PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(table)
    pool.run_until(0.05)
    pool.set_clock(0.05, 500)
    pool.run_until(np.inf)
    n_steps = sum(e.n_steps for e in pool.log)
    full = game.serve(range(5))
    assert [(e.t0, e.slots) for e in full.log] == [(e.t0, e.slots) for e in pool.log]
    assert game.value((1 << 5) - 1) == pytest.approx(game.own.sum() + 1.0 * n_steps, rel=1e-12)


def test_baselines_token_and_solo(case):
    table, prof, pool, law, game, exact = case
    total = exact.sum()
    tok = token_split(table.prompt_tokens, table.output_tokens, total)
    w = table.prompt_tokens + 5 * table.output_tokens
    assert tok.shares == pytest.approx(total * w / w.sum())
    solo = solo_split(game, total)
    alone = np.array([game.value(1 << i) for i in range(8)])
    assert solo.shares == pytest.approx(total * alone / alone.sum())
    assert solo.total_j == pytest.approx(total)


def test_own_mode_replayed_matches_fixed_without_preemption(case):
    table, prof, _, _, _, _ = case
    g = ReplayGame(table, prof, own_mode="replayed")
    f = ReplayGame(table, prof)
    for mask in (0b1, 0b10110, 0b11111111, 0b10000001):
        assert g.value(mask) == pytest.approx(f.value(mask), rel=1e-12)
