"""Festina's local scheduler (`commitenv_controllers.festina.local`, paper sec. 3.4) as a commitenv local policy.

Expectations are computed by hand from the attention toy profile of conftest.py (top clock 1000 MHz: t = 0.01 +
0.001 P + 0.0001 n + 1e-5 L + 1e-6 A, E = 1 + 0.1 P + 0.01 n + 0.001 L + 1e-4 A; low clock 500 MHz: t = 0.012 +
0.002 P + 0.0001 n + 1.2e-5 L + 2e-6 A, E = 0.8 + 0.12 P + 0.008 n + 0.0009 L + 2e-4 A; SM share s scales the
compute terms (tau1, tau4) by 1/s and the memory terms (tau0, tau2, tau3) by 1/sqrt(s)), with Table 2's SLOs
(TTFT 250 / 400 / 2000 ms, TBT 100 ms), never copied from the implementation's output.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.profiles import attn_toy_profile

from commitenv.latency_slo import latency_outcome, slo_class
from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
from commitenv.sim.local import LocalView, TaskView
from commitenv.workload.table import make_table
from commitenv_controllers.festina.local import FestinaLocal, slo_class_of
from commitenv_controllers.festina.lut import DEFAULT_SHARES, FestinaLUT, LutGrid

TOY_LENS = (2, 4, 6, 8, 12, 16, 24, 32, 48)
SCHED = {"token_budget": 8, "max_seqs": 4, "context_limit": 64, "block_size": 4, "kv_capacity_tokens": 64}


@pytest.fixture(scope="module")
def lut() -> FestinaLUT:
    return FestinaLUT.from_profile(attn_toy_profile(scheduler=SCHED), LutGrid((500, 1000), DEFAULT_SHARES, TOY_LENS))


def task(slot, *, running, prompt, computed, generated, pred, arrival, deadline, blocks, last=None):
    """A task view; a request with tokens had its latest one at ``last`` (default: t = 1 s, the views' time)."""
    left = prompt + generated - computed
    last = (1.0 if generated else -1.0) if last is None else last
    return TaskView(slot, running, left == 1 and generated >= 1, left, computed, prompt, generated, pred, arrival,
                    deadline, blocks, last)


def view_of(tasks, *, t=1.0, clock=1000, share=1.0, free=3, budget=8, max_seqs=4):
    return LocalView(t, 0, 0, 0, clock, (500, 1000), share, free, 4, budget, max_seqs, tuple(tasks))


# three decodes (slots 10, 11, 12) and two prefills (21 running, chunked; 20 waiting), at t = 1 s, 1000 MHz
FIVE = [
    task(10, running=True, prompt=12, computed=20, generated=9, pred=30, arrival=0.5, deadline=3.0, blocks=6),
    task(11, running=True, prompt=30, computed=40, generated=11, pred=11, arrival=0.0, deadline=2.0, blocks=11),
    task(12, running=True, prompt=8, computed=10, generated=3, pred=50, arrival=0.2, deadline=1.5, blocks=3),
    task(21, running=True, prompt=24, computed=8, generated=0, pred=200, arrival=0.95, deadline=5.0, blocks=2),
    task(20, running=False, prompt=16, computed=0, generated=0, pred=40, arrival=0.9, deadline=4.0, blocks=0),
]


def test_scores_and_order_by_hand(lut):
    pol = FestinaLocal(lut, beta=0.1)
    s = {x.slot: x for x in pol.scores(view_of(FIVE))}
    # decode 10: one step alone at context 21; budget per token min(0.1, (3 - 1) / (30 - 9)); age 0.5
    lat = 0.01 + 0.0001 + 1e-5 * 21
    slack = min(0.1, 2.0 / 21) - lat
    assert s[10].latency_s == pytest.approx(lat, rel=1e-12)
    assert s[10].slack_s == pytest.approx(slack, rel=1e-12)
    assert s[10].score == pytest.approx(lat / (slack - 0.1 * 0.5), rel=1e-12)
    # decode 11: generated 11 = predicted 11 and still running -> mis-predicted (first); age 1 -> +inf anyway
    assert s[11].mispredicted and s[11].score == math.inf
    # decode 12: budget 0.5 / 47 s per token; slack - 0.1 * 0.8 < 0 -> +inf, deadline 1 + 0.5 / 47
    assert s[12].score == math.inf and not s[12].mispredicted
    assert s[12].deadline_s == pytest.approx(1.0 + 0.5 / 47, rel=1e-12)
    # prefill 20 (short class: 16 tokens, predicted 40): TTFT deadline 0.9 + 0.25; 16 tokens in 2 chunks of 8,
    # attention pairs 16 * 17 / 2 = 136
    lat20 = 2 * 0.01 + 0.001 * 16 + 1e-6 * 136
    assert s[20].deadline_s == pytest.approx(1.15, rel=1e-12)
    assert s[20].latency_s == pytest.approx(lat20, rel=1e-12)
    assert s[20].score == pytest.approx(lat20 / (1.15 - 1.0 - lat20 - 0.1 * 0.1), rel=1e-12)
    # prefill 21 (medium class: predicted 200 >= 100): deadline 0.95 + 0.4; 16 tokens left after 8,
    # pairs 24 * 25 / 2 - 8 * 9 / 2 = 264
    lat21 = 2 * 0.01 + 0.001 * 16 + 1e-6 * 264
    assert s[21].score == pytest.approx(lat21 / (1.35 - 1.0 - lat21 - 0.1 * 0.05), rel=1e-12)
    # by hand: 20 -> 0.3478, 10 -> 0.2952, 21 -> 0.1173
    order = pol.priority(view_of(FIVE))
    assert order == (11, 12, 20, 10, 21)
    # the fill: budget 8, 3 free KV blocks, 4 sequences running: waiting 20 is bypassed (sequence cap), 21 gets
    # the 5 tokens left (8 + 5 = 13 tokens -> 4 blocks, holds 2: needs 2 <= 3)
    b = pol.batch(view_of(FIVE), order)
    assert b.slots == (11, 12, 10, 21)
    assert b.tokens == (1, 1, 1, 5)
    assert (b.P, b.A, b.n, b.L) == (5, 5 * 8 + 15, 3, 41 + 11 + 21)
    # the plan lists every task; at 1000 MHz that batch takes 0.01 + 0.001 * 5 + 0.0001 * 3 + 1e-5 * 73 + 1e-6 * 55 =
    # 16.1 ms, past decode 12's 0.5 / 47 = 10.6 ms per token, and the decodes alone take 11.0 ms: the step is cut to
    # the decodes (budget 3), listed first (`cap_chunks`)
    plan = pol.plan(view_of(FIVE))
    assert plan.order == (11, 12, 10, 20, 21) and plan.token_budget == 3
    assert pol.last[0].batch == (11, 12, 10) and pol.capped == 1


def test_a_decode_deadline_runs_from_its_previous_token(lut):
    """Per-token TBT: a decode whose previous token came 60 ms ago has 40 ms left of its 100 ms, whatever its
    end-to-end budget; the sweep then needs a step that ends by then."""
    pol = FestinaLocal(lut, beta=0.0)
    late = task(10, running=True, prompt=12, computed=20, generated=9, pred=30, arrival=0.5, deadline=30.0, blocks=6,
                last=0.94)
    s = pol.scores(view_of([late]))[0]
    assert s.deadline_s == pytest.approx(1.04, rel=1e-12)  # min(0.94 + 0.1, 1 + 29 / 21)
    lat = 0.01 + 0.0001 + 1e-5 * 21
    assert s.slack_s == pytest.approx(0.04 - lat, rel=1e-9)
    b = pol.batch(view_of([late]), (10,))
    assert b.decode_tbt_s == pytest.approx(0.04, rel=1e-9)
    # a step of 41 ms (500 MHz: 0.012 + 0.0001 + 1.2e-5 * 21 + ...) misses it, 1000 MHz meets it
    k500, k1000 = pol.coeffs(0, 500, 1.0), pol.coeffs(0, 1000, 1.0)
    assert not pol.feasible(k500, b._replace(decode_tbt_s=0.012), 1.0, 8)[0]
    assert pol.feasible(k1000, b, 1.0, 8)[0]
    on_time = late._replace(last_token_s=1.0)
    assert pol.scores(view_of([on_time]))[0].deadline_s == pytest.approx(1.1, rel=1e-12)


def test_a_step_that_would_stall_a_decode_is_cut_to_the_chunk_that_keeps_its_deadline(lut):
    """At 500 MHz (the step runs at the current clock) a decode over 21 keys whose previous token came 70 ms ago has
    30 ms left; beside it a 60-token prompt. Step time 0.012 + 0.002 P + 0.0001 + 1.2e-5 * 21 + 2e-6 P (P + 1) / 2:
    P = 8 takes 28.4 ms, P = 9 30.4 ms, so the step's budget is 1 + 8 = 9, the decode listed first."""
    pol = FestinaLocal(lut)
    view = view_of([
        task(2, running=False, prompt=60, computed=0, generated=0, pred=10, arrival=0.99, deadline=50.0, blocks=0),
        task(1, running=True, prompt=10, computed=20, generated=11, pred=100, arrival=0.0, deadline=100.0, blocks=6,
             last=0.93),
    ], clock=500, free=50, budget=64)
    t8 = 0.012 + 0.002 * 8 + 0.0001 + 1.2e-5 * 21 + 2e-6 * 36
    t9 = 0.012 + 0.002 * 9 + 0.0001 + 1.2e-5 * 21 + 2e-6 * 45
    assert t8 < 0.03 < t9
    plan = pol.plan(view)
    assert plan.token_budget == 9 and plan.order == (1, 2)
    d = pol.last[0]
    assert d.batch == (1, 2) and d.step_s == pytest.approx(t8, rel=1e-12) and pol.capped == 1
    # with the decode's previous token just now (100 ms left) the 60 tokens still take 136 ms: cut to 1 + 42 (98.2 ms;
    # 43 take 100.2 ms); a 20-token prompt (52.8 ms) is not cut
    assert pol.plan(view._replace(tasks=(view.tasks[0], view.tasks[1]._replace(last_token_s=1.0)))).token_budget == 43
    short = view._replace(tasks=(view.tasks[0]._replace(prompt_tokens=20, tokens_left=20),
                                 view.tasks[1]._replace(last_token_s=1.0)))
    assert pol.plan(short).token_budget is None and pol.capped == 2


def test_slo_class_matches_the_vectorised_one():
    p, o = np.meshgrid([1, 255, 256, 1023, 1024, 9000], [1, 99, 100, 349, 350, 2000])
    assert [slo_class_of(int(a), int(b)) for a, b in zip(p.ravel(), o.ravel())] == slo_class(p, o).ravel().tolist()


def sweep_view(arrival_lag, t=1.0, replica=0):
    """A decode (context 21, far deadline) and a waiting 6-token prompt that arrived ``arrival_lag`` s ago."""
    return view_of([
        task(1, running=True, prompt=10, computed=20, generated=11, pred=100, arrival=0.0, deadline=100.0, blocks=6,
             last=t),
        task(2, running=False, prompt=6, computed=0, generated=0, pred=10, arrival=t - arrival_lag,
             deadline=50.0, blocks=0),
    ], free=10, t=t)._replace(replica=replica)


# the step: P = 6, A = 6 * 7 / 2 = 21, n = 1, L = 21
T500 = 0.012 + 0.002 * 6 + 0.0001 + 1.2e-5 * 21 + 2e-6 * 21
E500 = 0.8 + 0.12 * 6 + 0.008 + 0.0009 * 21 + 2e-4 * 21
T1000 = 0.01 + 0.001 * 6 + 0.0001 + 1e-5 * 21 + 1e-6 * 21
E1000 = 1.0 + 0.1 * 6 + 0.01 + 0.001 * 21 + 1e-4 * 21


def test_loose_deadlines_choose_the_lower_clock(lut):
    pol = FestinaLocal(lut)
    plan = pol.plan(sweep_view(0.0))  # TTFT deadline 0.25 s away
    assert E500 < E1000
    assert plan.clock_mhz == 500
    d = pol.last[0]
    assert d.batch == (2, 1) or d.batch == (1, 2)
    assert d.feasible and d.clock_mhz == 500 == d.gpu_clock_mhz
    assert d.energy_j == pytest.approx(E500, rel=1e-12)
    assert d.step_s == pytest.approx(T500, rel=1e-12)
    # least share at 500 MHz: the decode's TBT (100 ms) binds. s = 0.1: memory part / sqrt(0.1) + compute part / 0.1
    mem, comp = 0.012 + 0.0001 + 1.2e-5 * 21, 0.002 * 6 + 2e-6 * 21
    assert mem / math.sqrt(0.1) + comp / 0.1 > 0.1 >= mem / math.sqrt(0.2) + comp / 0.2
    assert d.needed_share == pytest.approx(0.2)
    assert pol.peak_share == {0: pytest.approx(0.2)}


def test_a_tight_ttft_deadline_chooses_the_top_clock(lut):
    pol = FestinaLocal(lut)
    plan = pol.plan(sweep_view(0.23))  # deadline 0.02 s away: T1000 fits, T500 does not
    assert T1000 <= 0.02 < T500
    assert plan.clock_mhz == 1000
    d = pol.last[0]
    assert d.feasible and d.energy_j == pytest.approx(E1000, rel=1e-12)
    # least share at 1000 MHz: s = 0.8 meets 0.02 s, s = 0.7 does not
    mem, comp = 0.01 + 0.0001 + 1e-5 * 21, 0.001 * 6 + 1e-6 * 21
    assert mem / math.sqrt(0.8) + comp / 0.8 <= 0.02 < mem / math.sqrt(0.7) + comp / 0.7
    assert d.needed_share == pytest.approx(0.8)


def test_infeasible_at_every_clock_takes_the_top_clock(lut):
    pol = FestinaLocal(lut)
    plan = pol.plan(sweep_view(0.245))  # deadline 5 ms away: no clock makes it
    assert plan.clock_mhz == 1000
    d = pol.last[0]
    assert not d.feasible and d.needed_share is None
    assert d.energy_j == pytest.approx(E1000, rel=1e-12)
    assert pol.reset_peaks() == {0: 1.0} and pol.peak_share == {}


def test_a_co_resident_replicas_higher_clock_is_kept():
    lut_ = FestinaLUT.from_profile(attn_toy_profile(scheduler=SCHED), LutGrid((500, 1000), DEFAULT_SHARES, TOY_LENS))
    pol = FestinaLocal(lut_, vote_window_s=0.25)
    tight = sweep_view(0.23)
    assert pol.plan(tight).clock_mhz == 1000
    loose = sweep_view(0.0, t=1.1, replica=1)  # another instance of GPU 0, 0.1 s later
    assert pol.plan(loose).clock_mhz == 1000 and pol.last[1].clock_mhz == 500
    later = sweep_view(0.0, t=1.3, replica=1)  # the other choice is now older than the window
    assert pol.plan(later).clock_mhz == 500


# ------------------------------------------------------------------------------------------ the engine
class Spy(FestinaLocal):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen = []

    def plan(self, view):
        plan = super().plan(view)
        assert sorted(plan.order) == sorted(t.slot for t in view.tasks)
        self.seen.append((view.replica, view.t, self.last[view.replica].batch))
        return plan


def pool_of(n_rep, sched, *, policy=None, **opt):
    p = Pool(attn_toy_profile(scheduler=sched), PoolLayout.single(n_rep),
             EngineOptions(closed_form=False, log_steps=True, **opt))
    p.set_local_policy(policy)
    return p


RANDOM_SCHED = {"token_budget": 16, "max_seqs": 4, "context_limit": 64, "block_size": 4, "kv_capacity_tokens": 96}


def random_run(policy_class, n: int, seed: int):
    """``policy_class`` (on a LUT of RANDOM_SCHED's toy profile) serving ``n`` random requests on 2 replicas to the
    end: (pool, policy)."""
    lut_ = FestinaLUT.from_profile(attn_toy_profile(scheduler=RANDOM_SCHED),
                                   LutGrid((500, 1000), DEFAULT_SHARES, TOY_LENS))
    rng = np.random.default_rng(seed)
    prompt = rng.integers(2, 40, n)
    table = make_table(np.sort(rng.uniform(0, 4, n)), prompt, np.minimum(rng.integers(1, 25, n), 63 - prompt))
    pol = policy_class(lut_)
    pool = pool_of(2, RANDOM_SCHED, policy=pol, noise=NoiseSpec(), seed=1, alpha=2.0)
    pool.attach(table)
    pool.run_until(np.inf)
    return pool, pol


def test_the_engine_serves_a_random_workload_to_completion():
    pool, pol = random_run(Spy, 150, 3)
    assert np.all(np.isfinite(pool.finish_t))
    assert len(pol.seen) == pool.local_calls > 0
    # the predicted batch is the step the engine filled (when the plan filled anything)
    steps = {(e.replica, e.t0): e.slots for e in pool.log}
    filled = [(r, t, b) for r, t, b in pol.seen if b]
    assert filled and all(steps[r, t] == b for r, t, b in filled)
    clocks = {e.clock_mhz for e in pool.log}
    assert clocks == {500, 1000}  # busy spells need the top clock, quiet ones do not


class OnTheHost(FestinaLocal):
    """`FestinaLocal` called back on the host for every step (a subclass that overrides `plan` is not compiled)."""

    def plan(self, view):
        return super().plan(view)


def test_the_compiled_loop_plans_the_steps_the_host_plans():
    """The engine's loop runs the policy's compiled plan in place (`commitenv.sim.local_compiled`); called back on the
    host through `plan` instead, the same policy plans the same steps, clocks and budgets, and records the same."""
    (a, pa), (b, pb) = (random_run(cls, 200, 7) for cls in (FestinaLocal, OnTheHost))
    steps = [[(e.t0, e.replica, e.slots, e.new_tokens, e.clock_mhz) for e in p.log] for p in (a, b)]
    assert steps[0] == steps[1] and len({s[4] for s in steps[0]}) == 2
    assert np.array_equal(a.finish_t, b.finish_t) and a.energy_j() == b.energy_j()
    assert a.local_calls == 0 and b.local_calls == pb.calls == pa.calls == a.compiled_plans > 0
    assert pa.capped == pb.capped > 0
    assert pa.last == pb.last and pa.usage == pb.usage and pa.peak_share == pb.peak_share


def test_loose_deadlines_spend_less_energy_than_vllm_at_the_top_clock(lut):
    sched = dict(SCHED, kv_capacity_tokens=256)
    rng = np.random.default_rng(5)
    n = 60
    prompt = rng.integers(2, 30, n)
    table = make_table(np.sort(rng.uniform(0, 20, n)), prompt, rng.integers(2, 30, n))
    opt = {"noise": NoiseSpec(0, 0), "alpha": 10.0}
    vllm = pool_of(1, sched, **opt)
    fest = pool_of(1, sched, policy=FestinaLocal(lut), **opt)
    for p in (vllm, fest):
        p.attach(table)
        p.run_until(np.inf)
        assert np.all(np.isfinite(p.finish_t))
    assert {e.clock_mhz for e in vllm.log} == {1000}
    assert 500 in {e.clock_mhz for e in fest.log}
    horizon = max(vllm.now, fest.now)
    assert fest.energy_j(horizon) < vllm.energy_j(horizon)
    for p in (vllm, fest):  # and every request still meets its TTFT and TBT SLOs
        out = latency_outcome(table.arrival_s, p.first_t, p.finish_t, p.max_tbt_s, table.prompt_tokens,
                              table.output_tokens)
        assert out.met.all()
