"""The compiled loop (`commitenv.sim.pool.Pool`) held to the step-by-step reference engine (tests/helpers/reference),
bit for bit, on generated cases: random workloads on random pools (one or several GPUs, one or two instances per GPU,
one or two models), driven by random actions at random boundaries (active counts per model, clocks on random GPU
subsets, SM shares, instance moves with each migration mode), with or without settling, under no noise, the legacy
per-segment noise or a truth model, with prefix caches, a dispatch policy or a local policy. At every boundary the
GPU meters, replica states, placement, shares, clocks, idle floors and queue counts agree exactly; at the end every
request's completion, first token, replica and preemptions, and every booked step (the step log)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from helpers.profiles import toy_profile
from helpers.reference import ReferencePool

from commitenv.sim import EngineOptions, Instance, NoiseSpec, Pool, PoolLayout
from commitenv.sim.devices import device_state
from commitenv.sim.local import FcfsLocal, LocalPolicy, StepPlan
from commitenv.sim.migration import MIGRATE_MODES
from commitenv.sim.states import LOADING, MOVING
from commitenv.sim.truth import TruthSpec
from commitenv.workload.table import make_table

TRUTH = TruthSpec(time_sigma=0.05, energy_sigma=0.04, speed_sigma=0.05, power_sigma=0.05, power_bias=0.03,
                  drift_time_sigma=0.05, drift_energy_sigma=0.05, straggler_prob=0.05)
SCHED = dict(token_budget=64, max_seqs=8, context_limit=512, block_size=4, kv_capacity_tokens=1200)


def _profile(model: str = "toy-model"):
    return toy_profile(scheduler=SCHED, latencies=dict(clock_change_s=0.013, activation_s=0.07, load_s=0.5,
                                                       load_w=70.0),
                       model=dict(name=model, params_b=1, weight_gb=1, kv_bytes_per_token=64.0))


def _table(rng, n: int, rate: float, prefixes: bool):
    arr = np.cumsum(rng.exponential(1.0 / rate, n))
    prompt, out = rng.integers(1, 300, n), rng.integers(1, 120, n)
    prompt[rng.random(n) < 0.03] = 600  # over the context limit: rejected
    table = make_table(arr, prompt, out, tenant=rng.integers(0, 2, n).astype(np.int32))
    if not prefixes:
        return table
    blocks = rng.integers(0, 5, n)  # shared prefixes: a few trees of hash blocks
    tree = rng.integers(0, 3, n)
    offs = np.concatenate([[0], np.cumsum(blocks)]).astype(np.int64)
    hashes = np.concatenate([np.arange(b) + 1000 * t for b, t in zip(blocks, tree)]).astype(np.int64)
    return dataclasses.replace(table, prefix_offsets=offs, prefix_hashes=hashes)


class Reversed(LocalPolicy):
    """A local policy that runs its tasks youngest first and asks for a clock by queue length (a plan the engine must
    follow exactly: order, admission and clock)."""

    name = "reversed"

    def plan(self, view):
        order = tuple(t.slot for t in reversed(view.tasks))
        return StepPlan(order, view.clocks_mhz[len(view.tasks) % len(view.clocks_mhz)])


def _twins(case):
    """The same pool on both engines, the workload attached."""
    rng = np.random.default_rng(case["seed"])
    models = case["models"]
    profs = [_profile(f"toy-{m}") for m in range(models)]
    if case.get("moves"):  # half-share instances, two on the first GPU, one on each other: room to move into
        layout = PoolLayout(((Instance(0, 0.5), Instance(models - 1, 0.5)),)
                            + tuple((Instance(g % models, 0.5),) for g in range(1, case["gpus"])))
    elif case["coloc"]:
        layout = PoolLayout(tuple((Instance(0, 0.5), Instance(models - 1, 0.5)) for _ in range(case["gpus"])))
    else:
        layout = PoolLayout(tuple((Instance(g % models, 1.0),) for g in range(case["gpus"])))
    noise = case["noise"]
    opt = EngineOptions(noise=NoiseSpec() if noise == "legacy" else NoiseSpec(0, 0), seed=case["seed"],
                        truth=TRUTH if noise == "truth" else None, closed_form=False, log_steps=True,
                        dispatch=case.get("dispatch", "default"), prefix_block_tokens=16)
    table = _table(rng, case["n"], case["rate"], case.get("prefixes", False))
    tm = {0: 0, 1: models - 1}
    pools = []
    for cls in (ReferencePool, Pool):
        p = cls(profs, layout, opt)
        if case.get("local"):
            p.set_local_policy(FcfsLocal() if case["local"] == "fcfs" else Reversed(), [0])
        p.attach(table, tm)
        pools.append(p)
    return pools[0], pools[1], rng


def _same_now(ref: ReferencePool, lib: Pool, t: float) -> None:
    where = f"at t={t}"
    assert np.array_equal(ref.gpu_energy_j(t), lib.gpu_energy_j(t)), where
    d = device_state(lib)
    assert [r.state for r in ref.replicas] == d.replica_state.tolist(), where
    assert [r.gpu.index for r in ref.replicas] == d.replica_gpu.tolist(), where
    assert [r.share for r in ref.replicas] == d.replica_share.tolist(), where
    assert [g.clock_idx for g in ref.gpus] == d.gpu_clock_idx.tolist(), where
    assert [g.floor_w for g in ref.gpus] == d.gpu_floor_w.tolist(), where
    assert [len(g.replicas) for g in ref.gpus] == d.gpu_hosts.tolist(), where
    assert ref.counts() == lib.counts(), where
    assert ref.events == lib.events, where
    assert (ref.cold_starts, ref.migrated, ref.migration_j) == (lib.cold_starts, lib.migrated, lib.migration_j), where


def _drive(case) -> tuple[ReferencePool, Pool, set]:
    ref, lib, rng = _twins(case)
    pools = (ref, lib)
    n_models, n_gpus = ref.n_models, len(ref.gpus)
    mhz = list(ref.profiles[0].clock_mhz)
    t_end = float(ref.table.arrival_s[-1]) + 1.0
    t, kinds = 0.0, set()
    while t < t_end:
        t = round(t + float(rng.uniform(0.02, case["dt"])), 9)
        for p in pools:
            p.run_until(t)
            if case["settle"]:
                p.settle(t)
        _same_now(ref, lib, t)
        u = rng.random()
        if u < 0.3:
            m = int(rng.integers(0, n_models))
            c = int(rng.integers(1, len(ref.replicas_of(m)) + 1))
            for p in pools:
                p.set_active(t, c, model=m)
            kinds.add("active")
        elif u < 0.5:
            gpus = [int(g) for g in np.flatnonzero(rng.random(n_gpus) < 0.6)] or None
            f = int(mhz[rng.integers(len(mhz))])
            for p in pools:
                p.set_clock(t, f, gpus)
            kinds.add("clock")
        elif u < 0.65 and case["coloc"]:
            g = int(rng.integers(0, n_gpus))
            s = float(rng.choice([0.3, 0.5, 0.7]))
            here = [r.index for r in ref.gpus[g].replicas if r.state not in (MOVING, LOADING)]
            if len(here) == len(ref.gpus[g].replicas) == 2:
                a, b = here
                for p in pools:
                    p.set_share(t, b, ref.profiles[0].sm_share.min_share)
                    p.set_share(t, a, s)
                    p.set_share(t, b, round(1.0 - s, 6))
                kinds.add("share")
        elif u < 0.9 and case.get("moves"):
            x = int(rng.integers(0, len(ref.replicas)))
            dest = int((ref.replicas[x].gpu.index + rng.integers(1, n_gpus)) % n_gpus)
            mode = MIGRATE_MODES[int(rng.integers(0, len(MIGRATE_MODES)))]
            try:
                ref.move(t, {x: dest}, mode)
            except ValueError:
                with pytest.raises(ValueError):
                    lib.move(t, {x: dest}, mode)
            else:
                lib.move(t, {x: dest}, mode)
                kinds.add("move")
    for p in pools:
        for m in range(n_models):
            p.set_active(t, len(ref.replicas_of(m)), model=m)
        p.run_until(t + 600.0)
        p.settle(t + 600.0)
    _same_now(ref, lib, t + 600.0)
    for name in ("finish_t", "first_t", "max_tbt_s", "replica_of", "preemptions"):
        a, b = (np.nan_to_num(getattr(p, name), nan=-1.0) for p in (ref, lib))
        assert np.array_equal(a, b), name
    assert ref.log == lib.log
    assert lib.completed == int((~lib.rejected).sum()) > 0 and np.isinf(lib.finish_t[lib.rejected]).all()
    return ref, lib, kinds


CASES = {
    "one-gpu": dict(seed=1, n=60, rate=40.0, gpus=1, models=1, coloc=False, noise="off", dt=0.3, settle=False),
    "three-gpus-settled": dict(seed=2, n=120, rate=80.0, gpus=3, models=1, coloc=False, noise="off", dt=0.2,
                               settle=True),
    "legacy-noise": dict(seed=3, n=120, rate=80.0, gpus=3, models=1, coloc=False, noise="legacy", dt=0.25,
                         settle=True),
    "truth": dict(seed=4, n=150, rate=90.0, gpus=4, models=1, coloc=False, noise="truth", dt=0.25, settle=True),
    "colocated-shares": dict(seed=5, n=120, rate=80.0, gpus=2, models=1, coloc=True, noise="off", dt=0.2,
                             settle=True),
    "two-models-colocated": dict(seed=6, n=150, rate=90.0, gpus=3, models=2, coloc=True, noise="truth", dt=0.2,
                                 settle=True),
    "moves-and-migration": dict(seed=7, n=150, rate=60.0, gpus=3, models=1, coloc=True, noise="off", dt=0.3,
                                settle=True, moves=True),
    "moves-two-models": dict(seed=8, n=150, rate=60.0, gpus=4, models=2, coloc=True, noise="truth", dt=0.3,
                             settle=False, moves=True),
    "prefix-caches": dict(seed=9, n=150, rate=80.0, gpus=3, models=1, coloc=False, noise="off", dt=0.25, settle=True,
                          prefixes=True),
    "prefix-affinity-router": dict(seed=10, n=150, rate=80.0, gpus=3, models=1, coloc=False, noise="truth", dt=0.25,
                                   settle=True, prefixes=True, dispatch="prefix_affinity"),
    "least-unfinished-policy": dict(seed=11, n=120, rate=80.0, gpus=3, models=1, coloc=False, noise="off", dt=0.25,
                                    settle=True, dispatch="least_unfinished"),
    "local-fcfs": dict(seed=12, n=100, rate=60.0, gpus=2, models=1, coloc=False, noise="off", dt=0.25, settle=True,
                       local="fcfs"),
    "local-reordering-with-clocks": dict(seed=13, n=100, rate=60.0, gpus=2, models=1, coloc=False, noise="legacy",
                                         dt=0.25, settle=True, local="reversed"),
}


@pytest.mark.parametrize("draw", range(3))
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_compiled_loop_equals_the_reference_step_by_step(case, draw):
    ref, lib, kinds = _drive(dict(CASES[case], seed=CASES[case]["seed"] + 100 * draw))
    assert {"active", "clock"} <= kinds
    if CASES[case]["coloc"] and not CASES[case].get("moves"):
        assert "share" in kinds
    if CASES[case].get("moves"):
        assert "move" in kinds and ref.moves == lib.moves > 0 and lib.cold_starts > 0
    if CASES[case].get("prefixes"):
        assert sum(r.pcache.hit_tokens for r in ref.replicas) > 0  # the caches were hit
    if CASES[case].get("local"):
        assert ref.local_calls == lib.local_calls > 0


def test_the_generated_cases_preempt_and_reject():
    """The cases reach the engine's hard paths: KV pressure preempts running requests (recompute), and prompts over
    the context limit are rejected."""
    ref, lib, _ = _drive(CASES["three-gpus-settled"])
    assert lib.preemptions.sum() > 0 and lib.rejected.sum() > 0


def test_the_closed_form_agrees_with_the_reference_to_rounding():
    """With `EngineOptions.closed_form` (decode runs advanced as series) the compiled loop matches the step-by-step
    reference to rounding, and books fewer log entries."""
    case = CASES["three-gpus-settled"]
    ref, _, _ = _twins(case)
    closed = Pool(ref.profiles, ref.layout, dataclasses.replace(ref.opt, closed_form=True))
    closed.attach(ref.table, ref.tenant_model)
    for p in (ref, closed):
        p.run_until(math.inf)
    assert closed.finish_t.tolist() == pytest.approx(ref.finish_t.tolist(), abs=1e-9)
    assert closed.energy_j(ref.now) == pytest.approx(ref.energy_j(ref.now), rel=1e-12)
    assert len(closed.log) < len(ref.log)
