"""Engine, hand-computed cases: one request alone, two requests sharing decode steps, and an arrival that
cuts a running decode stretch at the next step boundary.

Toy profile at the top clock (tests/conftest.py):
    t = 0.01 + 0.001 P + 0.0001 n + 0.00001 L      E = 1 + 0.1 P + 0.01 n + 0.001 L      idle 50 W
"""

from __future__ import annotations

import pytest

from helpers.profiles import toy_profile

from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
from commitenv.workload.table import make_table

IDLE_W = 50.0


def exact(**kw) -> EngineOptions:
    return EngineOptions(noise=NoiseSpec(0, 0), log_steps=True, **kw)


def pool_of(arrivals, prompts, outputs, *, n_gpus=1, closed_form=True, profile=None) -> Pool:
    pool = Pool(profile or toy_profile(), PoolLayout.single(n_gpus), exact(closed_form=closed_form))
    pool.attach(make_table(arrivals, prompts, outputs))
    return pool


def t_step(P=0, n=0, L=0):
    return 0.01 + 0.001 * P + 0.0001 * n + 0.00001 * L


def e_step(P=0, n=0, L=0):
    return 1.0 + 0.1 * P + 0.01 * n + 0.001 * L


# ------------------------------------------------------------------------------------------- one request
@pytest.mark.parametrize("closed_form", [True, False])
def test_single_request_times_energy_and_log(closed_form):
    # prompt 6, output 5, arrives at 0.25 on an idle replica
    pool = pool_of([0.25], [6], [5], closed_form=closed_form)
    pool.run_until(2.0)

    # prefill: P = 6  -> 0.016 s, 1.6 J; the first token appears at the end of the prefill step
    t_pre, e_pre = 0.016, 1.6
    assert t_step(P=6) == pytest.approx(t_pre) and e_step(P=6) == pytest.approx(e_pre)
    ttft = 0.25 + t_pre
    assert pool.first_t[0] == pytest.approx(ttft, abs=1e-12)

    # 4 decode steps; step j attends over computed + 1 = 6 + j keys
    dec_t = [0.0101 + 0.00001 * (6 + j) for j in range(1, 5)]
    dec_e = [1.01 + 0.001 * (6 + j) for j in range(1, 5)]
    finish = ttft + sum(dec_t)
    assert finish == pytest.approx(0.30674, abs=1e-12)
    assert pool.finish_t[0] == pytest.approx(finish, abs=1e-12)

    steps_e = e_pre + sum(dec_e)
    assert steps_e == pytest.approx(5.674)
    busy = finish - 0.25
    assert pool.energy_j(2.0) == pytest.approx(steps_e + IDLE_W * (2.0 - busy), abs=1e-9)
    assert pool.energy_j(2.0) == pytest.approx(102.837, abs=1e-9)

    log = pool.log
    assert sum(e.n_steps for e in log) == 5
    assert log[0].slots == (0,) and log[0].new_tokens == (6,) and log[0].computed_before == (0,)
    assert log[0].t0 == pytest.approx(0.25) and log[0].t1 == pytest.approx(ttft)
    assert log[0].energy_j == pytest.approx(e_pre)
    assert sum(e.energy_j for e in log) == pytest.approx(steps_e, abs=1e-12)
    if closed_form:
        # the whole decode stretch is one closed-form run
        assert len(log) == 2
        assert log[1].n_steps == 4 and log[1].new_tokens == (1,) and log[1].computed_before == (6,)
    else:
        assert [e.n_steps for e in log] == [1] * 5
        assert [e.computed_before for e in log[1:]] == [(6,), (7,), (8,), (9,)]
        for e, dt, de in zip(log[1:], dec_t, dec_e):
            assert e.t1 - e.t0 == pytest.approx(dt, abs=1e-12)
            assert e.energy_j == pytest.approx(de, abs=1e-12)
    assert pool.completed == 1 and pool.live == 0
    assert pool.preemptions[0] == 0 and pool.replica_of[0] == 0


def test_meter_is_linear_inside_a_step_and_idle_before_arrival():
    pool = pool_of([0.25], [6], [5])
    pool.run_until(0.25)
    assert pool.energy_j(0.25) == pytest.approx(IDLE_W * 0.25)
    # half-way through the prefill step (0.016 s, 1.6 J): half of its energy
    assert pool.energy_j(0.258) == pytest.approx(IDLE_W * 0.25 + 0.8, abs=1e-12)
    pool.run_until(0.3)
    # inside the decode run: completed prefill + 3 decode steps + a linear part of the 4th
    ends = [0.266]
    for j in range(1, 5):
        ends.append(ends[-1] + 0.0101 + 0.00001 * (6 + j))
    t = 0.3
    assert ends[3] < t < ends[4]
    done_e = 1.6 + sum(1.01 + 0.001 * (6 + j) for j in range(1, 4))
    frac = (t - ends[3]) / (ends[4] - ends[3])
    exp = IDLE_W * 0.25 + done_e + frac * (1.01 + 0.001 * 10)
    assert pool.energy_j(t) == pytest.approx(exp, abs=1e-9)


def test_output_of_one_token_finishes_at_prefill_end():
    pool = pool_of([0.0], [3], [1])
    pool.run_until(1.0)
    assert pool.first_t[0] == pytest.approx(0.013) and pool.finish_t[0] == pytest.approx(0.013)
    assert sum(e.n_steps for e in pool.log) == 1


# ------------------------------------------------------------------------------------------- two requests
@pytest.mark.parametrize("closed_form", [True, False])
def test_two_requests_share_decode_steps(closed_form):
    # A: prompt 4, out 6 at 0 ; B: prompt 4, out 3 at 0.001 (during A's prefill)
    pool = pool_of([0.0, 0.001], [4, 4], [6, 3], closed_form=closed_form)
    pool.run_until(5.0)
    # step 1: A's prefill alone, P = 4
    first_a = 0.014
    # step 2: A's first decode (L = 4 + 1) together with B's prefill (P = 4)
    t2 = t_step(P=4, n=1, L=5)
    assert t2 == pytest.approx(0.01415)
    first_b = first_a + t2
    assert pool.first_t.tolist() == pytest.approx([first_a, first_b], abs=1e-12)
    # shared decode steps j = 1, 2: n = 2, L = (5 + j) + (4 + j)
    shared_t = [t_step(n=2, L=9 + 2 * j) for j in (1, 2)]
    shared_e = [e_step(n=2, L=9 + 2 * j) for j in (1, 2)]
    fin_b = first_b + sum(shared_t)
    assert fin_b == pytest.approx(0.04879)
    # A (4 tokens so far, computed 7) alone for two more steps: L = 8, 9
    solo_t = [t_step(n=1, L=L) for L in (8, 9)]
    solo_e = [e_step(n=1, L=L) for L in (8, 9)]
    fin_a = fin_b + sum(solo_t)
    assert fin_a == pytest.approx(0.06916)
    assert pool.finish_t.tolist() == pytest.approx([fin_a, fin_b], abs=1e-12)

    steps_e = 1.4 + e_step(P=4, n=1, L=5) + sum(shared_e) + sum(solo_e)
    assert steps_e == pytest.approx(6.916)
    assert sum(e.energy_j for e in pool.log) == pytest.approx(steps_e, abs=1e-12)
    assert sum(e.n_steps for e in pool.log) == 6
    assert pool.energy_j(5.0) == pytest.approx(steps_e + IDLE_W * (5.0 - fin_a), abs=1e-9)
    shared = [e for e in pool.log if e.slots == (0, 1) and e.new_tokens == (1, 1)]
    assert sum(e.n_steps for e in shared) == 2
    if closed_form:
        assert [e.n_steps for e in pool.log] == [1, 1, 2, 2]


@pytest.mark.parametrize("closed_form", [True, False])
def test_simultaneous_arrivals_share_the_first_step(closed_form):
    # A: prompt 4, out 6 ; B: prompt 4, out 3 ; both at t = 0 on one idle replica: one prefill step P = 8
    pool = pool_of([0.0, 0.0], [4, 4], [6, 3], closed_form=closed_form)
    pool.run_until(5.0)
    t1 = t_step(P=8)
    assert pool.first_t.tolist() == pytest.approx([t1, t1], abs=1e-12)
    fin_b = t1 + t_step(n=2, L=10) + t_step(n=2, L=12)
    fin_a = fin_b + t_step(n=1, L=7) + t_step(n=1, L=8) + t_step(n=1, L=9)
    assert pool.finish_t.tolist() == pytest.approx([fin_a, fin_b], abs=1e-12)
    assert sum(e.n_steps for e in pool.log) == 6


@pytest.mark.parametrize("closed_form", [True, False])
def test_arrival_during_decode_run_is_admitted_at_next_step_end(closed_form):
    # A: prompt 4, out 10 at 0 ; B: prompt 4, out 3 at 0.05 (during A's decode)
    pool = pool_of([0.0, 0.05], [4, 4], [10, 3], closed_form=closed_form)
    pool.run_until(5.0)
    # A: prefill 0.014 s; decode step j: 0.0101 + 0.00001 (4 + j)
    ends = [0.014]
    for j in range(1, 6):
        ends.append(ends[-1] + 0.0101 + 0.00001 * (4 + j))
    # first step end >= 0.05 is after decode step 4
    assert ends[3] < 0.05 <= ends[4]
    t_adm = ends[4]
    assert t_adm == pytest.approx(0.05466)
    # mixed step: A decodes over 9 keys, B prefills 4 tokens
    t_mixed = t_step(P=4, n=1, L=9)
    assert t_mixed == pytest.approx(0.01419)
    first_b = t_adm + t_mixed
    assert pool.first_t[1] == pytest.approx(first_b, abs=1e-12)
    # two shared decodes: L = (9+1) + (4+1) = 15, then 17
    fin_b = first_b + t_step(n=2, L=15) + t_step(n=2, L=17)
    assert pool.finish_t[1] == pytest.approx(fin_b, abs=1e-12)
    assert fin_b == pytest.approx(0.08957)
    # A has 1 + 4 + 1 + 2 = 8 tokens; two more alone with L = 12, 13
    fin_a = fin_b + t_step(n=1, L=12) + t_step(n=1, L=13)
    assert pool.finish_t[0] == pytest.approx(fin_a, abs=1e-12)
    assert fin_a == pytest.approx(0.11002)

    e_total = (
        e_step(P=4)
        + sum(e_step(n=1, L=4 + j) for j in range(1, 5))
        + e_step(P=4, n=1, L=9)
        + e_step(n=2, L=15)
        + e_step(n=2, L=17)
        + e_step(n=1, L=12)
        + e_step(n=1, L=13)
    )
    assert sum(e.energy_j for e in pool.log) == pytest.approx(e_total, abs=1e-12)
    assert sum(e.n_steps for e in pool.log) == 1 + 4 + 1 + 2 + 2
    assert pool.energy_j(5.0) == pytest.approx(e_total + IDLE_W * (5.0 - fin_a), abs=1e-9)
    # B's first step starts at the boundary, never at its arrival instant
    b_first = next(e for e in pool.log if 1 in e.slots)
    assert b_first.t0 == pytest.approx(t_adm, abs=1e-12)
    if closed_form:
        assert pool.log[1].n_steps == 4  # the run was cut after 4 steps, not run to A's end


def test_arrival_on_idle_replica_starts_at_arrival():
    pool = pool_of([0.0, 1.0], [4, 5], [1, 1])
    pool.run_until(2.0)
    assert pool.log[1].t0 == 1.0
    assert pool.finish_t[1] == pytest.approx(1.0 + 0.015)
