"""A serving state assembled outside the engine (a hardware pool's mirror, `Pool.place`) and resumed runs as on the
reference engine (tests/helpers/reference)."""

from __future__ import annotations

import numpy as np

from helpers.profiles import toy_profile
from helpers.reference import ReferencePool
from helpers.reference.copies import reference_snapshot

from commitenv.sim import EngineOptions, Pool
from commitenv.sim.pool import PoolLayout

SCHED = dict(token_budget=32, max_seqs=6, context_limit=512, block_size=4, kv_capacity_tokens=2048)


def _toy():
    return toy_profile(scheduler=SCHED, latencies=dict(clock_change_s=0.05, activation_s=1.0, load_s=3.0, load_w=70.0),
                       model=dict(name="toy-model", params_b=1, weight_gb=1, kv_bytes_per_token=1e5))


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


def test_a_placed_serving_state_runs_as_on_the_reference():
    """`Pool.place` (the hardware mirror's state) and `resume`, on a new pool and on the reference engine: the same
    snapshot views, and the same run to the end (finish times, energy, events)."""
    from commitenv.sim import take_snapshot

    def build(on_kernel: bool) -> Pool:
        p = (Pool if on_kernel else ReferencePool)(_toy(), PoolLayout.single(4), EngineOptions(closed_form=False))
        p.now = 5.0
        run, wait, unrouted, states = _placed(7)
        p._n_results = 0
        p.pred_out = p.visible_deadline = None
        p.place(run, wait, unrouted, states)
        return p

    a, b = build(True), build(False)
    sa, sb = take_snapshot(a), reference_snapshot(b)
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
