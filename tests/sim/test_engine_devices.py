"""`commitenv.sim.devices.device_state`: what the replicas and GPUs are doing, read off the compiled loop's arrays,
equals what the reference engine's objects hold on a twin run (tests/helpers/reference, both step by step), at every
check of a run with moves, activations, clock changes and the legacy noise; a step log hooked mid-run logs what the
reference does from then on."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers.profiles import toy_profile
from helpers.reference import ReferencePool, reference_device_state

from commitenv.sim import EngineOptions, NoiseSpec, Pool
from commitenv.sim.devices import device_state
from commitenv.sim.pool import Instance, PoolLayout
from commitenv.workload.table import make_table

SCHED = dict(token_budget=32, max_seqs=6, context_limit=512, block_size=4, kv_capacity_tokens=2048)
LAYOUT = ((Instance(0, 0.5), Instance(1, 0.5)), (Instance(0, 0.4), Instance(1, 0.4)), (Instance(0, 0.3),))


def _pool(on_kernel: bool, monkeypatch) -> Pool:
    """Two models sharing three GPUs (SM shares), 400 requests over a minute; on the compiled loop or the reference."""
    toy = toy_profile(scheduler=SCHED, latencies=dict(clock_change_s=0.05, activation_s=1.0, load_s=3.0, load_w=70.0),
                      model=dict(name="toy-model", params_b=1, weight_gb=1, kv_bytes_per_token=1e5))
    rng = np.random.default_rng(5)
    pool = (Pool if on_kernel else ReferencePool)([toy, toy], PoolLayout(LAYOUT),
                                                  EngineOptions(noise=NoiseSpec(0.03, 0.03), seed=5, closed_form=False))
    n = 400
    table = make_table(np.sort(rng.uniform(0, 60, n)), rng.integers(4, 300, n), rng.integers(1, 400, n))
    table = dataclasses.replace(table, tenant=rng.integers(0, 2, n).astype(np.int32), tenant_names=("a", "b"))
    pool.attach(table, {0: 0, 1: 1})
    return pool


def _act(pool: Pool, rng: np.random.Generator, t: float) -> None:
    """A random action at ``t`` (twins draw the same): a move, an activation count, a clock."""
    try:
        pool.move(t, {int(rng.integers(0, 5)): int(rng.integers(0, 3))},
                  migrate=("none", "latency_aware", "all")[int(rng.integers(0, 3))])
    except ValueError:
        pass
    m = int(rng.integers(0, 2))
    pool.set_active(t, int(rng.integers(1, (3, 2)[m] + 1)), model=m)
    mhz = [lvl.mhz for lvl in pool.profiles[0].clocks]
    pool.set_clock(t, int(mhz[rng.integers(len(mhz))]))


def test_device_state_of_the_compiled_loop_equals_the_reference_objects(monkeypatch):
    fast, ref = _pool(True, monkeypatch), _pool(False, monkeypatch)
    rngs = [np.random.default_rng(2) for _ in range(2)]
    seen_segments = 0
    for k in range(1, 25):
        t = 2.5 * k
        for p, rng in zip((fast, ref), rngs):
            p.run_until(t)
            if k % 4 == 0:
                _act(p, rng, t)
        a, b = device_state(fast), reference_device_state(ref)
        for f in dataclasses.fields(a):
            np.testing.assert_array_equal(getattr(a, f.name), getattr(b, f.name), err_msg=f"{f.name} at t={t}")
        seen_segments += int((a.replica_segment != 0).sum())
    assert seen_segments > 20  # (the checks fell while segments were in flight)
    assert fast.events == ref.events


@pytest.mark.parametrize("hook", ["log", "on_step"])
def test_a_step_log_hooked_mid_run_logs_what_starts_from_then_on(monkeypatch, hook):
    """From the moment a log (or hook) is set, the segments that start are logged, exactly as on the reference;
    segments already in flight are not."""
    fast, ref = _pool(True, monkeypatch), _pool(False, monkeypatch)
    for p in (fast, ref):
        p.run_until(20.0)
    got: dict[int, list] = {0: [], 1: []}
    for i, p in enumerate((fast, ref)):
        if hook == "log":
            p.log = got[i]
        else:
            p.on_step = got[i].append
    assert fast._ks.logging
    for p in (fast, ref):
        p.run_until(40.0)
    assert len(got[0]) > 50 and got[0] == got[1]
    assert all(e.t0 >= 20.0 for e in got[0])  # (what was in flight when the log was hooked is not in it)
