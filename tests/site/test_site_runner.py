"""The site runner: a controller per pool, on its own commitment or on the coordinator's budget (checked by hand at
every decision), and the site's bill equal to the env stepped with the same actions."""

from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pytest

from commitenv.site import SiteEnv, load_site
from commitenv.site.runner import pool_specs, run_site_episode, site_budgets, site_gates

from helpers.sites import three_pools

RECORDER = """
import json
from commitenv.control import Controller

class Recorder(Controller):
    '''Every replica at the reference clock; appends what it sees to LOG (one JSON line per decision).'''
    def __init__(self, log):
        self.log = log
    def act(self, observation, info):
        with open(self.log, "a") as fh:
            fh.write(json.dumps({"scenario_commit": self.ctx.commitments_j[info["hour"]], "commit": info["commitment_j"],
                                 "used": info["hour_energy_j"], "target": info["target_j"], "k": info["interval"],
                                 "hour": info["hour"], "t": info["t"], "last": info["interval_energy_j"], "gpus": self.ctx.n_gpus,
                                 "obs": [float(x) for x in observation[2:6]]}) + "\\n")
        return self.ctx.action(self.ctx.n_replicas, self.ctx.reference_clock_mhz)
"""


def _recorder(tmp_path):
    f = tmp_path / "recorder.py"
    f.write_text(textwrap.dedent(RECORDER))
    return f"{f}:Recorder"


def _decisions(log, n_pools):
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    return [rows[i:i + n_pools] for i in range(0, len(rows), n_pools)]  # one decision of every pool, in pool order


def test_own_budget_shows_each_pool_its_own_commitment(tmp_path, toy):
    path = three_pools(tmp_path, toy, commitment={"mj": 0.6})
    log = tmp_path / "own.jsonl"
    run_site_episode(path, _recorder(tmp_path), seed=2, budget="own", controller_kwargs={"log": str(log)})
    for step in _decisions(log, 3):
        for row in step:
            assert row["commit"] == row["scenario_commit"]


def test_site_budget_splits_the_sites_remaining_commitment_by_what_each_pool_had_left(tmp_path, toy):
    site = load_site(three_pools(tmp_path, toy, commitment={"mj": 0.6}))
    log = tmp_path / "site.jsonl"
    run_site_episode(site, _recorder(tmp_path), seed=2, budget="site", controller_kwargs={"log": str(log)})
    steps = _decisions(log, 3)
    assert len(steps) == 18
    moved = 0
    for step in steps:
        own = np.array([r["scenario_commit"] for r in step])
        used = np.array([r["used"] for r in step])
        left = np.maximum(own - used, 0.0)
        site_left = 0.6e6 - used.sum()
        w = left / left.sum() if left.sum() > 0 else np.full(3, 1 / 3)
        want = used + w * site_left
        got = np.array([r["commit"] for r in step])
        assert got == pytest.approx(want, rel=1e-12, abs=1e-6)
        assert got.sum() == pytest.approx(0.6e6, rel=1e-12)  # the budgets add up to the site's commitment
        k = step[0]["k"]
        for r in step:
            assert r["target"] == pytest.approx((r["commit"] - r["used"]) / (6 - k), rel=1e-12, abs=1e-6)
        moved += int(np.any(np.abs(got - own) > 1.0))
        for r in step:  # a policy reading the observation sees the budget too (features 2-5, by hand)
            b, u = r["commit"], r["used"]

            def soft(x):
                return x if x <= 1 else 1 + math.log(x)

            def slog(x):
                return math.copysign(math.log1p(abs(x)), x)

            e_scale = r["gpus"] * 100.0 * 3600  # the toy GPU's 100 W
            big = b if b > 0 else e_scale  # a budget <= 0 (the site already over): the energy-only regime
            d = big / 6
            want_obs = [soft(max(b, 0) / e_scale), soft(u / big), slog(r["last"] / d - 1),
                        slog((big - u) / (6 - k) / d - 1)]
            assert r["obs"] == pytest.approx(want_obs, rel=1e-5, abs=1e-6)
    assert moved >= 6  # the budgets do differ from the pools' own commitments


def test_site_run_equals_the_env_stepped_with_the_same_actions(tmp_path, toy):
    path = three_pools(tmp_path, toy)
    run = run_site_episode(path, "vllm", seed=5)
    env = SiteEnv(path)
    env.reset(seed=5)
    full = {n: {"active": e.n_replicas, "clock": e.profile.reference_clock_index} for n, e in env.envs.items()}
    ret, done = 0.0, False
    while not done:
        _, r, done, _, _ = env.step(full)
        ret += r
    assert run.summary["episode_return"] == pytest.approx(ret, rel=1e-12)
    cost = float(env.hour_cost_kwh.sum() + env.tail_cost_kwh)
    assert run.summary["cost_kwh_eq"] == pytest.approx(cost, rel=1e-12)
    assert run.summary["misses"] == env.misses
    gates = site_gates(run, run)
    assert set(gates["pools"]) == {"a", "b", "c"}
    assert gates["passed"] == all(g["passed"] for g in gates["pools"].values())


def _without_wall(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in ("wall_s", "shards", "shard_usage")}


def test_pools_sharded_on_a_local_ray_equal_the_in_process_run(tmp_path, toy):
    ray = pytest.importorskip("ray")
    # pools a and b behind a router whose policy moves the split (its shares travel to the actors with each step)
    route = {"name": "r", "workload": {"trace": str(toy.parent / "toy3.csv")}, "split": {"a": 0.4, "b": 0.6},
             "control": "action"}
    path = three_pools(tmp_path, toy, commitment={"mj": 0.6}, routes=[route])
    here = run_site_episode(path, "epact", seed=4, budget="site", router="efficient")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        there = run_site_episode(path, "epact", seed=4, budget="site", ray_address="local", shards=2,
                                 router="efficient")
    finally:
        ray.shutdown()
    assert there.summary["shards"] == 2 and there.splits == here.splits
    assert here.summary["route_splits"]["r"] != [0.4, 0.6]  # (the router did move the split)
    assert _without_wall(there.summary) == _without_wall(here.summary)
    assert there.hours == here.hours
    assert {n: _without_wall(p) for n, p in there.pools.items()} == {n: _without_wall(p) for n, p in here.pools.items()}


def test_a_ray_address_that_does_not_answer_is_an_error_not_a_hang(tmp_path, toy):
    pytest.importorskip("ray")
    import socket

    with socket.socket() as s:  # a port on this machine that nothing listens on (bound, never listening)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(ValueError, match=rf"Ray at 127.0.0.1:{port}: nothing answers"):
            run_site_episode(three_pools(tmp_path, toy), "vllm", ray_address=f"127.0.0.1:{port}", shards=2)


def test_a_controller_per_pool_pattern(tmp_path, toy):
    site = load_site(three_pools(tmp_path, toy))
    assert pool_specs(site, "vllm") == ["vllm"] * 3
    assert pool_specs(site, "epact@[ab]+vllm@c") == ["epact", "epact", "vllm"]
    with pytest.raises(ValueError, match="pool 'c' matches 0 of the patterns"):
        pool_specs(site, "epact@[ab]")
    with pytest.raises(ValueError, match="pool 'a' matches 2 of the patterns"):
        pool_specs(site, "epact@*+vllm@a")
    with pytest.raises(ValueError, match="expected SPEC@PATTERN parts"):
        pool_specs(site, "epact@a+vllm")
    run = run_site_episode(site, "epact@[ab]+vllm@c", seed=1)
    assert [run.pools[n]["controller"] for n in "abc"] == ["epact", "epact", "vllm"]


def test_the_guarded_coordinator_keeps_a_pool_near_its_gate_on_its_own_budget():
    from commitenv.site.pools import PoolReport

    def rep(own, used, miss):
        return PoolReport(0.0, used, own, 0, 3, 0, 0.0, miss, 0.01)

    reports = [rep(10, 5, 0.0), rep(20, 25, 0.004), rep(30, 10, 0.006)]  # the third at 0.6 % >= 0.5 x 1 %
    # site: 60 committed, 40 used, 20 left; own lefts 5, 0 (past its own), 20
    assert site_budgets(reports, 60.0) == pytest.approx([5 + 4, 25, 10 + 16])  # split 5 : 20 of the 20 left
    assert site_budgets(reports, 60.0, guarded=True) == pytest.approx([5, 25, 30])  # the third keeps its 20
    assert site_budgets(reports, 50.0, guarded=True) == pytest.approx([-5, 25, 30])  # the others absorb the cut
    everyone = [rep(10, 5, 0.02), rep(20, 25, 0.02)]
    assert site_budgets(everyone, 20.0, guarded=True) == pytest.approx([10, 25])  # all guarded: their own
    # a live request past its visible deadline guards a pool before any miss is known
    late = [rep(10, 5, 0.0), rep(20, 25, 0.004), PoolReport(0.0, 10, 30, 0, 3, 0, 0.0, 0.0, 0.01, 0.05)]
    assert site_budgets(late, 60.0, guarded=True) == pytest.approx([5, 25, 30])
    # proportional: the 20 left split 5 : 25 : 10 by what each has drawn, whatever its own commitment
    assert site_budgets(reports, 60.0, proportional=True) == pytest.approx([5 + 2.5, 25 + 12.5, 10 + 5])
    assert site_budgets(reports, 30.0, proportional=True) == pytest.approx([5 - 1.25, 25 - 6.25, 10 - 2.5])
    fresh = [rep(10, 0, 0.0), rep(30, 0, 0.0)]  # nothing drawn yet: the own commitments' weights (as site)
    assert site_budgets(fresh, 20.0, proportional=True) == pytest.approx(site_budgets(fresh, 20.0)) == [5, 15]


def test_a_guarded_run_counts_the_decisions_the_guard_protected(tmp_path):
    from helpers.scenarios import toy_miss
    from helpers.sites import write_site

    sc = toy_miss(tmp_path / "sc")  # bursts that one replica at the low clock misses
    site = write_site(tmp_path, [{"name": "a", "scenario": str(sc)}, {"name": "b", "scenario": str(sc)}],
                      commitment={"mj": 0.3})
    low = tmp_path / "low.py"
    low.write_text(LOW)
    log = tmp_path / "low.jsonl"
    run = run_site_episode(site, f"{low}:Low", seed=2, budget="guarded", controller_kwargs={"log": str(log)})
    seen = [json.loads(x) for x in log.read_text().splitlines()]  # pools a, b alternate, one line per decision
    eps = 0.01  # the toy scenario's epsilon (the schema's default)
    risky = [f >= 0.5 * eps or overdue > 0 for f, overdue in seen]
    want = {"a": sum(risky[0::2]), "b": sum(risky[1::2])}
    assert run.summary["guarded_decisions"] == want
    assert want["a"] > 0  # the bursts' misses do engage the guard
    assert "guarded_decisions" not in run_site_episode(site, "vllm", seed=2).summary


LOW = """
import json
from commitenv.control import Controller

class Low(Controller):
    '''One replica at the low clock; logs the miss fraction of the hour it decides in and its overdue share.'''
    def __init__(self, log):
        self.log = log
    def act(self, observation, info):
        with open(self.log, "a") as fh:
            fh.write(json.dumps([info["miss_fraction_by_hour"][info["hour"]], float(observation[12])]) + "\\n")
        return self.ctx.action(1, self.ctx.clocks_mhz[0])
"""


@pytest.mark.parametrize("extra, fragment", [
    (["--budget", "own,global"], "--budget: expected a comma-separated list of ('own', 'site', 'guarded', 'proportional')"),
    (["--shards", "2"], "--shards: only with --ray"),
    (["--controllers", "shared:/nowhere"], "no model.zip in /nowhere"),
    (["--controllers", "epact@a"], "pool 'b' matches 0 of the patterns"),
    (["--controllers", "no-such-controller"], "no-such-controller"),
    (["--router", "smart"], "--router: expected one of ['efficient', 'fixed']"),
])
def test_the_site_command_refuses_bad_options_before_any_run(tmp_path, toy, capsys, extra, fragment):
    from commitenv.cli import main

    rc = main(["site", str(three_pools(tmp_path, toy)), "--quiet", *extra])
    out, err = capsys.readouterr()
    assert rc == 2 and err.startswith("error:") and fragment in err, err
    assert "vllm" not in out  # nothing ran
