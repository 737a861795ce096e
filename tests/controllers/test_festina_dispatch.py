"""Festina's global scheduler as a dispatch policy (`commitenv_controllers.festina.dispatch`, paper sec. 3.3).

Hand-built candidate views on the toy profile (conftest.py: budget 8 tokens, two clocks, round coefficients). The
expected times and energies are written out from the toy's step laws here (a prompt of p tokens: ceil(p / 8)
steps; decode step t = tau0 + tau2 n + tau3 L; E = a + c1 P + b n + kappa L; SM-share scaling: compute terms x
1/share, memory terms x share**-0.5, energy plus the idle power over the extra time), never taken from the
policy. The prompts used (8 tokens) are LUT grid lengths, where the LUT returns the profiled values unchanged.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.profiles import toy_profile

from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
from commitenv.sim.dispatch import ArrivalView, CandidateView
from commitenv.workload.table import make_table
from commitenv_controllers.festina.dispatch import PHASES, FestinaDispatch
from commitenv_controllers.festina.lut import DEFAULT_SHARES, FestinaLUT, LutGrid

TOY_LENS = (2, 4, 6, 8, 12, 16, 24, 32, 48)
BUDGET = 8
TOP = dict(tau0=0.01, tau1=0.001, tau2=0.0001, tau3=0.00001, a=1.0, c1=0.1, b=0.01, kappa=0.001, idle=50.0)
LOW = dict(tau0=0.012, tau1=0.002, tau2=0.0001, tau3=0.000012, a=0.8, c1=0.12, b=0.008, kappa=0.0009, idle=40.0)


@pytest.fixture(scope="module")
def lut() -> FestinaLUT:
    return FestinaLUT.from_profile(toy_profile(), LutGrid((500, 1000), DEFAULT_SHARES, TOY_LENS), degree=3)


# ------------------------------------------------------------------------------------------ the toy laws by hand
def scaled(lv: dict, share: float) -> dict:
    fc, fm = 1.0 / share, share ** -0.5
    t = dict(tau0=lv["tau0"] * fm, tau1=lv["tau1"] * fc, tau2=lv["tau2"] * fm, tau3=lv["tau3"] * fm)
    extra = {"a": "tau0", "c1": "tau1", "b": "tau2", "kappa": "tau3"}
    return dict(t, **{e: lv[e] + lv["idle"] * (t[k] - lv[k]) for e, k in extra.items()}, idle=lv["idle"])


def step_t(lv, P, n, L):
    return lv["tau0"] + lv["tau1"] * P + lv["tau2"] * n + lv["tau3"] * L


def prefill_t(lv, p):
    return math.ceil(p / BUDGET) * lv["tau0"] + lv["tau1"] * p


def energy(lv, p, o):
    """Festina's E = prefill energy + (o - 1) decode-step energies at context p + 1 (the request alone)."""
    return math.ceil(p / BUDGET) * lv["a"] + lv["c1"] * p + (o - 1) * (lv["a"] + lv["b"] + lv["kappa"] * (p + 1))


def arrival(prompt=8, pred=10, within=10.0, t=0.0) -> ArrivalView:
    return ArrivalView(0, t, prompt, pred, t + within, 0, 0)


def cand(index, clock=1000, share=1.0, free=16, kv=16, running=0, waiting=0, P=0, L=0, bt=4) -> CandidateView:
    return CandidateView(index, index, running + waiting, running, waiting, free, kv, clock, share, 0, bt, P, L)


# ------------------------------------------------------------------------------------------ padding
def test_padded_output_length_arithmetic(lut):
    pol = FestinaDispatch(lut)
    assert [pol.padded_output(x) for x in (1, 10, 19, 20, 100, 200, 0)] == [2, 11, 20, 21, 105, 210, 1]
    assert FestinaDispatch(lut, pad=0.0).padded_output(7) == 7
    assert FestinaDispatch(lut, pad=0.1).padded_output(10) == 11


def test_padded_length_enters_the_deadline_and_the_memory_demand(lut):
    # prompt 8, predicted 20 -> padded 21 (20 decode steps). Empty replica at the top clock: first token at
    # TTFT = 1 step + 8 tokens = 0.018 s, TBT (one request, context 9) = 0.01 + 0.0001 + 0.00009 = 0.01019 s.
    done = prefill_t(TOP, 8) + 20 * step_t(TOP, 0, 1, 9)
    assert done == pytest.approx(0.2218)
    assert prefill_t(TOP, 8) + 19 * step_t(TOP, 0, 1, 9) < done - 1e-4  # unpadded would fit below
    ok, late = FestinaDispatch(lut), FestinaDispatch(lut)
    assert ok.choose(arrival(8, 20, within=done + 1e-4), (cand(0),)) == 0 and ok.decisions["energy"] == 1
    late.choose(arrival(8, 20, within=done - 1e-4), (cand(0),))
    assert late.decisions["infeasible"] == 1 and late.scale_out_requests == 1
    # memory: (8 + 21) tokens -> ceil(29 / 4) = 8 blocks. With 8 free the replica is available now; with 7 free it
    # must wait for its decoding request (residual 100 steps of 1 request at context 40: 1.0104 s x 1/9) and misses
    busy = dict(running=1, L=40, kv=16)
    pol = FestinaDispatch(lut, residual_steps=100)
    tbt2 = step_t(TOP, 0, 2, 40 + 9)  # the batch TBT: 2 requests at summed context 40 + 8 + 1
    req = arrival(8, 20, within=prefill_t(TOP, 8) + 20 * tbt2 + 1e-4)  # feasible when available now
    assert pol.choose(req, (cand(0, free=8, **busy),)) == 0 and pol.decisions["energy"] == 1
    wait = 1 / 9 * 100 * step_t(TOP, 0, 1, 40)
    assert prefill_t(TOP, 8) + wait + 20 * tbt2 > req.visible_deadline_s
    pol.choose(req, (cand(0, free=7, **busy),))
    assert pol.decisions["infeasible"] == 1


# ------------------------------------------------------------------------------------------ phase 2: energy
def test_lower_energy_gpu_wins_when_both_meet_the_slo(lut):
    # prompt 8, predicted 10 -> padded 11. Low clock: E = 0.8 + 0.96 + 10 (0.8 + 0.008 + 0.0081) = 9.921 J;
    # top clock: 1.8 + 10 x 1.019 = 11.99 J. Both meet a lenient deadline: the low clock wins, listed first or not.
    assert energy(LOW, 8, 11) == pytest.approx(9.921) and energy(TOP, 8, 11) == pytest.approx(11.99)
    for order in ((cand(0, clock=1000), cand(1, clock=500)), (cand(1, clock=500), cand(0, clock=1000))):
        pol = FestinaDispatch(lut)
        assert pol.choose(arrival(8, 10), order) == 1
        assert pol.decisions == {"energy": 1, "fallback_max_clock": 0, "infeasible": 0}
    # the low clock finishes at 0.028 + 10 x 0.012208 = 0.15008 s, the top clock at 0.018 + 0.1019 = 0.1199 s:
    # a deadline between them leaves only the top clock feasible
    low_done = prefill_t(LOW, 8) + 10 * step_t(LOW, 0, 1, 9)
    top_done = prefill_t(TOP, 8) + 10 * step_t(TOP, 0, 1, 9)
    assert low_done == pytest.approx(0.15008) and top_done == pytest.approx(0.1199)
    pol = FestinaDispatch(lut)
    assert pol.choose(arrival(8, 10, within=0.13), (cand(0, clock=1000), cand(1, clock=500))) == 0
    assert pol.decisions["energy"] == 1


def test_tie_break_most_free_memory_then_largest_sm_free(lut):
    req = arrival(8, 10)
    # same clock and share: the same energy -> most free memory (tokens: blocks x block size), then lowest index
    pol = FestinaDispatch(lut)
    assert pol.choose(req, (cand(0, free=10), cand(1, free=14), cand(2, free=12))) == 1
    assert pol.choose(req, (cand(0, free=10, bt=4), cand(1, free=6, kv=12, bt=8))) == 1  # 48 tokens > 40
    assert pol.choose(req, (cand(0, free=14), cand(1, free=14))) == 0
    # 2 % band: low clock 9.921 J vs top 11.99 J (21 % apart) -> energy decides despite less free memory...
    assert pol.choose(req, (cand(0, clock=1000, free=16), cand(1, clock=500, free=8))) == 1
    # ...a 25 % band holds both, so the most free memory wins
    assert FestinaDispatch(lut, tie=0.25).choose(req, (cand(0, clock=1000, free=16), cand(1, clock=500, free=8))) == 0
    # equal free memory: the largest SM_free (the instance's share) wins within the band. Low clock at share 0.9
    # costs the least, the top clock at share 1.0 is within 20 %:
    e_low9, e_top = energy(scaled(LOW, 0.9), 8, 11), energy(TOP, 8, 11)
    assert e_low9 == pytest.approx(10.2817, abs=1e-3) and e_low9 < e_top < 1.2 * e_low9
    pair = (cand(0, clock=500, share=0.9, free=12), cand(1, clock=1000, share=1.0, free=12))
    assert FestinaDispatch(lut, tie=0.2).choose(req, pair) == 1
    assert FestinaDispatch(lut).choose(req, pair) == 0  # outside 2 %: the least energy
    # more free memory beats a larger share
    pair = (cand(0, clock=500, share=0.9, free=13), cand(1, clock=1000, share=1.0, free=12))
    assert FestinaDispatch(lut, tie=0.2).choose(req, pair) == 0


# ------------------------------------------------------------------------------------------ phase 1: feasibility
def test_a_queue_that_breaks_the_ttft_slo_is_skipped(lut):
    # replica 0: 400 queued prompt tokens (20 waiting prompts of 20): ceil(400 / 8) = 50 steps, 0.5 + 0.4 = 0.9 s
    # ahead of the request, over the short class's 250 ms TTFT; replica 1 (less free memory, so second on a tie)
    # has nothing queued
    assert 50 * TOP["tau0"] + 400 * TOP["tau1"] + prefill_t(TOP, 8) > 0.250
    pol = FestinaDispatch(lut)
    assert pol.choose(arrival(8, 10), (cand(0, free=16, waiting=20, P=400), cand(1, free=8))) == 1
    assert pol.decisions["energy"] == 1
    # a short queue is fine: 2 waiting prompts of 12 = 24 tokens, 3 steps with the 2 decoding requests riding
    # along (n = 2, L = 40): 3 x (0.01 + 0.008 + 0.0002 + 0.0004) = 0.0558 s, then the request's 0.018 s
    first = 3 * step_t(TOP, 8, 2, 40) + prefill_t(TOP, 8)
    assert first == pytest.approx(0.0738)
    tbt = step_t(TOP, 0, 3, 40 + 9)  # running + 1 at summed context 40 + 8 + 1
    done = first + 10 * tbt
    q = cand(0, free=16, running=2, waiting=2, P=24, L=40)
    pol = FestinaDispatch(lut)
    assert pol.choose(arrival(8, 10, within=done + 1e-5), (q,)) == 0 and pol.decisions["energy"] == 1
    pol.choose(arrival(8, 10, within=done - 1e-5), (q,))
    assert pol.decisions["infeasible"] == 1


def test_ttft_slo_follows_the_request_class(lut):
    # 150 queued tokens (one waiting prompt): 19 steps x 0.01 + 0.15 = 0.34 s, + 0.018 s: over the short class's
    # 250 ms, under the medium class's 400 ms (predicted 100 tokens -> medium output class; padded 105: 29 blocks)
    first = 19 * TOP["tau0"] + 150 * TOP["tau1"] + prefill_t(TOP, 8)
    assert 0.25 < first < 0.40
    c = cand(0, waiting=1, P=150, free=64, kv=64)
    short, medium = FestinaDispatch(lut), FestinaDispatch(lut)
    short.choose(arrival(8, 99), (c,))
    medium.choose(arrival(8, 100), (c,))
    assert short.decisions["infeasible"] == 1 and medium.decisions["energy"] == 1


def test_batch_tbt_over_the_slo_is_skipped(lut):
    # 100 decoding requests at summed context 8000: one more makes a step of 0.01 + 0.0101 + 0.08009 s > 100 ms
    assert step_t(TOP, 0, 101, 8000 + 9) > 0.100
    assert step_t(TOP, 0, 91, 8000 + 9) < 0.100
    pol = FestinaDispatch(lut)
    heavy, light = cand(0, free=16, running=100, L=8000), cand(1, free=8, running=90, L=8000)
    assert pol.choose(arrival(8, 1, within=1.0), (heavy, light)) == 1
    assert pol.decisions["energy"] == 1


def test_t_avail_waits_for_blocks_to_free(lut):
    # demand ceil((8 + 11) / 4) = 5 blocks, 2 free of 16: deficit 3 of 14 held. The replica's 2 decoding requests
    # (context 40) drain in residual 10 steps of 0.01 + 0.0002 + 0.0004 = 0.0106 s: T_avail = 3/14 x 0.106 s
    t_avail = 3 / 14 * 10 * step_t(TOP, 0, 2, 40)
    done = t_avail + prefill_t(TOP, 8) + 10 * step_t(TOP, 0, 3, 49)
    assert done == pytest.approx(0.148614, abs=1e-6)
    c = cand(0, free=2, running=2, L=40)
    for within, phase in ((done + 1e-5, "energy"), (done - 1e-5, "infeasible")):
        pol = FestinaDispatch(lut, residual_steps=10)
        pol.choose(arrival(8, 10, within=within, t=3.0), (c,))
        assert pol.decisions[phase] == 1
    # default residual: half the mean predicted output so far (here this request's 10 -> 5 steps)
    t_avail5 = 3 / 14 * 5 * step_t(TOP, 0, 2, 40)
    done5 = t_avail5 + prefill_t(TOP, 8) + 10 * step_t(TOP, 0, 3, 49)
    for within, phase in ((done5 + 1e-5, "energy"), (done5 - 1e-5, "infeasible")):
        pol = FestinaDispatch(lut)
        pol.choose(arrival(8, 10, within=within), (c,))
        assert pol.decisions[phase] == 1
    # more blocks than the replica has: never available, only a bigger replica can take it
    pol = FestinaDispatch(lut)
    big = arrival(40, 30, within=100.0)  # 40 + 32 tokens = 18 blocks > 16
    assert pol.choose(big, (cand(0, free=16, kv=16), cand(1, free=20, kv=32, running=1, L=5))) == 1


# ------------------------------------------------------------------------------------------ phase 3
def test_fallback_to_the_max_clock_by_earliest_t_avail(lut):
    # both replicas at the low clock miss a 0.13 s deadline. At the top clock: replica 1 (empty, T_avail = now)
    # finishes at 0.1199 s. Replica 0 (2 blocks free, one decoding request at context 10; residual 2) would make
    # it too at the top clock, but its T_avail at the current clock is later, so replica 1 is tried first.
    req = arrival(8, 10, within=0.13, t=2.0)
    low0 = 3 / 14 * 2 * step_t(LOW, 0, 1, 10) + prefill_t(LOW, 8) + 10 * step_t(LOW, 0, 2, 19)
    top0 = 3 / 14 * 2 * step_t(TOP, 0, 1, 10) + prefill_t(TOP, 8) + 10 * step_t(TOP, 0, 2, 19)
    low1 = prefill_t(LOW, 8) + 10 * step_t(LOW, 0, 1, 9)
    top1 = prefill_t(TOP, 8) + 10 * step_t(TOP, 0, 1, 9)
    assert low0 > 0.13 and low1 > 0.13 and top0 < 0.13 and top1 < 0.13
    pair = (cand(0, clock=500, free=2, running=1, L=10), cand(1, clock=500))
    pol = FestinaDispatch(lut, residual_steps=2)
    assert pol.choose(req, pair) == 1
    assert pol.decisions == {"energy": 0, "fallback_max_clock": 1, "infeasible": 0}
    assert pol.boost_requests == {1: 2.0} and pol.scale_out_requests == 0
    # replica 1 is full of queued prompts (0.9 s ahead even at the top clock): replica 0 is next and feasible
    pair = (cand(0, clock=500, free=2, running=1, L=10), cand(1, clock=500, waiting=20, P=400))
    pol = FestinaDispatch(lut, residual_steps=2)
    assert pol.choose(req, pair) == 0 and pol.decisions["fallback_max_clock"] == 1 and pol.boost_requests == {0: 2.0}
    # max_clock_mhz = the low clock: no boost helps
    pol = FestinaDispatch(lut, max_clock_mhz=500, residual_steps=2)
    pol.choose(req, (cand(0, clock=500, free=2, running=1, L=10), cand(1, clock=500)))
    assert pol.decisions["infeasible"] == 1
    with pytest.raises(ValueError, match="not a grid clock"):
        FestinaDispatch(lut, max_clock_mhz=700)


def test_scale_out_when_nothing_is_feasible_even_at_the_max_clock(lut):
    # 0.1 s deadline: even an empty replica at the top clock needs 0.1199 s
    calls = []
    pol = FestinaDispatch(lut, scale_out=lambda t, r: calls.append((t, r.slot)), residual_steps=2)
    pair = (cand(0, clock=1000, free=2, running=1, L=10), cand(1, clock=500), cand(2, clock=500))
    assert pol.choose(arrival(8, 10, within=0.1, t=4.0), pair) == 1  # earliest T_avail (now), lowest index
    assert pol.decisions == {"energy": 0, "fallback_max_clock": 0, "infeasible": 1}
    assert pol.scale_out_requests == 1 and pol.last_scale_out_t == 4.0 and calls == [(4.0, 0)]
    # T_avail tie (both now): the earlier first token at the max clock (no queue) wins
    pair = (cand(0, clock=500, waiting=1, P=8), cand(1, clock=500))
    assert pol.choose(arrival(8, 10, within=0.1, t=5.0), pair) == 1
    assert pol.scale_out_requests == 2 and pol.last_scale_out_t == 5.0
    assert pol.pop_requests() == (2, {}) and pol.pop_requests() == (0, {})
    assert pol.scale_out_requests == 2  # the cumulative counter stays


def test_off_grid_shares_and_clocks_snap_down(lut):
    # share 0.55 evaluates as 0.5, clock 700 as 500: the 0.5 share at the low clock
    pol = FestinaDispatch(lut)
    assert pol.op(700, 0.55) is pol.op(500, 0.5)
    assert pol.op(2000, 1.0) is pol.op(1000, 1.0) and pol.op(100, 0.05) is pol.op(500, 0.1)
    assert pol.choose(arrival(8, 10), (cand(0, clock=700, share=0.55),)) == 0


# ------------------------------------------------------------------------------------------ end to end
class Recording(FestinaDispatch):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.seen: list[tuple[int, tuple[int, ...], int]] = []

    def choose(self, req, replicas):
        pick = super().choose(req, replicas)
        self.seen.append((req.slot, tuple(r.index for r in replicas), pick))
        return pick


def test_end_to_end_pool_with_two_clocks(lut):
    prof = toy_profile(scheduler=dict(token_budget=8, max_seqs=4, context_limit=64, block_size=4,
                                      kv_capacity_tokens=128))
    rng = np.random.default_rng(0)
    n = 300
    table = make_table(np.sort(rng.uniform(0, 15, n)), rng.integers(2, 40, n), rng.integers(1, 20, n))
    pool = Pool(prof, PoolLayout.single(4), EngineOptions(noise=NoiseSpec(0, 0), seed=1))
    pol = Recording(lut)
    pool.dispatch = pol
    pool.attach(table)
    pool.set_clock(0.0, 500, gpus=[0, 1])
    pool.run_until(np.inf)
    arrivals = int((~pool.rejected).sum())
    assert arrivals > 250
    assert len(pol.seen) == pool.dispatch_calls == arrivals
    assert all(pick in idx for _, idx, pick in pol.seen)
    assert {idx for _, idx, _ in pol.seen} == {(0, 1, 2, 3)}
    assert sum(pol.decisions.values()) == arrivals and set(pol.decisions) == set(PHASES)
    assert pol.decisions["energy"] > 0
    assert np.all(np.isfinite(pool.finish_t[~pool.rejected]))
    assert np.array_equal(pool.replica_of[[s for s, _, _ in pol.seen]], [p for _, _, p in pol.seen])
    # the low clock costs less energy per request: energy-phase choices go to GPUs 0 and 1 while they are feasible
    low = sum(1 for _, _, p in pol.seen if p in (0, 1))
    assert low > arrivals / 2
