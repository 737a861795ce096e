"""`commitenv.sim.kernel.fresh.fresh_state`: a new pool's kernel state built from its layout, profiles and options
equals, array by array and attribute by attribute, the state imported from the same pool's new idle replica and GPU
objects (`KernelState(pool)`), for one-model pools at `paper` (the truth model, per-GPU power factors) and under the
legacy noise, shared pools with SM shares, a step log, a dispatch policy, a non-default initial clock; and running
either state from its attached workload gives the same results."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.profiles import toy_profile

from commitenv.envs.commit_serve import CommitServeEnv
from commitenv.scenarios.build import engine_options
from commitenv.sim import EngineOptions, NoiseSpec, Pool, kernel
from commitenv.sim.dispatch import LeastUnfinished
from commitenv.sim.kernel import KernelState
from commitenv.sim.kernel.fresh import fresh_state
from commitenv.sim.pool import Instance, PoolLayout

SCHED = dict(token_budget=32, max_seqs=6, context_limit=512, block_size=4, kv_capacity_tokens=2048)
SHARED = ((Instance(0, 0.5), Instance(1, 0.5)), (Instance(0, 0.4), Instance(1, 0.4)), (Instance(0, 0.3),))


def _toy():
    return toy_profile(scheduler=SCHED, latencies=dict(clock_change_s=0.05, activation_s=1.0, load_s=3.0, load_w=70.0),
                       model=dict(name="toy-model", params_b=1, weight_gb=1, kv_bytes_per_token=1e5))


def _env_pool() -> Pool:
    env = CommitServeEnv("bench-h200-hour-fixed-a30")
    return Pool(env.profiles, env.layout, engine_options(env.scenario, 100003), clock_mhz=env.clocks_mhz[1])


def _shared_pool(log: bool = False, dispatch: bool = False) -> Pool:
    p = Pool([_toy(), _toy()], PoolLayout(SHARED), EngineOptions(noise=NoiseSpec(0.03, 0.03), seed=4, log_steps=log))
    if dispatch:
        p.dispatch = LeastUnfinished()
    return p


CASES = {
    "paper": _env_pool,
    "legacy-noise": lambda: Pool(_toy(), PoolLayout.single(5), EngineOptions(noise=NoiseSpec(0.05, 0.02), seed=9)),
    "no-noise": lambda: Pool(_toy(), PoolLayout.single(2), EngineOptions()),
    "shared": _shared_pool,
    "shared-log-dispatch": lambda: _shared_pool(log=True, dispatch=True),
}


def _equal(a, b, name: str) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_array_equal(a, b, err_msg=name)
    elif isinstance(a, tuple) and a and isinstance(a[0], np.ndarray):
        assert len(a) == len(b), name
        for i, (x, y) in enumerate(zip(a, b)):
            _equal(x, y, f"{name}[{i}]")
    elif isinstance(a, (int, float, bool, str, type(None))) or name in ("clock_mhz",):
        assert a == b or (a != a and b != b), (name, a, b)
    else:  # (sources, profiles, rows: the same kind of thing; their contents are the twins')
        assert type(a) is type(b), name


@pytest.mark.parametrize("case", list(CASES))
def test_a_fresh_state_equals_the_import_of_new_objects(monkeypatch, case):
    monkeypatch.setattr(kernel, "ENABLED", False)  # (twins with objects, the state built two ways)
    a, b = CASES[case](), CASES[case]()
    imported = KernelState(a, compact=True)
    built = fresh_state(b, tuple(g.power_factor for g in b.gpus))
    va, vb = vars(imported), vars(built)
    assert sorted(va) == sorted(vb)
    for name in va:
        _equal(va[name], vb[name], name)


def _placed(seed: int) -> tuple[list, list, list, list]:
    """A serving state as a hardware pool's mirror assembles it (`HardwarePool.clone`): 4 replicas (active, active,
    draining, standby), running requests holding their KV blocks, waiting ones (some started, evicted), unrouted."""
    from commitenv.sim.request import Req
    from commitenv.sim.states import ACTIVE, DRAINING, STANDBY

    rng = np.random.default_rng(seed)
    slots = iter(rng.permutation(200).tolist())

    def req(started: bool) -> Req:
        s = next(slots)
        r = Req(s, float(rng.uniform(0, 5)), int(rng.integers(4, 200)), int(rng.integers(5, 300)),
                float(rng.uniform(20, 60)))
        if started:
            r.started, r.computed = True, r.prompt + int(rng.integers(0, 4))
            r.generated = r.computed - r.prompt + 1
            r.blocks = -(-r.computed // SCHED["block_size"])
            r.first_t = 5.0
        return r

    running = [[req(True) for _ in range(k)] for k in (3, 5, 2, 0)]
    waiting = [[req(False) for _ in range(k)] + [req(True)] for k in (4, 0, 3, 2)]
    for w in waiting:  # (evicted: recompute from scratch, as the mirror resets them)
        w[-1].computed = w[-1].blocks = 0
    return running, waiting, [req(False) for _ in range(3)], [ACTIVE, ACTIVE, DRAINING, STANDBY]


def test_a_serving_state_placed_on_the_kernel_runs_as_on_the_python_loop(monkeypatch):
    """`Pool.place` (the hardware mirror's state) and `resume`, on a new pool's kernel state and on the Python loop's
    objects: the same snapshot views, and the same run to the end (finish times, energy, events)."""
    from commitenv.sim import take_snapshot

    def build(on_kernel: bool) -> Pool:
        monkeypatch.setattr(kernel, "ENABLED", on_kernel)
        p = Pool(_toy(), PoolLayout.single(4), EngineOptions())
        p.now = 5.0
        run, wait, unrouted, states = _placed(7)
        p._n_results = 0
        p.pred_out = p.visible_deadline = None
        p.place(run, wait, unrouted, states)
        assert (p._ks is not None) == on_kernel
        return p

    a, b = build(True), build(False)
    monkeypatch.setattr(kernel, "ENABLED", True)
    sa, sb = take_snapshot(a), take_snapshot(b)
    assert sa._engine._ks is not None
    for f in ("slot", "computed_tokens", "generated_tokens", "replica", "running", "output_tokens"):
        np.testing.assert_array_equal(getattr(sa.requests, f), getattr(sb.requests, f), err_msg=f)
    for f in ("state", "running", "waiting", "free_kv_blocks"):
        np.testing.assert_array_equal(getattr(sa.replicas, f), getattr(sb.replicas, f), err_msg=f)
    ends = []
    for p in (a, b):
        c = p.clone(hide_lengths=False)
        c.capture_all()
        c.resume(c.now)
        c.run_until(float("inf"))
        ends.append((c.captured_finish, c.energy_j(), c.events, c.completed))
    # (at least every running request finishes; the standby replica's queue and the unrouted requests wait for an
    # activation that never comes)
    assert ends[0] == ends[1] and len(ends[0][0]) >= sum(map(len, _placed(7)[0]))
