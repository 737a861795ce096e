"""Recompute after a preemption in the replay game, and what ``commitenv attribute --replay`` reports.

The preemption case (issue 14): a small replica (toy law, KV cache of 3,200 tokens in blocks of 4, token budget
512) serves 7 requests; request 6 (740 + 331 tokens) is preempted 44 times and most of its own energy is
recompute. With its own energy summed over each coalition's replayed steps (``own_mode="replayed"``, the
default) the replay game *is* the engine's game, so its Shapley value equals the exact Shapley value of the
engine's energy enumerated over 127 engine runs; with own energy fixed at the full run's (``"fixed"``, the
paper's Eq. (6)) every recompute stays on request 6 in every coalition and the shares are far off.

The report: on a sparse run (no step holds two requests, no request waits) the correction says "nothing to
correct" and keeps the closed form; on a run with bursts it counts the windows whose steps hold more than one
request and states the L1 with "exact" when every such window was enumerated and a standard error when sampled.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.profiles import COLOCATE, toy_profile

import commitenv.attribution.windows as windows
from commitenv.attribution import (
    PoolAttributor,
    ReplayGame,
    StepLaw,
    closed_form_for,
    decompose,
    exact_shapley,
    l1_distance,
    shapley_from_values,
)
from commitenv.attribution.windows import replay_correction
from commitenv.cli import main
from commitenv.evaluation import evaluate
from commitenv.sim import EngineOptions, Instance, NoiseSpec, Pool, PoolLayout
from commitenv.workload.table import make_table
from helpers.scenarios import write_scenario, write_trace

# the preemption case (docs/results/attribution-replay.md)
ARR = [0.019, 0.052, 0.077, 0.115, 0.124, 0.127, 0.143]
PROMPT = [629, 458, 64, 264, 383, 472, 740]
OUT = [553, 262, 648, 325, 263, 42, 331]
TIGHT = dict(token_budget=512, max_seqs=16, context_limit=2048, block_size=4, kv_capacity_tokens=3200)


def engine_energy(table, prof) -> float:
    pool = Pool(prof, PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(table)
    pool.run_until(np.inf)
    return sum(e.energy_j for e in pool.log)


@pytest.fixture(scope="module")
def tight():
    prof = toy_profile(scheduler=TIGHT)
    table = make_table(ARR, PROMPT, OUT)
    pool = Pool(prof, PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(table)
    pool.run_until(np.inf)
    n = len(table)
    values = np.zeros(1 << n)
    for mask in range(1, 1 << n):  # the engine's own energy of every coalition, served alone (noise off)
        values[mask] = engine_energy(table.take(np.array([i for i in range(n) if mask >> i & 1])), prof)
    return prof, table, pool, shapley_from_values(values)


def test_the_preemption_case_preempts_one_request_44_times(tight):
    prof, table, pool, exact = tight
    assert pool.preemptions.tolist() == [0, 0, 0, 0, 0, 0, 44]
    recompute = ReplayGame(table, prof).recompute_j()
    assert recompute[:6] == pytest.approx(np.zeros(6), abs=1e-9)
    own6 = decompose(pool.log, table, StepLaw.from_profiles(prof), players=range(7)).own_per_player()[6]
    assert 0.5 * own6 < recompute[6] < own6  # most of request 6's own energy is recompute
    assert exact.sum() == pytest.approx(sum(e.energy_j for e in pool.log), rel=1e-12)


def test_replayed_own_energy_is_the_engines_shapley_value_and_fixed_is_not(tight):
    prof, table, pool, exact = tight
    game = ReplayGame(table, prof)
    assert game.own_mode == "replayed"  # the default
    replayed = exact_shapley(game)
    np.testing.assert_allclose(replayed, exact, rtol=0, atol=1e-9)
    fixed = exact_shapley(ReplayGame(table, prof, own_mode="fixed"))
    assert l1_distance(fixed, exact) > 0.5
    assert fixed[6] > 2 * exact[6]  # the preempted request keeps its recompute
    # the closed form on the logged run charges it the same way
    cf = closed_form_for(pool.log, table, StepLaw.from_profiles(prof)).shares
    assert l1_distance(cf, exact) > 0.5


def test_replayed_own_fast_path_equals_the_decomposed_replay(tight):
    prof, table, _, _ = tight
    fast = ReplayGame(table, prof)
    slow = ReplayGame(table, prof)
    slow._nominal = None  # always decompose the replayed log
    rng = np.random.default_rng(0)
    for mask in [1, 2, 64, 0b0111111, 127, *rng.integers(1, 128, 12).tolist()]:
        assert fast.value(int(mask)) == pytest.approx(slow.value(int(mask)), rel=1e-12, abs=1e-9)


def test_window_correction_takes_the_own_mode(tight):
    prof, table, pool, exact = tight
    bills = closed_form_for(pool.log, table, StepLaw.from_profiles(prof)).shares
    kw = dict(finish_s=pool.finish_t, window=7, n_pairs=10)
    fair = replay_correction(table, bills, prof, pool.replica_of, **kw)
    paper = replay_correction(table, bills, prof, pool.replica_of, own_mode="fixed", **kw)
    assert fair.own_mode == "replayed" and paper.own_mode == "fixed"
    assert fair.status == "exact" and fair.windows_shared == 1 and fair.exact_windows == 1
    np.testing.assert_allclose(fair.shares, exact * bills.sum() / exact.sum(), rtol=1e-9)
    assert l1_distance(paper.shares, fair.shares) > 0.5
    assert fair.l1_correction == pytest.approx(l1_distance(cf_law(pool, table, prof), exact), rel=1e-9)
    with pytest.raises(ValueError, match="own_mode"):
        replay_correction(table, bills, prof, pool.replica_of, own_mode="mine", **kw)


def metered_busy_j(table, prof, layout) -> float:
    """The GPU meters' busy energy of serving ``table`` alone, as `PoolAttributor` splits it (noise off)."""
    pool = Pool(prof, layout, EngineOptions(noise=NoiseSpec(0, 0)))
    pool.attach(table)
    att = PoolAttributor(pool)
    pool.run_until(100.0)
    pool.settle(100.0)
    assert pool.live == 0
    return att.close(100.0).busy_j


def test_colocated_instances_count_the_floor_once():
    # two 0.5-share instances on one GPU: overlapping steps each include the GPU's idle floor, the meter counts it
    # once; the replay game is the metered busy energy, so its Shapley value is exact there too
    prof = toy_profile(scheduler=COLOCATE)
    layout = PoolLayout(((Instance(0, 0.5), Instance(0, 0.5)),))
    table = make_table([0.0, 0.002, 0.01, 0.03, 0.05], [8, 5, 12, 3, 9], [6, 9, 4, 7, 5])
    n = len(table)
    values = np.zeros(1 << n)
    for mask in range(1, 1 << n):
        values[mask] = metered_busy_j(table.take(np.array([i for i in range(n) if mask >> i & 1])), prof, layout)
    game = ReplayGame(table, prof, layout)
    assert game.value((1 << n) - 1) == pytest.approx(values[-1], rel=1e-12)
    np.testing.assert_allclose(exact_shapley(game), shapley_from_values(values), rtol=0, atol=1e-9)


def cf_law(pool, table, prof):
    return closed_form_for(pool.log, table, StepLaw.from_profiles(prof), scale="none").shares


# ------------------------------------------------------------------------------------------ the report
def sparse_table():
    """Requests far apart on one replica: each one runs alone, so nothing interacts."""
    return make_table([0.0, 5.0, 9.0, 20.0, 31.0], [4, 9, 3, 12, 6], [3, 5, 2, 4, 6])


def test_nothing_to_correct_without_interaction():
    prof = toy_profile()
    table = sparse_table()
    pool = Pool(prof, PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(table)
    pool.run_until(np.inf)
    assert all(len(e.slots) == 1 for e in pool.log)
    bills = closed_form_for(pool.log, table, StepLaw.from_profiles(prof)).shares
    # judged by the run: every request ran alone, so the bills are kept and nothing is replayed
    wc = replay_correction(table, bills, prof, pool.replica_of, finish_s=pool.finish_t, window=2, n_pairs=2)
    assert wc.status == "nothing to correct" and wc.windows_played == 0 and wc.windows == wc.windows_alone == 3
    assert wc.replays == 0 and wc.l1_correction == 0.0 and wc.l1 == 0.0 and np.all(wc.se == 0)
    assert np.array_equal(wc.shares, bills)
    assert "nothing to correct" in wc.summary() and "replay_j = total_j" in wc.summary()
    d = wc.as_dict()
    assert d["status"] == "nothing to correct" and d["l1_se"] is None and d["windows_shared"] == 0
    # without completion times: judged by the replay, which serves no coalition either
    wc = replay_correction(table, bills, prof, pool.replica_of, window=2, n_pairs=2)
    assert wc.status == "nothing to correct" and wc.windows_alone == 0 and wc.replays == 0
    np.testing.assert_allclose(wc.shares, bills, rtol=1e-12)  # noise off: the replay's closed form is the bill
    assert "+-" not in wc.summary()


def test_a_queued_request_is_played_even_without_a_shared_step():
    # one sequence at a time: B waits for A, so removing A moves B (and nothing shares a step)
    prof = toy_profile(scheduler=dict(max_seqs=1))
    table = make_table([0.0, 0.001, 5.0], [4, 4, 4], [3, 3, 3])
    pool = Pool(prof, PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(table)
    pool.run_until(np.inf)
    bills = closed_form_for(pool.log, table, StepLaw.from_profiles(prof)).shares
    wc = replay_correction(table, bills, prof, pool.replica_of, window=3, n_pairs=2)
    assert (wc.windows_shared, wc.windows_queued, wc.status) == (0, 1, "exact")
    assert wc.l1_correction == pytest.approx(0.0, abs=1e-12)  # no step is ever shared: additive after all


# ------------------------------------------------------------------------------------------ the CLI
def sparse_scenario(folder):
    rng = np.random.default_rng(3)
    t = np.concatenate([[0.0], np.sort(rng.uniform(10.0, 3500.0, 29))])
    t = t[np.concatenate([[True], np.diff(t) > 2.0])]  # a request takes well under a second alone
    trace = write_trace(folder / "sparse.csv", t, rng.integers(4, 24, len(t)), rng.integers(2, 20, len(t)))
    return write_scenario(folder, "toy-sparse", workload={"trace": str(trace)}, horizon_hours=1,
                          commitment={"mj": [0.2]})


def burst_scenario(folder):
    rng = np.random.default_rng(5)
    t = np.sort(np.concatenate([[0.0], np.repeat([300.0, 1200.0, 2500.0], 6) + rng.uniform(0, 0.02, 18),
                                rng.uniform(10.0, 3500.0, 12)]))
    trace = write_trace(folder / "burst.csv", t, rng.integers(4, 24, len(t)), rng.integers(2, 20, len(t)))
    return write_scenario(folder, "toy-burst", workload={"trace": str(trace)}, horizon_hours=1,
                          commitment={"mj": [0.2]})


def attribute(out, capsys, *args):
    assert main(["attribute", str(out), "--replay", "--quiet", *args]) == 0
    lines = capsys.readouterr()[0].strip().splitlines()
    return json.loads(lines[-1])["replay"], next(x for x in lines if x.startswith("replay correction"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("replay-report")
    out = {}
    for name, make in (("sparse", sparse_scenario), ("burst", burst_scenario)):
        out[name] = d / f"run-{name}"
        evaluate("vllm", str(make(d)), seed=0).write(out[name], figure=False, requests=False)
    return out


def test_cli_says_nothing_to_correct_on_a_run_without_sharing(runs, capsys):
    rep, line = attribute(runs["sparse"], capsys, "--pairs", "2")
    assert rep["status"] == "nothing to correct" and rep["windows_shared"] == 0 and rep["windows_played"] == 0
    assert rep["replays"] == 0 and rep["l1_correction"] == 0.0 and rep["l1_se"] is None
    assert rep["windows_alone"] == rep["windows"] and rep["l1_vs_closed_form"] == 0.0
    assert "nothing to correct" in line and "replay_j = total_j" in line and "+-" not in line


def test_cli_counts_shared_windows_and_states_exact_or_a_standard_error(runs, capsys):
    rep, line = attribute(runs["burst"], capsys, "--pairs", "2", "--window", "3")
    assert rep["status"] == "exact" and rep["windows_shared"] >= 3 and rep["sampled_windows"] == 0
    assert rep["exact_windows"] == rep["windows_played"] and rep["l1_se"] is None
    assert f"{rep['windows_shared']} with a step holding more than one request" in line
    assert "exact" in line and "+-" not in line
    rep, line = attribute(runs["burst"], capsys, "--pairs", "2", "--window", "8")
    assert rep["status"] == "sampled" and rep["sampled_windows"] >= 1
    assert rep["l1_se"] > 0 and rep["l1_correction_se"] > 0
    assert f"+- {100 * rep['l1_correction_se']:.3f} % (standard error" in line


def test_cli_replay_own_flag_reaches_the_game(runs, capsys, monkeypatch):
    seen = []

    class Spy(windows.ReplayGame):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            seen.append(self.own_mode)

    monkeypatch.setattr(windows, "ReplayGame", Spy)
    rep, line = attribute(runs["burst"], capsys, "--pairs", "2", "--window", "3", "--replay-own", "fixed")
    assert rep["own"] == "fixed" and "(fixed own energy)" in line and set(seen) == {"fixed"}
    seen.clear()
    rep, _ = attribute(runs["burst"], capsys, "--pairs", "2", "--window", "3")
    assert rep["own"] == "replayed" and set(seen) == {"replayed"}
    with pytest.raises(SystemExit):
        main(["attribute", str(runs["burst"]), "--replay", "--replay-own", "mine"])
    assert "invalid choice" in capsys.readouterr()[1]
