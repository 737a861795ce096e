"""The engine's hooks with their default policies change nothing: a benchmark run with the least-unfinished dispatch
policy installed equals the engine's own router bit for bit, and one with first-come-first-served local plans equals
the vLLM scheduler stepping one step at a time bit for bit (requests' finish times and replicas, metered energy); a
local policy plans every step, so against the engine's closed-form decode runs it agrees to rounding (1e-12 of the
time). Quick:
the first 15 minutes of a benchmark hour; slow: a whole day. FCFS equals vLLM while KV suffices, so the premise (no
preemption) is asserted too."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.slow import slow_requested

from commitenv.envs import CommitServeEnv
from commitenv.sim.dispatch import LeastUnfinished
from commitenv.sim.local import FcfsLocal


def _run(scenario: str, *, dispatch: bool = False, local: bool = False, stepwise: bool = False,
         intervals: int | None = None):
    env = CommitServeEnv(scenario)
    env.reset(seed=100000)
    if stepwise:
        env.pool.opt.closed_form = False  # (test only) the engine steps decode runs one step at a time
    if dispatch:
        env.set_dispatch(LeastUnfinished())
    if local:
        env.set_local_policy(FcfsLocal())
    act = {"active": env.n_replicas, "clock": env.profile.reference_clock_index}
    for _ in range(intervals or env.H * env.K):
        env.step(act)
    return env.pool


def _same(a, b) -> None:
    assert np.array_equal(a.finish_t, b.finish_t, equal_nan=True)
    assert np.array_equal(a.replica_of, b.replica_of)
    assert a.energy_j() == b.energy_j()


def _check(scenario: str, intervals: int | None) -> None:
    base = _run(scenario, intervals=intervals)
    assert base.preemptions.sum() == 0 and base.completed > 1000  # the premise of FCFS = vLLM
    routed = _run(scenario, dispatch=True, intervals=intervals)
    assert routed.dispatch_calls >= routed.completed and base.dispatch_calls == 0
    _same(base, routed)
    stepped = _run(scenario, stepwise=True, intervals=intervals)
    planned = _run(scenario, stepwise=True, local=True, intervals=intervals)
    assert planned.local_calls > 0 and stepped.local_calls == 0
    _same(stepped, planned)
    done = ~np.isnan(base.finish_t)
    assert np.array_equal(done, ~np.isnan(planned.finish_t))
    # rounding of the closed-form runs' sums: 1.4e-11 s after 15 minutes, 1.5e-9 s after a day (t ~ 86,400 s)
    assert np.all(np.abs(base.finish_t[done] - planned.finish_t[done]) <= 1e-12 * np.maximum(base.finish_t[done], 1.0))
    assert planned.energy_j() == pytest.approx(base.energy_j(), rel=1e-10)


def test_default_hooks_equal_the_engine_on_a_quarter_hour():
    _check("bench-h200-hour-fixed-a30", 15)


@pytest.mark.slow
def test_default_hooks_equal_the_engine_on_a_benchmark_day(request):
    if not slow_requested(request.config):
        pytest.skip("slow (a day, four runs: minutes): run with -m slow or COMMITENV_RUN_SLOW=1")
    _check("bench-h200-day", None)
