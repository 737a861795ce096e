"""Shapley split of an hour's settlement cost (`commitenv.attribution.cost_split`): against a brute force over all
orders written here (a different algorithm from the module's count-vector enumeration) on hand-built hours under,
over and straddling the commitment; the worked example by hand; efficiency, symmetry, null players; the energy
split when every coalition is on one side of E*; the sampled estimate against exact values; and the environment's
hour (``info["attribution"]["hour"]``) on the ePACT H200 hour.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest

from commitenv.attribution import CostSplit, hour_cost_shares
from commitenv.envs import CommitServeEnv

KWH = 3.6e6  # J


def hand_cost(e_j: float, commit_j: float, lp: float, lm: float) -> float:
    """lp [E - E*]+ + lm [E* - E]+ in kWh-eq, written out (the test's own, not the module's)."""
    d = (e_j - commit_j) / KWH
    return lp * d if d > 0 else -lm * d


def brute_shapley(e: list[float], idle: float, commit: float, lp: float, lm: float) -> list[float]:
    """Average over all n! orders of each tenant's marginal cost on top of the idle energy and its predecessors."""
    n = len(e)
    phi = [0.0] * n
    for order in itertools.permutations(range(n)):
        s = idle
        for i in order:
            phi[i] += hand_cost(s + e[i], commit, lp, lm) - hand_cost(s, commit, lp, lm)
            s += e[i]
    return [p / math.factorial(n) for p in phi]


def shares(split: CostSplit) -> np.ndarray:
    return np.array(list(split.tenant_kwh_eq.values()))


def split_of(e_kwh, idle_kwh, commit_kwh, lp=2.0, lm=1.0, **kw) -> CostSplit:
    return hour_cost_shares({f"t{i}": x * KWH for i, x in enumerate(e_kwh)}, idle_kwh * KWH, commit_kwh * KWH,
                            lp, lm, **kw)


def coalition_sides(e_kwh, idle_kwh, commit_kwh) -> set[str]:
    sides = set()
    for r in range(len(e_kwh) + 1):
        for s in itertools.combinations(e_kwh, r):
            x = idle_kwh + sum(s)
            sides.add("over" if x > commit_kwh else "under" if x < commit_kwh else "at")
    return sides


# ------------------------------------------------------------------------------------------ by hand
def test_worked_example_by_hand():
    """Idle 10 kWh, E* 20 kWh, lambdas 2:1, tenants 4 and 2 kWh: under by 4, C = 4. v({}) = 10, v(A) = C(14) = 6,
    v(B) = C(12) = 8, v(AB) = 4: phi_A = ((6-10) + (4-8))/2 = -4, phi_B = ((8-10) + (4-6))/2 = -2."""
    s = hour_cost_shares({"A": 4 * KWH, "B": 2 * KWH}, 10 * KWH, 20 * KWH, 2.0, 1.0)
    assert s.cost_kwh_eq == pytest.approx(4.0, abs=1e-12)
    assert s.idle_kwh_eq == pytest.approx(10.0, abs=1e-12)
    assert s.tenant_kwh_eq["A"] == pytest.approx(-4.0, abs=1e-12)
    assert s.tenant_kwh_eq["B"] == pytest.approx(-2.0, abs=1e-12)
    assert s.exact and s.se_kwh_eq is None and s.method == "linear"
    # the energy split it replaces: 4 x 4/16 = 1.0, 4 x 2/16 = 0.5, idle 4 x 10/16 = 2.5
    assert (4 * 4 / 16, 4 * 2 / 16, 4 * 10 / 16) == (1.0, 0.5, 2.5)


def test_straddling_example_by_hand():
    """Same hour, tenants 8 and 6 kWh: over by 4, C = 8. v({}) = 10, v(A) = C(18) = 2, v(B) = C(16) = 4,
    v(AB) = C(24) = 8: phi_A = ((2-10) + (8-4))/2 = -2, phi_B = ((4-10) + (8-2))/2 = 0."""
    s = hour_cost_shares({"A": 8 * KWH, "B": 6 * KWH}, 10 * KWH, 20 * KWH, 2.0, 1.0)
    assert s.cost_kwh_eq == pytest.approx(8.0, abs=1e-12)
    assert s.idle_kwh_eq == pytest.approx(10.0, abs=1e-12)
    assert s.tenant_kwh_eq["A"] == pytest.approx(-2.0, abs=1e-12)
    assert s.tenant_kwh_eq["B"] == pytest.approx(0.0, abs=1e-12)
    assert s.exact and s.method == "enumeration"


# ------------------------------------------------------------------------------------------ brute force
HOURS = {  # tenants (kWh), idle (kWh), E* (kWh), lambda_plus, lambda_minus
    "under": ([1.2, 0.4, 2.5, 0.9], 3.0, 12.0, 2.0, 1.0),
    "over": ([1.2, 0.4, 2.5, 0.9, 3.1], 6.0, 5.0, 2.0, 1.0),
    "straddle": ([1.2, 0.4, 2.5, 0.9, 3.1, 1.7], 3.0, 7.3, 2.0, 1.0),
    "straddle-ties": ([1.5, 0.7, 1.5, 2.2, 0.7, 1.5], 1.0, 5.6, 3.0, 0.5),
    "straddle-lopsided": ([0.05, 6.0, 0.3, 0.05, 2.0], 0.5, 6.6, 1.0, 4.0),
    "straddle-kink-at-a-coalition": ([1.0, 2.0, 3.0], 1.0, 4.0, 2.0, 1.0),  # idle + 1 + 2 = E* exactly
}


@pytest.mark.parametrize("case", sorted(HOURS))
def test_matches_brute_force_over_all_orders(case):
    e, idle, commit, lp, lm = HOURS[case]
    s = split_of(e, idle, commit, lp, lm)
    ref = brute_shapley([x * KWH for x in e], idle * KWH, commit * KWH, lp, lm)
    assert s.exact and s.se_kwh_eq is None
    np.testing.assert_allclose(shares(s), ref, rtol=0, atol=1e-12)
    assert s.idle_kwh_eq == pytest.approx(hand_cost(idle * KWH, commit * KWH, lp, lm), abs=1e-12)
    sides = coalition_sides(e, idle, commit)
    if case.startswith("straddle"):
        assert {"over", "under"} <= sides and s.method == "enumeration"
    else:
        assert sides == {case} and s.method == "linear"


def test_under_used_hour_credits_the_energy_that_cut_the_penalty():
    """The issue's complaint: in an under-used hour more energy means less penalty, so a tenant's share is a credit
    that grows with its energy (the energy split charged it more instead)."""
    e, idle, commit, lp, lm = HOURS["under"]
    s = shares(split_of(e, idle, commit, lp, lm))
    assert np.all(s < 0)
    assert np.array_equal(np.argsort(s), np.argsort(-np.array(e)))


# ------------------------------------------------------------------------------------------ axioms
def random_hours(n_cases=40, seed=3):
    rng = np.random.default_rng(seed)
    for _ in range(n_cases):
        n = int(rng.integers(1, 9))
        e = rng.uniform(0.0, 3.0, n)
        idle = float(rng.uniform(0.0, 6.0))
        commit = idle + float(rng.uniform(-0.3, 1.3)) * float(e.sum())
        yield e, idle, max(commit, 0.1), float(rng.uniform(0.5, 3)), float(rng.uniform(0.5, 3))


def test_efficiency_shares_plus_idle_is_the_settlement_cost():
    for e, idle, commit, lp, lm in random_hours():
        s = split_of(e, idle, commit, lp, lm)
        c = hand_cost((idle + e.sum()) * KWH, commit * KWH, lp, lm)
        assert s.cost_kwh_eq == pytest.approx(c, abs=1e-12)
        assert math.fsum(s.tenant_kwh_eq.values()) + s.idle_kwh_eq == pytest.approx(c, abs=1e-12)


def test_symmetry_equal_energies_equal_shares():
    e = [1.3, 0.6, 1.3, 2.0, 1.3, 0.6]
    for idle, commit in [(1.0, 4.5), (1.0, 7.0), (2.0, 5.1)]:
        s = shares(split_of(e, idle, commit))
        assert s[0] == s[2] == s[4] and s[1] == s[5]
    s = shares(split_of([0.9] * 11, 1.0, 6.0))
    assert np.all(s == s[0])
    total = hand_cost(10.9 * KWH, 6 * KWH, 2, 1) - hand_cost(1.0 * KWH, 6 * KWH, 2, 1)
    assert s[0] == pytest.approx(total / 11, abs=1e-12)  # symmetry + efficiency


def test_dummy_zero_energy_tenant_gets_zero_and_changes_nobody():
    e, idle, commit, lp, lm = HOURS["straddle"]
    with_dummy = split_of(e[:3] + [0.0] + e[3:], idle, commit, lp, lm)
    without = split_of(e, idle, commit, lp, lm)
    assert with_dummy.tenant_kwh_eq["t3"] == 0.0
    s = shares(with_dummy)
    np.testing.assert_allclose(np.delete(s, 3), shares(without), rtol=0, atol=1e-12)
    assert with_dummy.idle_kwh_eq == without.idle_kwh_eq
    only_dummies = split_of([0.0, 0.0], idle, commit, lp, lm)
    assert only_dummies.tenant_kwh_eq == {"t0": 0.0, "t1": 0.0} and only_dummies.method == "none"
    assert only_dummies.idle_kwh_eq == only_dummies.cost_kwh_eq == pytest.approx(hand_cost(idle * KWH, commit * KWH,
                                                                                            lp, lm))
    empty = hour_cost_shares({}, 5 * KWH, 4 * KWH, 2.0, 1.0)
    assert empty.tenant_kwh_eq == {} and empty.idle_kwh_eq == pytest.approx(2.0)


@pytest.mark.parametrize("idle, commit", [(2.0, 11.0), (2.0, 8.3), (9.0, 8.0), (8.0, 8.0)])
def test_all_coalitions_on_one_side_is_the_energy_split(idle, commit):
    """C is linear over every coalition: each tenant pays its energy's part of v(N) - v({}) (lambda_plus or
    -lambda_minus per kWh); (2, 8.3): idle + all = E* exactly."""
    e = np.array([1.2, 0.4, 2.5, 0.9, 1.3])
    s = split_of(e, idle, commit)
    assert s.method == "linear" and s.exact
    v0 = hand_cost(idle * KWH, commit * KWH, 2, 1)
    vn = hand_cost((idle + e.sum()) * KWH, commit * KWH, 2, 1)
    np.testing.assert_allclose(shares(s), (vn - v0) * e / e.sum(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(shares(s), brute_shapley(list(e * KWH), idle * KWH, commit * KWH, 2, 1), atol=1e-12)
    rate = 2.0 if idle >= commit else -1.0
    np.testing.assert_allclose(shares(s), rate * e, rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------ larger games
def test_seventeen_distinct_tenants_are_exact_eighteen_are_sampled():
    """17 distinct energies: 2**17 coalitions x 17 groups fit the default grid; 18 do not."""
    rng = np.random.default_rng(7)
    e = rng.uniform(0.1, 1.0, 18)
    for n in (16, 17):
        t0 = time.process_time()  # CPU time, which a loaded machine does not stretch (wall time it does)
        s = split_of(e[:n], 1.0, 1.0 + 0.5 * e[:n].sum())
        assert s.exact and s.method == "enumeration" and time.process_time() - t0 < 5
        assert math.fsum(s.tenant_kwh_eq.values()) + s.idle_kwh_eq == pytest.approx(s.cost_kwh_eq, abs=1e-12)
    s18 = split_of(e, 1.0, 1.0 + 0.5 * e.sum())
    assert not s18.exact and s18.method == "sampled" and set(s18.se_kwh_eq) == set(s18.tenant_kwh_eq)
    assert all(v > 0 for v in s18.se_kwh_eq.values())
    # every sampled order's marginals telescope, so the sampled split is efficient too
    assert math.fsum(s18.tenant_kwh_eq.values()) + s18.idle_kwh_eq == pytest.approx(s18.cost_kwh_eq, abs=1e-12)
    # a 17-tenant exact split, sampled: within 4 standard errors (E* off the middle: with the kink exactly half
    # way, an order and its reverse always add up to the same marginals and the antithetic estimate is exact)
    exact = shares(split_of(e[:17], 1.0, 1.0 + 0.3 * e[:17].sum()))
    est = split_of(e[:17], 1.0, 1.0 + 0.3 * e[:17].sum(), max_grid=0)
    se = np.array(list(est.se_kwh_eq.values()))
    assert np.all(se > 1e-4) and np.all(np.abs(shares(est) - exact) <= 4 * se)


@pytest.mark.parametrize("case", ["straddle", "straddle-ties", "straddle-lopsided"])
def test_sampled_estimate_within_four_standard_errors_of_exact(case):
    e, idle, commit, lp, lm = HOURS[case]
    exact = shares(split_of(e, idle, commit, lp, lm))
    est = split_of(e, idle, commit, lp, lm, max_grid=0, n_pairs=2000, seed=11)  # force sampling
    assert not est.exact and est.method == "sampled"
    se = np.array(list(est.se_kwh_eq.values()))
    assert np.all(se > 1e-4)  # a real test: no order pair here gives every tenant the same marginals
    assert np.all(np.abs(shares(est) - exact) <= 4 * se + 1e-12)  # + rounding where no order changes a marginal
    assert math.fsum(est.tenant_kwh_eq.values()) + est.idle_kwh_eq == pytest.approx(est.cost_kwh_eq, abs=1e-12)
    if case == "straddle-ties":  # pooled within equal-energy groups
        s = shares(est)
        assert s[0] == s[2] == s[5] and s[1] == s[4]
    again = split_of(e, idle, commit, lp, lm, max_grid=0, n_pairs=2000, seed=11)
    assert again == est  # deterministic from the seed


@pytest.mark.parametrize("counts, vals", [((10, 10, 10, 10), (0.3, 0.7, 1.1, 0.05)), ((600, 601), (0.01, 0.03))])
def test_many_tenants_with_few_distinct_energies_are_exact(counts, vals):
    """Equal-energy groups collapse the enumeration to count vectors: 40 tenants (11**4 vectors), and 1201 (the
    log-space weights), checked by efficiency, symmetry and the sampled estimate."""
    e = np.repeat(vals, counts)
    idle = 2.0
    commit = idle + 0.55 * float(e.sum())
    s = split_of(e, idle, commit)
    assert s.exact and s.method == "enumeration"
    phi = shares(s)
    assert math.fsum(phi) + s.idle_kwh_eq == pytest.approx(s.cost_kwh_eq, abs=1e-10)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    for a, c in zip(starts, counts):
        assert np.all(phi[a:a + c] == phi[a])
    est = split_of(e, idle, commit, max_grid=0, n_pairs=300 if len(e) > 100 else 2000, seed=5)
    se = np.array(list(est.se_kwh_eq.values()))
    assert np.all(se > 0) and np.all(np.abs(shares(est) - phi) <= 4 * se)


def test_rejects_bad_energies():
    with pytest.raises(ValueError, match=">= 0"):
        hour_cost_shares({"a": -1.0}, 0.0, 1.0, 2.0, 1.0)
    with pytest.raises(ValueError, match="finite"):
        hour_cost_shares({"a": math.nan}, 0.0, 1.0, 2.0, 1.0)


# ------------------------------------------------------------------------------------------ environment
def test_env_hour_cost_is_the_shapley_split_of_its_tenants():
    env = CommitServeEnv("epact-h200-hour-fixed-a30", attribution=True)
    env.reset(seed=0)
    top = len(env.clocks_mhz) - 1
    terminated, k, info = False, 0, {}
    while not terminated:  # one hour of 60 intervals; few replicas at first, then all of them
        _, _, terminated, _, info = env.step({"active": 4 if k < 30 else env.n_replicas, "clock": top})
        k += 1
    hr, st = info["attribution"]["hour"], info["settlement"]
    assert hr["energy_j"] == pytest.approx(st["energy_j"], rel=1e-12)  # realism ideal: one meter
    assert hr["cost_kwh_eq"] == st["cost_kwh_eq"] > 0
    assert math.fsum(hr["tenant_cost_kwh_eq"].values()) + hr["idle_cost_kwh_eq"] == pytest.approx(
        hr["cost_kwh_eq"], rel=1e-12)
    ref = hour_cost_shares(hr["tenant_j"], hr["idle_j"], st["commitment_j"], env.scenario.lambda_plus,
                           env.scenario.lambda_minus)
    assert ref.exact and hr["tenant_cost_se_kwh_eq"] is None
    assert hr["idle_cost_kwh_eq"] == pytest.approx(ref.idle_kwh_eq, rel=1e-12)
    assert set(hr["tenant_cost_kwh_eq"]) == set(hr["tenant_j"]) and hr["tenant_j"]
    for name, c in hr["tenant_cost_kwh_eq"].items():
        assert c == pytest.approx(ref.tenant_kwh_eq[name], rel=1e-9, abs=1e-12)
    # the idle share is what the idle energy alone would have settled at
    assert hr["idle_cost_kwh_eq"] == pytest.approx(hand_cost(hr["idle_j"], st["commitment_j"], 2.0, 1.0), rel=1e-12)
