"""Shapley machinery: the four axioms on random small games, sampled estimates (antithetic pairs, control variate
of Proposition 5.2: unbiased, deterministic across workers), the model game's fast marginals, and the
mixture-of-experts split (Eq. 8) against enumeration."""

from __future__ import annotations

import math

import numpy as np
import pytest

from commitenv.attribution import (
    FunctionGame,
    TabularGame,
    exact_shapley,
    marginals,
    moe_game,
    moe_split,
    sample_shapley,
    shapley_from_values,
)
from commitenv.attribution.shapley import members_of


def random_game(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = rng.uniform(0, 10, 1 << n)
    v[0] = 0.0
    return v


def brute_force(values: np.ndarray) -> np.ndarray:
    """Eq. (1) literally: average marginal contribution over all n! orders."""
    n = int(round(math.log2(len(values))))
    import itertools

    phi = np.zeros(n)
    for perm in itertools.permutations(range(n)):
        mask = 0
        for p in perm:
            phi[p] += values[mask | 1 << p] - values[mask]
            mask |= 1 << p
    return phi / math.factorial(n)


@pytest.mark.parametrize("seed", range(3))
def test_subset_formula_matches_permutation_definition(seed):
    v = random_game(5, seed)
    assert shapley_from_values(v) == pytest.approx(brute_force(v), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_efficiency(seed):
    v = random_game(6, seed)
    assert shapley_from_values(v).sum() == pytest.approx(v[-1], rel=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_symmetry(seed):
    n, a, b = 6, 1, 4
    r = random_game(n, seed)

    def swap(s: int) -> int:
        ba, bb = s >> a & 1, s >> b & 1
        s &= ~((1 << a) | (1 << b))
        return s | (bb << a) | (ba << b)

    v = np.array([(r[s] + r[swap(s)]) / 2 for s in range(1 << n)])
    phi = shapley_from_values(v)
    assert phi[a] == pytest.approx(phi[b], rel=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_null_player(seed):
    n, z = 6, 2
    r = random_game(n, seed)
    v = np.array([r[s & ~(1 << z)] for s in range(1 << n)])  # z never changes the value
    phi = shapley_from_values(v)
    assert abs(phi[z]) < 1e-12
    assert phi.sum() == pytest.approx(v[-1], rel=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_additivity(seed):
    v, w = random_game(6, seed), random_game(6, seed + 100)
    assert shapley_from_values(v + w) == pytest.approx(shapley_from_values(v) + shapley_from_values(w), rel=1e-12)


def test_function_game_and_tabular_agree():
    v = random_game(5, 7)
    g = FunctionGame(5, lambda mem: v[sum(1 << i for i in mem)])
    assert exact_shapley(g) == pytest.approx(TabularGame(v).shapley(), rel=1e-12)


def test_sampled_estimate_is_efficient_per_sample():
    v = random_game(7, 3)
    est = sample_shapley(TabularGame(v), 5, seed=1)
    assert est.phi.sum() == pytest.approx(v[-1], rel=1e-12)  # every order's marginals add up to v(N)


def correlated_pair(n: int, seed: int) -> tuple[TabularGame, TabularGame]:
    """A target game and a control that tracks it (additive part + a common interaction) but differs."""
    rng = np.random.default_rng(seed)
    S = np.arange(1 << n)
    bits = ((S[:, None] >> np.arange(n)) & 1).astype(float)
    own = rng.uniform(1, 5, n)
    inter = rng.uniform(0, 3, 1 << n)
    inter[0] = 0
    target = bits @ own + inter + rng.normal(0, 0.5, 1 << n) * (S > 0)
    control = bits @ own + inter
    return TabularGame(target), TabularGame(control)


def test_control_variate_is_unbiased_over_seeds():
    """Mean over 400 deterministic seeds of a 3-pair estimate lands on the exact value within 4 standard errors
    of that mean (the seeds are fixed, so the outcome is too), and the control variate reduces the spread."""
    game, control = correlated_pair(6, 11)
    truth = game.shapley()
    ests = np.array([sample_shapley(game, 3, seed=s, control=control).phi for s in range(400)])
    plain = np.array([sample_shapley(game, 3, seed=s).phi for s in range(400)])
    sem = ests.std(axis=0, ddof=1) / math.sqrt(len(ests))
    assert np.all(np.abs(ests.mean(axis=0) - truth) < 4 * sem)
    sem_plain = plain.std(axis=0, ddof=1) / math.sqrt(len(plain))
    assert np.all(np.abs(plain.mean(axis=0) - truth) < 4 * sem_plain)
    assert np.all(ests.std(axis=0) < plain.std(axis=0))  # the control variate removes the shared variance


def test_stated_error_bar_matches_spread():
    """The per-estimate standard error agrees with the spread of estimates across seeds (within 25 %)."""
    game, control = correlated_pair(6, 12)
    ests = [sample_shapley(game, 20, seed=s, control=control) for s in range(200)]
    spread = np.std([e.phi for e in ests], axis=0, ddof=1)
    stated = np.sqrt(np.mean([e.se**2 for e in ests], axis=0))
    assert np.all(np.abs(stated / spread - 1) < 0.25)


def test_sampling_is_deterministic_and_independent_of_workers():
    game, control = correlated_pair(6, 13)
    a = sample_shapley(game, 12, seed=5, control=control, workers=1)
    b = sample_shapley(game, 12, seed=5, control=control, workers=2)
    c = sample_shapley(game, 12, seed=5, control=control, workers=1)
    assert np.array_equal(a.phi, b.phi) and np.array_equal(a.se, b.se) and np.array_equal(a.phi, c.phi)
    d = sample_shapley(game, 12, seed=6, control=control)
    assert not np.array_equal(a.phi, d.phi)


def test_generic_marginals_follow_the_order():
    v = random_game(4, 2)
    m = marginals(TabularGame(v), np.array([2, 0, 3, 1]))
    assert m[2] == pytest.approx(v[0b0100])
    assert m[0] == pytest.approx(v[0b0101] - v[0b0100])
    assert m[3] == pytest.approx(v[0b1101] - v[0b0101])
    assert m[1] == pytest.approx(v[0b1111] - v[0b1101])


def test_members_of():
    assert members_of(0b10110, 5) == (1, 2, 4)


# ------------------------------------------------------------------------------------------ mixture of experts
def random_routing(n: int, n_steps: int, n_experts: int, seed: int):
    rng = np.random.default_rng(seed)
    steps = []
    for _ in range(n_steps):
        members = [i for i in range(n) if rng.random() < 0.6] or [int(rng.integers(n))]
        steps.append({i: set(rng.choice(n_experts, size=int(rng.integers(1, 4)), replace=False).tolist()) for i in members})
    return steps


@pytest.mark.parametrize("a0", [2.0, lambda m: 1.0 + 0.4 * m - 0.02 * m * m], ids=["const", "a(m)"])
def test_moe_split_equals_enumeration(a0):
    n, X = 7, 8
    steps = random_routing(n, 12, X, 4)
    own = np.random.default_rng(5).uniform(0, 1, n)
    weights = np.random.default_rng(6).integers(1, 4, len(steps)).astype(float)
    kw = dict(n_experts=X, w=3.2, a0=a0, own=own, weights=weights)
    phi = moe_split(steps, n, **kw)
    ref = exact_shapley(moe_game(steps, n, **kw))
    assert phi == pytest.approx(ref, rel=1e-9)
    assert phi.sum() == pytest.approx(moe_game(steps, n, **kw).value((1 << n) - 1), rel=1e-12)


def test_moe_hand_case():
    """One step: A uses experts {0, 1}, B uses {1}; X = 4, w = 4 (1 J per expert), a0 = 2.
    A: 2/2 + 1 (expert 0 alone) + 1/2 (expert 1 shared) = 2.5; B: 1 + 1/2 = 1.5."""
    phi = moe_split([{0: {0, 1}, 1: {1}}], 2, n_experts=4, w=4.0, a0=2.0)
    assert phi.tolist() == pytest.approx([2.5, 1.5])
