"""A site router: one stream of arrivals split between pools serving the same model. Its pools together serve every
request of the route exactly once, in the split's proportions, drawn alike in every process; routed pools' commitments
come from their share of the route's reference run; bad routes are refused naming the route and the field."""

from __future__ import annotations

import math

import numpy as np
import pytest

from commitenv.envs import CommitServeEnv
from commitenv.scenarios import load_scenario, scenario_workload
from commitenv.scenarios.build import reference_workload
from commitenv.scenarios.schema import ScenarioError
from commitenv.site import SiteEnv, SiteError, load_site
from commitenv.site.pools import PoolGroup
from commitenv.workload import load_trace
from helpers.scenarios import write_scenario
from helpers.sites import write_site


def routed(folder, toy, split: dict[str, float], **fields):
    """Pools a, b (and c when the split names it) of the toy scenario, fed by one route of the toy trace."""
    trace = str(toy.parent / "toy3.csv")
    pools = [{"name": n, "scenario": str(toy)} for n in ("a", "b", "c")]
    route = {"name": "r", "workload": {"trace": trace}, "split": split}
    return write_site(folder, pools, routes=[route], **fields)


def rows(table) -> set[tuple]:
    return set(zip(table.arrival_s.tolist(), table.prompt_tokens.tolist(), table.output_tokens.tolist()))


def test_the_routes_pools_serve_every_request_once(tmp_path, toy):
    site = load_site(routed(tmp_path, toy, {"a": 0.3, "b": 0.7}))
    assert [p.route for p in site.pools] == ["r", "r", None]
    env = SiteEnv(site)
    env.reset(seed=4)
    whole = load_trace(toy.parent / "toy3.csv")
    ta, tb, tc = (env.envs[n].table for n in "abc")
    assert len(ta) + len(tb) == len(whole) == len(tc)  # c serves its own workload: the same trace, whole
    assert rows(ta) | rows(tb) == rows(whole) and not rows(ta) & rows(tb)
    for t in (ta, tb):
        assert np.all(np.diff(t.arrival_s) >= 0)
    # the shares of the toy trace's 301 requests: 0.3 within 4 standard deviations of the binomial
    n = len(whole)
    assert abs(len(ta) / n - 0.3) < 4 * math.sqrt(0.3 * 0.7 / n)


def test_a_large_route_keeps_its_split_and_every_process_draws_it_alike(tmp_path):
    site = load_site(variant(tmp_path, "fixed"))
    assert site.spec.routes[0].split == {"h200": 0.5, "h20": 0.5}
    env = SiteEnv(site)
    env.reset(seed=9)
    a, b = (env.envs[n].table for n in ("h200", "h20"))
    n = len(a) + len(b)
    assert n > 30_000 and abs(len(a) / n - 0.5) < 4 * math.sqrt(0.25 / n)
    # the whole stream is the route's workload (coding hour 12 at rate x 2): twice one pool's mean hour, within the
    # rate spread of 10 %
    one = len(scenario_workload(load_scenario("bench-h200-hour-fixed-a30"), 9))
    assert 2 * one * 0.85 < n < 2 * one * 1.15
    # a pool group (what a Ray actor runs) holding only pool h20 draws the same share: no trace crosses processes
    group = PoolGroup(site, [1], ["vllm"])
    group.reset(9)
    assert np.array_equal(group.envs[0].table.arrival_s, b.arrival_s)
    env.reset(seed=10)
    assert not np.array_equal(env.envs["h20"].table.arrival_s[:50], b.arrival_s[:50])


def test_a_routed_pools_commitment_is_from_its_share_of_the_routes_reference(tmp_path):
    site = load_site("site-routed-hour")
    shares = [reference_workload(p.scenario, 0) for p in site.pools]
    plain = site.pools[0].scenario
    whole = reference_workload(plain.model_copy(update={"workload": plain.workload.model_copy(update={"route": None})}), 0)
    assert rows(shares[0]) | rows(shares[1]) == rows(whole) and not rows(shares[0]) & rows(shares[1])
    alone = load_site("site-4pool-hour").commit_j[0] / 2  # one H200 and one H20 pool, each on the whole hour
    # each pool committed on about half the route's rate-x2 hour: about one pool's hour each (idle floors kept)
    assert 0.9 * alone < site.commit_j[0] < 1.1 * alone


@pytest.mark.parametrize("split, route_extra, msg", [
    ({"a": 0.5, "b": 0.4}, {}, "fractions must sum to 1, got 0.9"),
    ({"a": 0.5, "z": 0.5}, {}, "unknown pool 'z'"),
    ({"a": 1.2, "b": -0.2}, {}, "expected fractions in [0, 1]"),
    ({"a": 0.5, "b": 0.5}, {"workload": {"trace": "x.csv", "bogus": 1}}, "bogus"),
])
def test_bad_routes_are_refused(tmp_path, toy, split, route_extra, msg):
    path = routed(tmp_path, toy, split)
    if route_extra:
        import yaml

        raw = yaml.safe_load(path.read_text())
        raw["routes"][0].update(route_extra)
        path.write_text(yaml.safe_dump(raw))
    with pytest.raises(SiteError, match=msg.replace("[", r"\[").replace("]", r"\]")) as e:
        load_site(path)
    assert "route" in str(e.value) and "toy-site.yaml" in str(e.value)


def test_a_pool_in_two_routes_or_serving_another_model_is_refused(tmp_path, toy):
    trace = str(toy.parent / "toy3.csv")
    pools = [{"name": n, "scenario": str(toy)} for n in ("a", "b")]
    two = [{"name": "r", "workload": {"trace": trace}, "split": {"a": 0.5, "b": 0.5}},
           {"name": "s", "workload": {"trace": trace}, "split": {"a": 1.0}}]
    with pytest.raises(SiteError, match="pool 'a' is in routes 'r' and 's'"):
        load_site(write_site(tmp_path, pools, routes=two))
    other = write_scenario(tmp_path, "h200-pool", pool={"profile": "h200-qwen3.8-27b-fp8", "gpus": 2},
                           workload={"trace": trace}, horizon_hours=3, commitment={"mj": [0.2, 0.5, 0.3]},
                           lambda_plus=3.0, lambda_minus=0.5)
    mixed = [{"name": "a", "scenario": str(toy)}, {"name": "h", "scenario": str(other)}]
    route = [{"name": "r", "workload": {"trace": trace}, "split": {"a": 0.5, "h": 0.5}}]
    with pytest.raises(SiteError, match="route 'r': its pools serve different models"):
        load_site(write_site(tmp_path, mixed, routes=route))


def test_a_route_share_in_a_scenario_is_checked(tmp_path, toy):
    trace = str(toy.parent / "toy3.csv")
    for route, msg in (({"name": "r", "split": [0.5, 0.5], "index": 2}, "workload.route.index: expected 0 .. 1"),
                       ({"name": "r", "split": [0.7, 0.7], "index": 0}, "fractions must sum to 1, got 1.4")):
        path = write_scenario(tmp_path, "share", workload={"trace": trace, "route": route}, horizon_hours=3,
                              commitment={"mj": [0.2, 0.5, 0.3]})
        with pytest.raises(ScenarioError, match=msg):
            load_scenario(path)


def test_reset_options_are_checked(toy):
    env = CommitServeEnv(load_scenario(toy))
    with pytest.raises(ValueError, match=r"unknown \['workload'\]; expected 'workload_seed' and 'stream' only"):
        env.reset(seed=1, options={"workload": 3})
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="workload_seed'\\]: expected an integer >= 0"):
            env.reset(seed=1, options={"workload_seed": bad})
    with pytest.raises(ValueError, match="stream'\\]: expected true or false"):
        env.reset(seed=1, options={"stream": 1})
    with pytest.raises(ValueError, match="without attribution"):
        CommitServeEnv(load_scenario(toy), attribution=True).reset(seed=1, options={"stream": True})


def test_a_route_may_feed_pools_expanded_from_one_entry(tmp_path, toy):
    trace = str(toy.parent / "toy3.csv")
    path = write_site(tmp_path, [{"name": "a", "scenario": str(toy), "count": 3}],
                      routes=[{"name": "r", "workload": {"trace": trace}, "split": {"a-0": 0.5, "a-2": 0.5}}])
    site = load_site(path)
    assert [(p.name, p.route) for p in site.pools] == [("a-0", "r"), ("a-1", None), ("a-2", "r")]
    env = SiteEnv(site)
    env.reset(seed=2)
    t0, t1, t2 = (env.envs[n].table for n in ("a-0", "a-1", "a-2"))
    assert rows(t0) | rows(t2) == rows(t1) and not rows(t0) & rows(t2)  # a-1 serves the whole trace alone


def test_a_route_refuses_a_shared_pool(tmp_path):
    pools = [{"name": "s", "scenario": "festina-h100-shared"}]
    route = [{"name": "r", "workload": {"builtin": "azure-conv-hour"}, "split": {"s": 1.0}}]
    with pytest.raises(SiteError, match="route 'r': pool 's' serves several models"):
        load_site(write_site(tmp_path, pools, routes=route))


# ---------------------------------------------------------------------------------------------- a router as an action
def variant(folder, control: str, base: str = "site-routed-hour"):
    """The shipped routed site with its route under ``control`` (the file's order kept: it numbers the shares)."""
    import yaml

    from commitenv.site.loader import resolve_site

    raw = yaml.safe_load(resolve_site(base)[0].read_text())
    raw["name"] = f"routed-{control}"
    raw["routes"][0]["control"] = control
    path = folder / f"routed-{control}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def action_site(folder):
    return variant(folder, "action")


def run_site(env, seed, routes=None, steps=None):
    """Returns, per pool: (requests, misses, energy J), and the rewards; ``routes(k)``: the router action of step k."""
    env.reset(seed=seed)
    rewards, done, k = [], False, 0
    while not done and (steps is None or k < steps):
        a = {n: {"active": 20 + k % 12, "clock": k % 3} for n in env.names}
        if routes is not None:
            a["routes"] = {"code": routes(k)}
        _, r, done, _, _ = env.step(a)
        rewards.append(r)
        k += 1
    return {n: (len(e.table), e.misses, e.pool.energy_j()) for n, e in env.envs.items()}, rewards


def test_a_router_at_the_files_split_runs_exactly_as_the_fixed_route(tmp_path):
    fixed = SiteEnv(load_site(variant(tmp_path, "fixed")))
    routed = SiteEnv(load_site(action_site(tmp_path)))
    assert routed.action_space["routes"]["code"].shape == (2,)
    # weights (0.5, 0.5) and all-zero weights (the file's split) alternate: the same split every interval
    half = lambda k: np.array([0.0, 0.0] if k % 2 else [0.5, 0.5], np.float32)  # noqa: E731
    a, ra = run_site(fixed, 5)
    b, rb = run_site(routed, 5, half)
    assert a == b and ra == rb  # bit for bit: the pools took their shares interval by interval


def test_the_router_sends_each_interval_where_its_action_says(tmp_path):
    env = SiteEnv(load_site(action_site(tmp_path)))
    to_h200 = lambda k: np.array([1.0, 0.0] if k % 3 == 0 else [0.0, 1.0], np.float32)  # noqa: E731
    run_site(env, 6, to_h200, steps=12)
    whole = env.routers[0].table
    h200, h20 = env.envs["h200"].table, env.envs["h20"].table
    k_of = lambda t: (t // 60.0).astype(int)  # noqa: E731
    assert np.all(k_of(h200.arrival_s) % 3 == 0) and np.all(k_of(h20.arrival_s) % 3 != 0)
    # every request of the first 12 intervals handed out exactly once, none later
    first = whole.arrival_s < 12 * 60.0
    assert len(h200) + len(h20) == int(first.sum())
    assert rows(h200) | rows(h20) == rows(select_first(whole, int(first.sum())))


def select_first(table, n):
    from commitenv.workload import select_rows

    return select_rows(table, np.arange(n))


def test_bad_router_actions_are_refused_and_change_nothing(tmp_path):
    env = SiteEnv(load_site(action_site(tmp_path)))
    env.reset(seed=1)
    pools = {n: {"active": 32, "clock": 0} for n in env.names}
    for routes, msg in (({"code": [1.5, 0.0]}, "expected 2 weights in \\[0, 1\\]"),
                        ({"code": [0.5]}, "expected 2 weights"),
                        ({"code": [float("nan"), 0.5]}, "expected 2 weights"),
                        ({"other": [0.5, 0.5]}, "with keys \\['code'\\]")):
        with pytest.raises(ValueError, match=msg):
            env.step({**pools, "routes": routes})
    with pytest.raises(ValueError, match="missing: \\['routes'\\]"):
        env.step(pools)
    assert env.k == 0 and all(len(e.table) == 0 for e in env.envs.values())


def test_the_router_site_passes_gymnasiums_checker(tmp_path, toy):
    from gymnasium.utils.env_checker import check_env

    trace = str(toy.parent / "toy3.csv")
    path = write_site(tmp_path, [{"name": n, "scenario": str(toy)} for n in ("a", "b")],
                      routes=[{"name": "r", "workload": {"trace": trace}, "split": {"a": 0.3, "b": 0.7},
                               "control": "action"}])
    check_env(SiteEnv(load_site(path)), skip_render_check=True)


def test_a_pool_may_not_be_named_routes(tmp_path, toy):
    trace = str(toy.parent / "toy3.csv")
    path = write_site(tmp_path, [{"name": n, "scenario": str(toy)} for n in ("routes", "b")],
                      routes=[{"name": "r", "workload": {"trace": trace}, "split": {"routes": 0.5, "b": 0.5}}])
    with pytest.raises(SiteError, match="'routes' names the routers' part"):
        load_site(path)


def test_the_runner_routes_with_a_policy(tmp_path):
    from commitenv.site.runner import run_site_episode

    fixed = run_site_episode(load_site(variant(tmp_path, "fixed")), "vllm", 2)
    at_split = run_site_episode(load_site("site-routed-hour"), "vllm", 2)  # control: action, router fixed
    assert at_split.summary["cost_kwh_eq"] == fixed.summary["cost_kwh_eq"]
    assert at_split.summary["route_splits"] == {"code": [0.5, 0.5]}
    assert {n: p["requests"] for n, p in at_split.pools.items()} == {n: p["requests"] for n, p in fixed.pools.items()}
    moved = run_site_episode(load_site("site-routed-hour"), "vllm", 2, router="efficient")
    # the H200 pool draws less energy per request than the H20 pool (docs/results/site.md): the router moves load to it
    assert moved.summary["route_splits"]["code"][0] > 0.6
    assert moved.pools["h200"]["requests"] > 1.1 * fixed.pools["h200"]["requests"]
    assert moved.summary["requests"] == fixed.summary["requests"]  # every request of the route served once
    with pytest.raises(ValueError, match="router: expected one of \\['efficient', 'fixed'\\]"):
        run_site_episode(load_site("site-routed-hour"), "vllm", 2, router="smart")


def test_a_replayed_routing_hands_each_pool_the_same_requests(tmp_path):
    from commitenv.site.runner import run_site_episode, site_gates

    moved = run_site_episode(load_site("site-routed-hour"), "vllm", 4, router="efficient")
    again = run_site_episode(load_site("site-routed-hour"), "vllm", 4, replay_splits=moved.splits)
    assert len(moved.splits["code"]) == 60 and again.summary["cost_kwh_eq"] == moved.summary["cost_kwh_eq"]
    for n in ("h200", "h20"):
        assert again.pools[n]["slo_arrivals_by_hour"] == moved.pools[n]["slo_arrivals_by_hour"]
    assert site_gates(moved, again)["passed"]  # (the relative H20 gate needs the same arrivals: it compares them)
