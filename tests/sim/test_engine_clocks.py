"""GPU clocks: a clock change applies after the profile's clock-change latency; the step in flight finishes at
the old clock, steps starting afterwards use the new law; idle power follows the clock level.

Toy laws: 1000 MHz  t = 0.01 + 0.001 P + 0.0001 n + 0.00001 L,   E = 1 + 0.1 P + 0.01 n + 0.001 L,   idle 50 W
          500 MHz   t = 0.012 + 0.002 P + 0.0001 n + 0.000012 L, E = 0.8 + 0.12 P + 0.008 n + 0.0009 L, idle 40 W
"""

from __future__ import annotations

import pytest

from helpers.reference import ReferencePool, reference_device_state
from helpers.profiles import toy_profile

from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
from commitenv.workload.table import make_table


def hi_t(P=0, n=0, L=0):
    return 0.01 + 0.001 * P + 0.0001 * n + 0.00001 * L


def hi_e(P=0, n=0, L=0):
    return 1.0 + 0.1 * P + 0.01 * n + 0.001 * L


def lo_t(P=0, n=0, L=0):
    return 0.012 + 0.002 * P + 0.0001 * n + 0.000012 * L


def lo_e(P=0, n=0, L=0):
    return 0.8 + 0.12 * P + 0.008 * n + 0.0009 * L


def make(arrivals, prompts, outputs, *, latency=0.05, closed_form=True, clock_mhz=None, n=1):
    prof = toy_profile(latencies=dict(clock_change_s=latency, activation_s=1.0))
    pool = (Pool if closed_form else ReferencePool)(prof, PoolLayout.single(n), EngineOptions(
        noise=NoiseSpec(0, 0), log_steps=True, closed_form=closed_form), clock_mhz=clock_mhz)
    pool.attach(make_table(arrivals, prompts, outputs))
    return pool


def hand_clock_change():
    """Prompt 8, out 20 at t = 0; 500 MHz requested at 0 with a 0.05 s latency -> applies at 0.05.
    Returns (per-step (duration, energy) list, finish time)."""
    steps = [(hi_t(P=8), hi_e(P=8))]
    t = steps[0][0]
    for j in range(1, 20):  # decode step j attends over 8 + j keys
        if t < 0.05:  # starts before the change applies: old clock (the one straddling 0.05 too)
            steps.append((hi_t(n=1, L=8 + j), hi_e(n=1, L=8 + j)))
        else:
            steps.append((lo_t(n=1, L=8 + j), lo_e(n=1, L=8 + j)))
        t += steps[-1][0]
    return steps, t


@pytest.mark.parametrize("closed_form", [True, False], ids=["closed", "step"])
def test_clock_change_after_latency_step_in_flight_keeps_old_law(closed_form):
    steps, fin = hand_clock_change()
    # the 4th decode step straddles 0.05: [0.04882, 0.05882) with the 1000 MHz law
    ends = [sum(d for d, _ in steps[: i + 1]) for i in range(len(steps))]
    assert ends[3] < 0.05 < ends[4]
    assert ends[4] == pytest.approx(0.05882)
    assert steps[5][0] == pytest.approx(lo_t(n=1, L=13))

    pool = make([0.0], [8], [20], closed_form=closed_form)
    pool.set_clock(0.0, 500)
    pool.run_until(5.0)
    assert pool.finish_t[0] == pytest.approx(fin, abs=1e-12)
    assert sum(e.energy_j for e in pool.log) == pytest.approx(sum(e for _, e in steps), abs=1e-12)
    assert sum(e.n_steps for e in pool.log) == 20
    if not closed_form:
        for e, (d, en) in zip(pool.log, steps):
            assert e.t1 - e.t0 == pytest.approx(d, abs=1e-12)
            assert e.energy_j == pytest.approx(en, abs=1e-12)
    else:
        # the decode run was cut at the first step end >= 0.05
        assert pool.log[1].n_steps == 4 and pool.log[1].t1 == pytest.approx(0.05882)
    # after the request, the idle floor is the 500 MHz one
    e1 = pool.energy_j(5.0)
    pool.run_until(6.0)
    assert pool.energy_j(6.0) - e1 == pytest.approx(40.0)


def test_idle_power_follows_clock_level():
    pool = make([100.0], [4], [2], latency=0.05)
    pool.run_until(1.0)
    assert pool.energy_j(1.0) == pytest.approx(50.0)
    pool.set_clock(1.0, 500)
    pool.run_until(1.05)
    assert pool.energy_j(1.05) == pytest.approx(50.0 * 1.05)
    pool.run_until(2.05)
    assert pool.energy_j(2.05) == pytest.approx(50.0 * 1.05 + 40.0)
    pool.set_clock(2.05, 1000)
    pool.run_until(3.1)
    assert pool.energy_j(3.1) == pytest.approx(50.0 * 1.05 + 40.0 + 40.0 * 0.05 + 50.0 * 1.0)


def test_initial_clock_and_reference_deadline():
    pool = make([0.0], [8], [3], clock_mhz=500)
    pool.run_until(2.0)
    fin = lo_t(P=8) + lo_t(n=1, L=9) + lo_t(n=1, L=10)
    assert pool.finish_t[0] == pytest.approx(fin, abs=1e-12)
    # L_ref and the deadline are defined at the reference (top) clock whatever the pool runs at
    lref = hi_t(P=8) + hi_t(n=1, L=9) + hi_t(n=1, L=10)
    assert pool.lref[0] == pytest.approx(lref, abs=1e-12)
    assert pool.deadline[0] == pytest.approx(3.0 * lref, abs=1e-12)
    steps_e = lo_e(P=8) + lo_e(n=1, L=9) + lo_e(n=1, L=10)
    assert pool.energy_j(2.0) == pytest.approx(steps_e + 40.0 * (2.0 - fin), abs=1e-9)


def test_cancelled_pending_change_has_no_effect():
    base = make([0.0], [8], [20])
    base.run_until(5.0)
    pool = make([0.0], [8], [20])
    pool.set_clock(0.0, 500)
    pool.run_until(0.02)
    pool.set_clock(0.02, 1000)  # back to the current clock before the change applied at 0.05
    pool.run_until(5.0)
    assert pool.finish_t[0] == base.finish_t[0]
    assert pool.energy_j(5.0) == pytest.approx(base.energy_j(5.0), abs=1e-12)
    assert reference_device_state(pool).gpu_clock_idx[0] == 1


def test_repeating_the_pending_clock_does_not_delay_it():
    # 500 MHz requested at 0 (applies at 0.05); asking again at 0.02 keeps the pending change at 0.05
    pool = make([10.0], [4], [2])
    pool.set_clock(0.0, 500)
    pool.run_until(0.02)
    pool.set_clock(0.02, 500)
    pool.run_until(1.0)
    assert pool.energy_j(1.0) == pytest.approx(50.0 * 0.05 + 40.0 * 0.95)


def test_clock_applies_to_selected_gpus_only():
    pool = make([10.0], [4], [2], latency=0.0, n=2)
    pool.set_clock(0.0, 500, gpus=[1])
    pool.run_until(1.0)
    assert pool.gpu_energy_j(1.0).tolist() == pytest.approx([50.0, 40.0])


def test_meter_equals_step_energies_plus_idle_across_clock_change():
    steps, fin = hand_clock_change()
    pool = make([0.0], [8], [20])
    pool.set_clock(0.0, 500)
    pool.run_until(2.0)
    # no idle gap before the finish; after it, the 500 MHz idle floor
    expected = sum(e for _, e in steps) + 40.0 * (2.0 - fin)
    assert pool.energy_j(2.0) == pytest.approx(expected, abs=1e-9)


def test_meter_is_continuous_inside_a_step_straddling_a_clock_change():
    # at 500 MHz the prefill of 8 tokens takes 0.012 + 0.016 = 0.028 s and 0.8 + 0.96 = 1.76 J; the clock goes
    # up at 0.01 (no latency) while it runs: it finishes under its old law and is metered linearly in time
    pool = make([0.0], [8], [3], latency=0.0, clock_mhz=500)
    pool.run_until(0.01)
    assert pool.energy_j(0.01) == pytest.approx(1.76 * 0.01 / 0.028, abs=1e-12)
    pool.set_clock(0.01, 1000)
    pool.run_until(0.01)
    assert pool.energy_j(0.01) == pytest.approx(1.76 * 0.01 / 0.028, abs=1e-12)
    pool.run_until(0.02)
    assert pool.energy_j(0.02) == pytest.approx(1.76 * 0.02 / 0.028, abs=1e-12)


def test_step_starting_at_the_clock_change_instant_is_metered_at_its_energy():
    # the request arrives at 1.0 on an idle replica, its prefill starts at 1.0 at 1000 MHz; a clock change
    # requested at 1.0 with no latency applies at 1.0, after that step started (it keeps the old law)
    pool = make([1.0], [8], [1], latency=0.0)
    pool.run_until(1.0)
    pool.set_clock(1.0, 500)
    pool.run_until(2.0)
    assert pool.finish_t[0] == pytest.approx(1.0 + hi_t(P=8), abs=1e-12)
    assert pool.energy_j(2.0) == pytest.approx(50.0 * 1.0 + hi_e(P=8) + 40.0 * (1.0 - hi_t(P=8)), abs=1e-9)
