"""Scenarios: shipped files, name forms, workload/engine mapping, commitments and their reference cache,
Gymnasium registration, and every malformed-scenario error (each names the file and the field)."""

from __future__ import annotations

import copy
import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

import commitenv.sim.fixed as fixed_mod
from commitenv._paths import data_dir
from commitenv.profiles import load_profile
from commitenv.scenarios import (
    ScenarioError,
    commitments_mj,
    describe_scenarios,
    engine_options,
    list_scenarios,
    load_scenario,
    parse_scenario,
    reference_cache_path,
    reference_key,
    register_all,
    scenario_layout,
    scenario_profile,
    scenario_profiles,
    scenario_workload,
    workload_seed,
)
from commitenv.scenarios import loader as loader_mod
from commitenv.scenarios.make_epact_files import main as make_main
from commitenv.scenarios.make_epact_files import render_all
from commitenv.sim.noise import NoiseSpec
from commitenv.sim.pool import EngineOptions, Pool
from commitenv.workload import AZURE_CODE_DAY_HOURLY_COUNTS, builtin_workload, time_window
from helpers.slow import slow_requested
from helpers.paths import SHARED

DAY_CSV = SHARED / "data" / "paper" / "epact_day_hourly.csv"

HOUR_NAMES = {
    f"epact-{gpu}-hour-{setting}-a{scale}"
    for gpu in ("h20", "h200")
    for setting in ("fixed", "decreasing")
    for scale in ("25", "30", "35")
}
DAY_NAMES = {"epact-h20-day", "epact-h200-day"}
REPRO_NAMES = DAY_NAMES | HOUR_NAMES
BENCH_NAMES = {n.replace("epact-", "bench-", 1) for n in REPRO_NAMES}  # realism 'paper' twins
SHARED_NAMES = {"festina-h100-shared", "festina-h100-shared-day", "festina-h100-shared-energy",
                "festina-h100-serverless-valley", "festina-h100-serverless-day"}
HELDOUT_NAMES = {f"heldout-{n}-hour-a30" for n in ("h200-conv", "h20-conv", "h200-code-burst", "h200-code-tracebursts",
                                                    "h200-code-valley", "h200-code-evening")}  # secret-draw families
ALL_NAMES = REPRO_NAMES | BENCH_NAMES | SHARED_NAMES | HELDOUT_NAMES
PROFILE = {"h20": "h20-qwen3.8-27b-fp8", "h200": "h200-qwen3.8-27b-fp8"}
EXPECTED_FRACTION = {
    ("h20", "fixed"): {"25": 0.85, "30": 0.85, "35": 0.85},
    ("h200", "fixed"): {"25": 0.85, "30": 0.85, "35": 0.85},
    ("h20", "decreasing"): {"25": 0.85, "30": 0.80, "35": 0.75},
    ("h200", "decreasing"): {"25": 0.95, "30": 0.90, "35": 0.85},
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Every test gets its own empty reference cache."""
    monkeypatch.setenv("COMMITENV_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _count_run_fixed(monkeypatch) -> list[int]:
    calls = [0]
    real = fixed_mod.run_fixed

    def counting(*a, **k):
        calls[0] += 1
        return real(*a, **k)

    monkeypatch.setattr(fixed_mod, "run_fixed", counting)
    return calls


def _forbid_run_fixed(monkeypatch) -> None:
    def boom(*a, **k):
        raise AssertionError("run_fixed called: the reference should have come from the cache")

    monkeypatch.setattr(fixed_mod, "run_fixed", boom)


# ------------------------------------------------------------------------------------------ shipped files
def test_shipped_names_and_ids_are_exactly_the_required_set():
    assert set(list_scenarios()) == ALL_NAMES
    assert len(list_scenarios()) == 39
    desc = describe_scenarios()
    assert {eid for eid, _ in desc} == {f"commitenv/{n}-v0" for n in ALL_NAMES}
    for eid, line in desc:
        assert line and "\n" not in line and not line.startswith("INVALID"), (eid, line)
    assert not (data_dir("scenarios") / ".keep").exists()


@pytest.mark.parametrize("name", sorted(REPRO_NAMES | BENCH_NAMES))
def test_every_shipped_file_validates(name):
    path = data_dir("scenarios") / f"{name}.yaml"
    sc = load_scenario(path)
    assert sc.name == name == path.stem
    assert sc.env_id == f"commitenv/{name}-v0"
    assert sc.source == str(path)
    assert sc.pool.gpus == 32
    assert sc.interval_s == 60 and sc.intervals_per_hour == 60
    assert (sc.lambda_plus, sc.lambda_minus) == (2.0, 1.0)
    assert sc.epsilon == 0.01
    bench = name in BENCH_NAMES
    assert sc.workload.builtin == "azure-code-day" and sc.workload.seed == (None if bench else 0)
    assert sc.realism.level == ("paper" if bench else "ideal")
    assert (sc.seeds is not None) == bench
    assert sc.miss_penalty_kwh > 0  # deadlines cost on every shipped scenario
    assert sc.commitment.fractions is not None and sc.commitment.mj is None
    for key in ("pool", "workload", "commitment", "reference", "lambdas", "alpha", "epsilon", "miss_penalty", "realism"):
        assert sc.paper.get(key), f"{name}: paper.{key} missing"
    assert "does not print" in sc.paper["epsilon"]
    assert scenario_profile(sc).name == sc.pool.profile


def test_the_shared_gpu_scenario():
    """festina-h100-shared: 8 H100s, three models on shared GPUs (shares <= 1 per GPU), every model placed, the
    traffic split among the models, absolute commitment, deadlines that cost, a trace per seed; every instance's memory
    fits its GPU (the pool builds)."""
    sc = load_scenario("festina-h100-shared")
    assert sc.pool.shared and sc.pool.gpus == 8 and len(sc.pool.placement) == 8
    assert [m.profile for m in sc.pool.models] == ["h100-qwen2.5-7b-festina", "h100-llama2-13b", "h100-mistral-small-24b"]
    assert all(sum(i.share for i in g) <= 1.0 for g in sc.pool.placement)
    assert sum(sc.workload.tenant_mix.values()) == pytest.approx(1.0) and sc.workload.seed is None
    assert sc.commitment.mj == [10.09]
    assert sc.miss_penalty_kwh > 0 and sc.seeds is not None
    assert len(Pool(scenario_profiles(sc), scenario_layout(sc)).replica_models) == 14  # every instance fits its memory
    for key in ("pool", "workload", "commitment", "slo", "realism"):
        assert sc.paper.get(key), f"paper.{key} missing"


def test_generated_single_hour_files_equal_the_script_rendering():
    rendered = render_all()
    assert {Path(f).stem for f in rendered} == HOUR_NAMES | {n.replace("epact-", "bench-", 1) for n in HOUR_NAMES}
    for fname, text in rendered.items():
        assert (data_dir("scenarios") / fname).read_text() == text, f"{fname} is stale: run make_epact_files"
    assert make_main(["--check"]) == 0


def test_make_epact_files_writes_and_checks(tmp_path, capsys):
    out = tmp_path / "sc"
    assert make_main(["--check", "--out", str(out)]) == 1
    assert make_main(["--out", str(out)]) == 0
    assert sorted(p.stem for p in out.glob("*.yaml")) == sorted(HOUR_NAMES | {n.replace("epact-", "bench-", 1) for n in HOUR_NAMES})
    assert make_main(["--check", "--out", str(out)]) == 0
    assert not list(out.glob(".*tmp"))


@pytest.mark.parametrize("name", sorted(HOUR_NAMES | {n.replace("epact-", "bench-", 1) for n in HOUR_NAMES}))
def test_single_hour_settings(name):
    kind, gpu, _, setting, a = name.split("-")
    scale = a[1:]
    sc = load_scenario(name)
    assert sc.pool.profile == PROFILE[gpu]
    assert sc.horizon_hours == 1
    assert sc.workload.start_hour == 12
    assert sc.alpha == {"25": 2.5, "30": 3.0, "35": 3.5}[scale]
    assert sc.commitment.fractions == [EXPECTED_FRACTION[(gpu, setting)][scale]]
    # the reproduction serves its reference hour; a benchmark episode is measured against the historical hour
    assert sc.commitment.reference.workload_seed == (None if kind == "epact" else 0)


@pytest.mark.parametrize("gpu", ["h20", "h200"])
def test_day_settings(gpu):
    sc = load_scenario(f"epact-{gpu}-day")
    assert sc.pool.profile == PROFILE[gpu]
    assert sc.horizon_hours == 24 and sc.workload.start_hour == 0
    assert sc.alpha == 3.0
    assert sc.commitment.reference.workload_seed == 1
    assert len(sc.commitment.fractions) == 24


@pytest.mark.skipif(not DAY_CSV.exists(), reason="shared paper data not present")
@pytest.mark.parametrize("gpu", ["h20", "h200"])
def test_day_fractions_equal_the_paper_csv(gpu):
    with open(DAY_CSV) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["hour"]) for r in rows] == list(range(24))
    want = [float(r["target_fraction"]) for r in rows]
    assert load_scenario(f"epact-{gpu}-day").commitment.fractions == want


# ------------------------------------------------------------------------------------------ name forms
def test_name_forms_agree():
    by_name = load_scenario("epact-h20-hour-fixed-a30")
    by_id = load_scenario("commitenv/epact-h20-hour-fixed-a30-v0")
    path = data_dir("scenarios") / "epact-h20-hour-fixed-a30.yaml"
    assert by_name == by_id == load_scenario(path) == load_scenario(str(path))
    assert load_scenario(by_name) == by_name  # an already built scenario passes through (checked)


def test_unknown_name_lists_the_available_ones():
    with pytest.raises(ScenarioError) as ei:
        load_scenario("epact-h100-day")
    msg = str(ei.value)
    assert "epact-h100-day" in msg and "epact-h20-day" in msg and "epact-h200-hour-fixed-a35" in msg
    with pytest.raises(ScenarioError, match="commitenv/nope-v0.*unknown scenario 'nope'.*epact-h20-day"):
        load_scenario("commitenv/nope-v0")
    with pytest.raises(ScenarioError, match="unknown version v3.*expected v0"):
        load_scenario("commitenv/epact-h20-day-v3")
    with pytest.raises(ScenarioError, match="missing.yaml: file not found"):
        load_scenario("missing.yaml")


# ------------------------------------------------------------------------------------------ build
def test_scenario_workload_windows_and_rebases():
    sc = load_scenario("epact-h20-hour-fixed-a30")
    t = scenario_workload(sc, seed=123)  # workload.seed 0 wins over the run seed
    assert len(t) == AZURE_CODE_DAY_HOURLY_COUNTS[12]
    assert t.arrival_s.min() >= 0 and t.arrival_s.max() < 3600
    day = builtin_workload("azure-code-day", 0)
    ref = time_window(day, 12 * 3600, 13 * 3600)
    np.testing.assert_array_equal(t.arrival_s, ref.arrival_s)
    np.testing.assert_array_equal(t.output_tokens, ref.output_tokens)
    assert t.arrival_s.flags.writeable  # a fresh copy, not the cached source


def test_scenario_workload_seed_rate_scale_and_window_errors():
    base = load_scenario("epact-h20-hour-fixed-a30")
    run_seeded = base.model_copy(update={"workload": base.workload.model_copy(update={"seed": None})})
    a, b = scenario_workload(run_seeded, 1), scenario_workload(run_seeded, 2)
    assert len(a) == len(b) == AZURE_CODE_DAY_HOURLY_COUNTS[12]
    assert not np.array_equal(a.arrival_s, b.arrival_s)
    with pytest.raises(ScenarioError, match="workload.seed"):
        workload_seed(run_seeded, None)
    half = base.model_copy(update={"workload": base.workload.model_copy(update={"rate_scale": 0.5})})
    assert len(scenario_workload(half, 0)) == round(0.5 * AZURE_CODE_DAY_HOURLY_COUNTS[12])
    late = base.model_copy(update={"workload": base.workload.model_copy(update={"start_hour": 23.5})})
    with pytest.raises(ScenarioError, match=r"epact-h20-hour-fixed-a30\.yaml: workload\.start_hour: .*runs past"):
        scenario_workload(late, 0)


def test_engine_options_mapping():
    sc = load_scenario("epact-h20-hour-decreasing-a35")
    o = engine_options(sc, 7)
    assert (o.alpha, o.seed, o.oracle_lengths, o.length_error_sigma) == (3.5, 7, False, 0.25)
    assert o.noise == NoiseSpec(time_sigma=0.03, energy_sigma=0.02)
    raw = yaml.safe_load((data_dir("scenarios") / "epact-h20-hour-decreasing-a35.yaml").read_text())
    raw["observation"] = {"lengths": "oracle", "length_error_sigma": 0.0}
    raw["noise"] = {"time_sigma": 0.0, "energy_sigma": 0.1}
    o2 = engine_options(parse_scenario(raw), 0)
    assert o2.oracle_lengths and o2.length_error_sigma == 0.0 and o2.noise == NoiseSpec(0.0, 0.1)


# ------------------------------------------------------------------------------------------ commitments
@pytest.mark.parametrize(("name", "frac"), [("epact-h20-hour-fixed-a30", 0.85), ("epact-h200-hour-decreasing-a25", 0.95)])
def test_single_hour_commitment_is_fraction_of_independent_vllm_run(name, frac):
    sc = load_scenario(name)
    got = commitments_mj(sc)
    day = builtin_workload("azure-code-day", 0)
    hour = time_window(day, 12 * 3600.0, 13 * 3600.0, rebase=True)
    prof = load_profile(sc.pool.profile)
    res = fixed_mod.run_fixed(prof, hour, n_gpus=32, options=EngineOptions(alpha=sc.alpha, seed=0,
                              noise=NoiseSpec(0.03, 0.02)), hours=1, interval_s=60.0)
    assert got.shape == (1,)
    assert got[0] == pytest.approx(frac * res.hourly_energy_j[0] / 1e6, rel=1e-12)
    assert not got.flags.writeable
    if name.startswith("epact-h20-"):  # hour 12 ~ the paper's implied 16.138982 / 0.85 = 18.99 MJ
        assert 17.0 < res.hourly_energy_j[0] / 1e6 < 21.0


def test_historical_reference_uses_its_own_workload_seed():
    raw = yaml.safe_load((data_dir("scenarios") / "epact-h20-hour-fixed-a30.yaml").read_text())
    raw["commitment"]["reference"]["workload_seed"] = 1
    sc = parse_scenario(raw, "hist.yaml")
    got = commitments_mj(sc)
    hist = time_window(builtin_workload("azure-code-day", 1), 12 * 3600.0, 13 * 3600.0)
    res = fixed_mod.run_fixed(load_profile(sc.pool.profile), hist, n_gpus=32,
                              options=EngineOptions(alpha=3.0, seed=0, noise=NoiseSpec(0.03, 0.02)), hours=1)
    assert got[0] == pytest.approx(0.85 * res.hourly_energy_j[0] / 1e6, rel=1e-12)
    assert got[0] != commitments_mj(load_scenario("epact-h20-hour-fixed-a30"))[0]
    assert len(scenario_workload(sc, 0)) == len(hist)  # the evaluation workload is still seed 0
    np.testing.assert_array_equal(scenario_workload(sc, 0).arrival_s,
                                  scenario_workload(load_scenario("epact-h20-hour-fixed-a30"), 0).arrival_s)


def test_cache_hit_returns_identical_numbers_without_recomputing(monkeypatch, _cache):
    sc = load_scenario("epact-h20-hour-fixed-a25")
    calls = _count_run_fixed(monkeypatch)
    first = commitments_mj(sc)
    assert calls[0] == 1
    path = reference_cache_path(sc)
    assert path.parent == _cache / "references" and path.is_file()
    doc = json.loads(path.read_text())
    assert doc["key"] == reference_key(sc) == path.stem and len(doc["hourly_energy_j"]) == 1
    assert not [p for p in path.parent.iterdir() if p.suffix == ".tmp"]  # atomic write left nothing behind
    _forbid_run_fixed(monkeypatch)
    second = commitments_mj(load_scenario("epact-h20-hour-fixed-a25"))
    np.testing.assert_array_equal(first, second)
    assert first.tobytes() == second.tobytes()
    # decreasing-a25 is the same hour at the same alpha: it shares the reference run
    dec = commitments_mj(load_scenario("epact-h20-hour-decreasing-a25"))
    np.testing.assert_array_equal(dec, first)


@pytest.mark.parametrize("corruption", ["garbage", "truncated", "wrong_key", "wrong_length", "negative", "not_dict"])
def test_corrupt_cache_file_is_recomputed(monkeypatch, corruption):
    sc = load_scenario("epact-h20-hour-fixed-a35")
    good = commitments_mj(sc)
    path = reference_cache_path(sc)
    doc = json.loads(path.read_text())
    text = path.read_text()
    if corruption == "garbage":
        path.write_bytes(b"\x00\xffnot json")
    elif corruption == "truncated":
        path.write_text(text[: len(text) // 2])
    elif corruption == "wrong_key":
        path.write_text(json.dumps({**doc, "key": "0" * 64, "hourly_energy_j": [1.0]}))
    elif corruption == "wrong_length":
        path.write_text(json.dumps({**doc, "hourly_energy_j": doc["hourly_energy_j"] * 2}))
    elif corruption == "negative":
        path.write_text(json.dumps({**doc, "hourly_energy_j": [-5.0]}))
    else:
        path.write_text("[1, 2, 3]")
    calls = _count_run_fixed(monkeypatch)
    with pytest.warns(RuntimeWarning, match="recomputing"):
        again = commitments_mj(sc)
    assert calls[0] == 1
    np.testing.assert_array_equal(again, good)
    assert json.loads(path.read_text())["hourly_energy_j"] == doc["hourly_energy_j"]  # rewritten, valid


def test_cache_key_changes_with_profile_bytes_and_run_inputs(tmp_path):
    prof_copy = tmp_path / "myprof.yaml"
    shutil.copy(data_dir("profiles") / "h20-qwen3.8-27b-fp8.yaml", prof_copy)
    raw = yaml.safe_load((data_dir("scenarios") / "epact-h20-hour-fixed-a30.yaml").read_text())
    raw["pool"]["profile"] = "myprof.yaml"  # relative to the scenario file
    scen = tmp_path / "mine.yaml"
    scen.write_text(yaml.safe_dump(raw))
    sc = load_scenario(scen)
    assert sc.pool.profile == str(prof_copy.resolve())
    shipped = load_scenario("epact-h20-hour-fixed-a30")
    k0 = reference_key(sc)
    assert k0 == reference_key(shipped)  # same bytes, another location: same key
    prof_copy.write_text(prof_copy.read_text() + "\n# edited\n")
    assert reference_key(sc) != k0
    assert reference_key(load_scenario("epact-h200-hour-fixed-a30")) != k0

    def with_(**upd):
        return shipped.model_copy(update=upd)

    assert reference_key(with_(workload=shipped.workload.model_copy(update={"seed": 3}))) != k0
    assert reference_key(with_(workload=shipped.workload.model_copy(update={"start_hour": 11.0}))) != k0
    assert reference_key(with_(pool=shipped.pool.model_copy(update={"gpus": 16}))) != k0
    assert reference_key(with_(alpha=2.0)) != k0
    assert reference_key(with_(noise=shipped.noise.model_copy(update={"energy_sigma": 0.0}))) != k0
    # what does not affect the reference run leaves the key alone
    assert reference_key(with_(lambda_plus=5.0, description="x", epsilon=0.5)) == k0
    frac = with_(commitment=shipped.commitment.model_copy(update={"fractions": [0.5]}))
    assert reference_key(frac) == k0


def test_absolute_mj_commitments_broadcast_without_a_reference_run(monkeypatch):
    _forbid_run_fixed(monkeypatch)
    raw = yaml.safe_load((data_dir("scenarios") / "epact-h20-day.yaml").read_text())
    raw["commitment"] = {"mj": [12.5]}
    c = commitments_mj(parse_scenario(raw, "abs.yaml"))
    assert c.tolist() == [12.5] * 24 and not c.flags.writeable
    raw["commitment"] = {"mj": list(range(1, 25))}
    assert commitments_mj(parse_scenario(raw)).tolist() == list(map(float, range(1, 25)))


def test_trace_scenario_relative_path_and_content_key(tmp_path):
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(240):  # 2 hours, one request every 30 s
        s = i * 30
        lines.append(f"2024-05-11 {s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}.000000+00:00,{100 + i},{20 + i % 7}")
    (tmp_path / "tr.csv").write_text("\n".join(lines) + "\n")
    raw = yaml.safe_load((data_dir("scenarios") / "epact-h20-hour-fixed-a30.yaml").read_text())
    raw["workload"] = {"trace": "tr.csv", "start_hour": 1}
    raw["pool"]["gpus"] = 2
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(raw))
    sc = load_scenario(tmp_path / "t.yaml")
    assert Path(sc.workload.trace).is_absolute()
    t = scenario_workload(sc, 0)
    assert len(t) == 120 and t.arrival_s[0] == 0.0
    k = reference_key(sc)
    c = commitments_mj(sc)
    assert c.shape == (1,) and c[0] > 0
    (tmp_path / "tr.csv").write_text("\n".join(lines[:-1]) + "\n")
    assert reference_key(sc) != k


def test_reference_of_the_first_two_hours_is_the_historical_day_and_near_the_paper(monkeypatch):
    """The quick variant of the full-day test below: the day scenario cut to its first two hours."""
    sc = load_scenario("epact-h20-day")
    sc = sc.model_copy(update={"horizon_hours": 2, "commitment": sc.commitment.model_copy(
        update={"fractions": sc.commitment.fractions[:2]})})
    got = commitments_mj(sc)
    hist = time_window(builtin_workload("azure-code-day", 1), 0.0, 7200.0)
    res = fixed_mod.run_fixed(load_profile(sc.pool.profile), hist, n_gpus=32,
                              options=EngineOptions(alpha=3.0, seed=0, noise=NoiseSpec(0.03, 0.02)), hours=2)
    np.testing.assert_allclose(got, np.asarray(sc.commitment.fractions) * res.hourly_energy_j / 1e6, rtol=1e-12)
    if DAY_CSV.is_file():  # the paper's hourly H20 commitments (Table 4), hours 0-1
        with DAY_CSV.open() as f:
            paper = [float(r["h20_target_mj"]) for r in csv.DictReader(f)][:2]
        np.testing.assert_allclose(got, paper, rtol=0.05)
    _forbid_run_fixed(monkeypatch)
    np.testing.assert_array_equal(commitments_mj(sc), got)  # from the cache, without a new run


@pytest.mark.slow
def test_day_reference_is_the_historical_day_and_near_the_paper(monkeypatch, request):
    if not slow_requested(request.config):
        pytest.skip("slow (two full-day runs, ~2 min; the two-hour variant above runs always): "
                    "run with -m slow or COMMITENV_RUN_SLOW=1")
    sc = load_scenario("epact-h20-day")
    got = commitments_mj(sc)
    hist = builtin_workload("azure-code-day", 1)
    res = fixed_mod.run_fixed(load_profile(sc.pool.profile), hist, n_gpus=32,
                              options=EngineOptions(alpha=3.0, seed=0, noise=NoiseSpec(0.03, 0.02)), hours=24)
    np.testing.assert_allclose(got, np.asarray(sc.commitment.fractions) * res.hourly_energy_j / 1e6, rtol=1e-12)
    assert got.sum() == pytest.approx(496.1070, rel=0.05)  # paper App. C.3: H20 commitments total 496.1070 MJ
    _forbid_run_fixed(monkeypatch)
    np.testing.assert_array_equal(commitments_mj(load_scenario("commitenv/epact-h20-day-v0")), got)


# ------------------------------------------------------------------------------------------ registration
def test_register_all_is_idempotent_and_points_at_the_env():
    import gymnasium as gym

    register_all()
    assert register_all() == []
    for name in ALL_NAMES:
        spec = gym.spec(f"commitenv/{name}-v0")
        assert spec.entry_point == "commitenv.envs:CommitServeEnv"
        assert spec.kwargs == {"scenario": name}
        assert spec.max_episode_steps is None
        assert load_scenario(spec.id).name == name


# ------------------------------------------------------------------------------------------ malformed files
def _base() -> dict:
    return yaml.safe_load((data_dir("scenarios") / "epact-h20-day.yaml").read_text())


def _del(d, *keys):
    for k in keys[:-1]:
        d = d[k]
    del d[keys[-1]]


def _set(d, *keys_value):
    *keys, value = keys_value
    for k in keys[:-1]:
        d = d[k]
    d[keys[-1]] = value


BAD_CASES = {
    "missing_gpus": (lambda r: _del(r, "pool", "gpus"), ["pool.gpus", "missing"]),
    "missing_horizon": (lambda r: _del(r, "horizon_hours"), ["horizon_hours", "missing"]),
    "missing_commitment": (lambda r: _del(r, "commitment"), ["commitment", "missing"]),
    "bad_fraction_count": (lambda r: _set(r, "commitment", "fractions", [0.9] * 23),
                           ["commitment.fractions", "horizon_hours=24", "got 23"]),
    "bad_mj_count": (lambda r: _set(r, "commitment", {"mj": [1.0, 2.0]}), ["commitment.mj", "got 2"]),
    "both_mj_and_fractions": (lambda r: _set(r, "commitment", "mj", [10.0] * 24),
                              ["commitment", "exactly one of 'mj'", "'fractions'"]),
    "fraction_out_of_range": (lambda r: _set(r, "commitment", "fractions", [2.5] * 24),
                              ["commitment.fractions", "(0, 2]"]),
    "fractions_without_reference": (lambda r: _del(r, "commitment", "reference"), ["commitment.reference", "required"]),
    "mj_with_reference": (lambda r: _set(r, "commitment", {"mj": [1.0], "reference": {"workload_seed": 1}}),
                          ["commitment.reference", "only used with 'fractions'"]),
    "unknown_profile": (lambda r: _set(r, "pool", "profile", "b300-nope"),
                        ["pool.profile", "b300-nope", "h20-qwen3.8-27b-fp8"]),
    "missing_profile_file": (lambda r: _set(r, "pool", "profile", "nope/prof.yaml"), ["pool.profile", "not found"]),
    "unknown_builtin": (lambda r: _set(r, "workload", "builtin", "azure-code-week"),
                        ["workload.builtin", "azure-code-week", "azure-code-day"]),
    "builtin_and_trace": (lambda r: _set(r, "workload", "trace", "x.csv"), ["workload", "exactly one of 'builtin'"]),
    "missing_trace_file": (lambda r: _set(r, "workload", {"trace": "nowhere.csv"}), ["workload.trace", "not found"]),
    "interval_not_dividing_hour": (lambda r: _set(r, "interval_s", 7), ["interval_s", "does not divide an hour", "3600"]),
    "interval_longer_than_hour": (lambda r: _set(r, "interval_s", 7200), ["interval_s", "does not divide an hour"]),
    "unknown_field": (lambda r: _set(r, "lamda_plus", 2.0), ["lamda_plus", "unknown field"]),
    "wrong_type": (lambda r: _set(r, "pool", "gpus", "many"), ["pool.gpus", "integer", "'many'"]),
    "negative_lambda": (lambda r: _set(r, "lambda_minus", -1), ["lambda_minus", "greater than 0"]),
    "bad_lengths_mode": (lambda r: _set(r, "observation", "lengths", "psychic"), ["observation.lengths", "psychic"]),
    "bad_name": (lambda r: _set(r, "name", "Bad Name"), ["name", "pattern"]),
    "unknown_initial_clock": (lambda r: _set(r, "initial", {"clock_mhz": 1234}),
                              ["initial.clock_mhz", "1234", "1980"]),
    "too_many_initial_active": (lambda r: _set(r, "initial", {"active": 40}), ["initial.active", "pool.gpus=32"]),
    "null_seeds": (lambda r: (_set(r, "workload", "seed", None), _set(r, "commitment", "reference", "workload_seed", None)),
                   ["commitment.reference.workload_seed", "workload.seed is null"]),
    "delay_too_long": (lambda r: _set(r, "actuation_delay_s", 60), ["actuation_delay_s", "shorter than interval_s"]),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_malformed_scenario_errors_name_file_and_field(tmp_path, case):
    mutate, needles = BAD_CASES[case]
    raw = copy.deepcopy(_base())
    mutate(raw)
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ScenarioError) as ei:
        load_scenario(path)
    msg = str(ei.value)
    assert msg.startswith(f"{path}: "), msg
    for n in needles:
        assert n in msg, f"{case}: {n!r} not in {msg!r}"


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("name: [unclosed\n", ["not valid YAML"]),
        ("- a\n- b\n", ["expected a mapping", "list"]),
        ("", ["expected a mapping", "NoneType"]),
        ("name: a\nname: b\n", ["not valid YAML", "'name' given twice"]),
    ],
)
def test_unparsable_files(tmp_path, text, needles):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as ei:
        load_scenario(path)
    msg = str(ei.value)
    assert msg.startswith(f"{path}: ")
    for n in needles:
        assert n in msg, msg


def test_shipped_file_name_must_match_its_name_field(tmp_path, monkeypatch):
    d = tmp_path / "scen"
    d.mkdir()
    raw = _base()
    raw["name"] = "something-else"
    (d / "mismatch.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.setattr(loader_mod, "scenarios_dir", lambda: d)
    assert list_scenarios() == ["mismatch"]
    with pytest.raises(ScenarioError, match=r"mismatch\.yaml: name: expected 'mismatch'.*got 'something-else'"):
        load_scenario("mismatch")
    with pytest.raises(ScenarioError, match="unknown scenario 'epact-h20-day'.*mismatch"):
        load_scenario("epact-h20-day")
    assert describe_scenarios()[0][1].startswith("INVALID: ")


def test_reference_key_follows_the_engine_source_code(tmp_path, monkeypatch):
    """A reference cached by other engine code is never reused: one changed byte in an engine, workload, profile
    or scenario module gives another code hash, and the code hash enters the key."""
    from commitenv.scenarios import commitments as cm

    root = Path(cm.__file__).resolve().parents[1]
    for pkg in ("sim", "workload", "profiles", "scenarios"):
        shutil.copytree(root / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "data"))
    h0 = cm.source_sha256(tmp_path)
    assert h0 == cm.engine_code_sha256()
    target = tmp_path / "sim" / "pool.py"
    target.write_bytes(target.read_bytes() + b"\n")
    h1 = cm.source_sha256(tmp_path)
    assert h1 != h0
    target = tmp_path / "sim" / "kernel" / "loop.py"  # (a subpackage's module counts too)
    target.write_bytes(target.read_bytes() + b"\n")
    assert cm.source_sha256(tmp_path) != h1
    sc = load_scenario("epact-h20-hour-fixed-a30")
    k0 = reference_key(sc)
    monkeypatch.setattr(cm, "engine_code_sha256", lambda: "other code")
    assert reference_key(sc) != k0
