"""Closed-form decode runs on the compiled loop vs the step-by-step reference engine (tests/helpers/reference): on
random small cases with several replicas, arrivals, preemptions, periodic `run_until(t); settle(t)` boundaries and
controller actions (active count, clock, SM share) at those boundaries, completion and first-token times, preemption
counts, per-GPU energies at every boundary and the executed steps agree."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.profiles import toy_profile
from helpers.reference import ReferencePool

from commitenv.sim import EngineOptions, Instance, NoiseSpec, Pool, PoolLayout
from commitenv.workload.table import make_table


def expand(pool):
    out = []
    for e in sorted(pool.log, key=lambda e: (e.replica, e.t0)):
        for j in range(e.n_steps):
            out.append((e.replica, e.slots, e.new_tokens, tuple(c + j for c in e.computed_before)))
    return out


def make(layout, prof, table, closed_form):
    """The closed form on the compiled loop; without it, the reference engine (tests/helpers/reference)."""
    opt = EngineOptions(noise=NoiseSpec(0, 0), log_steps=True, closed_form=closed_form)
    pool = (Pool if closed_form else ReferencePool)(prof, layout, opt)
    pool.attach(table)
    return pool


def random_table(rng, n, rate):
    arr = np.cumsum(rng.exponential(1.0 / rate, n))
    return make_table(arr, rng.integers(1, 45, n), rng.integers(1, 45, n))


def compare(a, b, t):
    assert a.energy_j(t) == pytest.approx(b.energy_j(t), abs=1e-9)
    assert a.gpu_energy_j(t) == pytest.approx(b.gpu_energy_j(t), abs=1e-9)
    assert a.completed == b.completed
    assert a.counts() == b.counts()


CASES = [
    # seed, n, rate, n_gpus, boundary step (s), actions?, clock latency, colocated?
    (101, 40, 60.0, 1, 0.05, False, 0.0, False),
    (102, 60, 120.0, 3, 0.037, False, 0.0, False),
    (103, 60, 90.0, 3, 0.1, True, 0.0, False),
    (104, 60, 90.0, 3, 0.1, True, 0.013, False),
    (105, 50, 150.0, 2, 0.0613, True, 0.02, False),
    (106, 50, 100.0, 2, 0.08, True, 0.0, True),
]


@pytest.mark.parametrize("seed,n,rate,n_gpus,dt,actions,clock_lat,coloc", CASES)
def test_closed_form_equals_step_by_step(seed, n, rate, n_gpus, dt, actions, clock_lat, coloc):
    rng = np.random.default_rng(seed)
    table = random_table(rng, n, rate)
    # co-located: a KV cache at share 1 of 132 tokens leaves each half-share instance 64 (`commitenv.sim.memory`)
    prof = toy_profile(latencies=dict(clock_change_s=clock_lat, activation_s=0.07),
                       scheduler=dict(kv_capacity_tokens=132 if coloc else 64))
    if coloc:
        layout = PoolLayout(tuple((Instance(0, 0.5), Instance(0, 0.5)) for _ in range(n_gpus)))
    else:
        layout = PoolLayout.single(n_gpus)
    a = make(layout, prof, table, True)
    b = make(layout, prof, table, False)
    n_rep = len(a.replica_models)
    t_end = float(table.arrival_s[-1]) + 10.0
    t = 0.0
    n_actions = 0
    while t < t_end:
        t = round(t + dt, 9)
        for p in (a, b):
            p.run_until(t)
            p.settle(t)
        compare(a, b, t)
        if actions and t < table.arrival_s[-1]:
            u = rng.random()
            if u < 0.25:
                k = int(rng.integers(1, n_rep + 1))
                for p in (a, b):
                    p.set_active(t, k)
                n_actions += 1
            elif u < 0.45:
                mhz = int(rng.choice([500, 1000]))
                for p in (a, b):
                    p.set_clock(t, mhz)
                n_actions += 1
            elif coloc and u < 0.6:
                g = int(rng.integers(0, n_gpus))
                s = float(rng.choice([0.3, 0.5, 0.7]))
                for p in (a, b):
                    p.set_share(t, 2 * g + 1, 0.1)  # make room first: shares on a GPU must sum to <= 1
                    p.set_share(t, 2 * g, s)
                    p.set_share(t, 2 * g + 1, round(1.0 - s, 6))
                n_actions += 1
    for p in (a, b):
        if p.live:
            p.set_active(t, n_rep)
        p.run_until(t + 100.0)
    assert a.completed == b.completed == n
    assert a.finish_t.tolist() == pytest.approx(b.finish_t.tolist(), abs=1e-9)
    assert a.first_t.tolist() == pytest.approx(b.first_t.tolist(), abs=1e-9)
    assert a.max_tbt_s.tolist() == pytest.approx(b.max_tbt_s.tolist(), abs=1e-9)
    assert a.preemptions.tolist() == b.preemptions.tolist()
    assert a.replica_of.tolist() == b.replica_of.tolist()
    compare(a, b, t + 100.0)
    assert expand(a) == expand(b)
    # the closed form actually compressed something
    assert len(a.log) < len(b.log)
    if actions:
        assert n_actions > 0


def test_cases_include_preemption():
    rng = np.random.default_rng(102)
    table = random_table(rng, 60, 120.0)
    p = make(PoolLayout.single(3), toy_profile(), table, True)
    p.run_until(100.0)
    assert p.preemptions.sum() > 0


# ----------------------------------------------------------------------------------------- exact ties
def dyadic_profile():
    """Step times that are exact binary fractions (tau0 = 1/64 s, tau1 = 1/1024 s, others 0)."""
    lvl = dict(
        mhz=1000,
        time=dict(tau0=1 / 64, tau1=1 / 1024, tau2=0.0, tau3=0.0, tau4=0.0),
        energy=dict(a=1.0, c1=0.125, c2=0.0, b=0.0625, kappa=0.0),
        active_idle_w=50.0,
        draining_idle_w=50.0,
    )
    return toy_profile(clocks=[lvl], reference_clock_mhz=1000)


T_PREFILL_A = 1 / 64 + 8 / 1024  # A: prompt 8
T_PREFILL_B = 1 / 64 + 4 / 1024  # B: prompt 4


def tie_case(arrival_b, closed_form):
    pool = make(PoolLayout.single(1), dyadic_profile(), make_table([0.0, arrival_b], [8, 4], [20, 2]), closed_form)
    pool.run_until(10.0)
    return pool


@pytest.mark.parametrize("closed_form", [True, False], ids=["closed", "step"])
@pytest.mark.parametrize("which", ["inside-run", "prefill-end"])
def test_arrival_exactly_at_step_end_is_admitted_at_that_boundary(which, closed_form):
    # A's decode step j ends at T_PREFILL_A + j/64 exactly. B arrives exactly at the end of A's decode step 3
    # (inside a closed-form run) or exactly at the end of A's prefill step: the first step end >= its arrival
    # is that very step end, so B's prefill starts there, in both engines.
    t_b = T_PREFILL_A + 3 / 64 if which == "inside-run" else T_PREFILL_A
    pool = tie_case(t_b, closed_form)
    assert pool.first_t[1] == t_b + T_PREFILL_B
