"""Reference latency L_ref (standalone service time at the reference clock and full SM share) against a hand
loop over chunked prefill and decode steps, and deadlines d = a + alpha * L_ref."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.profiles import COLOCATE, toy_profile

from commitenv.sim import EngineOptions, Instance, NoiseSpec, Pool, PoolLayout
from commitenv.sim.lref import reference_latency
from commitenv.workload.table import make_table


def attn_profile(**over):
    clocks = [c.model_dump() for c in toy_profile().clocks]
    clocks[1]["time"]["tau4"] = 1e-6
    clocks[1]["energy"]["c2"] = 1e-4
    clocks[0]["time"]["tau4"] = 3e-6
    return toy_profile(clocks=clocks, **over)


def hand_lref(tl, budget, p, o):
    """Loop: prefill chunks of at most ``budget`` tokens (A = k*computed + k(k+1)/2), then o - 1 decode
    steps, decode step j attending over p + j keys."""
    t = 0.0
    done = 0
    while done < p:
        k = min(budget, p - done)
        t += tl["tau0"] + tl["tau1"] * k + tl["tau4"] * (k * done + k * (k + 1) // 2)
        done += k
    for j in range(1, o):
        t += tl["tau0"] + tl["tau2"] * 1 + tl["tau3"] * (p + j)
    return t


PAIRS = [(1, 1), (1, 5), (7, 1), (8, 2), (9, 3), (16, 16), (17, 4), (20, 30), (33, 12), (63, 1)]


@pytest.mark.parametrize("budget", [8, 5, 64])
def test_reference_latency_equals_hand_loop(budget):
    prof = attn_profile(scheduler=dict(token_budget=budget))
    top = dict(tau0=0.01, tau1=0.001, tau2=0.0001, tau3=0.00001, tau4=1e-6)
    p = np.array([a for a, _ in PAIRS])
    o = np.array([b for _, b in PAIRS])
    got = reference_latency(prof, p, o)
    exp = [hand_lref(top, budget, a, b) for a, b in PAIRS]
    assert got.tolist() == pytest.approx(exp, rel=1e-12, abs=1e-15)


def test_reference_latency_worked_example():
    # prompt 20, out 3, budget 8: chunks 8, 8, 4 with A = 36, 100, 74; decodes over 21 and 22 keys
    prof = attn_profile()
    exp = (3 * 0.01 + 0.001 * 20 + 1e-6 * 210) + 2 * (0.01 + 0.0001) + 0.00001 * (21 + 22)
    assert exp == pytest.approx(0.05021 + 0.0202 + 0.00043)
    assert exp == pytest.approx(0.07084)
    assert reference_latency(prof, np.array([20]), np.array([3]))[0] == pytest.approx(exp, abs=1e-15)


def test_reference_latency_uses_declared_reference_clock():
    prof = attn_profile(reference_clock_mhz=500)
    low = dict(tau0=0.012, tau1=0.002, tau2=0.0001, tau3=0.000012, tau4=3e-6)
    got = reference_latency(prof, np.array([20, 5]), np.array([3, 7]))
    assert got.tolist() == pytest.approx([hand_lref(low, 8, 20, 3), hand_lref(low, 8, 5, 7)], rel=1e-12)


@pytest.mark.parametrize("p,o", PAIRS)
def test_lone_request_takes_exactly_lref(p, o):
    prof = attn_profile()
    if p + o > 64:
        o = 64 - p
    pool = Pool(prof, PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), alpha=2.5))
    pool.attach(make_table([1.25], [p], [o]))
    pool.run_until(100.0)
    top = dict(tau0=0.01, tau1=0.001, tau2=0.0001, tau3=0.00001, tau4=1e-6)
    lref = hand_lref(top, 8, p, o)
    assert pool.lref[0] == pytest.approx(lref, rel=1e-12)
    assert pool.finish_t[0] - 1.25 == pytest.approx(lref, abs=1e-12)
    assert pool.deadline[0] == pytest.approx(1.25 + 2.5 * lref, abs=1e-12)


def test_deadlines_use_clamped_output_and_full_share():
    prof = attn_profile(scheduler=COLOCATE)
    layout = PoolLayout(((Instance(0, 0.5), Instance(0, 0.5)),))
    pool = Pool(prof, layout, EngineOptions(noise=NoiseSpec(0, 0), alpha=3.0))
    pool.attach(make_table([0.0, 2.0], [60, 10], [50, 5]))
    top = dict(tau0=0.01, tau1=0.001, tau2=0.0001, tau3=0.00001, tau4=1e-6)
    # request 0: output clamped to 64 - 60 = 4
    l0 = hand_lref(top, 8, 60, 4)
    l1 = hand_lref(top, 8, 10, 5)
    assert pool.lref.tolist() == pytest.approx([l0, l1], rel=1e-12)
    assert pool.deadline.tolist() == pytest.approx([3.0 * l0, 2.0 + 3.0 * l1], rel=1e-12)
    # on a half-share instance the request is slower than its reference
    pool.run_until(100.0)
    assert pool.finish_t[0] > l0 * 1.3
