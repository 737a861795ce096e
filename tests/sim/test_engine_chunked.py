"""Engine, hand-computed cases: chunked prefill within the token budget (toy budget 8), running requests
before waiting ones, waiting requests admitted in arrival order into the remaining budget, max_seqs cap,
and the prefill attention term A."""

from __future__ import annotations

import pytest

from helpers.profiles import attn_toy_profile, toy_profile

from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
from commitenv.workload.table import make_table


def exact(**kw) -> EngineOptions:
    return EngineOptions(noise=NoiseSpec(0, 0), log_steps=True, **kw)


def run(profile, arrivals, prompts, outputs, *, closed_form=True, t_end=10.0) -> Pool:
    pool = Pool(profile, PoolLayout.single(1), exact(closed_form=closed_form))
    pool.attach(make_table(arrivals, prompts, outputs))
    pool.run_until(t_end)
    return pool


def t_step(P=0, n=0, L=0):
    return 0.01 + 0.001 * P + 0.0001 * n + 0.00001 * L


def e_step(P=0, n=0, L=0):
    return 1.0 + 0.1 * P + 0.01 * n + 0.001 * L


def attn_profile():
    """Toy profile whose top clock also charges the prefill attention term: tau4 = 1e-6 s, c2 = 1e-4 J."""
    return attn_toy_profile()


@pytest.mark.parametrize("closed_form", [True, False])
def test_long_prompt_runs_in_budget_chunks_with_attention_term(closed_form):
    # prompt 20 > budget 8: chunks 8, 8, 4 after 0, 8, 16 computed tokens
    pool = run(attn_profile(), [0.0], [20], [3], closed_form=closed_form)
    A = [8 * 0 + 8 * 9 // 2, 8 * 8 + 8 * 9 // 2, 4 * 16 + 4 * 5 // 2]
    assert A == [36, 100, 74] and sum(A) == 20 * 21 // 2
    chunks = [8, 8, 4]
    pre_t = [0.01 + 0.001 * c + 1e-6 * a for c, a in zip(chunks, A)]
    pre_e = [1.0 + 0.1 * c + 1e-4 * a for c, a in zip(chunks, A)]
    log = pool.log
    assert [e.new_tokens for e in log[:3]] == [(8,), (8,), (4,)]
    assert [e.computed_before for e in log[:3]] == [(0,), (8,), (16,)]
    for e, dt, de in zip(log[:3], pre_t, pre_e):
        assert e.t1 - e.t0 == pytest.approx(dt, abs=1e-12)
        assert e.energy_j == pytest.approx(de, abs=1e-12)
    ttft = sum(pre_t)
    assert pool.first_t[0] == pytest.approx(ttft, abs=1e-12)
    # then two decode steps over 21 and 22 keys
    fin = ttft + t_step(n=1, L=21) + t_step(n=1, L=22)
    assert pool.finish_t[0] == pytest.approx(fin, abs=1e-12)
    assert sum(e.energy_j for e in log) == pytest.approx(sum(pre_e) + e_step(n=1, L=21) + e_step(n=1, L=22))


@pytest.mark.parametrize("closed_form", [True, False])
def test_running_prefill_is_scheduled_before_waiting_request(closed_form):
    # A: prompt 20, out 3 at 0 ; B: prompt 6, out 2 at 0.001 (arrives during A's first chunk)
    pool = run(toy_profile(), [0.0, 0.001], [20, 6], [3, 2], closed_form=closed_form)
    log = pool.log
    # step 2 (t = 0.018): A's second chunk takes the whole budget, B stays waiting
    assert log[1].slots == (0,) and log[1].new_tokens == (8,)
    assert log[1].t0 == pytest.approx(0.018)
    # step 3 (t = 0.036): A's last chunk of 4, B admitted with the remaining 4 of its 6 tokens
    assert log[2].slots == (0, 1) and log[2].new_tokens == (4, 4) and log[2].computed_before == (16, 0)
    assert log[2].t1 == pytest.approx(0.054)
    assert pool.first_t[0] == pytest.approx(0.054, abs=1e-12)
    # step 4: A decodes over 21 keys, B finishes its prefill with 2 tokens
    assert log[3].slots == (0, 1) and log[3].new_tokens == (1, 2) and log[3].computed_before == (20, 4)
    t4 = t_step(P=2, n=1, L=21)
    assert t4 == pytest.approx(0.01231)
    assert pool.first_t[1] == pytest.approx(0.054 + t4, abs=1e-12)
    # step 5: both decode (L = 22 + 7), both finish
    fin = 0.054 + t4 + t_step(n=2, L=29)
    assert fin == pytest.approx(0.0768)
    assert pool.finish_t.tolist() == pytest.approx([fin, fin], abs=1e-12)
    total_e = 1.8 + 1.8 + 1.8 + e_step(P=2, n=1, L=21) + e_step(n=2, L=29)
    assert sum(e.energy_j for e in log) == pytest.approx(total_e, abs=1e-12)
    assert sum(e.n_steps for e in log) == 5


@pytest.mark.parametrize("closed_form", [True, False])
def test_waiting_admitted_in_arrival_order_into_remaining_budget(closed_form):
    # X occupies [0, 0.018); C1, C2, C3 (prompt 5) arrive in that order while it runs
    pool = run(toy_profile(), [0.0, 0.001, 0.002, 0.003], [8, 5, 5, 5], [1, 1, 1, 1], closed_form=closed_form)
    log = pool.log
    assert log[0].slots == (0,)
    # at 0.018: C1 gets 5, C2 the remaining 3, C3 nothing
    assert log[1].slots == (1, 2) and log[1].new_tokens == (5, 3)
    assert pool.finish_t[1] == pytest.approx(0.036)
    # at 0.036: C2 (running) first with its last 2 tokens, then C3 with 5
    assert log[2].slots == (2, 3) and log[2].new_tokens == (2, 5) and log[2].computed_before == (3, 0)
    assert pool.finish_t[2] == pytest.approx(0.036 + 0.017)
    assert pool.finish_t[3] == pytest.approx(0.036 + 0.017)


@pytest.mark.parametrize("closed_form", [True, False])
def test_same_arrival_time_keeps_table_order_and_one_token_chunk_is_prefill(closed_form):
    # X at 0 keeps the replica busy; three prompts of 3 arrive together at 0.001
    pool = run(toy_profile(), [0.0, 0.001, 0.001, 0.001], [2, 3, 3, 3], [1, 1, 1, 1], closed_form=closed_form)
    log = pool.log
    t1 = t_step(P=2)
    assert log[1].slots == (1, 2, 3) and log[1].new_tokens == (3, 3, 2)
    assert pool.finish_t[1] == pytest.approx(t1 + 0.018)
    # the last prompt token of request 3 is a 1-token prefill chunk (P = 1: 0.011 s, 1.1 J), not a decode
    assert log[2].slots == (3,) and log[2].new_tokens == (1,)
    assert log[2].t1 - log[2].t0 == pytest.approx(0.011, abs=1e-12)
    assert log[2].energy_j == pytest.approx(1.1, abs=1e-12)
    assert pool.finish_t[3] == pytest.approx(t1 + 0.018 + 0.011)


@pytest.mark.parametrize("closed_form", [True, False])
def test_max_seqs_caps_admission(closed_form):
    # toy max_seqs = 4. X (prompt 1, out 1) keeps the replica busy; five requests (prompt 1, out 3) arrive
    # together while it runs: 4 are admitted although budget is left, the fifth waits for a free sequence.
    arrivals = [0.0] + [0.001] * 5
    pool = run(toy_profile(), arrivals, [1] * 6, [1] + [3] * 5, closed_form=closed_form)
    log = pool.log
    t0 = t_step(P=1)
    assert log[1].slots == (1, 2, 3, 4) and log[1].new_tokens == (1, 1, 1, 1)
    t1 = t0 + t_step(P=4)
    # two decode steps of four requests: L = 4 * 2, 4 * 3
    t2 = t1 + t_step(n=4, L=8) + t_step(n=4, L=12)
    assert pool.finish_t[1:5].tolist() == pytest.approx([t2] * 4, abs=1e-12)
    dec = [e for e in log[2:] if e.slots == (1, 2, 3, 4) and e.new_tokens == (1, 1, 1, 1)]
    assert sum(e.n_steps for e in dec) == 2
    # the fifth starts only after the four finish
    first5 = next(e for e in log if 5 in e.slots)
    assert first5.t0 == pytest.approx(t2, abs=1e-12) and first5.slots == (5,)
    fin5 = t2 + t_step(P=1) + t_step(n=1, L=2) + t_step(n=1, L=3)
    assert pool.finish_t[5] == pytest.approx(fin5, abs=1e-12)
    assert max(len(e.slots) for e in log) <= 4


def test_budget_caps_tokens_per_step_in_every_log_entry():
    pool = run(toy_profile(), [0.0, 0.0005, 0.001, 0.0015], [13, 9, 7, 11], [4, 6, 3, 5], closed_form=False)
    for e in pool.log:
        assert sum(e.new_tokens) <= 8
        assert len(e.slots) <= 4
    assert pool.completed == 4


@pytest.mark.parametrize("closed_form", [True, False])
def test_a_decode_that_shares_steps_with_a_prefill_has_longer_gaps_between_tokens(closed_form):
    """Per-token TBT by hand: A (prompt 4, 5 tokens) decodes alone, then beside B's prompt chunks (B: 20 tokens,
    arrives at 15 ms, during A's first decode step); A's longest gap is the step with a 7-token chunk of B over 7
    keys of A, longer than its mean gap."""
    pool = run(toy_profile(), [0.0, 0.015], [4, 20], [5, 1], closed_form=closed_form)
    steps = [t_step(P=4), t_step(n=1, L=5), t_step(P=7, n=1, L=6), t_step(P=7, n=1, L=7), t_step(P=6, n=1, L=8)]
    assert [e.new_tokens for e in pool.log[:5]] == [(4,), (1,), (1, 7), (1, 7), (1, 6)]
    gaps = steps[1:]  # A's tokens end steps 1-5
    assert pool.first_t[0] == pytest.approx(steps[0], abs=1e-12)
    assert pool.finish_t[0] == pytest.approx(sum(steps), abs=1e-12)
    assert pool.max_tbt_s[0] == pytest.approx(0.01717, abs=1e-12) == pytest.approx(max(gaps), abs=1e-12)
    mean = (pool.finish_t[0] - pool.first_t[0]) / 4
    assert mean == pytest.approx(sum(gaps) / 4, abs=1e-12) and mean < pool.max_tbt_s[0] - 0.001
    assert pool.max_tbt_s[1] == 0.0  # one token: no gap


@pytest.mark.parametrize("closed_form", [True, False])
def test_a_decode_run_records_its_longest_step_as_its_gap(closed_form):
    """A lone request decoding 6 tokens after a 4-token prompt: its gaps are the decode steps over 5..9 keys, the
    last the longest (the closed form derives it from the run's first and last steps)."""
    pool = run(toy_profile(), [0.0], [4], [6], closed_form=closed_form)
    assert pool.max_tbt_s[0] == pytest.approx(t_step(n=1, L=9), abs=1e-12)
    assert pool.finish_t[0] - pool.first_t[0] == pytest.approx(sum(t_step(n=1, L=L) for L in range(5, 10)), abs=1e-12)
