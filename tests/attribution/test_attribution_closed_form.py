"""Step sharing (Proposition 5.1) on step logs: equal to brute-force enumeration of the model game for static and
continuous batching logs of the real engine; a hand-built timeline in the style of the paper's Figure 3;
decode runs expanded analytically; chunked prefill telescoping; the law matching the engine's own step energy
(decode vs one-token prefill chunks, preemption); per-segment scaling to logged (noisy) energy."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.profiles import toy_profile

from commitenv.attribution import (
    ModelGame,
    StepLaw,
    closed_form,
    closed_form_from_log,
    decompose,
    exact_shapley,
    time_sharing_split,
)
from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout, StepLogEntry
from commitenv.sim.coeffs import StepCoeffs
from commitenv.workload.table import make_table


def c2_profile(**sched):
    """The toy profile with a prefill attention term (c2, tau4 > 0) so chunk telescoping is exercised."""
    clocks = [c.model_dump() for c in toy_profile().clocks]
    clocks[1]["time"]["tau4"] = 1e-6
    clocks[1]["energy"]["c2"] = 0.002
    return toy_profile(clocks=clocks, scheduler=sched) if sched else toy_profile(clocks=clocks)


def run(profile, arrivals, prompts, outputs, *, noise=False, closed=True, n_gpus=1, seed=0):
    opts = EngineOptions(noise=NoiseSpec() if noise else NoiseSpec(0, 0), log_steps=True, closed_form=closed, seed=seed)
    pool = Pool(profile, PoolLayout.single(n_gpus), opts)
    table = make_table(arrivals, prompts, outputs)
    pool.attach(table)
    pool.run_until(np.inf)
    return pool, table


def static_batch(n=8, seed=0):
    """All requests at t = 0 with a budget that prefills every prompt in the first step."""
    prof = c2_profile(token_budget=512, max_seqs=16, kv_capacity_tokens=2048, context_limit=64)
    rng = np.random.default_rng(seed)
    return run(prof, np.zeros(n), rng.integers(3, 30, n), rng.integers(1, 25, n))


def continuous_batch(n=8, seed=0, **kw):
    """Staggered arrivals on the toy budget (8 tokens, 4 sequences): chunked prefill, queueing, runs."""
    rng = np.random.default_rng(seed)
    return run(c2_profile(), np.sort(rng.uniform(0, 0.3, n)), rng.integers(2, 20, n), rng.integers(1, 12, n), **kw)


def law_of(profile):
    return StepLaw.from_profiles(profile)


@pytest.mark.parametrize("shared_fn", [None, lambda m: 0.7 + 0.3 * m - 0.01 * m * m], ids=["a", "a(m)"])
@pytest.mark.parametrize("make", [static_batch, continuous_batch], ids=["static", "continuous"])
@pytest.mark.parametrize("seed", [0, 1])
def test_closed_form_equals_enumeration(make, seed, shared_fn):
    pool, table = make(8, seed)
    assert len({s for e in pool.log for s in e.slots}) == 8
    law = StepLaw.from_profiles(pool.profiles[0], shared_fn=shared_fn)
    steps = decompose(pool.log, table, law, players=range(8))
    for scale in ("none", "step"):
        game = ModelGame(steps, scale=scale)
        cf = closed_form(steps, scale=scale).shares
        brute = exact_shapley(game)
        assert np.max(np.abs(cf - brute)) <= 1e-9 * np.max(np.abs(brute))
        assert cf.sum() == pytest.approx(game.value((1 << 8) - 1), rel=1e-12)


def test_static_batch_is_the_airport_game():
    """Under static batching request i is in steps 1..d_i, so its shared part is sum_{k<=d_i} a/m_k with m_k the
    number of requests with d_j >= k."""
    pool, table = static_batch(8, 3)
    out = table.output_tokens
    steps = decompose(pool.log, table, law_of(pool.profiles[0]), players=range(8))
    att = closed_form(steps, scale="none")
    a = pool.profiles[0].clocks[1].energy.a
    for i in range(8):
        want = sum(a / np.sum(out >= k) for k in range(1, out[i] + 1))
        assert att.shared[i] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("make", [static_batch, continuous_batch], ids=["static", "continuous"])
def test_law_reproduces_engine_step_energy(make):
    """Noise off: the law's energy of every logged segment equals the engine's (decode vs prefill classified as
    the engine does, runs expanded in closed form)."""
    for seed in range(4):
        pool, table = make(10, seed)
        st = decompose(pool.log, table, law_of(pool.profiles[0]))
        assert st.law_j == pytest.approx(st.logged_j, rel=1e-12, abs=1e-12)
        assert st.total_steps > len(pool.log) or make is continuous_batch


def test_law_matches_engine_with_preemption_and_one_token_chunks():
    """The preemption scenario of test_engine_preemption (recompute chunks, a 1-token prefill chunk)."""
    pool, table = run(toy_profile(), [0.0, 0.0005, 0.2], [24, 8, 2], [24, 24, 2])
    assert pool.preemptions.sum() > 0
    st = decompose(pool.log, table, law_of(pool.profiles[0]))
    assert st.law_j == pytest.approx(st.logged_j, rel=1e-12)
    # A decodes when B arrives: B's prompt of 8 goes in a chunk of 7 beside A's decode token, then a 1-token chunk
    pool, table = run(toy_profile(), [0.0, 0.005], [3, 8], [6, 2])
    assert any(1 in e.slots and e.new_tokens[e.slots.index(1)] == 1 and e.computed_before[e.slots.index(1)] == 7
               for e in pool.log)
    st = decompose(pool.log, table, law_of(pool.profiles[0]))
    assert st.law_j == pytest.approx(st.logged_j, rel=1e-12)


def test_decode_runs_expand_to_the_step_by_step_log():
    pool_r, table = continuous_batch(10, 5, closed=True)
    pool_s, _ = continuous_batch(10, 5, closed=False)
    assert len(pool_r.log) < len(pool_s.log)  # the run log really has multi-step runs
    law = law_of(pool_r.profiles[0])
    a = closed_form_from_log(pool_r.log, table, law)
    b = closed_form_from_log(pool_s.log, table, law)
    assert a.shares == pytest.approx(b.shares, rel=1e-10)
    assert a.own == pytest.approx(b.own, rel=1e-10)


def test_chunked_prefill_telescopes():
    """Own energy is c1*p + c2*p(p+1)/2 + sum over the d-1 decode steps of (b + kappa*context), whether the prompt
    is prefilled in one step or in chunks of the toy budget (8 tokens)."""
    prof = c2_profile()
    e = prof.clocks[1].energy
    p, d = 29, 5
    want = e.c1 * p + e.c2 * p * (p + 1) / 2 + sum(e.b + e.kappa * (p + j) for j in range(1, d))
    pool, table = run(prof, [0.0], [p], [d])
    assert sum(1 for x in pool.log if x.new_tokens[0] > 1) == 4  # chunks 8, 8, 8, 5
    att = closed_form_from_log(pool.log, table, law_of(prof), scale="none")
    assert att.own[0] == pytest.approx(want, rel=1e-12)


# ------------------------------------------------------------------------------------------ hand-built timeline
LAW = StepCoeffs(tau0=0.01, tau1=0, tau2=0, tau3=0, tau4=0, a=1.0, c1=0.1, c2=0.01, b=0.01, kappa=0.001, idle_w=0)
PROMPTS = {0: 4, 1: 3, 2: 5, 3: 2}  # A, B, C, D


def hand_log(step6_energy=3.093):
    """Figure-3 style timeline (a = 1 J per step):
    1: A prefills 4                                  m=1
    2: A decodes (ctx 5), B prefills 3               m=2
    3: run of 2 steps: A (ctx 6, 7), B (ctx 4, 5)    m=2
    4: A (ctx 8, its last token), B (ctx 6), C prefills a chunk of 2 of its 5    m=3
    5: B (ctx 7, last), C prefills the remaining 3, D prefills 2                   m=3
    6: run of 3 steps: C (ctx 6, 7, 8), D (ctx 3, 4, 5)                            m=2
    Logged energies are the law's (hand-summed below)."""
    E = StepLogEntry
    return [
        E(0, 0, 0.00, 0.01, 1, 1.5, (0,), (4,), (0,)),
        E(0, 0, 0.01, 0.02, 1, 1.375, (0, 1), (1, 3), (4, 0)),
        E(0, 0, 0.02, 0.04, 2, 2.062, (0, 1), (1, 1), (5, 3)),
        E(0, 0, 0.04, 0.05, 1, 1.264, (0, 1, 2), (1, 1, 2), (7, 5, 0)),
        E(0, 0, 0.05, 0.06, 1, 1.667, (1, 2, 3), (1, 3, 2), (6, 2, 0)),
        E(0, 0, 0.06, 0.09, 3, step6_energy, (2, 3), (1, 1), (5, 2)),
    ]


# shared parts by hand: A 1 + 1/2 + 2/2 + 1/3; B 1/2 + 2/2 + 1/3 + 1/3; C 1/3 + 1/3 + 3/2; D 1/3 + 3/2
HAND_SHARED = [17 / 6, 13 / 6, 13 / 6, 11 / 6]
# own parts by hand: A 0.4 + 0.01*10 + 4*0.01 + 0.001*(5+6+7+8); B 0.3 + 0.01*6 + 0.04 + 0.001*(4+5+6+7);
# C 0.1*5 + 0.01*(3 + 12) + 0.03 + 0.001*(6+7+8); D 0.2 + 0.01*3 + 0.03 + 0.001*(3+4+5)
HAND_OWN = [0.566, 0.422, 0.701, 0.272]


def test_hand_timeline_shares():
    steps = decompose(hand_log(), PROMPTS, StepLaw(LAW), players=[0, 1, 2, 3])
    assert steps.law_j == pytest.approx(steps.logged_j, rel=1e-12)
    att = closed_form(steps)
    assert att.shared.tolist() == pytest.approx(HAND_SHARED, rel=1e-12)
    assert att.own.tolist() == pytest.approx(HAND_OWN, rel=1e-12)
    assert att.shares.tolist() == pytest.approx([o + s for o, s in zip(HAND_OWN, HAND_SHARED)], rel=1e-12)
    assert att.total_j == pytest.approx(10.961, rel=1e-12)
    assert exact_shapley(ModelGame(steps)) == pytest.approx(att.shares, rel=1e-12)
    assert steps.steps_per_player().tolist() == [5, 5, 5, 4]


def test_hand_timeline_logged_energy_scales_its_segment():
    """Metering step 6 at twice the law: C's and D's parts of that run double, everything else is unchanged,
    and the shares add up to the logged energy."""
    base = closed_form(decompose(hand_log(), PROMPTS, StepLaw(LAW)))
    hot = closed_form(decompose(hand_log(2 * 3.093), PROMPTS, StepLaw(LAW)))
    run6 = [0.0, 0.0, 1.5 + 0.051, 1.5 + 0.042]  # C, D: 3/2 shared + decode terms of the run
    assert (hot.shares - base.shares).tolist() == pytest.approx(run6, rel=1e-12)
    assert hot.total_j == pytest.approx(10.961 + 3.093, rel=1e-12)
    total = closed_form(decompose(hand_log(), PROMPTS, StepLaw(LAW)), total_j=100.0)
    assert total.total_j == pytest.approx(100.0) and total.shares == pytest.approx(base.shares * 100 / 10.961)


def test_hand_timeline_time_sharing():
    """Time sharing with the same own energies: the 9 J of shared energy split by sum of duration/m.
    Durations (ms): 10, 10, 20, 10, 10, 30 -> A 10 + 5 + 10 + 10/3; B 5 + 10 + 10/3 + 10/3; C 10/3 + 10/3 + 15;
    D 10/3 + 15."""
    att = time_sharing_split(decompose(hand_log(), PROMPTS, StepLaw(LAW)))
    w = np.array([25 + 10 / 3, 15 + 20 / 3, 15 + 20 / 3, 15 + 10 / 3])
    assert att.shared == pytest.approx(9 * w / w.sum(), rel=1e-12)
    assert att.own == pytest.approx(HAND_OWN, rel=1e-12)


def test_noisy_log_shares_sum_to_logged_energy_and_match_scaled_game():
    pool, table = continuous_batch(8, 2, noise=True)
    steps = decompose(pool.log, table, law_of(pool.profiles[0]), players=range(8))
    assert not np.allclose(steps.law_j, steps.logged_j)
    att = closed_form(steps)
    assert att.total_j == pytest.approx(sum(e.energy_j for e in pool.log), rel=1e-12)
    assert exact_shapley(ModelGame(steps)) == pytest.approx(att.shares, rel=1e-9)


def test_unknown_slot_and_missing_prompts_are_errors():
    with pytest.raises(ValueError, match="not one of the players"):
        decompose(hand_log(), PROMPTS, StepLaw(LAW), players=[0, 1, 2])
    with pytest.raises(ValueError, match="prompt lengths"):
        decompose(hand_log(), None, StepLaw(LAW))
