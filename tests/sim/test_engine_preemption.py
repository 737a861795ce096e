"""Engine: KV blocks and recompute preemption (vLLM V1) on the toy cache: 64 tokens in blocks of 4 = 16 blocks,
context limit 64, token budget 8, max_seqs 4.

Scenario: A (prompt 24, out 24) and B (prompt 8, out 24) at t = 0.0 / 0.0005, C (prompt 2, out 2) at 0.2.
A prefills in chunks 8, 8, 8; at the 4th step A's first decode runs with B's first chunk of 7 tokens, then both
decode. KV use after A has c_A computed tokens and B c_B: ceil(c_A/4) + ceil(c_B/4) blocks.
When A needs its 11th block (scheduling A's decode of token 41, A computed 40, B computed 22 = 6 blocks;
10 + 6 = 16 blocks are in use), the newest running request (B) is preempted: its blocks are freed, its
computed tokens drop to 0, it goes to the front of the waiting queue, and nothing is admitted in that step.
"""

from __future__ import annotations

import pytest

from helpers.reference import ReferencePool
from helpers.reference.copies import free_blocks
from helpers.profiles import toy_profile

from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
from commitenv.workload.table import make_table

ARR = [0.0, 0.0005, 0.2]
PROMPT = [24, 8, 2]
OUT = [24, 24, 2]


def scenario(closed_form: bool) -> Pool:
    opt = EngineOptions(noise=NoiseSpec(0, 0), log_steps=True, closed_form=closed_form)
    pool = (Pool if closed_form else ReferencePool)(toy_profile(), PoolLayout.single(1), opt)
    pool.attach(make_table(ARR, PROMPT, OUT))
    pool.run_until(10.0)
    return pool


def steps(pool):
    """Expand the log into single steps: (t0, slots, new_tokens, computed_before)."""
    out = []
    for e in pool.log:
        for j in range(e.n_steps):
            cb = tuple(c + j for c in e.computed_before) if e.n_steps > 1 else e.computed_before
            out.append((e.slots, e.new_tokens, cb))
    return out


@pytest.fixture(params=[True, False], ids=["closed", "step"])
def pool(request):
    return scenario(request.param)


def test_first_preemption_step(pool):
    st = steps(pool)
    # the step in which B's computed tokens are last seen > 0 and then B reappears from 0
    i_pre = next(i for i, (s, n, c) in enumerate(st) if s == (0,) and c[0] == 40)
    prev = st[i_pre - 1]
    assert prev == ((0, 1), (1, 1), (39, 21))  # before: A computed 39 -> 40 (10 blocks), B 21 -> 22 (6 blocks)
    # preemption step: only A (its 11th block comes from B's freed blocks); B's recompute chunk of 7 tokens
    # would fit the budget (7) and the free blocks (16 - 11 = 5 >= 2) but is not admitted in this step
    assert st[i_pre] == ((0,), (1,), (40,))
    # next step: B first in the waiting queue, recomputing from 0 with a chunk of 7
    assert st[i_pre + 1] == ((0, 1), (1, 7), (41, 0))


def test_preemption_counts_and_token_conservation(pool):
    # hand walk of the KV arithmetic: B is preempted at A's 41st, 44th and 47th token (see module docstring)
    assert pool.preemptions.tolist() == [0, 3, 0]
    st = steps(pool)
    # recomputed tokens of B: what it had computed at each preemption: 22, then 14 twice
    seq_b = [(n[s.index(1)], c[s.index(1)]) for s, n, c in st if 1 in s]
    recomputed = 0
    last = 0
    for new, before in seq_b:
        if before == 0 and last > 0:
            recomputed += last
        last = before + new
    assert recomputed == 22 + 14 + 14
    total_b = sum(new for new, _ in seq_b)
    assert total_b == PROMPT[1] + OUT[1] - 1 + recomputed
    total_a = sum(n[s.index(0)] for s, n, c in st if 0 in s)
    assert total_a == PROMPT[0] + OUT[0] - 1
    assert pool.completed == 3 and pool.live == 0


def test_preempted_request_keeps_first_token_time_and_goes_first(pool):
    # B's first token: end of the step that completed its 8-token prompt (chunk 7, then 1 with A's decode)
    st_b = [e for e in pool.log if 1 in e.slots]
    first = next(e for e in st_b if e.computed_before[e.slots.index(1)] + e.new_tokens[e.slots.index(1)] == 8)
    assert pool.first_t[1] == pytest.approx(first.t1, abs=1e-12)
    # C arrived (0.2) before B's first preemption but is admitted only after B is back in the batch
    b_back = next(e for e in pool.log if 1 in e.slots and e.computed_before[e.slots.index(1)] == 0 and e.t0 > 0.1)
    c_first = next(e for e in pool.log if 2 in e.slots)
    assert b_back.t0 < c_first.t0
    # A finishes with 24 tokens while B is waiting; C shares steps with B's recompute
    a_last = max(e.t1 for e in pool.log if 0 in e.slots)
    assert pool.finish_t[0] == pytest.approx(a_last)
    assert c_first.t0 >= pool.finish_t[0] - 1e-12


def test_kv_never_exceeds_capacity(pool):
    for s, n, c in steps(pool):
        blocks = sum(-(-(ci + ni) // 4) for ci, ni in zip(c, n))
        assert blocks <= 16


def test_closed_form_matches_step_by_step():
    a, b = scenario(True), scenario(False)
    assert a.finish_t.tolist() == pytest.approx(b.finish_t.tolist(), abs=1e-9)
    assert a.first_t.tolist() == pytest.approx(b.first_t.tolist(), abs=1e-9)
    assert a.preemptions.tolist() == b.preemptions.tolist()
    assert a.energy_j(10.0) == pytest.approx(b.energy_j(10.0), abs=1e-9)
    assert steps(a) == steps(b)


def test_single_request_at_context_limit_is_never_preempted():
    # prompt 40 + out 24 = 64 = context limit: 63 tokens need 16 blocks = the whole cache
    pool = ReferencePool(toy_profile(), PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(make_table([0.0], [40], [24]))
    pool.run_until(10.0)
    assert pool.preemptions[0] == 0 and pool.completed == 1


def test_output_clamped_to_context_limit_and_long_prompt_rejected():
    pool = ReferencePool(toy_profile(), PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(make_table([0.0, 0.1], [60, 64], [10, 5]))
    # output clamped to 64 - 60 = 4 tokens; prompt 64 >= context limit is rejected
    assert pool.out_tokens.tolist()[0] == 4
    pool.run_until(10.0)
    assert pool.completed == 1
    assert pool.finish_t[1] == float("inf")
    toks = sum(e.new_tokens[0] * e.n_steps for e in pool.log)
    assert toks == 60 + 4 - 1


def test_kv_capacity_not_multiple_of_block_size_is_rejected():
    """66 tokens of KV in blocks of 4 is 16 whole blocks = 64 tokens < the 66-token context limit: a request at
    the limit could never be scheduled, so the profile is refused (as vLLM refuses such a configuration)."""
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        toy_profile(scheduler=dict(kv_capacity_tokens=66, context_limit=66))


# ----------------------------------------------------------------------------- full-sequence admission (issue 14)
LOOP_ARR = [0.019, 0.052, 0.077, 0.115, 0.124, 0.127, 0.143]
LOOP_PROMPT = [629, 458, 64, 264, 383, 472, 740]
LOOP_OUT = [553, 262, 648, 325, 263, 42, 331]
LOOP_KV = dict(token_budget=512, max_seqs=16, context_limit=2048, block_size=4, kv_capacity_tokens=3200)


def _tight_run(reserve: bool, closed_form: bool = True) -> Pool:
    prof = toy_profile(scheduler={**LOOP_KV, "reserve_full_sequence": reserve})
    pool = (Pool if closed_form else ReferencePool)(prof, PoolLayout.single(1), EngineOptions(
        noise=NoiseSpec(0, 0), log_steps=True, closed_form=closed_form))
    pool.attach(make_table(LOOP_ARR, LOOP_PROMPT, LOOP_OUT))
    pool.run_until(float("inf"))
    return pool


@pytest.mark.parametrize("closed_form", [True, False])
def test_reserving_the_full_sequence_ends_the_preemption_loop(closed_form):
    """Without the gate a request whose first 512-token chunk fits but whose 740-token prompt does not is admitted,
    preempted and admitted again with no progress (44 times here: the admission of vLLM V1 before its
    scheduler_reserve_full_isl); with it, the request waits until its whole sequence fits."""
    loop, gated = _tight_run(False, closed_form), _tight_run(True, closed_form)
    assert loop.preemptions.tolist()[6] == 44
    assert gated.preemptions.tolist()[6] <= 2 and sum(gated.preemptions.tolist()) <= 3
    assert (gated.finish_t > 0).all() and (gated.out_tokens == loop.out_tokens).all()
    assert gated.energy_j() < loop.energy_j()  # the recompute is gone
    cap = 3200 // 4
    for e in gated.log:  # the KV never overflows: every running request's blocks fit (token conservation elsewhere)
        assert len(e.slots) <= 16
    assert all(f == cap for f in free_blocks(gated))


def test_reserve_full_sequence_is_a_scenario_setting(tmp_path):
    from commitenv.scenarios import load_scenario
    from commitenv.scenarios.build import scenario_profile
    from helpers.scenarios import toy_three_hour

    sc = toy_three_hour(tmp_path, name="gate", engine={"reserve_full_sequence": True})
    assert scenario_profile(load_scenario(sc)).scheduler.reserve_full_sequence is True
    plain = toy_three_hour(tmp_path, name="plain")
    assert scenario_profile(load_scenario(plain)).scheduler.reserve_full_sequence is False
