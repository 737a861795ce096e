"""Malformed engine input gets a clear ValueError naming what was expected, and leaves the engine untouched."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.profiles import COLOCATE, toy_profile

from commitenv.sim import EngineOptions, Instance, NoiseSpec, Pool, PoolLayout, observed_arrivals, simulate, take_snapshot
from commitenv.sim.devices import device_state
from commitenv.sim.kernel.layout import G_PENDING, I_HEAP
from commitenv.workload.table import make_table


def exact():
    return EngineOptions(noise=NoiseSpec(0, 0), log_steps=True)


def busy_pool(n=3):
    pool = Pool(toy_profile(), PoolLayout.single(n), exact())
    pool.attach(make_table([0.0, 0.001, 0.002, 0.5], [20, 20, 20, 4], [30, 30, 30, 3]))
    pool.run_until(0.1)
    pool.settle(0.1)
    return pool


def fingerprint(pool):
    """Everything an action could change: replica states and shares, clocks and pending clock changes, where each
    live request is and what it computed, the pending events."""
    ks = pool._ks
    d = device_state(pool)
    rows = ks.view_rows()
    return (
        d.replica_state.tolist(),
        d.gpu_clock_idx.tolist(),
        ks.gi[:, G_PENDING].tolist(),
        d.replica_share.tolist(),
        sorted(zip(rows["slot"].tolist(), rows["replica"].tolist(), rows["computed_tokens"].tolist())),
        int(ks.si[I_HEAP]),
        ks.ht[: int(ks.si[I_HEAP])].tolist(),
    )


@pytest.mark.parametrize("count", [0, -1, 4, 10])
def test_invalid_active_count(count):
    pool = busy_pool()
    before = fingerprint(pool)
    with pytest.raises(ValueError, match=r"1\.\.3"):
        pool.set_active(0.1, count)
    assert fingerprint(pool) == before


def test_set_active_in_the_past():
    pool = busy_pool()
    before = fingerprint(pool)
    with pytest.raises(ValueError, match="precedes"):
        pool.set_active(0.05, 2)
    assert fingerprint(pool) == before
    pool.set_active(0.1, 2)  # at the engine clock is fine


def test_unsupported_clock_lists_levels():
    pool = busy_pool()
    before = fingerprint(pool)
    with pytest.raises(ValueError, match=r"750.*\[500, 1000\]"):
        pool.set_clock(0.1, 750)
    assert fingerprint(pool) == before
    with pytest.raises(ValueError, match=r"\[500, 1000\]"):
        Pool(toy_profile(), PoolLayout.single(1), exact(), clock_mhz=900)


@pytest.mark.parametrize("share", [0.0, 0.05, 1.01, -0.5])
def test_set_share_out_of_range(share):
    pool = busy_pool()
    before = fingerprint(pool)
    with pytest.raises(ValueError, match=r"0\.1\.\.1\.0"):
        pool.set_share(0.1, 0, share)
    assert fingerprint(pool) == before


def test_layout_errors():
    with pytest.raises(ValueError, match="sum"):
        PoolLayout(((Instance(0, 0.7), Instance(0, 0.4)),))
    with pytest.raises(ValueError, match="at least one"):
        PoolLayout(((Instance(0, 0.5),), ()))
    with pytest.raises(ValueError, match="at least one GPU"):
        PoolLayout.single(0)
    with pytest.raises(ValueError, match="no profile"):
        Pool(toy_profile(), PoolLayout(((Instance(1),),)), exact())
    one = toy_profile()
    one = one.model_copy(update={"name": "toy-one-clock", "clocks": one.clocks[1:]})
    with pytest.raises(ValueError, match=r"different clock levels \[\(500, 1000\), \(1000,\)\]"):
        Pool([toy_profile(), one], PoolLayout(((Instance(0, 0.5), Instance(1, 0.5)),)), exact())


def test_option_errors():
    with pytest.raises(ValueError, match="alpha"):
        Pool(toy_profile(), PoolLayout.single(1), EngineOptions(alpha=0.0))
    with pytest.raises(ValueError, match="time_sigma"):
        NoiseSpec(1.0, 0.0)
    with pytest.raises(ValueError, match="energy_sigma"):
        NoiseSpec(0.0, -0.1)


def test_tenant_mapped_to_missing_model():
    pool = Pool(toy_profile(), PoolLayout.single(1), exact())
    with pytest.raises(ValueError, match="tenant"):
        pool.attach(make_table([0.0], [4], [2]), tenant_model={0: 1})


def test_replay_before_snapshot_and_no_workload():
    pool = busy_pool()
    snap = take_snapshot(pool)
    with pytest.raises(ValueError, match="before the snapshot"):
        simulate(snap, 2, 1000, 1.0, arrivals=make_table([0.05], [4], [2]))
    bare = Pool(toy_profile(), PoolLayout.single(1), exact())
    with pytest.raises(ValueError, match="no workload"):
        observed_arrivals(bare, 1.0)


@pytest.mark.parametrize("which", ["clock", "share"])
def test_actions_in_the_past_are_rejected(which):
    prof = toy_profile(scheduler=COLOCATE)
    layout = PoolLayout(((Instance(0, 0.5), Instance(0, 0.5)),))
    pool = Pool(prof, layout, exact())
    pool.attach(make_table([0.0], [4], [40]))
    pool.run_until(0.2)
    with pytest.raises(ValueError):
        if which == "clock":
            pool.set_clock(0.05, 500)
        else:
            pool.set_share(0.05, 0, 0.3)


@pytest.mark.parametrize("share", [0.05, 0.0, -0.2])
def test_layout_share_out_of_range_rejected_at_construction(share):
    with pytest.raises(ValueError):
        Pool(toy_profile(), PoolLayout(((Instance(0, share),),)), exact())


def test_rejected_request_never_enters_the_pool():
    pool = Pool(toy_profile(), PoolLayout.single(1), exact())
    pool.attach(make_table([0.0, 0.1], [64, 100], [5, 5]))
    pool.run_until(1.0)
    assert pool.completed == 0 and pool.live == 0
    assert np.all(np.isinf(pool.finish_t))
    assert pool.energy_j(1.0) == pytest.approx(50.0)
