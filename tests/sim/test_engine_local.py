"""Local scheduling policies called by the engine at each step: first-come-first-served through the plan equals
the vLLM scheduler while KV suffices (bit for bit), hand-built queues for priority order and the skip of a task
that does not fit, the fallback to vLLM when a plan fills nothing, a plan's clock, what a policy sees, bad plans,
and the controller/env wiring."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.reference import ReferencePool
from helpers.profiles import toy_profile

from commitenv.sim import EngineOptions, NoiseSpec, PoolLayout
from commitenv.sim.local import FcfsLocal, LocalPolicy, StepPlan
from commitenv.workload.table import make_table

BIG = dict(token_budget=32, max_seqs=8, context_limit=64, block_size=4, kv_capacity_tokens=4096)


def pool_of(n_rep=1, *, policy=None, sched=BIG, noise=False, **opt):
    p = ReferencePool(toy_profile(scheduler=sched), PoolLayout.single(n_rep),
             EngineOptions(noise=NoiseSpec() if noise else NoiseSpec(0, 0), closed_form=False, log_steps=True, **opt))
    p.set_local_policy(policy)
    return p


def first_batch(pool, slot):
    e = next(e for e in pool.log if slot in e.slots)
    return e.slots, e.new_tokens


def test_fcfs_through_the_plan_equals_the_vllm_scheduler_while_kv_suffices():
    rng = np.random.default_rng(0)
    n = 200
    table = make_table(np.sort(rng.uniform(0, 10, n)), rng.integers(2, 30, n), rng.integers(1, 25, n))
    runs = []
    for policy in (None, FcfsLocal()):
        pool = pool_of(3, policy=policy, noise=True, seed=4)
        pool.attach(table)
        pool.run_until(np.inf)
        runs.append(pool)
    a, b = runs
    assert a.preemptions.sum() == 0  # KV never ran short: the premise of the equality
    assert [(e.t0, e.slots, e.new_tokens) for e in a.log] == [(e.t0, e.slots, e.new_tokens) for e in b.log]
    assert np.array_equal(a.finish_t, b.finish_t) and a.energy_j() == b.energy_j()
    assert b.local_calls >= len(b.log) and a.local_calls == 0


class ShortestFirst(LocalPolicy):
    """Fewest tokens left first (slot on ties)."""

    name = "shortest_first"

    def plan(self, view):
        return StepPlan(tuple(t.slot for t in sorted(view.tasks, key=lambda t: (t.tokens_left, t.slot))))


def test_the_plans_priority_decides_who_is_served_first():
    # three prompts arrive together; budget 32: vLLM admits in arrival order 20 + 12 (budget spent), then 6;
    # shortest-first admits 6 + 12 and 14 tokens of the 20-token prompt in the first step
    table = make_table([0.0, 0.0, 0.0], [20, 12, 6], [3, 3, 3])
    out = {}
    for name, policy in (("vllm", None), ("short", ShortestFirst())):
        pool = pool_of(policy=policy)
        pool.attach(table)
        pool.run_until(np.inf)
        out[name] = (pool.log[0].slots, pool.log[0].new_tokens)
    assert out["vllm"] == ((0, 1), (20, 12))
    assert out["short"] == ((2, 1, 0), (6, 12, 14))


def test_a_task_that_does_not_fit_is_skipped_for_one_that_does():
    # KV 8 blocks of 4 tokens = 32 tokens. Request 0 (prompt 20) is admitted first and holds 5 blocks (+1 when its
    # first token needs one more). Then a 24-token prompt (6 blocks) does not fit; the 8-token one (2 blocks) does:
    # vLLM's FCFS admission stops at the head of the queue, the plan skips it.
    sched = dict(BIG, kv_capacity_tokens=32, context_limit=32)
    table = make_table([0.0, 0.001, 0.002], [20, 24, 8], [6, 3, 3])
    out = {}
    for name, policy in (("vllm", None), ("fcfs", FcfsLocal())):
        pool = pool_of(policy=policy, sched=sched)
        pool.attach(table)
        pool.run_until(np.inf)
        out[name] = pool
    v, f = out["vllm"], out["fcfs"]
    # vLLM: request 2 waits behind request 1 until request 0 finishes; both start together
    assert v.first_t[2] == v.first_t[1] > v.finish_t[0]
    # the plan: request 2 joins request 0's second step, past the head that does not fit
    assert f.log[1].slots == (0, 2) and f.log[1].new_tokens == (1, 8)
    assert f.first_t[2] < f.finish_t[0] < f.first_t[1]
    assert np.all(np.isfinite(f.finish_t))


def test_an_empty_plan_falls_back_to_the_vllm_scheduler():
    class Idle(LocalPolicy):
        name = "idle"

        def plan(self, view):
            return StepPlan(())

    table = make_table([0.0, 0.5], [10, 10], [5, 5])
    a, b = pool_of(), pool_of(policy=Idle())
    for p in (a, b):
        p.attach(table)
        p.run_until(np.inf)
    assert np.array_equal(a.finish_t, b.finish_t)


def test_a_plans_clock_is_requested_for_the_gpu():
    seen = []

    class Slow(LocalPolicy):
        name = "slow"

        def plan(self, view):
            seen.append(view.clock_mhz)
            return StepPlan(tuple(t.slot for t in view.tasks), clock_mhz=min(view.clocks_mhz))

    pool = pool_of(policy=Slow())
    pool.attach(make_table([0.0], [4], [4]))
    pool.run_until(np.inf)
    assert seen[0] == 1000 and seen[-1] == 500  # toy clock change latency 0: the next steps run at 500 MHz
    # the toy law at 500 MHz for a decode step of context c: tau0 0.012 + tau2 0.0001 + tau3 0.000012 * c
    last = pool.log[-1]
    c = last.computed_before[0] + 1
    assert last.t1 - last.t0 == pytest.approx(0.012 + 0.0001 + 0.000012 * c, abs=1e-12)
    assert len(seen) > 3 and pool.gpus[0].version == 1  # one change; the same clock asked again changes nothing


def test_a_plan_asking_for_the_current_clock_changes_nothing():
    class Same(LocalPolicy):
        name = "same"

        def plan(self, view):
            return StepPlan(tuple(t.slot for t in view.tasks), clock_mhz=view.clock_mhz)

    runs = []
    for policy in (FcfsLocal(), Same()):
        pool = pool_of(policy=policy)
        pool.attach(make_table([0.0, 0.5], [4, 9], [4, 3]))
        pool.run_until(np.inf)
        runs.append(pool)
    a, b = runs
    assert b.gpus[0].version == 0 and b.gpus[0].pending_clock is None
    assert [(e.t0, e.t1, e.slots) for e in a.log] == [(e.t0, e.t1, e.slots) for e in b.log]


def test_a_policy_sees_predicted_lengths_and_visible_deadlines():
    views = []

    class Spy(FcfsLocal):
        def plan(self, view):
            views.append(view)
            return super().plan(view)

    rng = np.random.default_rng(2)
    n = 40
    table = make_table(np.sort(rng.uniform(0, 2, n)), rng.integers(2, 20, n), rng.integers(2, 25, n))
    pool = pool_of(policy=Spy(), length_error_sigma=0.6, visible_deadlines="predicted")
    pool.attach(table)
    pool.run_until(np.inf)
    tasks = {t.slot: t for v in views for t in v.tasks}
    slots = np.array(sorted(tasks))
    assert np.array_equal([tasks[s].predicted_output_tokens for s in slots], pool.pred_out[slots])
    assert np.any(pool.pred_out[slots] != pool.out_tokens[slots])
    assert np.allclose([tasks[s].visible_deadline_s for s in slots], pool.visible_deadline[slots])
    for v in views:  # decode tasks have exactly one token left, after the first token
        for t in v.tasks:
            assert t.decode == (t.tokens_left == 1 and t.generated >= 1)


@pytest.mark.parametrize("order, says", [((0, 0), "listed twice"), ((7,), "holds no request"), (None, "not one of")])
def test_bad_plans_are_errors(order, says):
    class Bad(LocalPolicy):
        name = "bad"

        def plan(self, view):
            if order is None:
                return StepPlan((0,), clock_mhz=777)
            return StepPlan(order)

    pool = pool_of(policy=Bad())
    pool.attach(make_table([0.0], [4], [2]))
    with pytest.raises(ValueError, match=says):
        pool.run_until(1.0)


def test_a_controllers_local_policy_reaches_the_engine(tmp_path):
    from commitenv.control import Controller
    from commitenv.evaluation import run_episode
    from helpers.scenarios import toy_three_hour

    class Local(Controller):
        name = "local"

        def local_policy(self):
            return FcfsLocal()

        def act(self, obs, info):
            return {"active": 2, "clock": 1}

    env, res = run_episode(Local(), str(toy_three_hour(tmp_path)), seed=0)
    assert env.pool.local_calls > 0 and all(isinstance(p, FcfsLocal) for p in env.pool.local_policies)
    assert res.summary["misses"] == res.summary["rejected"]  # the toy pool serves everything it accepts


class Chunked(LocalPolicy):
    """First come, first served in steps of at most ``budget`` tokens."""

    name = "chunked"

    def __init__(self, budget):
        self.budget = budget

    def plan(self, view):
        return StepPlan(tuple(t.slot for t in view.tasks), None, self.budget)


@pytest.mark.parametrize("engine", ["library", "reference"])
def test_a_plans_token_budget_cuts_the_steps_chunks_by_hand(engine):
    """Replica budget 32, plan budget 5: a 12-token prompt runs in chunks of 5, 5, 2 (toy step 0.01 + 0.001 P s), the
    second prompt takes what is left of each step's 5, a decode 1 of them."""
    from commitenv.sim.pool import Pool

    cls = Pool if engine == "library" else ReferencePool
    pool = cls(toy_profile(scheduler=BIG), PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.set_local_policy(Chunked(5))
    pool.attach(make_table(np.array([0.0, 0.001]), np.array([12, 9]), np.array([3, 1])))
    pool.run_until(np.inf)
    log = [(e.slots, e.new_tokens) for e in pool.log]
    # A: 5, 5, then its last 2 beside 3 of B (first token); then A decodes beside B's 4 and last 2 tokens
    assert log == [((0,), (5,)), ((0,), (5,)), ((0, 1), (2, 3)), ((0, 1), (1, 4)), ((0, 1), (1, 2))]
    assert pool.first_t[0] == pytest.approx(3 * (0.01 + 0.001 * 5), abs=1e-12)


@pytest.mark.parametrize("engine", ["library", "reference"])
@pytest.mark.parametrize("budget", [0, 33, 2.5, True])
def test_a_plans_token_budget_outside_the_replicas_is_refused(engine, budget):
    from commitenv.sim.pool import Pool

    cls = Pool if engine == "library" else ReferencePool
    pool = cls(toy_profile(scheduler=BIG), PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0)))
    pool.set_local_policy(Chunked(budget))
    pool.attach(make_table(np.array([0.0]), np.array([12]), np.array([3])))
    with pytest.raises(ValueError, match=r"local policy 'chunked': token_budget .* of the plan for replica 0: an integer "
                                         r"in 1 \.\. 32"):
        pool.run_until(np.inf)
