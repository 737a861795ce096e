"""Local plans made inside the compiled loop (`commitenv.sim.local_compiled`): a compiled first-come-first-served
policy steps exactly as the host's `FcfsLocal` (which the vLLM scheduler equals while KV suffices), a compiled plan's
clock and token budget act as a host plan's do, and every malformed compiled plan or array is refused."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cfunc

from helpers.profiles import toy_profile

from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
from commitenv.sim.local import FcfsLocal, LocalPolicy, StepPlan
from commitenv.sim.local_compiled import PLAN_SIG, CompiledPlan
from commitenv.workload.table import make_table

BIG = dict(token_budget=32, max_seqs=8, context_limit=64, block_size=4, kv_capacity_tokens=4096)

# pf[0]: (mode, clock level or -1, token budget or 0); mode 0 lists the rows in order, 1 lists row 0 twice (with two
# tasks), 2 a row past the tasks, 3 answers -2 (no policy), 4 a plan longer than the tasks; si[0, 0] counts the calls
@cfunc(PLAN_SIG)
def fcfs_plan(t, x, gpu, model, clock_level, levels, share, free, bs, budget, max_seqs, ints, flts, pf, pi, sf, si,
              out):  # pragma: no cover (compiled)
    si[0, 0] += 1
    mode = int(pf[0, 0])
    out[0] = int(pf[0, 1])
    out[1] = int(pf[0, 2])
    n = ints.shape[0]
    for i in range(n):
        out[2 + i] = i
    if mode == 1 and n > 1:
        out[3] = 0
    if mode == 2:
        out[2] = n
    if mode == 3:
        return -2
    if mode == 4:
        return n + 1
    return n


class CompiledFcfs(LocalPolicy):
    """`FcfsLocal` planned in the loop (optionally asking a clock level and a token budget, or malformed)."""

    name = "compiled_fcfs"

    def __init__(self, mode: int = 0, level: int = -1, budget: int = 0) -> None:
        self.pf = np.array([[mode, level, budget]], np.float64)
        self.si = np.zeros((1, 1), np.int64)

    def plan(self, view):  # (never called when the loop plans)
        raise AssertionError("a compiled policy was called back on the host")

    def compiled(self, replicas, gpus, max_seqs):
        return CompiledPlan(fcfs_plan, self.pf, np.zeros((1, 1), np.int64), np.zeros((1, 1)), self.si)


class HostPlan(LocalPolicy):
    """A host plan with a fixed clock and token budget (what `CompiledFcfs` asks through its output row)."""

    name = "host"

    def __init__(self, clock_mhz=None, budget=None) -> None:
        self.clock_mhz, self.budget = clock_mhz, budget

    def plan(self, view):
        return StepPlan(tuple(t.slot for t in view.tasks), self.clock_mhz, self.budget)


def run(policy, table, n_rep=3, **opt):
    pool = Pool(toy_profile(scheduler=BIG), PoolLayout.single(n_rep),
                EngineOptions(noise=NoiseSpec(), closed_form=False, log_steps=True, seed=4, **opt))
    pool.set_local_policy(policy)
    pool.attach(table)
    pool.run_until(np.inf)
    return pool


def workload(n=200, seed=0):
    rng = np.random.default_rng(seed)
    return make_table(np.sort(rng.uniform(0, 10, n)), rng.integers(2, 30, n), rng.integers(1, 25, n))


def steps(pool):
    return [(e.t0, e.replica, e.slots, e.new_tokens, e.clock_mhz) for e in pool.log]


def test_a_compiled_fcfs_plans_the_steps_the_host_fcfs_plans():
    table = workload()
    host, loop = run(FcfsLocal(), table), run(CompiledFcfs(), table)
    assert steps(host) == steps(loop) and len(steps(loop)) > 100
    assert np.array_equal(host.finish_t, loop.finish_t) and np.array_equal(host.replica_of, loop.replica_of)
    assert host.energy_j() == loop.energy_j()
    # every step was planned in the loop: as many calls as the host made, none of them on the host
    assert loop.local_calls == 0 and host.local_calls > 0
    assert loop.local_policies[0].si[0, 0] == host.local_calls


@pytest.mark.parametrize("level, budget", [(0, 0), (1, 5), (-1, 3)])
def test_a_compiled_plans_clock_and_budget_act_as_a_host_plans(level, budget):
    table = workload(120, seed=2)
    clocks = toy_profile(scheduler=BIG).clock_mhz
    host = run(HostPlan(clocks[level] if level >= 0 else None, budget or None), table)
    loop = run(CompiledFcfs(level=level, budget=budget), table)
    assert steps(host) == steps(loop)
    assert np.array_equal(host.finish_t, loop.finish_t) and host.energy_j() == loop.energy_j()
    if budget:
        assert max(sum(e.new_tokens) for e in loop.log) <= budget
    if level >= 0:
        assert {e.clock_mhz for e in loop.log if e.t0 > 1.0} == {clocks[level]}  # (after the change latency)


@pytest.mark.parametrize("kw, says", [
    ({"mode": 1}, "listed twice"), ({"mode": 2}, "outside the replica's tasks"), ({"budget": 33}, "token budget"),
    ({"budget": -1}, "token budget"), ({"level": 9}, "clock level"), ({"mode": 3}, "without its policy"),
    ({"mode": 4}, "longer than")])
def test_a_malformed_compiled_plan_is_refused(kw, says):
    with pytest.raises((ValueError, RuntimeError), match=says):
        run(CompiledFcfs(**kw), make_table([0.0, 0.0], [4, 6], [2, 3]), n_rep=1)


@pytest.mark.parametrize("field, value, says", [
    ("pf", np.zeros((1, 3), np.float32), "CompiledPlan.pf"), ("si", np.zeros(3, np.int64), "CompiledPlan.si"),
    ("sf", np.zeros((4, 4))[:, ::2], "CompiledPlan.sf"), ("fn", np.zeros((1, 1)), "CompiledPlan.fn")])
def test_a_compiled_plan_with_bad_arrays_is_refused(field, value, says):
    class Bad(CompiledFcfs):
        def compiled(self, replicas, gpus, max_seqs):
            return super().compiled(replicas, gpus, max_seqs)._replace(**{field: value})

    with pytest.raises(ValueError, match=says):
        run(Bad(), make_table([0.0], [4], [2]), n_rep=1)


def test_one_compiled_policy_in_the_loop_a_second_on_the_host():
    """The loop carries one compiled policy: a second object on other replicas is planned through its `plan`."""
    table = workload(150, seed=5)
    first, second = CompiledFcfs(), CompiledFcfs()
    second.plan = FcfsLocal().plan  # (this object's host plan: FCFS too)
    pool = Pool(toy_profile(scheduler=BIG), PoolLayout.single(3),
                EngineOptions(noise=NoiseSpec(), closed_form=False, log_steps=True, seed=4))
    pool.set_local_policy(first, [0, 1])
    pool.set_local_policy(second, [2])
    pool.attach(table)
    pool.run_until(np.inf)
    assert steps(pool) == steps(run(FcfsLocal(), table))
    assert first.si[0, 0] > 0 and second.si[0, 0] == 0 and pool.local_calls > 0
