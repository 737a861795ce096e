"""Attribution in the environment, evaluation and command line: per-interval and per-hour tenant shares that add
up to the busy energy with idle energy apart, hourly cost shares (Shapley, `hour_cost_shares`) that add up to the
settlement cost, bills that add up to the run's busy energy and equal the closed form computed independently from
a ``log_steps=True`` run (two tenants sharing steps), bills.csv written by evaluation and reproduced by
``commitenv attribute``, and determinism (attribution never changes the run).

Cases run on a two-hour, two-tenant toy scenario: two BurstGPT-format traces tagged ``alpha`` and ``beta``,
merged, with bursts of both tenants just before interval and hour boundaries and at the horizon's end (so steps
are shared across tenants and in flight when periods close), a rejected request, and idle gaps.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math

import numpy as np
import pytest

from commitenv.attribution import PoolAttributor, StepLaw, decompose, hour_cost_shares
from commitenv.cli import main
from commitenv.envs import CommitServeEnv, commit_serve
from commitenv.evaluation import BILL_COLUMNS, evaluate
from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
from commitenv.workload.table import make_table
from commitenv.workload.transforms import merge, tag_tenant
from helpers.profiles import toy_profile
from helpers.episodes import run_episode, varied_policy
from helpers.scenarios import write_scenario

BOUNDARIES = (599.97, 1199.985, 3599.97, 4199.99, 7199.95)  # bursts just before interval / hour / horizon ends


def tenant_table(seed: int, name: str, *, rejected: bool = False):
    rng = np.random.default_rng(seed)
    t = np.concatenate([rng.uniform(1.0, 7100.0, 70), np.repeat(BOUNDARIES, 3), [0.0] if seed == 1 else []])
    t = np.sort(t)
    p = rng.integers(2, 30, len(t))
    o = rng.integers(1, 20, len(t))
    if rejected:
        p[5] = 70  # over the toy context limit (64)
    return tag_tenant(make_table(t, p, o), name)


def write_burstgpt(path, table) -> None:
    names = table.tenant_names
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    for a, ten, p, o in zip(table.arrival_s, table.tenant, table.prompt_tokens, table.output_tokens):
        lines.append(f"{a:.6f},{names[ten]},{p},{o},{p + o},Conversation log")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def two_tenants(tmp_path_factory):
    """Path of the two-tenant scenario (2 toy GPUs, 600 s intervals, 2 hours, absolute commitments)."""
    d = tmp_path_factory.mktemp("two-tenants")
    merged = merge(tenant_table(1, "alpha", rejected=True), tenant_table(2, "beta"))
    assert merged.tenant_names == ("alpha", "beta") and merged.arrival_s[0] == 0.0
    write_burstgpt(d / "two.csv", merged)
    return write_scenario(d, "toy-two-tenants", workload={"trace": str(d / "two.csv")}, horizon_hours=2,
                          commitment={"mj": [0.2, 0.25]}, lambda_plus=3.0, lambda_minus=0.5)


def top_clock(k):
    return {"active": 2, "clock": 1}


def attributed(path, policy, seed=0):
    env = CommitServeEnv(str(path), attribution=True)
    rewards, infos, _ = run_episode(env, policy, seed=seed)
    return env, rewards, infos


# ------------------------------------------------------------------------------------------ periods
def test_interval_shares_sum_to_busy_energy_and_idle_is_apart(two_tenants):
    env, _, infos = attributed(two_tenants, varied_policy)
    assert "attribution" not in infos[0]  # nothing closed at reset
    idle_seen = 0
    for info in infos[1:]:
        iv = info["attribution"]["interval"]
        assert iv["end_s"] - iv["start_s"] == pytest.approx(600.0)
        assert set(iv["tenant_j"]) <= {"alpha", "beta"}
        assert math.fsum(iv["tenant_j"].values()) == pytest.approx(iv["busy_j"], rel=1e-12, abs=1e-9)
        assert iv["busy_j"] + iv["idle_j"] == pytest.approx(iv["energy_j"], rel=1e-12)
        assert iv["energy_j"] == pytest.approx(info["interval_energy_j"], rel=1e-12)
        assert iv["idle_j"] >= -1e-9 and iv["busy_j"] > 0
        idle_seen += iv["idle_j"] > 0.1 * iv["energy_j"]
    assert idle_seen >= 6  # a lightly loaded toy pool is mostly idle: idle energy is not billed to requests
    # per GPU: what no step covers is metered at the floor, so idle <= floor power x time
    assert infos[1]["attribution"]["interval"]["idle_j"] <= 2 * 50.0 * 600.0 + 1e-6


def test_hour_cost_shares_sum_to_settlement_cost(two_tenants):
    env, _, infos = attributed(two_tenants, varied_policy)
    hours = [i for i in infos[1:] if "hour" in i["attribution"]]
    assert len(hours) == 2
    for k, info in enumerate(infos[1:]):
        if "hour" not in info["attribution"]:
            continue
        hr, st = info["attribution"]["hour"], info["settlement"]
        assert hr["energy_j"] == pytest.approx(st["energy_j"], rel=1e-12)
        assert hr["cost_kwh_eq"] == st["cost_kwh_eq"] > 0
        costs = math.fsum(hr["tenant_cost_kwh_eq"].values()) + hr["idle_cost_kwh_eq"]
        assert costs == pytest.approx(st["cost_kwh_eq"], rel=1e-12)
        # the Shapley split of the hour's cost game (docs/attribution-cost.md), not cost x tenant energy / energy
        ref = hour_cost_shares(hr["tenant_j"], hr["idle_j"], st["commitment_j"], env.settlement.lambda_plus,
                               env.settlement.lambda_minus)
        assert ref.exact and hr["tenant_cost_se_kwh_eq"] is None
        assert hr["idle_cost_kwh_eq"] == pytest.approx(ref.idle_kwh_eq, rel=1e-12)
        for name, c in hr["tenant_cost_kwh_eq"].items():
            assert c == pytest.approx(ref.tenant_kwh_eq[name], rel=1e-9, abs=1e-12)
        # the hour is the sum of its intervals
        ivs = [infos[j]["attribution"]["interval"] for j in range(k + 1 - 5, k + 2)]
        assert hr["start_s"] == ivs[0]["start_s"] and hr["end_s"] == ivs[-1]["end_s"]
        for name in hr["tenant_j"]:
            assert hr["tenant_j"][name] == pytest.approx(sum(i["tenant_j"].get(name, 0.0) for i in ivs), rel=1e-12)
        assert hr["busy_j"] == pytest.approx(sum(i["busy_j"] for i in ivs), rel=1e-12)


def test_bills_sum_to_the_run_busy_energy(two_tenants):
    env, _, infos = attributed(two_tenants, varied_policy)
    last = infos[-1]["attribution"]
    tail = last["tail"]
    assert tail["start_s"] == 7200.0 and tail["end_s"] > 7200.0 and tail["busy_j"] > 0  # the horizon-end burst
    busy = math.fsum(i["attribution"]["interval"]["busy_j"] for i in infos[1:]) + tail["busy_j"]
    idle = math.fsum(i["attribution"]["interval"]["idle_j"] for i in infos[1:]) + tail["idle_j"]
    bills = env.bills()
    assert bills["total_j"].sum() == pytest.approx(busy, rel=1e-12)
    assert bills["total_j"].sum() + idle == pytest.approx(env.pool.energy_j(), rel=1e-12)
    np.testing.assert_allclose(bills["own_j"] + bills["shared_j"], bills["total_j"], rtol=1e-15)
    served = env.pool.replica_of >= 0
    assert np.all(bills["total_j"][served] > 0) and np.all(bills["total_j"][~served] == 0) and (~served).sum() == 1


def test_two_tenants_match_the_closed_form_of_a_logged_run(two_tenants, monkeypatch):
    """Bills and per-interval tenant shares equal Proposition 5.1 applied independently to the step log of the
    same run with ``log_steps=True`` (prompt walking, no decode flags; boundary steps split linearly in time)."""
    orig = commit_serve.engine_options
    monkeypatch.setattr(commit_serve, "engine_options",
                        lambda sc, seed: dataclasses.replace(orig(sc, seed), log_steps=True))
    env, _, infos = attributed(two_tenants, top_clock, seed=3)
    pool, table = env.pool, env.table
    log = pool.log
    assert log and all(e.clock_mhz == 1000 for e in log)
    # the tenants really share steps
    ten = table.tenant
    assert sum(1 for e in log if len({int(ten[s]) for s in e.slots}) == 2) > 5
    n = len(table)
    st = decompose(log, table.prompt_tokens, StepLaw.from_pool(pool), players=range(n))
    f = st.scale("step")
    ent = st.entry_of
    part = f[ent] * (st.own_law + (st.shared_law / st.m)[ent])
    cf = np.bincount(st.member, weights=part, minlength=n)
    bills = env.bills()["total_j"]
    np.testing.assert_allclose(bills, cf, rtol=1e-9, atol=1e-12)
    assert bills.sum() == pytest.approx(math.fsum(e.energy_j for e in log), rel=1e-12)
    per_tenant = np.bincount(ten, weights=cf, minlength=2)
    assert np.all(per_tenant > 0)
    # per interval: entries inside, and the in-flight step at a boundary split in proportion to time
    spans = 0
    tmember = ten[st.players[st.member]]
    for info in infos[1:]:
        iv = info["attribution"]["interval"]
        lo, hi = iv["start_s"], iv["end_s"]
        dur = st.t1 - st.t0
        frac = np.clip(np.minimum(st.t1, hi) - np.maximum(st.t0, lo), 0, None) / np.where(dur > 0, dur, 1)
        spans += int(np.count_nonzero((frac > 0) & (frac < 1)))
        want = np.bincount(tmember, weights=part * frac[ent], minlength=2)
        got = np.array([iv["tenant_j"].get("alpha", 0.0), iv["tenant_j"].get("beta", 0.0)])
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
        assert iv["busy_j"] == pytest.approx(float(np.sum(st.logged_j * frac)), rel=1e-9)
    assert spans >= 4  # steps in flight at interval, hour and horizon boundaries were split


def test_attribution_does_not_change_the_run_and_is_deterministic(two_tenants):
    plain = run_episode(CommitServeEnv(str(two_tenants)), varied_policy, seed=5)
    env_a, rew_a, infos_a = attributed(two_tenants, varied_policy, seed=5)
    env_b, rew_b, infos_b = attributed(two_tenants, varied_policy, seed=5)
    assert rew_a == plain[0] == rew_b
    strip = [{k: v for k, v in i.items() if k != "attribution"} for i in infos_a]
    assert strip == plain[1]
    assert infos_a == infos_b
    for k, v in env_a.bills().items():
        np.testing.assert_array_equal(v, env_b.bills()[k])


def test_pool_attributor_rejects_a_second_hook_and_detaches():
    pool = Pool(toy_profile(), PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0)))
    with pytest.raises(ValueError, match="attach the pool"):
        PoolAttributor(pool)
    pool.attach(make_table(np.array([0.0, 0.001]), np.array([4, 6]), np.array([3, 2])))
    att = PoolAttributor(pool)
    with pytest.raises(ValueError, match="on_step is already in use"):
        PoolAttributor(pool)
    pool.run_until(math.inf)
    split = att.close(pool.now)
    assert split.busy_j == pytest.approx(att.bills_j.sum(), rel=1e-12)
    assert split.metered_j == pytest.approx(pool.energy_j(), rel=1e-12) and split.idle_j == pytest.approx(0.0, abs=1e-9)
    att.detach()
    assert pool.on_step is None


# ------------------------------------------------------------------------------------------ evaluation and CLI
def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_evaluation_writes_bills_csv(two_tenants, tmp_path):
    res = evaluate("vllm", str(two_tenants), seed=1, attribution=True)
    assert evaluate("vllm", str(two_tenants), seed=1).bills is None  # off by default
    out = tmp_path / "run"
    res.write(out)
    assert sorted(p.name for p in out.iterdir()) == ["bills.csv", "decisions.csv", "hourly.csv", "overview.png",
                                                     "requests.csv", "summary.json"]
    rows = _rows(out / "bills.csv")
    assert tuple(rows[0]) == BILL_COLUMNS
    assert len(rows) == res.summary["requests"]
    req = _rows(out / "requests.csv")
    assert [r["request_id"] for r in rows] == [r["request_id"] for r in req]
    total = res.bills["total_j"].sum()
    assert res.bills["token_split_j"].sum() == pytest.approx(total, rel=1e-12)
    assert sum(float(r["total_j"]) for r in rows) == pytest.approx(total, rel=1e-6)
    assert {r["tenant"] for r in rows} == {"0", "1"}
    for r in rows[:20]:
        assert float(r["own_j"]) + float(r["shared_j"]) == pytest.approx(float(r["total_j"]), abs=2e-6)
    res.write(tmp_path / "no-bills", bills=False, figure=False)
    assert not (tmp_path / "no-bills" / "bills.csv").exists()


def test_cli_attribute_reproduces_bills(two_tenants, tmp_path, capsys):
    out = tmp_path / "run"
    evaluate("vllm", str(two_tenants), seed=2, attribution=True).write(out, figure=False)
    want = (out / "bills.csv").read_bytes()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scenario_file"] == str(two_tenants.resolve())
    (out / "bills.csv").unlink()
    assert main(["attribute", str(out), "--quiet"]) == 0
    stdout, err = capsys.readouterr()
    assert (out / "bills.csv").read_bytes() == want
    rep = json.loads(stdout.strip().splitlines()[-1])
    assert set(rep["tenant_mj"]) == {"alpha", "beta"}
    assert sum(rep["tenant_mj"].values()) == pytest.approx(rep["busy_mj"], rel=1e-12)
    assert sorted(p.name for p in out.iterdir()) == ["bills.csv", "decisions.csv", "hourly.csv", "requests.csv",
                                                     "summary.json"]
    # a folder written by `commitenv run` (no bills) gets them too
    run2 = tmp_path / "run2"
    assert main(["run", str(two_tenants), "--seed", "2", "--out", str(run2), "--quiet"]) == 0
    capsys.readouterr()
    assert not (run2 / "bills.csv").exists()
    assert main(["attribute", str(run2), "--quiet"]) == 0
    capsys.readouterr()
    assert (run2 / "bills.csv").read_bytes() == want


def test_cli_attribute_reuses_recorded_controller_arguments(two_tenants, tmp_path, capsys):
    # fixed_config on both toy GPUs at the low clock: the run records the arguments and `attribute` passes them
    # back, so the re-run reproduces the recorded scores; at the default clock it would not, and is refused
    out = tmp_path / "run"
    kw = {"active": 2, "clock_mhz": 500}
    res = evaluate("fixed_config", str(two_tenants), seed=0, controller_kwargs=kw)
    assert res.summary["controller_kwargs"] == kw
    res.write(out, figure=False, requests=False)
    assert main(["attribute", str(out), "--quiet"]) == 0
    capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    summary["controller_kwargs"] = {"active": 2}
    (out / "summary.json").write_text(json.dumps(summary))
    assert main(["attribute", str(out), "--quiet"]) != 0
    assert "would not belong to this run" in capsys.readouterr()[1]
    with pytest.raises(ValueError, match="controller_kwargs: expected plain JSON"):
        evaluate("fixed_config", str(two_tenants), controller_kwargs={"active": object()})


def test_cli_attribute_replay_correction(two_tenants, tmp_path, capsys):
    out = tmp_path / "run"
    evaluate("vllm", str(two_tenants), seed=0).write(out, figure=False, requests=False)
    assert main(["attribute", str(out), "--replay", "--pairs", "3", "--window", "6", "--quiet"]) == 0
    stdout, _ = capsys.readouterr()
    assert "L1 distance to the closed form" in stdout and "+-" in stdout
    rep = json.loads(stdout.strip().splitlines()[-1])["replay"]
    assert rep["windows"] == rep["windows_total"] > 5 and rep["pairs"] == 3
    rows = _rows(out / "bills.csv")
    assert tuple(rows[0])[-2:] == ("replay_j", "replay_se_j")
    served = [r for r in rows if float(r["total_j"]) > 0]
    assert all(r["replay_j"] != "nan" for r in served)
    # the correction moves energy within windows only: the run total is kept
    assert sum(float(r["replay_j"]) for r in served) == pytest.approx(sum(float(r["total_j"]) for r in served),
                                                                      rel=1e-6)
    assert 0 <= rep["l1_vs_closed_form"] < 0.5 and rep["l1_noise"] >= 0
    # only the first windows
    assert main(["attribute", str(out), "--replay", "--pairs", "2", "--max-windows", "2", "--quiet"]) == 0
    rep = json.loads(capsys.readouterr()[0].strip().splitlines()[-1])["replay"]
    assert rep["windows"] == 2 and rep["windows_total"] > 2
    assert sum(r["replay_j"] != "nan" for r in _rows(out / "bills.csv")) == rep["requests"]


def test_cli_attribute_errors(two_tenants, tmp_path, capsys):
    rc = main(["attribute", str(tmp_path / "nope")])
    _, err = capsys.readouterr()
    assert rc == 2 and err.startswith("error:") and "not a folder" in err
    out = tmp_path / "run"
    evaluate("vllm", str(two_tenants), seed=0).write(out, figure=False, requests=False)
    s = json.loads((out / "summary.json").read_text())
    s["energy_mj"] *= 1.01
    (out / "summary.json").write_text(json.dumps(s))
    rc = main(["attribute", str(out), "--quiet"])
    _, err = capsys.readouterr()
    assert rc == 2 and "would not belong to this run" in err and len(err.strip().splitlines()) == 1
    assert not (out / "bills.csv").exists() and not list(out.glob(".bills*"))
    rc = main(["attribute", str(out), "--replay", "--pairs", "1"])
    _, err = capsys.readouterr()
    assert rc == 2 and "--pairs" in err
