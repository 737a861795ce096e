"""Shared pools (several models on the GPUs, Festina's setting): the scenario format and its errors, tenants drawn
from a mix and served by their own model only, the env's per-model active counts, per-GPU clocks and per-replica
SM shares, and the per-model latency attainment."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from helpers.scenarios import shared_scenario

from commitenv.sim.devices import device_state
from commitenv.envs import CommitServeEnv
from commitenv.evaluation import run_episode
from commitenv.scenarios import ScenarioError, load_scenario, scenario_layout, scenario_workload


@pytest.mark.parametrize("edit, says", [
    (lambda r: r["pool"].update(profile="x"), "exactly one of 'profile'"),
    (lambda r: r["pool"]["placement"].pop(), "expected 3 GPUs"),
    (lambda r: r["pool"]["placement"][1].append({"model": "huge", "share": 0.1}), "unknown model 'huge'"),
    (lambda r: r["pool"]["placement"][0][0].update(share=0.7), "sum to 1.2 > 1"),
    (lambda r: r["pool"].update(placement=[[{"model": "small"}]] * 3), "model(s) ['big'] have no instance"),
    (lambda r: r["workload"].update(tenant_mix={"s": 0.5, "x": 0.5}), "tenant(s) ['x'] are served by no model"),
    (lambda r: r["workload"].update(tenant_mix={"s": 0.5, "b": 0.4}), "must sum to 1"),
    (lambda r: r["workload"].pop("tenant_mix"), "needs the workload's tenants"),
])
def test_bad_shared_scenarios_are_refused_naming_the_field(tmp_path, edit, says):
    path = shared_scenario(tmp_path)
    raw = yaml.safe_load(path.read_text())
    edit(raw)
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ScenarioError, match=says.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        load_scenario(path)


def test_profiles_of_different_gpus_cannot_share_a_pool(tmp_path):
    path = shared_scenario(tmp_path)
    raw = yaml.safe_load(path.read_text())
    other = yaml.safe_load(Path(raw["pool"]["models"][1]["profile"]).read_text())
    other["clocks"] = other["clocks"][1:]
    other["name"] = "toy-one-clock"
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(other))
    raw["pool"]["models"][1]["profile"] = str(tmp_path / "one.yaml")
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ScenarioError, match="different clock levels"):
        load_scenario(path)


def test_layout_and_tenant_mix(tmp_path):
    sc = load_scenario(shared_scenario(tmp_path))
    lay = scenario_layout(sc)
    assert [[(i.model, i.share) for i in g] for g in lay.gpus] == [[(0, 0.5), (1, 0.5)], [(0, 1.0)], [(1, 0.6), (0, 0.4)]]
    t1, t2 = scenario_workload(sc, 0), scenario_workload(sc, 0)
    assert set(t1.tenant_names) == {"s", "b"} and np.array_equal(t1.tenant, t2.tenant)  # seeded
    frac = np.mean(t1.tenant == t1.tenant_names.index("b"))
    assert abs(frac - 0.3) < 4 * np.sqrt(0.3 * 0.7 / len(t1))


def test_each_tenant_is_served_by_its_own_model_and_scored_per_model(tmp_path):
    env, res = run_episode("vllm", str(shared_scenario(tmp_path)), 0)
    pool, table = env.pool, env.table
    served = pool.replica_of >= 0
    model_of_replica = device_state(pool).replica_model
    want = np.array([{"s": 0, "b": 1}[n] for n in table.tenant_names])[table.tenant]  # s -> small, b -> big
    assert np.array_equal(model_of_replica[pool.replica_of[served]], want[served])
    assert np.array_equal(pool.model_of, want)
    by = res.summary["latency_by_model"]
    assert set(by) == {"small", "big"} and by["small"]["requests"] + by["big"]["requests"] == len(table)
    assert res.summary["requests"] == len(table) and env.n_replicas == 5 and env.n_gpus == 3


def test_per_model_active_per_gpu_clocks_and_shares_reach_the_engine(tmp_path):
    env = CommitServeEnv(str(shared_scenario(tmp_path)))
    env.reset(seed=0)
    assert env.action_space["active"].nvec.tolist() == [3, 2]
    sample = env.action_space.sample()
    # the space's own form (share weights, GPU requests: every point legal); exact "shares" are taken as well
    assert set(sample) == {"active", "clock", "clocks", "share_weights", "gpu_request", "migrate"}
    # small: 3 instances (GPU 0, 1, 2), big: 2 (GPU 0, 2); replicas in placement order: s0 b0 | s1 | b2 s2
    env.step({"active": [2, 1], "clock": 1, "clocks": [0, 1, 1], "shares": [0.3, 0.7, 1.0, 0.5, 0.5]})
    d = device_state(env.pool)
    assert d.gpu_clock_idx.tolist() == [0, 1, 1]
    assert d.replica_share.tolist() == [0.3, 0.7, 1.0, 0.5, 0.5]
    states = d.replica_state.tolist()
    from commitenv.sim.states import ACTIVE, STANDBY

    assert states[4] != ACTIVE and states[3] != ACTIVE  # small's 3rd instance and big's 2nd are off
    assert states[0] == states[1] == states[2] == ACTIVE and STANDBY is not None
    info = env._info(0.0, new_misses=0)
    assert info["active_by_model"] == [2, 1] and info["clocks_mhz"] == [500, 1000, 1000]
    with pytest.raises(ValueError, match="GPU 0 would get 1.200 > 1"):
        env.step({"active": [2, 1], "clock": 1, "shares": [0.6, 0.6, 1.0, 0.5, 0.5]})
    with pytest.raises(ValueError, match=r"active'\]\[1\]: expected 1..2"):
        env.step({"active": [2, 3], "clock": 1})


def test_the_controller_context_builds_shared_actions(tmp_path):
    from commitenv.control import ControllerContext

    env = CommitServeEnv(str(shared_scenario(tmp_path)))
    env.reset(seed=0)
    ctx = ControllerContext.from_env(env)
    assert ctx.shared and ctx.models == ("small", "big") and ctx.all_active == (3, 2)
    assert ctx.placement == (((0, 0.5), (1, 0.5)), ((0, 1.0),), ((1, 0.6), (0, 0.4)))
    act = ctx.action((1, 2), 1000, clocks_mhz=[500, 500, 1000])
    assert act == {"active": [1, 2], "clock": 1, "clocks": [0, 0, 1]}
    env.step(act)
    with pytest.raises(ValueError, match="one active count per model"):
        ctx.action(3, 1000)


def test_decisions_csv_of_a_shared_pool_has_the_per_model_columns(tmp_path):
    import csv

    from commitenv.evaluation import evaluate

    res = evaluate("festina", str(shared_scenario(tmp_path)), 0)
    res.write(tmp_path / "out", figure=False)
    rows = list(csv.DictReader((tmp_path / "out" / "decisions.csv").open()))
    assert set(rows[0]) >= {"active", "active_by_model", "clocks_mhz", "shares"}
    for r in rows:
        by = [int(x) for x in r["active_by_model"].split()]
        assert int(r["active"]) == sum(by) and len(by) == 2
        assert len(r["shares"].split()) == 5 and r["clocks_mhz"] == ""  # festina sets shares, not per-GPU clocks
    assert res.summary["requests"] > 0


# ------------------------------------------------------------------------------------------ ePACT on a shared pool


def test_spread_active_by_hand(tmp_path):
    from commitenv.control import ControllerContext

    env = CommitServeEnv(str(shared_scenario(tmp_path)))
    env.reset(seed=0)
    ctx = ControllerContext.from_env(env)  # small: 3 instances, big: 2
    # one each, the rest in proportion to (2, 1) other instances, largest remainder first
    assert [ctx.spread_active(n) for n in (2, 3, 4, 5)] == [(1, 1), (2, 1), (2, 2), (3, 2)]
    with pytest.raises(ValueError, match="expected a total in 2..5"):
        ctx.spread_active(1)
    assert ctx.model_tenants == (("s",), ("b",))
    assert ctx.model_of_tenants(("b", "x", "s")).tolist() == [1, -1, 0]


def test_a_shared_what_if_replays_each_arrival_to_its_tenants_model(tmp_path):
    from commitenv.sim.lref import reference_latency
    from commitenv.sim.whatif import observed_arrivals

    env = CommitServeEnv(str(shared_scenario(tmp_path)))
    env.reset(seed=0)
    env.step({"active": [3, 2], "clock": 1})
    pool = env.pool
    replay = observed_arrivals(pool, 600.0)
    snap = env.snapshot()
    copy = snap._engine.clone(hide_lengths=False)
    copy.attach_replay(replay)
    big = replay.tenant == replay.tenant_names.index("b")
    assert big.any() and (~big).any()
    assert [m for m in copy._model] == big.astype(int).tolist()  # tenant b -> model 1 ("big")
    i = int(np.flatnonzero(big)[0])
    want = replay.arrival_s[i] + env.scenario.alpha * reference_latency(
        env.profiles[1], replay.prompt_tokens[i:i + 1], replay.output_tokens[i:i + 1])[0]
    assert copy._deadline[i] == pytest.approx(want, rel=1e-12)
    res = snap.simulate((1, 1), 1000, 600.0, replay, track_arrivals=True)
    assert res.forecast_n == int((~copy.rejected).sum()) and res.complete
    with pytest.raises(ValueError, match="one active count per model"):
        snap.simulate(2, 1000, 600.0)


def test_epact_runs_a_shared_pool_with_spread_counts(tmp_path):
    from commitenv.evaluation import run_episode

    env, res = run_episode("epact", str(shared_scenario(tmp_path)), 0, controller_kwargs={"workers": 0})
    by = [tuple(int(x) for x in d["active_by_model"].split()) for d in res.decisions]
    assert len(by) == 6 and all(1 <= a <= 3 and 1 <= b <= 2 for a, b in by)
    # every decision is the spread of its own total (the catalog's pool-wide count)
    from commitenv.control import ControllerContext

    ctx = ControllerContext.from_env(env)
    assert all(ctx.spread_active(a + b) == (a, b) for a, b in by)
    assert res.summary["requests"] > 0 and res.summary["energy_mj"] > 0


def test_a_shared_pools_reference_run_is_its_full_capacity_vllm_hour(tmp_path):
    from commitenv.evaluation import run_episode
    from commitenv.scenarios import load_scenario
    from commitenv.scenarios.commitments import commitments_mj

    path = shared_scenario(tmp_path, name="toy-shared-ref", commitment={"fractions": [0.8], "reference": {}},
                           noise={"time_sigma": 0.0, "energy_sigma": 0.0})
    raw = yaml.safe_load(path.read_text())
    raw["workload"]["seed"] = 0  # the episode serves the reference's own workload (trace, tenants drawn with seed 0)
    path.write_text(yaml.safe_dump(raw))
    c = commitments_mj(load_scenario(str(path)), use_cache=False)
    env, res = run_episode("vllm", str(path), 0)  # every instance at its placed share, the reference clock
    assert c[0] == pytest.approx(0.8 * env.hour_energy_j[0] / 1e6, rel=1e-9)


def test_fixed_config_spreads_its_count_over_the_models(tmp_path):
    # 5 instances (3 small, 2 big): round(28/32 x 5) = 4 active; one per model, the 2 left in proportion to the
    # others (2 : 1 -> 1.33, 0.67; the larger remainder takes the last one): 2 small, 2 big, all hour long
    env, _ = run_episode("fixed_config", str(shared_scenario(tmp_path)), 0)
    assert env.shared_cfg.active == (2, 2)
    assert [env.pool.active_count(m) for m in range(2)] == [2, 2]


def test_the_shared_flat_action_maps_counts_and_clocks_by_hand(tmp_path):
    from commitenv.envs import CommitServeEnv, SharedFlatActionWrapper

    env = SharedFlatActionWrapper(CommitServeEnv(str(shared_scenario(tmp_path))), shares=False)  # (counts, clocks)
    assert env.action_space.nvec.tolist() == [3, 2, 2, 2, 2]  # 3 small, 2 big instances; 2 clock levels x 3 GPUs
    act = env.action(np.array([1, 0, 1, 0, 1]))
    assert act["active"].tolist() == [2, 1] and act["clock"] == 1 and act["clocks"].tolist() == [1, 0, 1]
    assert env.reverse_action(act).tolist() == [1, 0, 1, 0, 1]
    with pytest.raises(ValueError, match="element 1 is 2, expected 0..1"):
        env.action(np.array([0, 2, 0, 0, 0]))
    env.reset(seed=0)
    for _ in range(3):  # every draw is a valid action, and it is the configuration the env runs next
        a = env.action_space.sample()
        env.step(a)
        cfg = env.unwrapped.shared_cfg
        assert cfg.active == tuple(int(x) + 1 for x in a[:2]) and cfg.clocks == tuple(int(x) for x in a[2:])


def test_decisions_csv_records_the_shares_applied_from_share_weights(tmp_path):
    """A controller acting through ``share_weights`` (not explicit shares): decisions.csv records the shares the env
    applied, each GPU's summing to 1 and split by the weights above the minimums."""
    import csv

    from commitenv.control import Controller
    from commitenv.evaluation import evaluate

    class Weighted(Controller):
        name = "weighted"

        def act(self, observation, info):
            return {"active": list(self.ctx.all_active), "clock": 0, "share_weights": [0.25, 0.75, 1.0, 0.5, 0.5]}

    res = evaluate(Weighted(), str(shared_scenario(tmp_path)), 0)
    res.write(tmp_path / "out", figure=False)
    rows = list(csv.DictReader((tmp_path / "out" / "decisions.csv").open()))
    for r in rows:
        s = [float(x) for x in r["shares"].split()]  # GPU 0: replicas 0, 1; GPU 1: replica 2; GPU 2: replicas 3, 4
        assert s[0] + s[1] == pytest.approx(1.0) and s[2] == 1.0 and s[3] + s[4] == pytest.approx(1.0)
        assert s[0] < s[1] and s[3] == pytest.approx(s[4])  # weights 1 : 3 on GPU 0, equal on GPU 2
