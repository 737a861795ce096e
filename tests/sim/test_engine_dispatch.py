"""Dispatch policies called by the engine at each arrival: the default router reproduced through the views (bit for
bit, re-routing on deactivation included), prefix-affinity routing on hand-built queues and its balance bound,
what a policy can see (predicted lengths and visible deadlines, never the truth), bad choices, and timing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers.reference import ReferencePool
from helpers.profiles import toy_profile

from commitenv.sim import EngineOptions, NoiseSpec, PoolLayout
from commitenv.sim.dispatch import ArrivalView, DispatchPolicy, LeastUnfinished, PrefixAffinity, make_dispatch
from commitenv.workload.table import make_table
from helpers.paths import ROOT

BIG = dict(token_budget=32, max_seqs=4, context_limit=64, block_size=4, kv_capacity_tokens=64)


def with_hashes(table, hashes):
    offs = np.concatenate([[0], np.cumsum([len(h) for h in hashes])]).astype(np.int64)
    flat = np.asarray([x for h in hashes for x in h], dtype=np.int64)
    return dataclasses.replace(table, prefix_offsets=offs, prefix_hashes=flat)


def pool_of(n_rep, *, policy=None, sched=BIG, noise=False, **opt):
    p = ReferencePool(toy_profile(scheduler=sched), PoolLayout.single(n_rep),
             EngineOptions(noise=NoiseSpec() if noise else NoiseSpec(0, 0), prefix_block_tokens=4, **opt))
    p.dispatch = policy
    return p


def random_workload(n=300, seed=0):
    rng = np.random.default_rng(seed)
    return make_table(np.sort(rng.uniform(0, 20, n)), rng.integers(2, 30, n), rng.integers(1, 20, n))


def test_least_unfinished_policy_reproduces_the_engines_router_bit_for_bit():
    table = random_workload()
    runs = []
    for policy in (None, LeastUnfinished()):
        pool = pool_of(4, policy=policy, noise=True, seed=7)
        pool.attach(table)
        pool.run_until(5.0)
        pool.set_active(5.0, 2)  # queued requests of the deactivated replicas are dispatched again
        pool.run_until(12.0)
        pool.set_active(12.0, 4)
        pool.run_until(np.inf)
        runs.append(pool)
    a, b = runs
    assert np.array_equal(a.replica_of, b.replica_of)
    assert np.array_equal(a.finish_t, b.finish_t)
    assert a.energy_j() == b.energy_j()
    assert b.dispatch_calls >= len(table) and a.dispatch_calls == 0
    assert b.dispatch_s > 0


def test_prefix_affinity_follows_the_cache_within_the_balance_bound():
    # 2 replicas. r0 (blocks 1,2,3) goes to replica 0 (tie -> first). r1 (blocks 9) to replica 1 (fewer
    # unfinished). r2 shares r0's prefix: with both replicas holding one request, least-unfinished would pick
    # replica 0 by the tie anyway, so r3 (same prefix) arrives while replica 0 holds 2 and replica 1 holds 1:
    # least-unfinished sends it to replica 1, prefix affinity to replica 0 (3 cached blocks, load within slack).
    arr = [0.0, 0.001, 0.002, 0.003]  # after r0's first step is scheduled (its blocks registered)
    prompts = [13, 13, 13, 13]
    hashes = [[1, 2, 3], [9, 8, 7], [1, 2, 3], [1, 2, 3]]
    out = {}
    for name, policy in (("least", None), ("affinity", PrefixAffinity(slack=4))):
        pool = pool_of(2, policy=policy, sched=dict(BIG, max_seqs=1))  # one running request per replica
        pool.attach(with_hashes(make_table(arr, prompts, [30, 30, 30, 30]), hashes))
        pool.run_until(np.inf)
        out[name] = pool.replica_of.tolist()
    assert out["least"] == [0, 1, 0, 1]
    assert out["affinity"] == [0, 1, 0, 0]


def test_prefix_affinity_gives_way_to_balance():
    # slack 0 and ratio 0: a replica with more unfinished requests than the least loaded never qualifies
    pol = PrefixAffinity(slack=0, ratio=0.0)
    req = ArrivalView(0, 0.0, 13, 10, 5.0, 0, 3)
    from commitenv.sim.dispatch import CandidateView

    loaded = CandidateView(0, 0, 3, 1, 2, 10, 16, 1000, 1.0, 3, 4, 0, 0)
    idle = CandidateView(1, 1, 2, 1, 1, 10, 16, 1000, 1.0, 0, 4, 0, 0)
    assert pol.choose(req, (loaded, idle)) == 1
    assert PrefixAffinity(slack=1).choose(req, (loaded, idle)) == 0  # within a slack of 1: the cache wins
    # ratio: least 10 -> bound 10 + 0.5 * 10 = 15
    a = CandidateView(0, 0, 15, 4, 11, 10, 16, 1000, 1.0, 1, 4, 0, 0)
    b = CandidateView(1, 1, 10, 4, 6, 10, 16, 1000, 1.0, 0, 4, 0, 0)
    c = CandidateView(2, 2, 16, 4, 12, 10, 16, 1000, 1.0, 3, 4, 0, 0)
    assert PrefixAffinity(slack=0, ratio=0.5).choose(req, (a, b, c)) == 0


def test_prefix_affinity_raises_cache_hits_on_a_multi_turn_workload():
    """Conversations of 4 turns, each prompt extending the previous one, interleaved over 8 replicas: routing by
    prefix keeps a conversation's turns together, so more prompt tokens hit the caches."""
    rng = np.random.default_rng(3)
    arr, prompts, hashes = [], [], []
    t = 0.0
    for turn in range(4):
        for conv in range(24):
            t += float(rng.exponential(0.02))
            arr.append(t)
            prompts.append(4 * (2 + 2 * turn) + 1)
            hashes.append([1000 * conv + j for j in range(2 + 2 * turn)])
    table = with_hashes(make_table(arr, prompts, [2] * len(arr)), hashes)
    hit = {}
    for name, policy in (("least", None), ("affinity", PrefixAffinity())):
        pool = pool_of(8, policy=policy, sched=dict(BIG, kv_capacity_tokens=4096))
        pool.attach(table)
        pool.run_until(np.inf)
        hit[name] = sum(r.pcache.hit_tokens for r in pool.replicas)
    assert hit["affinity"] > 1.5 * hit["least"]


def test_a_policy_sees_predicted_lengths_and_visible_deadlines_not_the_truth():
    seen: list[ArrivalView] = []

    class Spy(LeastUnfinished):
        def choose(self, req, replicas):
            seen.append(req)
            assert all(type(v).__module__ == "commitenv.sim.dispatch" for v in replicas)
            return super().choose(req, replicas)

    table = random_workload(80, seed=1)
    pool = pool_of(2, policy=Spy(), length_error_sigma=0.5, visible_deadlines="predicted")
    pool.attach(table)
    pool.run_until(np.inf)
    slots = [v.slot for v in seen]
    pred = np.array([v.predicted_output_tokens for v in seen])
    assert np.array_equal(pred, pool.pred_out[slots])
    assert np.any(pred != pool.out_tokens[slots])  # the truth differs, and the policy never saw it
    assert np.allclose([v.visible_deadline_s for v in seen], pool.visible_deadline[slots])
    assert not np.allclose(pool.visible_deadline[slots], pool.deadline[slots])


def test_a_choice_outside_the_active_replicas_is_an_error():
    class Bad(DispatchPolicy):
        name = "bad"

        def choose(self, req, replicas):
            return 99

    pool = pool_of(2, policy=Bad())
    pool.attach(make_table([0.0], [4], [2]))
    with pytest.raises(ValueError, match="chose replica 99"):
        pool.run_until(1.0)


def test_builtin_policies_by_name():
    assert make_dispatch("default") is None
    assert isinstance(make_dispatch("prefix_affinity"), PrefixAffinity)
    with pytest.raises(ValueError, match="prefix_affinity"):
        make_dispatch("round_robin")


class Counting(LeastUnfinished):
    """Least unfinished, counting its calls (a controller's own policy)."""

    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def choose(self, req, replicas):
        self.calls += 1
        return super().choose(req, replicas)


def test_a_controllers_policy_and_the_scenarios_router_reach_the_engine(tmp_path):
    from commitenv.control import Controller
    from commitenv.evaluation import run_episode
    from helpers.scenarios import toy_three_hour

    class Routed(Controller):
        name = "routed"

        def reset(self, ctx, seed=None):
            super().reset(ctx, seed)
            self.policy = Counting()

        def dispatch_policy(self):
            return self.policy

        def act(self, obs, info):
            return {"active": 2, "clock": 1}

    path = toy_three_hour(tmp_path)
    ctrl = Routed()
    env, res = run_episode(ctrl, str(path), seed=0)
    assert ctrl.policy.calls >= res.summary["requests"] - res.summary["rejected"]
    _, plain = run_episode(_plain_controller(), str(path), seed=0)
    assert plain.summary["energy_mj"] == res.summary["energy_mj"]  # the same choices as the engine's router
    # the scenario's router: prefix_affinity on a workload without hash blocks routes like least unfinished
    path2 = toy_three_hour(tmp_path, name="toy-three-affinity", engine={"dispatch": "prefix_affinity"})
    env2, res2 = run_episode(_plain_controller(), str(path2), seed=0)
    assert type(env2.pool.dispatch).__name__ == "PrefixAffinity" and env2.pool.dispatch_calls > 0
    assert res2.summary["energy_mj"] == res.summary["energy_mj"]


def _plain_controller():
    from commitenv.control import Controller

    class Plain(Controller):
        name = "plain"

        def act(self, obs, info):
            return {"active": 2, "clock": 1}

    return Plain()


def test_readme_dispatch_example_runs(tmp_path):
    """README's dispatch example, executed as written, on the toy scenario."""
    import re

    from commitenv.evaluation import run_episode
    from helpers.scenarios import toy_three_hour

    readme = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme[readme.index("### Dispatch: choosing a replica"):], re.S).group(1)
    ns: dict = {}
    exec(compile(code, "README-dispatch", "exec"), ns)
    env, res = run_episode(ns["Routed"](), str(toy_three_hour(tmp_path)), seed=0)
    assert type(env.pool.dispatch).__name__ == "LeastTokens"
    assert env.pool.dispatch_calls >= res.summary["requests"] - res.summary["rejected"]


def test_token_loads_by_hand():
    """Replica 0 serves r0 (prompt 8, 20 outputs) alone; r1 (prompt 12) arrives while r0 decodes and r2 (prompt
    6) right after: at r2's arrival the loads are r0's context (decode) and r1's 12 prompt tokens (waiting)."""
    seen = []

    class Loads(LeastUnfinished):
        wants_load = True

        def choose(self, req, replicas):
            seen.append((req.slot, replicas[0]))
            return replicas[0].index

    pool = pool_of(1, policy=Loads(), sched=dict(BIG, max_seqs=1))
    pool.attach(make_table([0.0, 0.05, 0.0501], [8, 12, 6], [20, 5, 5]))
    pool.run_until(0.0502)
    (s0, v0), (s1, v1), (s2, v2) = seen
    assert (v0.queued_prefill_tokens, v0.decode_context_tokens) == (0, 0)
    r0 = pool.replicas[0].running[0]
    assert v2.queued_prefill_tokens == 12
    # r0 is decoding: its context when r2 arrived was its computed tokens + 1 (r0 did not step in between)
    assert v2.decode_context_tokens == r0.computed + 1 and v1.decode_context_tokens == v2.decode_context_tokens
    assert v2.block_tokens == 4
