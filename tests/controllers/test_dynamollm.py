"""DynamoLLM baseline: nine-class classifier, profiled capacity, the instance-count integer program, the
per-step frequency rule on a hand-built queue, emergency escalation, and a single-hour end-to-end run."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("ortools", reason='dynamollm needs OR-Tools (a core dependency): pip install commitenv')

import commitenv  # noqa: F401  (registers the scenario ids)
from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout, observed_arrivals, simulate, take_snapshot
from commitenv.sim.lref import reference_latency
from commitenv.workload.table import make_table
from helpers.profiles import toy_profile
from commitenv_controllers import ControllerContext, available, make
from commitenv_controllers.dynamollm import (
    REP_OUTPUT,
    REP_PROMPT,
    ClockLaws,
    DynamoLLMController,
    choose_clock,
    class_capacity,
    classify,
    estimate_queue,
    forecast_load,
    plan_replicas,
    transition_energy_j,
)
from helpers.scenarios import HOUR_SCENARIO

LOW, TOP = 0, 1  # toy profile levels: 500 MHz, 1000 MHz


class PoolProbe:
    """The controller's view of a bare engine pool (what `EnvProbe` gives from an env)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def snapshot(self):
        return take_snapshot(self.pool)

    def recent_arrivals(self, window_s: float):
        return observed_arrivals(self.pool, window_s)

    def report_planning_delay(self, seconds: float) -> None:  # pragma: no cover
        pass


def toy_ctx(pool: Pool, alpha: float, n: int) -> ControllerContext:
    return ControllerContext(scenario="toy", n_replicas=n, clocks_mhz=(500, 1000), reference_clock_mhz=1000,
                             interval_s=60.0, intervals_per_hour=60, horizon_hours=1, commitments_j=(1e6,),
                             lambda_plus=2.0, lambda_minus=1.0, alpha=alpha, epsilon=0.01, actuation_delay_s=0.0,
                             profile=pool.profiles[0], probe=PoolProbe(pool))


def toy_pool(arr, prompt, out, *, alpha: float, n: int = 1, active: int | None = None, clock_mhz: int = 1000) -> Pool:
    opt = EngineOptions(alpha=alpha, noise=NoiseSpec(0.0, 0.0), oracle_lengths=True)
    pool = Pool(toy_profile(), PoolLayout.single(n), opt, clock_mhz=clock_mhz)
    if active is not None:
        pool.set_active(0.0, active)
    pool.attach(make_table(arr, prompt, out))
    return pool


# ------------------------------------------------------------------------------------------ classes
def test_registered():
    assert "dynamollm" in available()
    assert isinstance(make("dynamollm"), DynamoLLMController)


def test_missing_ortools_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ortools.linear_solver", None)
    with pytest.raises(ImportError, match=r'pip install "commitenv\[opt\]"'):
        DynamoLLMController()


def test_nine_classes_at_the_boundaries():
    # input bins: < 256, < 1024, else; output bins: < 100, < 350, else
    assert classify([255, 256, 1023, 1024], [1, 1, 1, 1]).tolist() == [0, 3, 3, 6]
    assert classify([1, 1, 1, 1], [99, 100, 349, 350]).tolist() == [0, 1, 1, 2]
    assert classify([255, 256, 1023, 1024], [99, 100, 349, 350]).tolist() == [0, 4, 4, 8]
    assert classify([10, 300, 5000], [400, 50, 200]).tolist() == [2, 3, 7]
    assert classify(np.array(REP_PROMPT).repeat(3), np.tile(REP_OUTPUT, 3)).tolist() == list(range(9))


def test_capacity_alone_matches_reference_latency_and_grows_with_clock():
    prof = toy_profile(scheduler=dict(token_budget=512, max_seqs=64, context_limit=4096, kv_capacity_tokens=1 << 20))
    laws = ClockLaws.of(prof)
    p = np.array(REP_PROMPT).repeat(3)
    o = np.tile(REP_OUTPUT, 3)
    cap = class_capacity(laws, alpha=3.0, slo_frac=0.5)
    np.testing.assert_allclose(cap.lref_s, reference_latency(prof, p, o), rtol=1e-12)
    # at the top clock every class sustains B* >= 1 (latency target 1.5 L_ref > L_ref)
    assert np.all(cap.batch[:, TOP] >= 1) and np.all(cap.rate[:, TOP] > 0)
    # throughput is B*/T(B*) with T(B*) within the target; a faster clock carries more
    for c in range(9):
        if cap.rate[c, LOW] > 0:
            assert cap.rate[c, TOP] > cap.rate[c, LOW]
        np.testing.assert_allclose(cap.busy_s[c, TOP] * cap.rate[c, TOP], 1.0)
        assert cap.batch[c, TOP] / cap.rate[c, TOP] <= 1.5 * cap.lref_s[c] + 1e-12
    # a looser SLO share admits larger batches, hence more capacity
    loose = class_capacity(laws, alpha=3.0, slo_frac=1.0)
    assert np.all(loose.rate[:, TOP] >= cap.rate[:, TOP]) and np.any(loose.rate[:, TOP] > cap.rate[:, TOP])


# ------------------------------------------------------------------------------------------ slow loop
def test_integer_program_hand_instance():
    # one class, two clocks: low carries 2 req/s per replica at 40 W idle + 10 J/req, high 5 req/s at
    # 45 W + 12 J/req; standby 20 W; load 6.2 req/s, no headroom; N = 10.
    # one pool clock: low needs 4 -> 4*(40-20) + 6.2*10 = 142;  high needs 2 -> 2*25 + 6.2*12 = 124.4  => 2 high
    # a per-clock mix: 1 low + 1 high (capacity 7): y_low = 2, y_high = 4.2 -> 20 + 25 + 20 + 50.4 = 115.4
    #   (2 low + 1 high: 131.4; 0 + 2: 124.4; 3 low: capacity 6 < 6.2)                                 => 1 + 1
    args = ([6.2], [[2.0, 5.0]], [[10.0, 12.0]], [40.0, 45.0], 20.0, 10)
    one = plan_replicas(*args, headroom=1.0, pool_clock=True)
    assert one.feasible and one.counts == (0, 2) and one.active == 2 and one.clock_idx == 1
    assert one.power_w == pytest.approx(124.4 + 10 * 20.0)
    mix = plan_replicas(*args, headroom=1.0, pool_clock=False)
    assert mix.counts == (1, 1) and mix.power_w == pytest.approx(115.4 + 200.0)
    # headroom 1.1: load 6.82 -> low 4 (8 >= 6.82): 80 + 68.2 = 148.2; high 2: 50 + 81.84 = 131.84
    assert plan_replicas(*args, headroom=1.1, pool_clock=True).counts == (0, 2)
    # a class the low clock cannot serve (capacity 0) forces the high clock
    two = plan_replicas([0.0, 1.0], [[2.0, 5.0], [0.0, 4.0]], [[10.0, 12.0], [np.inf, 20.0]], [40.0, 45.0], 20.0, 10,
                        headroom=1.0)
    assert two.counts == (0, 1) and two.power_w == pytest.approx(25.0 + 20.0 + 200.0)
    # no load: one replica at the cheapest idle clock
    assert plan_replicas([0.0], [[2.0, 5.0]], [[10.0, 12.0]], [40.0, 45.0], 20.0, 10).counts == (1, 0)
    # more load than N replicas carry at the top clock: all N at the top clock, flagged infeasible
    over = plan_replicas([60.0], [[2.0, 5.0]], [[10.0, 12.0]], [40.0, 45.0], 20.0, 10, top=1)
    assert not over.feasible and over.counts == (0, 10) and over.active == 10
    # pricing a fixed count (transition check)
    fixed = plan_replicas(*args, headroom=1.0, fixed_total=4)
    assert fixed.active == 4 and fixed.power_w == pytest.approx(142.0 + 200.0)  # 4 low beats 4 high (100 + 74.4)


def test_forecast_peak_and_mean():
    # 10 minutes of history at t = 600: 30 short-short requests in the newest 5 min, 6 in the older 5 min
    t, window = 600.0, 600.0
    arr = np.concatenate([np.linspace(10, 290, 6), np.linspace(310, 590, 30)])  # original arrival times
    tab = make_table(arr + window, np.full(36, 100), np.full(36, 20))  # as recent_arrivals shifts them
    peak = forecast_load(tab, window, t, bucket_s=300.0, mode="peak")
    mean = forecast_load(tab, window, t, mode="mean")
    assert peak[0] == pytest.approx(30 / 300) and mean[0] == pytest.approx(36 / 600)
    assert peak[1:].sum() == 0 and mean[1:].sum() == 0
    assert forecast_load(None, window, t).sum() == 0


def test_transition_energy():
    laws = ClockLaws.of(toy_profile())  # activation 1 s, active idle 50 W at the top clock
    assert transition_energy_j(3, 5, laws) == pytest.approx(100.0)
    assert transition_energy_j(5, 3, laws) == pytest.approx(100.0)
    assert transition_energy_j(4, 4, laws) == 0.0


# ------------------------------------------------------------------------------------------ fast loop
# Hand-built queue on one toy replica (token budget 8): two requests arrive at t = 0, each 8 prompt tokens
# and 3 output tokens (oracle lengths). At the snapshot r0 is admitted (its prefill step in flight) and r1
# waits. The estimate (`_replica_estimate`): prefills in queue order, r0's in one step of tau0 + tau1*8;
# r1's prefill runs while r0 decodes, so its steps carry r0's decode (tau2 + tau3*9) and leave 7 budget tokens:
# 2 chunks. Then d = 2 decode steps each, co-batched (B = 2) over context 8 + 8 growing by 2 per step; r1's
# prefill compute (tau1*8) rides in r0's decode steps.
#   top (1000 MHz): r0 = 0.018 + [2*(0.01 + 0.0001*2 + 0.00001*16) + 0.00001*2*3 = 0.02078] + 0.008 = 0.04678
#                   r1 = 0.018 + [2*(0.01 + 0.0001 + 0.00001*9) + 0.008 = 0.02838] + 0.02078    = 0.06716
#   low  (500 MHz): r0 = 0.028 + [2*(0.012 + 0.0002 + 0.000012*16) + 0.000012*6 = 0.024856] + 0.016 = 0.068856
#                   r1 = 0.028 + [2*(0.012 + 0.0001 + 0.000012*9) + 0.016 = 0.040416] + 0.024856   = 0.093272
# Deadline = alpha * L_ref, L_ref = 0.01 + 0.008 + 2*(0.01 + 0.0001) + 0.00001*(2*8 + 3) = 0.03839 s.
EST = {TOP: (0.04678, 0.06716), LOW: (0.068856, 0.093272)}
LREF = 0.03839


def hand_queue(alpha: float, clock_mhz: int = 1000) -> Pool:
    opt = EngineOptions(alpha=alpha, noise=NoiseSpec(0.0, 0.0), oracle_lengths=True)
    pool = Pool(toy_profile(), PoolLayout.single(1), opt, clock_mhz=clock_mhz)
    pool.attach(make_table([0.0, 0.0], [8, 8], [3, 3]))
    pool.run_until(0.0)
    pool.settle(0.0)
    return pool


def test_queue_estimate_by_hand_and_against_the_engine():
    laws = ClockLaws.of(toy_profile())
    for clk, (f0, f1) in EST.items():
        pool = hand_queue(alpha=3.0, clock_mhz=laws.mhz[clk])
        assert pool.deadline.tolist() == pytest.approx([3.0 * LREF] * 2)
        snap = take_snapshot(pool)
        est = estimate_queue(snap, laws)
        assert est.slots.tolist() == [0, 1] and est.waiting == 1
        np.testing.assert_allclose(est.finish[:, clk], [f0, f1], rtol=1e-9)
        # close to what the engine does (oracle what-if at the pool's own clock, no noise): r0 finishes at
        # 0.04639 s / 0.068428 s, r1 at 0.06678 s / about 0.092 s
        truth = simulate(snap, 1, laws.mhz[clk], horizon_s=1.0).finish
        assert abs(truth[0] - f0) < 0.02 * f0 and abs(truth[1] - f1) < 0.02 * f1


@pytest.mark.parametrize(
    "alpha, admissible, chosen",
    [
        # loose: deadlines 0.1152 s, both levels finish in time; with 60 s of replica time the idle floor
        # dominates the interval energy (40 W vs 50 W), so the low clock is the least-energy one
        (3.0, [True, True], LOW),
        # tight: deadlines 0.0768 s; top finishes at 0.0468 / 0.0672, low at 0.0689 / 0.0933: top only
        (2.0, [False, True], TOP),
        # hopeless: deadlines 0.0384 s < every estimate: none qualifies, so the top clock
        (1.0, [False, False], TOP),
    ],
)
def test_frequency_rule_on_the_hand_queue(alpha, admissible, chosen):
    pool = hand_queue(alpha)
    laws = ClockLaws.of(toy_profile())
    est = estimate_queue(take_snapshot(pool), laws)
    clock, ok, energy = choose_clock(est, laws, active=1, interval_s=60.0)
    assert ok.tolist() == admissible and clock == chosen
    assert energy[LOW] < energy[TOP]  # the low clock is cheaper whenever it is admissible
    # the controller picks the same clock (one replica, no emergency unless hopeless)
    ctrl = DynamoLLMController(warmup_s=0.0, urgent_min=3)
    ctrl.reset(toy_ctx(pool, alpha, n=1), seed=0)
    assert ctrl.act(np.zeros(16, np.float32), {"active": 1, "clock_mhz": 1000}) == {"active": 1, "clock": chosen}


def test_forecast_work_that_does_not_fit_rules_out_the_slow_clock():
    pool = hand_queue(alpha=3.0)
    laws = ClockLaws.of(toy_profile())
    est = estimate_queue(take_snapshot(pool), laws)
    # recent arrivals needing 50 s of replica time at 500 MHz but 40 s at 1000 MHz, with max_util 0.8 of 60 s
    clock, ok, _ = choose_clock(est, laws, 1, 60.0, fc_busy=np.array([50.0, 40.0]), fc_energy=np.zeros(2),
                                max_util=0.8)
    assert ok.tolist() == [False, True] and clock == TOP


# ------------------------------------------------------------------------------------------ escalation
def test_emergency_escalation_goes_to_top_clock_and_more_replicas():
    # 4 replicas, 1 active at 500 MHz; a burst of 4 requests at t = 1 lands on it with tight deadlines
    opt = EngineOptions(alpha=1.2, noise=NoiseSpec(0.0, 0.0), oracle_lengths=True)
    pool = Pool(toy_profile(), PoolLayout.single(4), opt, clock_mhz=500)
    pool.set_active(0.0, 1)
    pool.attach(make_table([1.0] * 4, [8] * 4, [6] * 4))
    pool.run_until(1.0)
    pool.settle(1.0)
    # no slow-loop plan yet (warmup not reached): the count stays 1 unless the emergency rule acts
    ctrl = DynamoLLMController(warmup_s=1e6)
    ctrl.reset(toy_ctx(pool, 1.2, n=4), seed=0)
    laws = ctrl.laws
    est = estimate_queue(take_snapshot(pool), laws)
    assert est.misses(TOP) >= 2  # queued behind each other, they cannot all make it even at the top clock
    act = ctrl.act(np.zeros(16, np.float32), {"active": 1, "clock_mhz": 500})
    assert act == {"active": 2, "clock": TOP}  # doubled (escalation_factor 2) and top clock
    assert ctrl.log[-1]["emergency"] and ctrl.esc_until == pytest.approx(1.0 + ctrl.escalation_hold_s)
    # a larger factor restores more capacity, capped at N
    big = DynamoLLMController(warmup_s=1e6, escalation_factor=8.0)
    big.reset(toy_ctx(pool, 1.2, n=4), seed=0)
    assert big.act(np.zeros(16, np.float32), {"active": 1, "clock_mhz": 500}) == {"active": 4, "clock": TOP}
    # with loose deadlines the same queue is no emergency: the plan's count and the least-energy clock
    calm = toy_pool([1.0] * 4, [8] * 4, [6] * 4, alpha=50.0, n=4, active=1)
    calm.run_until(1.0)
    calm.settle(1.0)
    c = DynamoLLMController(warmup_s=1e6)
    c.reset(toy_ctx(calm, 50.0, n=4), seed=0)
    a = c.act(np.zeros(16, np.float32), {"active": 1, "clock_mhz": 1000})
    assert not c.log[-1]["emergency"] and a == {"active": 1, "clock": LOW}


# ------------------------------------------------------------------------------------------ end to end
def _run(name: str, seed: int = 0) -> tuple[float, list[tuple[int, int]], int]:
    env = gym.make(f"commitenv/{HOUR_SCENARIO}-v0")
    obs, info = env.reset(seed=seed)
    ctrl = make(name)
    ctrl.reset(ControllerContext.from_env(env), seed)
    energy = 0.0
    actions = []
    steps = 0
    done = False
    while not done:
        a = ctrl.act(obs, info)
        actions.append((a["active"], a["clock"]))
        obs, _, done, _, info = env.step(a)
        energy += info["interval_energy_j"]
        steps += 1
    env.close()
    return energy, actions, steps


def test_single_hour_runs_saves_energy_and_is_deterministic():
    e_dyn, acts, steps = _run("dynamollm")
    e_vllm, _, _ = _run("vllm")
    assert steps == 60
    assert e_dyn < 0.9 * e_vllm  # energy-minimizing: well below the all-replicas top-clock baseline
    actives = [a for a, _ in acts]
    assert min(actives) < 32 and len(set(acts)) > 1  # it does scale the pool and move the clock
    e2, acts2, _ = _run("dynamollm")
    assert acts2 == acts and e2 == e_dyn
    assert math.isfinite(e_dyn)
