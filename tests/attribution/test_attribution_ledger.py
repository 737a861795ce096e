"""Online ledger: fed the step log as the engine runs, settled per window against the metered energy with idle
gaps excluded; window shares add up to the window's busy energy, bills are issued when requests finish, and
with noise off they equal the closed form of the whole log."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.profiles import toy_profile

from commitenv.attribution import Ledger, StepLaw, closed_form_for, ledger_horizon
from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
from commitenv.workload.table import make_table

IDLE_W = 50.0


def workload(n=24, seed=0):
    """Three bursts separated by idle gaps, so windows hold time no step covers."""
    rng = np.random.default_rng(seed)
    arr = np.sort(np.concatenate([rng.uniform(b, b + 0.1, n // 3) for b in (0.0, 0.8, 1.6)]))
    return make_table(arr, rng.integers(2, 20, n), rng.integers(1, 10, n))


def drive(table, *, noise: bool, n_gpus: int = 1, window_s: float = 0.05, bills=None, mappings: bool = False):
    prof = toy_profile()
    opts = EngineOptions(noise=NoiseSpec() if noise else NoiseSpec(0, 0), log_steps=True, seed=3)
    pool = Pool(prof, PoolLayout.single(n_gpus), opts)
    pool.attach(table)
    prompts, outs = table, pool.out_tokens
    if mappings:  # lengths looked up slot by slot
        prompts = {i: int(p) for i, p in enumerate(table.prompt_tokens)}
        outs = {i: int(o) for i, o in enumerate(pool.out_tokens)}
    led = Ledger(StepLaw.from_pool(pool), prompts, outs, n_gpus=n_gpus,
                 on_bill=None if bills is None else (lambda s, j: bills.append((s, j))))
    t = 0.0
    while pool.live or pool.arrived < len(table):
        t = round(t + window_s, 10)
        pool.run_until(t)
        pool.settle(t)
        led.sync(pool.log)
        led.close_from_pool(pool, t)
        led.settle(ledger_horizon(pool))
    pool.run_until(np.inf)
    led.sync(pool.log)
    t_end = max(t, pool.now)
    if t_end > t:
        led.close_from_pool(pool, t_end)
    led.settle()
    return pool, led


@pytest.mark.parametrize("n_gpus", [1, 2])
def test_window_shares_sum_to_busy_energy_with_noise(n_gpus):
    table = workload()
    pool, led = drive(table, noise=True, n_gpus=n_gpus)
    assert led.pending_windows == 0 and len(led.windows) > 10
    gaps = 0
    for w in led.windows:
        assert sum(w.shares.values()) + w.unattributed_j == pytest.approx(w.busy_j, rel=1e-12, abs=1e-12)
        gaps += w.idle_j > 0
    assert gaps > 3  # idle gaps were excluded
    # busy energy over the run = metered - idle floor outside steps = the logged step energies
    busy = sum(w.busy_j for w in led.windows)
    logged = sum(e.energy_j for e in pool.log)
    assert busy == pytest.approx(logged, rel=1e-9)
    assert sum(w.metered_j for w in led.windows) == pytest.approx(pool.energy_j(pool.now), rel=1e-12)
    assert abs(sum(w.unattributed_j for w in led.windows)) < 1e-9 * busy
    # every request finished and was billed; bills add up to the busy energy
    assert sorted(led.bills) == list(range(len(table)))
    assert sum(led.bills.values()) == pytest.approx(busy, rel=1e-9)


def test_bills_equal_closed_form_without_noise():
    table = workload(seed=1)
    bills = []
    pool, led = drive(table, noise=False, bills=bills)
    cf = closed_form_for(pool.log, table, StepLaw.from_pool(pool))
    got = np.array([led.bills[i] for i in range(len(table))])
    assert got == pytest.approx(cf.shares, rel=1e-9)
    # bills were issued once each, when the request's last window settled (in finishing order)
    assert sorted(s for s, _ in bills) == list(range(len(table)))
    order = [s for s, _ in bills]
    fin = pool.finish_t[order]
    win = np.floor(fin / 0.05 - 1e-9)
    assert np.all(np.diff(win) >= 0)


def test_bills_wait_for_the_window_of_the_last_token():
    """A window settles once the step in flight across its end has ended (ledger_horizon); a request is billed
    when the window of its last token settles, and a running one only accumulates settled shares."""
    table = make_table([0.0, 0.0], [4, 4], [3, 30])
    prof = toy_profile()
    pool = Pool(prof, PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(table)
    led = Ledger(StepLaw.from_pool(pool), table, pool.out_tokens)
    for t in (0.1, 0.2):
        pool.run_until(t)
        pool.settle(t)
        led.sync(pool.log)
        led.close_from_pool(pool, t)
        done = led.settle(ledger_horizon(pool))
        if t == 0.1:
            assert done == [] and led.pending_windows == 1  # request 1's step spans t = 0.1
    assert [w.index for w in led.windows] == [0]
    assert 0 in led.bills and 1 not in led.bills  # request 0 is done and billed, request 1 still runs
    assert led.settled[1] > 0
    pool.run_until(np.inf)
    led.sync(pool.log)
    led.close_from_pool(pool, pool.now)
    led.settle()
    assert 1 in led.bills and led.bills[1] > led.settled[0]
    assert led.bills[0] + led.bills[1] == pytest.approx(sum(e.energy_j for e in pool.log), rel=1e-12)


def test_settling_too_early_is_an_error():
    table = make_table([0.0], [4], [40])
    pool = Pool(toy_profile(), PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(table)
    led = Ledger(StepLaw.from_pool(pool), table, pool.out_tokens)
    pool.run_until(0.1)
    pool.settle(0.1)
    led.sync(pool.log)
    led.close_from_pool(pool, 0.1)
    led.settle()  # ignores the step in flight across t = 0.1
    pool.run_until(np.inf)
    with pytest.raises(ValueError, match="ledger_horizon"):
        led.sync(pool.log)


def test_close_window_rejects_the_past():
    table = make_table([0.0], [4], [3])
    pool = Pool(toy_profile(), PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(table)
    pool.run_until(np.inf)
    led = Ledger(StepLaw.from_pool(pool), table, pool.out_tokens)
    led.sync(pool.log)
    with pytest.raises(ValueError, match="precedes the end"):
        led.close_window(0.001, 1.0)


# a preemption-heavy run (request 6 is preempted 44 times: tests/attribution/test_attribution_replay_report.py)
TIGHT = dict(token_budget=512, max_seqs=16, context_limit=2048, block_size=4, kv_capacity_tokens=3200)
TIGHT_ARR = [0.019, 0.052, 0.077, 0.115, 0.124, 0.127, 0.143]
TIGHT_PROMPT = [629, 458, 64, 264, 383, 472, 740]
TIGHT_OUT = [553, 262, 648, 325, 263, 42, 331]


def replay_log(pool, table, log, window_s: float) -> Ledger:
    """Feed a finished run's log to a ledger window by window (settling up to the earliest step in flight)."""
    led = Ledger(StepLaw.from_pool(pool), table, pool.out_tokens)
    t, i = 0.0, 0
    while i < len(log):
        t = round(t + window_s, 10)
        j = i
        while j < len(log) and log[j].t1 <= t:
            j += 1
        for e in log[i:j]:
            led.consume(e)
        i = j
        led.close_window(t, 100.0)
        led.settle(min((e.t0 for e in log[j:]), default=t))
    led.settle()
    return led


def test_preemption_recompute_is_billed_like_the_closed_form_and_completions_are_found():
    """Recompute chunks after a preemption are prefill (own terms ``c1*k + c2*(...)``), and a request is
    complete only when a step computes its last token: the ledger's law parts per request equal the closed
    form's law terms, window by window, and all seven requests are billed exactly once."""
    import dataclasses

    table = make_table(TIGHT_ARR, TIGHT_PROMPT, TIGHT_OUT)
    pool = Pool(toy_profile(scheduler=TIGHT), PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(table)
    pool.run_until(np.inf)
    assert pool.preemptions.tolist() == [0, 0, 0, 0, 0, 0, 44]
    law = StepLaw.from_pool(pool)
    cf = closed_form_for(pool.log, table, law, scale="none")
    for log in (pool.log, [dataclasses.replace(e, decode=()) for e in pool.log]):  # flags, and walking the log
        led = replay_log(pool, table, log, 0.25)
        assert sorted(led.bills) == list(range(7))  # every completion found, the preempted request's included
        for w in led.windows:
            assert sum(w.shares.values()) == pytest.approx(w.busy_j, rel=1e-12)
        assert sum(led.bills.values()) == pytest.approx(sum(w.metered_j for w in led.windows), rel=1e-12)
        # in one window spanning the run, the meter is split exactly in proportion to the closed form's law terms
        whole = replay_log(pool, table, log, 1e6)
        want = cf.shares / cf.shares.sum() * sum(w.metered_j for w in whole.windows)
        assert np.array([whole.bills[i] for i in range(7)]) == pytest.approx(want, rel=1e-12)


def test_a_log_mixing_entries_with_and_without_decode_flags_is_refused():
    import dataclasses

    table = make_table([0.0, 0.0], [4, 4], [3, 5])
    pool = Pool(toy_profile(), PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(table)
    pool.run_until(np.inf)
    led = Ledger(StepLaw.from_pool(pool), table, pool.out_tokens)
    led.consume(pool.log[0])
    with pytest.raises(ValueError, match="decode flags"):
        led.consume(dataclasses.replace(pool.log[1], decode=()))


def test_lengths_given_as_mappings_bill_like_arrays():
    table = workload(seed=2)
    _, led = drive(table, noise=True)
    _, led2 = drive(table, noise=True, mappings=True)
    assert sorted(led2.bills) == list(range(len(table)))
    assert led2.bills == pytest.approx(led.bills, rel=1e-12)
