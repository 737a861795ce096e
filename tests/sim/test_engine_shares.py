"""SM shares: co-located instances on one GPU. With share s, compute-bound terms (tau1, tau4) stretch by
s**-compute_exponent (toy: 1.0) and memory-bound terms (tau0, tau2, tau3) by s**-memory_exponent (toy: 0.5);
the dynamic (above-idle) energy of a step is kept and the GPU's idle floor is metered once."""

from __future__ import annotations

import math

import pytest

from helpers.reference import ReferencePool, reference_device_state
from helpers.profiles import COLOCATE, toy_profile

from commitenv.sim import EngineOptions, Instance, NoiseSpec, Pool, PoolLayout
from commitenv.workload.table import make_table

IDLE_W = 50.0
TAU = dict(tau0=0.01, tau1=0.001, tau2=0.0001, tau3=0.00001, tau4=1e-6)
EN = dict(a=1.0, c1=0.1, c2=1e-4, b=0.01, kappa=0.001)


def share_profile():
    clocks = [c.model_dump() for c in toy_profile().clocks]
    clocks[1]["time"] = dict(TAU)
    clocks[1]["energy"] = dict(EN)
    return toy_profile(clocks=clocks, scheduler=COLOCATE)


def exact(closed_form=True):
    return EngineOptions(noise=NoiseSpec(0, 0), log_steps=True, closed_form=closed_form)


def law(share, P=0, n=0, L=0, A=0):
    """(time, energy) of one step at the top clock and SM share ``share``, from the stated scaling."""
    fc, fm = share**-1.0, share**-0.5
    t_full = TAU["tau0"] + TAU["tau1"] * P + TAU["tau2"] * n + TAU["tau3"] * L + TAU["tau4"] * A
    t = fm * TAU["tau0"] + fc * TAU["tau1"] * P + fm * TAU["tau2"] * n + fm * TAU["tau3"] * L + fc * TAU["tau4"] * A
    e_full = EN["a"] + EN["c1"] * P + EN["c2"] * A + EN["b"] * n + EN["kappa"] * L
    # dynamic energy kept: e - idle * t == e_full - idle * t_full
    return t, e_full + IDLE_W * (t - t_full), e_full - IDLE_W * t_full


def hand_request(share, prompt, out):
    """Standalone request on an instance with ``share``: list of (t, e, dynamic) per step."""
    steps = [law(share, P=prompt, A=prompt * (prompt + 1) // 2)]
    for j in range(1, out):
        steps.append(law(share, n=1, L=prompt + j))
    return steps


@pytest.mark.parametrize("closed_form", [True, False], ids=["closed", "step"])
def test_two_half_shares_stretch_steps_and_count_floor_once(closed_form):
    layout = PoolLayout(((Instance(0, 0.5), Instance(0, 0.5)),))
    pool = (Pool if closed_form else ReferencePool)(share_profile(), layout, exact(closed_form))
    pool.attach(make_table([0.0, 0.0], [8, 8], [3, 3]))
    pool.run_until(1.0)
    assert pool.replica_of.tolist() == [0, 1]  # one on each instance
    steps = hand_request(0.5, 8, 3)
    # memory terms x sqrt(2), compute terms x 2
    t_pre = steps[0][0]
    assert t_pre == pytest.approx(0.01 * math.sqrt(2) + 2 * (0.008 + 1e-6 * 36))
    fin = sum(t for t, _, _ in steps)
    assert pool.finish_t.tolist() == pytest.approx([fin, fin], abs=1e-12)
    assert pool.first_t.tolist() == pytest.approx([t_pre, t_pre], abs=1e-12)
    for rep in (0, 1):
        assert sum(e.energy_j for e in pool.log if e.replica == rep) == pytest.approx(sum(e for _, e, _ in steps), abs=1e-12)
    # GPU meter: idle floor once over [0, 1] plus the dynamic energy of both instances' steps
    dyn = sum(d for _, _, d in steps)
    assert pool.energy_j(1.0) == pytest.approx(IDLE_W * 1.0 + 2 * dyn, abs=1e-9)
    assert len(pool.layout.gpus) == 1


def test_idle_colocated_gpu_meters_floor_once():
    pool = ReferencePool(share_profile(), PoolLayout(((Instance(0, 0.5), Instance(0, 0.3)),)), exact())
    pool.attach(make_table([10.0], [4], [2]))
    pool.run_until(2.0)
    assert pool.energy_j(2.0) == pytest.approx(2 * IDLE_W)


def test_uneven_shares_and_single_full_share_is_unscaled():
    layout = PoolLayout(((Instance(0, 0.25), Instance(0, 0.75)), (Instance(0, 1.0),)))
    pool = ReferencePool(share_profile(), layout, exact())
    pool.attach(make_table([0.0, 0.0, 0.0], [6, 6, 6], [4, 4, 4]))
    pool.run_until(1.0)
    assert pool.replica_of.tolist() == [0, 1, 2]
    fins = [sum(t for t, _, _ in hand_request(s, 6, 4)) for s in (0.25, 0.75, 1.0)]
    assert pool.finish_t.tolist() == pytest.approx(fins, abs=1e-12)
    full = hand_request(1.0, 6, 4)
    assert full[0][0] == pytest.approx(0.01 + 0.006 + 1e-6 * 21)
    dyn = [sum(d for _, _, d in hand_request(s, 6, 4)) for s in (0.25, 0.75, 1.0)]
    assert pool.gpu_energy_j(1.0).tolist() == pytest.approx([IDLE_W + dyn[0] + dyn[1], IDLE_W + dyn[2]], abs=1e-9)


@pytest.mark.parametrize("closed_form", [True, False], ids=["closed", "step"])
def test_set_share_applies_from_next_step(closed_form):
    # one instance at share 0.5 (other instance idle at 0.5); at a boundary its share drops to 0.25
    layout = PoolLayout(((Instance(0, 0.5), Instance(0, 0.5)),))
    pool = (Pool if closed_form else ReferencePool)(share_profile(), layout, exact(closed_form))
    pool.attach(make_table([0.0], [8], [12]))
    t_b = 0.06
    pool.run_until(t_b)
    pool.settle(t_b)
    pool.set_share(t_b, 0, 0.25)
    pool.run_until(2.0)
    # by hand: steps starting before t_b (and the one in flight at t_b) at 0.5, later ones at 0.25
    t = 0.0
    e_dyn = 0.0
    for j in range(12):
        s = 0.5 if t < t_b else 0.25
        st = law(s, P=8, A=36) if j == 0 else law(s, n=1, L=8 + j)
        t += st[0]
        e_dyn += st[2]
    assert pool.finish_t[0] == pytest.approx(t, abs=1e-12)
    assert pool.energy_j(2.0) == pytest.approx(IDLE_W * 2.0 + e_dyn, abs=1e-9)


def test_invalid_share_sums_raise():
    with pytest.raises(ValueError, match="sum"):
        PoolLayout(((Instance(0, 0.6), Instance(0, 0.6)),))
    pool = ReferencePool(share_profile(), PoolLayout(((Instance(0, 0.5), Instance(0, 0.5)),)), exact())
    with pytest.raises(ValueError, match="sum"):
        pool.set_share(0.0, 0, 0.6)
    with pytest.raises(ValueError):
        pool.set_share(0.0, 0, 0.05)  # below min_share 0.1
    with pytest.raises(ValueError):
        pool.set_share(0.0, 0, 1.5)
    assert reference_device_state(pool).replica_share.tolist() == [0.5, 0.5]
    with pytest.raises(ValueError):
        PoolLayout(((),))
