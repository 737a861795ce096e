"""Moving model instances between GPUs (`Pool.move`): the cold start's time and energy by hand, running requests
finishing in place or migrating with their KV cache (transfer time, link energy, no recompute), the latency-aware
rule, a swap whose loaded instance waits for the SMs its departing neighbour still uses, and bad moves."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.reference import ReferencePool
from helpers.profiles import COLOCATE, toy_profile

from commitenv.sim import EngineOptions, NoiseSpec
from commitenv.sim.devices import device_state
from commitenv.sim.migration import MigrationSpec
from commitenv.sim.pool import Instance, PoolLayout
from commitenv.sim.states import ACTIVE, LOADING, MOVING, STANDBY
from commitenv.workload.table import make_table

LOAD_S, LOAD_W = 5.0, 70.0  # cold start of the toy profile below; active idle 50 W at 1,000 MHz, standby 20 W
SCHED = dict(token_budget=64, max_seqs=8, context_limit=1024, block_size=4, kv_capacity_tokens=8192)


def profile(kv_bytes: float = 1.0):
    return toy_profile(scheduler=SCHED, latencies=dict(clock_change_s=0.0, activation_s=1.0, load_s=LOAD_S,
                                                       load_w=LOAD_W),
                       model=dict(name="toy-model", params_b=1, weight_gb=1, kv_bytes_per_token=kv_bytes))


def pool_of(gpus, *, kv_bytes=1.0, migration=None, log=True):
    layout = PoolLayout(tuple(tuple(Instance(0, s) for s in g) for g in gpus))
    opt = EngineOptions(noise=NoiseSpec(0, 0), closed_form=False, log_steps=log,
                        **({"migration": migration} if migration else {}))
    return ReferencePool(profile(kv_bytes), layout, opt)


def test_an_idle_instance_moves_with_the_cold_start_energy_by_hand():
    pool = pool_of([[0.5], [0.5]])
    pool.attach(make_table(np.zeros(0), np.zeros(0, int), np.zeros(0, int)))
    pool.run_until(10.0)
    pool.move(10.0, {0: 1})
    assert pool.replicas[0].state == LOADING and pool.replicas[0].gpu.index == 1
    pool.run_until(10.0 + LOAD_S - 1e-6)
    assert pool.replicas[0].state == LOADING
    pool.run_until(100.0)
    assert pool.replicas[0].state == ACTIVE and pool.cold_starts == 1 and pool.moves == 1
    # GPU 0: active idle until the move, then nothing on it: standby power
    assert pool.gpu_energy_j(100.0)[0] == pytest.approx(50.0 * 10 + 20.0 * 90, rel=1e-12)
    # GPU 1: its own active instance (50 W) all along, raised to load_w while the newcomer loads
    assert pool.gpu_energy_j(100.0)[1] == pytest.approx(50.0 * 10 + LOAD_W * LOAD_S + 50.0 * (90 - LOAD_S), rel=1e-12)


def test_a_moved_instance_serves_on_its_new_gpu_after_the_load():
    pool = pool_of([[1.0], [0.5]])
    pool.attach(make_table(np.array([1.0, 20.0]), np.array([8, 8]), np.array([4, 4])))
    pool.run_until(0.5)
    pool.move(0.5, {0: 1, 1: 0})  # a swap: each GPU's shares stay within 1 once both moves are made
    pool.run_until(np.inf)
    # the first request arrives while both load: it waits unrouted until the first load ends at 5.5
    assert pool.first_t[0] > 0.5 + LOAD_S
    assert np.all(np.isfinite(pool.finish_t)) and pool.cold_starts == 2
    log = [e for e in pool.log if 1 in e.slots]
    assert {(e.gpu, e.replica) for e in log} <= {(1, 0), (0, 1)}


def _decoding(pool, t):
    """Run to ``t`` and return the live requests decoding there."""
    pool.run_until(t)
    return [r for r in pool.live_requests() if r.generated >= 1]


def test_without_migration_running_requests_finish_in_place_before_the_instance_leaves():
    ref = pool_of([[0.5], [0.5]])
    pool = pool_of([[0.5], [0.5]])
    table = make_table(np.array([0.0]), np.array([40]), np.array([300]))
    for p in (ref, pool):
        p.attach(table)
    assert _decoding(pool, 1.0)
    pool.move(1.0, {0: 1})
    assert pool.replicas[0].state == MOVING
    ref.run_until(np.inf)
    pool.run_until(np.inf)
    assert pool.finish_t[0] == ref.finish_t[0] and pool.replica_of[0] == 0  # served where it was, unchanged
    done = pool.finish_t[0]
    # unloaded when the request ended: GPU 0 is at standby power from then, and the load ran on GPU 1
    e0 = pool.gpu_energy_j(done + 100)[0] - pool.gpu_energy_j(done)[0]
    assert e0 == pytest.approx(20.0 * 100, rel=1e-9)
    assert pool.replicas[0].state == ACTIVE and pool.replicas[0].gpu.index == 1


def test_migrate_all_sends_the_kv_over_the_link_and_the_request_resumes_elsewhere():
    kvb = 1e6  # bytes of KV per token
    spec = MigrationSpec(link_gbs=10.0, setup_s=0.02, j_per_gb=0.5)
    pool = pool_of([[0.5], [0.5]], kv_bytes=kvb, migration=spec)
    table = make_table(np.array([0.0]), np.array([40]), np.array([300]))
    pool.attach(table)
    live = _decoding(pool, 1.0)
    pool.move(1.0, {0: 1}, migrate="all")
    pool.run_until(1.5)
    # it left at the end of the step in flight at t = 1
    last = max((e for e in pool.log if e.replica == 0), key=lambda e: e.t1)
    assert last.t0 < 1.0 <= last.t1
    assert live[0].slot == 0 and last.slots == (0,)
    computed = last.computed_before[0] + last.new_tokens[0] * last.n_steps  # its KV when it left
    land = last.t1 + 0.02 + computed * kvb / 10e9
    pool.run_until(np.inf)
    assert pool.replica_of[0] == 1 and pool.preemptions[0] == 0 and pool.migrated == 1
    # no recompute: the first step on replica 1 computes one token (a decode) right after landing
    first = min((e for e in pool.log if e.replica == 1), key=lambda e: e.t0)
    assert first.t0 == pytest.approx(land, rel=1e-12) and first.new_tokens == (1,)
    assert pool.migration_j == pytest.approx(computed * kvb / 1e9 * 0.5, rel=1e-12)
    # GPU 0's meter: its steps above the floor, its floor (active idle until it left, standby after), the link
    t_end = pool.finish_t[0] + 10
    steps = sum(e.energy_j - e.floor_j for e in pool.log if e.gpu == 0)
    floor = 50.0 * last.t1 + 20.0 * (t_end - last.t1)
    assert pool.gpu_energy_j(t_end)[0] == pytest.approx(steps + floor + pool.migration_j, rel=1e-9)


T_SHORT = 135


def test_latency_aware_migration_keeps_the_near_complete_request():
    spec = MigrationSpec(link_gbs=100.0, setup_s=0.5, j_per_gb=0.0)  # a slow handoff: 0.5 s per request
    pool = pool_of([[0.5], [0.5]], migration=spec)
    # both on replica 0 (replica 1 wakes at 1.5 s), decoding at t = 2: one has a handful of tokens left (< 0.5 s at
    # ~12 ms a step), one hundreds
    table = make_table(np.array([0.0, 0.0]), np.array([8, 8]), np.array([T_SHORT, 600]))
    pool.set_active(0.0, 1)
    pool.attach(table)
    pool.pred_out = pool.out_tokens.copy()  # predictions equal the truth here, so the rule's input is exact
    pool.run_until(0.5)
    pool.set_active(0.5, 2)
    pool.run_until(2.0)
    pool.settle(2.0)
    short = next(r for r in pool.live_requests() if r.slot == 0)
    assert 0 < short.out - short.generated < 30 and pool.replicas[1].state == ACTIVE
    pool.move(2.0, {0: 1}, migrate="latency_aware")
    pool.run_until(np.inf)
    assert pool.replica_of[0] == 0 and pool.replica_of[1] == 1 and pool.migrated == 1


def _one_busy(pool):
    """Run to 0.5 s with one 2,000-token request on one of the two replicas: (busy, idle) replica indices."""
    pool.attach(make_table(np.array([0.0]), np.array([8]), np.array([2000])))
    pool.run_until(0.5)
    assert pool.replica_of[0] == -1 and pool.replicas[0].unf + pool.replicas[1].unf == 1
    busy = 0 if pool.replicas[0].unf else 1
    return busy, 1 - busy


def test_a_loaded_instance_waits_for_the_sms_its_departing_neighbour_still_uses():
    pool = pool_of([[0.5], [0.5]])
    busy, other = _one_busy(pool)
    pool.set_share(0.5, busy, 0.7)  # its SMs grow to 0.7; its memory stays the 0.5 it was placed with
    pool.move(0.5, {busy: other, other: busy})  # swap; the busy one drains in place (no migration)
    pool.run_until(0.5 + LOAD_S + 1.0)
    waiting = pool.replicas[other]
    # memory fits (0.5 + 0.5), so the load ran at once; loaded, but 0.7 + 0.5 SMs > 1 while the other drains
    assert waiting.state == LOADING and waiting.load_ready and pool.cold_starts == 1
    pool.run_until(np.inf)
    left = pool.finish_t[0]
    assert left > 0.5 + LOAD_S + 1.0
    log = [e for e in pool.log if e.replica == other]
    assert not log  # it never ran a step before the neighbour left (no work came, but also no SMs)
    assert pool.replicas[other].state == ACTIVE and pool.replicas[busy].state == ACTIVE
    # the departing instance loads on the freed GPU from the moment its request ended
    assert pool.replicas[busy].gpu.index == other and pool.cold_starts == 2
    assert pool.replicas[busy].load_t == pytest.approx(left + LOAD_S, rel=1e-12)


def test_an_arriving_instance_loads_only_once_its_departing_neighbour_frees_the_memory():
    pool = pool_of([[0.6], [0.6]])
    busy, other = _one_busy(pool)
    pool.move(0.5, {busy: other, other: busy})  # swap; 0.6 + 0.6 of the busy one's GPU memory until it leaves
    pool.run_until(0.5 + 2 * LOAD_S)
    waiting = pool.replicas[other]
    assert waiting.state == LOADING and waiting.load_wait and not waiting.load_ready and pool.cold_starts == 0
    # while it waits it draws nothing: the busy one's GPU meters its own steps and the active idle floor only
    g = pool.replicas[busy].gpu.index
    steps = sum(e.energy_j - e.floor_j for e in pool.log if e.gpu == g and e.t1 <= 0.5 + 2 * LOAD_S)
    inflight = pool.gpu_energy_j(0.5 + 2 * LOAD_S)[g] - steps - 50.0 * (0.5 + 2 * LOAD_S)
    assert 0.0 <= inflight < 1.0  # the step in flight at the check, well under one joule, and no load_w
    pool.run_until(np.inf)
    left = pool.finish_t[0]
    assert waiting.load_t == pytest.approx(left + LOAD_S, rel=1e-12)  # its load began when the neighbour left
    assert pool.replicas[busy].load_t == pytest.approx(left + LOAD_S, rel=1e-12)
    assert waiting.state == ACTIVE and pool.cold_starts == 2


def test_a_standby_instance_moves_and_stays_on_standby():
    pool = pool_of([[0.5], [0.5]])
    pool.attach(make_table(np.zeros(0), np.zeros(0, int), np.zeros(0, int)))
    pool.set_active(0.0, 1)
    pool.run_until(2.0)
    assert pool.replicas[1].state == STANDBY
    pool.move(2.0, {1: 0})
    pool.run_until(20.0)
    assert pool.replicas[1].state == STANDBY and pool.replicas[1].gpu.index == 0
    pool.set_active(20.0, 2)
    pool.run_until(30.0)
    assert pool.replicas[1].state == ACTIVE


def test_bad_moves_are_refused_with_the_reason():
    pool = pool_of([[0.6], [0.6]])
    with pytest.raises(ValueError, match="GPU 1 would hold 1.200 > 1"):
        pool.move(0.0, {0: 1})
    with pytest.raises(ValueError, match="GPU index 5"):
        pool.move(0.0, {0: 5})
    with pytest.raises(ValueError, match="migrate must be one of"):
        pool.move(0.0, {0: 0}, migrate="some")
    bare = ReferencePool(toy_profile(scheduler=COLOCATE), PoolLayout(((Instance(0, 0.5),), (Instance(0, 0.5),))))
    with pytest.raises(ValueError, match="no cold-start figures"):
        bare.move(0.0, {0: 1})
    with pytest.raises(ValueError, match="migration.link_gbs"):
        MigrationSpec(link_gbs=0.0)


def test_a_what_if_copy_carries_moves_loads_and_requests_in_transit():
    pool = pool_of([[0.5], [0.5]], kv_bytes=1e6, migration=MigrationSpec(link_gbs=1.0, setup_s=0.0, j_per_gb=0.0))
    pool.attach(make_table(np.array([0.0]), np.array([40]), np.array([300])))
    _decoding(pool, 1.0)
    pool.move(1.0, {0: 1}, migrate="all")
    pool.run_until(1.1)
    (r,) = [r for _, r in pool.transit.values()]
    assert r.replica == -1 and pool.counts()["waiting"] == 1 and pool.replicas[0].state == LOADING
    copy = pool.clone(hide_lengths=False)
    assert [r.index for r in copy.replicas] == [0, 1] and copy.replicas[0].gpu.index == 1
    assert len(copy.transit) == 1 and copy.live == 1
    copy.run_until(np.inf)
    pool.run_until(np.inf)
    assert copy.replicas[0].state == ACTIVE
    assert copy.completed == 1 and pool.completed == 1


# ------------------------------------------------------------------------------------------ through the env


def test_the_env_moves_an_instance_with_its_placement_key_and_reports_it():
    from commitenv.control import ControllerContext
    from commitenv.envs import CommitServeEnv

    env = CommitServeEnv("festina-h100-shared")
    env.reset(seed=100000)
    ctx = ControllerContext.from_env(env)
    gpus = [g for g, insts in enumerate(ctx.placement) for _ in insts]  # replica -> GPU: 0 1 2 2 3 3 ...
    shares = [s for g in ctx.placement for _, s in g]
    assert gpus[:6] == [0, 1, 2, 2, 3, 3] and shares[:6] == [1.0, 1.0, 0.4, 0.6, 0.4, 0.6]
    bad = gpus.copy()
    bad[2] = 3  # Qwen (0.4) onto GPU 3, which already holds 0.4 + 0.6
    with pytest.raises(ValueError, match="GPU 3 would get 1.400 > 1"):
        env.step(ctx.action(ctx.all_active, 1980, placement=bad))
    fit = shares.copy()
    fit[2] = fit[4] = 0.2  # the SMs would fit (0.2 + 0.2 + 0.6), but both Qwens keep the 0.4 of memory they were placed with
    with pytest.raises(ValueError, match="GPU 3 would reserve 1.400 > 1 of its memory"):
        env.step(ctx.action(ctx.all_active, 1980, shares=fit, placement=bad))
    assert device_state(env.pool).replica_share.tolist() == shares  # refused whole: not even the shares changed
    good = gpus.copy()
    good[2], good[4] = 3, 2  # the two Qwen instances swap GPUs
    _, _, _, _, info = env.step(ctx.action(ctx.all_active, 1980, placement=good, migrate="all"))
    assert info["placement"][:6] == [0, 1, 3, 2, 2, 3] and info["cold_starts"] == 2 and info["moves"] == 2
    pool = env.pool
    d = device_state(pool)
    assert d.replica_gpu[2] == 3 and np.flatnonzero(d.replica_gpu == 2).tolist() == [3, 4]
    assert d.replica_state[2] in (ACTIVE, LOADING)
    env.step(ctx.action(ctx.all_active, 1980))  # placement absent: it stays
    assert device_state(pool).replica_state[2] == ACTIVE and pool.moves == 2
    snap = ctx.probe.snapshot()
    assert snap.replicas.gpu[2] == 3 and snap.replicas.state[2] == "active"


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_moves_lose_no_request_and_never_oversubscribe_a_gpu(seed):
    """Random moves (every migration mode), activations and arrivals on two models sharing three GPUs: every
    request finishes once, every replica ends with all its KV blocks free, the steps running at any moment on a
    GPU never hold more than its SMs, and the instances on a GPU never hold more than its memory (SM shares shrink
    at random, so a move's SMs can fit where its memory does not)."""
    rng = np.random.default_rng(seed)
    profiles = [profile(1e5), profile(1e5)]
    layout = PoolLayout(((Instance(0, 0.5), Instance(1, 0.5)), (Instance(0, 0.4), Instance(1, 0.4)),
                         (Instance(0, 0.3),)))
    pool = ReferencePool(profiles, layout, EngineOptions(noise=NoiseSpec(0, 0), closed_form=False, log_steps=True))
    n = 400
    table = make_table(np.sort(rng.uniform(0, 120, n)), rng.integers(4, 200, n), rng.integers(1, 1500, n))
    table = table.__class__(**{**table.__dict__, "tenant": rng.integers(0, 2, n).astype(np.int32),
                               "tenant_names": ("a", "b")})
    pool.attach(table, {0: 0, 1: 1})
    t = 0.0
    while t < 120:
        t += float(rng.uniform(2, 12))
        pool.run_until(t)
        r = int(rng.integers(0, len(pool.replicas)))
        g = int(rng.integers(0, len(pool.gpus)))
        if rng.random() < 0.3:
            s = int(rng.integers(0, len(pool.replicas)))
            pool.set_share(t, s, float(rng.uniform(0.1, pool.replicas[s].share)))
        try:
            pool.move(t, {r: g}, migrate=["none", "latency_aware", "all"][int(rng.integers(0, 3))])
        except ValueError as e:
            assert "would hold" in str(e) or "of its memory" in str(e)  # the only refusals: SMs or memory
        for gpu in pool.gpus:
            held = sum(x.mem_share for x in gpu.replicas if not (x.state == LOADING and x.load_wait))
            assert held <= 1 + 1e-9
        if rng.random() < 0.3:
            m = int(rng.integers(0, 2))
            pool.set_active(t, int(rng.integers(1, len(pool.replicas_of(m)) + 1)), model=m)
    for m in range(2):
        pool.set_active(t, len(pool.replicas_of(m)), model=m)
    pool.run_until(np.inf)
    assert np.all(np.isfinite(pool.finish_t)) and pool.completed == n and not pool.transit
    assert all(r.free_blocks == r.cap_blocks and not r.has_work() for r in pool.replicas)
    assert pool.moves > 0 and pool.cold_starts > 0
    for g in range(len(pool.gpus)):  # SMs of the steps running at once on GPU g: a sweep over starts and ends
        ev = sorted([(e.t1, 0, e.share) for e in pool.log if e.gpu == g] +
                    [(e.t0, 1, e.share) for e in pool.log if e.gpu == g])  # at equal times, ends first
        used = 0.0
        for _, start, share in ev:
            used += share if start else -share
            assert used <= 1 + 1e-9
