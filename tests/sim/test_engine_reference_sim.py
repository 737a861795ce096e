"""Engine against an independent, deliberately naive step-by-step simulator written here from the stated
semantics (vLLM V1 scheduling, fewest-unfinished routing, the step laws), on random small workloads with
batching, chunked prefill and preemption. Arrival times are random floats, so no arrival coincides with a
step end."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest

from helpers.profiles import toy_profile

from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
from commitenv.workload.table import make_table


class _R:
    def __init__(self, i, arrival, prompt, out):
        self.i, self.arrival, self.prompt, self.out = i, arrival, prompt, out
        self.computed = self.generated = self.blocks = 0
        self.first = self.finish = None
        self.tokens: list[float] = []  # the time of each output token
        self.preempted = 0
        self.admitted = False


class _Rep:
    def __init__(self, budget, max_seqs, bs, n_blocks):
        self.budget, self.max_seqs, self.bs = budget, max_seqs, bs
        self.free = n_blocks
        self.running: list[_R] = []
        self.waiting: deque[_R] = deque()
        self.step = None  # (t_end, batch, energy, t_start)

    def blocks_for(self, tokens):
        return math.ceil(tokens / self.bs)

    def schedule(self):
        budget = self.budget
        batch = []
        preempted_any = False
        scheduled = 0
        while scheduled < len(self.running) and budget > 0:
            r = self.running[scheduled]
            k = min(r.prompt + r.generated - r.computed, budget)
            extra = self.blocks_for(r.computed + k) - r.blocks
            ok = True
            while extra > self.free:
                v = self.running.pop()  # newest running request
                self.free += v.blocks
                v.blocks = 0
                v.computed = 0
                v.preempted += 1
                self.waiting.appendleft(v)
                preempted_any = True
                if v is r:
                    ok = False
                    break
            if not ok:
                break
            self.free -= extra
            r.blocks += extra
            batch.append((r, k))
            budget -= k
            scheduled += 1
        if not preempted_any:
            while self.waiting and budget > 0 and len(self.running) < self.max_seqs:
                r = self.waiting[0]
                k = min(r.prompt + r.generated - r.computed, budget)
                extra = self.blocks_for(r.computed + k) - r.blocks
                if extra > self.free:
                    break
                self.waiting.popleft()
                self.running.append(r)
                self.free -= extra
                r.blocks += extra
                batch.append((r, k))
                budget -= k
        return batch


def max_gap(r: _R) -> float:
    """The longest time between two consecutive output tokens of ``r`` (0 with one token)."""
    return max((b - a for a, b in zip(r.tokens, r.tokens[1:])), default=0.0)


def reference(profile, arrivals, prompts, outputs, n_rep, t_end):
    lvl = profile.clocks[profile.reference_clock_index]
    tl, el, idle = lvl.time, lvl.energy, lvl.active_idle_w
    sch = profile.scheduler
    reps = [_Rep(sch.token_budget, sch.max_seqs, sch.block_size, sch.kv_capacity_tokens // sch.block_size) for _ in range(n_rep)]
    reqs = [_R(i, a, p, o) for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))]
    where = [-1] * len(reqs)
    steps = [[] for _ in range(n_rep)]  # per replica: (t0, t1, energy, slots, new_tokens, computed_before)

    def start(ri, t):
        rep = reps[ri]
        batch = rep.schedule()
        if not batch:
            rep.step = None
            return
        P = n = L = A = 0
        for r, k in batch:
            if k == 1 and r.generated >= 1 and r.computed + 1 == r.prompt + r.generated:
                n += 1
                L += r.computed + 1
            else:
                P += k
                A += k * r.computed + k * (k + 1) // 2
        dt = tl.tau0 + tl.tau1 * P + tl.tau2 * n + tl.tau3 * L + tl.tau4 * A
        e = el.a + el.c1 * P + el.c2 * A + el.b * n + el.kappa * L
        steps[ri].append((t, t + dt, e, tuple(r.i for r, _ in batch), tuple(k for _, k in batch), tuple(r.computed for r, _ in batch)))
        rep.step = (t + dt, batch)

    def end(ri):
        rep = reps[ri]
        t, batch = rep.step
        rep.step = None
        for r, k in batch:
            r.computed += k
            if r.computed == r.prompt + r.generated:
                r.generated += 1
                r.tokens.append(t)
                if r.first is None:
                    r.first = t
                if r.generated == r.out:
                    r.finish = t
                    rep.running.remove(r)
                    rep.free += r.blocks
                    r.blocks = 0

    # Every instant t: first the steps ending at t (completions free their requests), then the arrivals at t
    # (routed one by one), then every idle replica with work schedules its next step at t, so that the
    # requests arriving together, or exactly at a step end, share the step that starts at t.
    nxt = 0
    while True:
        ta = reqs[nxt].arrival if nxt < len(reqs) else math.inf
        busy = [rep.step[0] for rep in reps if rep.step is not None]
        t = min([ta] + busy)
        if t > t_end:
            break
        for ri, rep in enumerate(reps):
            if rep.step is not None and rep.step[0] == t:
                end(ri)
        while nxt < len(reqs) and reqs[nxt].arrival == t:
            r = reqs[nxt]
            nxt += 1
            loads = [len(rep.running) + len(rep.waiting) for rep in reps]
            best = loads.index(min(loads))
            where[r.i] = best
            reps[best].waiting.append(r)
        for ri, rep in enumerate(reps):
            if rep.step is None and (rep.running or rep.waiting):
                start(ri, t)
    energy = 0.0
    for ri in range(n_rep):
        busy_t = sum(s[1] - s[0] for s in steps[ri])
        energy += sum(s[2] for s in steps[ri]) + idle * (t_end - busy_t)
    return reqs, where, steps, energy


def engine_steps(pool, replica):
    out = []
    for e in pool.log:
        if e.replica != replica:
            continue
        for j in range(e.n_steps):
            out.append((e.slots, e.new_tokens, tuple(c + j for c in e.computed_before)))
    return out


def workload(seed, n, rate, max_total=64):
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1.0 / rate, n))
    prompt = rng.integers(1, 40, n)
    out = np.minimum(rng.integers(1, 40, n), max_total - prompt)
    out = np.maximum(out, 1)
    return arr, prompt, out


CASES = [
    # seed, n, rate (1/s), replicas, scheduler override
    (1, 30, 40.0, 1, {}),
    (2, 40, 80.0, 2, {}),
    (3, 40, 150.0, 3, {}),
    (4, 30, 60.0, 1, dict(token_budget=16, max_seqs=6)),
    (5, 40, 100.0, 2, dict(token_budget=5, max_seqs=3)),
    (6, 30, 200.0, 1, dict(kv_capacity_tokens=96, max_seqs=8, token_budget=12)),
    (7, 30, 8.0, 2, {}),
    (8, 30, 80.0, 1, dict(token_budget=3, max_seqs=6)),  # decodes alone can exhaust the budget
    (9, 40, 120.0, 2, dict(block_size=16, kv_capacity_tokens=80, context_limit=64)),
]


def attn_profile(sched):
    """Toy profile with a prefill attention term at the top clock (tau4 = 1e-6 s, c2 = 1e-4 J)."""
    base = toy_profile(scheduler=sched)
    clocks = [c.model_dump() for c in base.clocks]
    clocks[1]["time"]["tau4"] = 1e-6
    clocks[1]["energy"]["c2"] = 1e-4
    return toy_profile(scheduler=sched, clocks=clocks)


@pytest.mark.parametrize("attn", [False, True], ids=["toy", "attn"])
@pytest.mark.parametrize("closed_form", [True, False], ids=["closed", "step"])
@pytest.mark.parametrize("seed,n,rate,n_rep,sched", CASES)
def test_engine_matches_independent_reference(seed, n, rate, n_rep, sched, closed_form, attn):
    prof = attn_profile(sched) if attn else toy_profile(scheduler=sched)
    if attn:
        assert prof.clocks[1].time.tau4 == 1e-6
    arr, prompt, out = workload(seed, n, rate)
    t_end = float(arr[-1]) + 10.0
    reqs, where, ref_steps, ref_energy = reference(prof, arr.tolist(), prompt.tolist(), out.tolist(), n_rep, t_end)
    assert all(r.finish is not None for r in reqs)

    pool = Pool(prof, PoolLayout.single(n_rep), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True, closed_form=closed_form))
    pool.attach(make_table(arr, prompt, out))
    pool.run_until(t_end)

    assert pool.completed == n
    assert pool.replica_of.tolist() == where
    assert pool.finish_t.tolist() == pytest.approx([r.finish for r in reqs], abs=1e-9)
    assert pool.first_t.tolist() == pytest.approx([r.first for r in reqs], abs=1e-9)
    assert pool.max_tbt_s.tolist() == pytest.approx([max_gap(r) for r in reqs], abs=1e-9)
    assert pool.preemptions.tolist() == [r.preempted for r in reqs]
    assert pool.energy_j(t_end) == pytest.approx(ref_energy, abs=1e-9)
    for ri in range(n_rep):
        assert engine_steps(pool, ri) == [(s[3], s[4], s[5]) for s in ref_steps[ri]]


def test_reference_cases_exercise_preemption_and_batching():
    """Guard: the random cases above are not trivial (some preempt, some batch several requests)."""
    total_pre = 0
    max_batch = 0
    for seed, n, rate, n_rep, sched in CASES:
        prof = toy_profile(scheduler=sched)
        arr, prompt, out = workload(seed, n, rate)
        reqs, _, steps, _ = reference(prof, arr.tolist(), prompt.tolist(), out.tolist(), n_rep, float(arr[-1]) + 10)
        total_pre += sum(r.preempted for r in reqs)
        max_batch = max(max_batch, max(len(s[3]) for st in steps for s in st))
    assert total_pre >= 5
    assert max_batch >= 3


TIE_CASES = [
    # arrivals on a coarse grid: many arrive together; seed, n, grid (s), replicas, scheduler override
    (21, 40, 0.02, 1, {}),
    (22, 60, 0.01, 2, {}),
    (23, 60, 0.005, 3, dict(max_seqs=6, token_budget=16)),
    (24, 40, 0.05, 2, dict(token_budget=5, max_seqs=3)),
]


@pytest.mark.parametrize("seed,n,grid,n_rep,sched", TIE_CASES)
def test_simultaneous_arrivals_match_reference_step_by_step(seed, n, grid, n_rep, sched):
    """Arrivals sharing a timestamp are routed one by one and share the step that starts at that instant."""
    prof = toy_profile(scheduler=sched)
    rng = np.random.default_rng(seed)
    arr = np.sort(rng.integers(0, n // 3, n)) * grid
    prompt = rng.integers(1, 40, n)
    out = np.maximum(np.minimum(rng.integers(1, 40, n), 64 - prompt), 1)
    assert len(set(arr.tolist())) < n  # there are ties
    t_end = float(arr[-1]) + 20.0
    reqs, where, ref_steps, ref_energy = reference(prof, arr.tolist(), prompt.tolist(), out.tolist(), n_rep, t_end)
    pool = Pool(prof, PoolLayout.single(n_rep), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True, closed_form=False))
    pool.attach(make_table(arr, prompt, out))
    pool.run_until(t_end)
    assert pool.replica_of.tolist() == where
    assert pool.finish_t.tolist() == [r.finish for r in reqs]
    assert pool.first_t.tolist() == [r.first for r in reqs]
    assert pool.max_tbt_s.tolist() == [max_gap(r) for r in reqs]
    assert pool.preemptions.tolist() == [r.preempted for r in reqs]
    assert pool.energy_j(t_end) == pytest.approx(ref_energy, abs=1e-9)
    for ri in range(n_rep):
        assert engine_steps(pool, ri) == [(s[3], s[4], s[5]) for s in ref_steps[ri]]
    # the closed form agrees too (no arrival falls exactly on a closed-form step end here)
    cf = Pool(prof, PoolLayout.single(n_rep), EngineOptions(noise=NoiseSpec(0, 0), closed_form=True))
    cf.attach(make_table(arr, prompt, out))
    cf.run_until(t_end)
    assert cf.finish_t.tolist() == pytest.approx(pool.finish_t.tolist(), abs=1e-9)
    assert cf.max_tbt_s.tolist() == pytest.approx(pool.max_tbt_s.tolist(), abs=1e-9)
    assert cf.energy_j(t_end) == pytest.approx(pool.energy_j(t_end), abs=1e-9)
