"""Scenario-file features: the ``engine`` section, ``workload.synthetic``, the trace reference window
(``commitment.reference.start_hour``) and the trace loaders' time origin.

Toy scenarios (the toy profile of ``conftest.py``: context limit 64, KV capacity 64 tokens in blocks of 4) are
written into a temporary folder with the helpers of ``test_env.py``; expectations come from the hand-written
inputs, not from the code under test.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from commitenv.evaluation import evaluate
from commitenv.profiles import load_profile
from commitenv.scenarios import (
    ScenarioError,
    commitments_mj,
    compute_reference,
    engine_options,
    load_scenario,
    reference_key,
    scenario_profile,
    scenario_workload,
)
from commitenv.scenarios.build import derived_seed
from commitenv.scenarios.commitments import reference_inputs
from commitenv.sim.fixed import run_fixed
from commitenv.sim.pool import EngineOptions
from commitenv.workload import builtin_lengths, load_azure_csv, load_burstgpt_csv, load_mooncake_jsonl, time_window
from helpers.scenarios import write_scenario, write_trace

HOUR = 3600.0


def _per_hour(table, hours: int) -> list[int]:
    return np.bincount((table.arrival_s // HOUR).astype(np.int64), minlength=hours).tolist()


def _raises(path: Path, *words: str) -> str:
    """Loading (and building) the scenario at ``path`` fails with a message holding every word."""
    with pytest.raises(ScenarioError) as ei:
        sc = load_scenario(path)
        scenario_profile(sc)
        scenario_workload(sc, 0)
    msg = str(ei.value)
    for w in words:
        assert w in msg, (w, msg)
    return msg


# ------------------------------------------------------------------------------------------ 1. engine section
PROMPTS = [5, 19, 20, 21, 40, 63, 64, 8, 30, 12]


@pytest.fixture
def long_prompt_trace(tmp_path) -> Path:
    """Ten requests a minute apart with the prompts above (the toy profile's own limit is 64 tokens)."""
    return write_trace(tmp_path / "prompts.csv", np.arange(len(PROMPTS)) * 60.0, PROMPTS, [3] * len(PROMPTS))


def test_engine_context_limit_rejects_exactly_the_prompts_at_or_over_it(tmp_path, long_prompt_trace):
    common = dict(workload={"trace": str(long_prompt_trace)}, horizon_hours=1, commitment={"mj": [0.2]})
    limited = load_scenario(write_scenario(tmp_path, "limit-20", engine={"context_limit": 20}, **common))
    default = load_scenario(write_scenario(tmp_path, "limit-default", **common))
    prompts = np.asarray(PROMPTS)

    prof = scenario_profile(limited)
    assert prof.scheduler.context_limit == 20
    assert prof.scheduler.kv_capacity_tokens == 64 and prof.clocks == load_profile(limited.pool.profile).clocks
    assert "engine.context_limit" in prof.sources["scheduler.context_limit"]  # the override is traceable
    assert scenario_profile(default).scheduler.context_limit == 64  # no engine section: the profile's limit

    res = evaluate("vllm", limited, seed=0)
    np.testing.assert_array_equal(res.requests["rejected"], prompts >= 20)  # 20, 21, 40, 63, 64, 30
    served = ~res.requests["rejected"]
    assert np.all(np.isfinite(res.requests["finish_s"][served]))
    assert res.summary["rejected"] == 6

    base = evaluate("vllm", default, seed=0)
    np.testing.assert_array_equal(base.requests["rejected"], prompts >= 64)  # only the 64-token prompt
    assert base.summary["rejected"] == 1


def test_engine_context_limit_must_fit_the_kv_capacity_and_prefix_settings_pass_through(tmp_path, long_prompt_trace):
    common = dict(workload={"trace": str(long_prompt_trace)}, horizon_hours=1, commitment={"mj": [0.2]})
    _raises(write_scenario(tmp_path, "too-long", engine={"context_limit": 65}, **common),
            "engine.context_limit", "65", "kv_capacity_tokens")
    _raises(write_scenario(tmp_path, "tiny", engine={"context_limit": 1}, **common), "engine.context_limit")
    with pytest.raises(ScenarioError, match="engine.context_limit"):  # by load_scenario itself, before any build
        load_scenario(write_scenario(tmp_path, "too-long-load", engine={"context_limit": 65}, **common))
    _raises(write_scenario(tmp_path, "odd-block", engine={"prefix_block_tokens": 6}, **common),
            "engine.prefix_block_tokens", "block_size")
    _raises(write_scenario(tmp_path, "typo", engine={"context_limt": 20}, **common),
            "engine.context_limt", "unknown field")

    sc = load_scenario(write_scenario(tmp_path, "prefix", engine={"prefix_caching": False, "prefix_block_tokens": 8},
                                      **common))
    opts = engine_options(sc, 0)
    assert (opts.prefix_caching, opts.prefix_block_tokens) == (False, 8)
    assert scenario_profile(sc).scheduler.context_limit == 64  # untouched when only prefix settings are given
    plain = engine_options(load_scenario(write_scenario(tmp_path, "plain", **common)), 0)
    defaults = EngineOptions()
    assert (plain.prefix_caching, plain.prefix_block_tokens) == (defaults.prefix_caching, defaults.prefix_block_tokens)


def test_engine_settings_enter_the_reference_key_only_when_given(tmp_path, long_prompt_trace):
    common = dict(workload={"trace": str(long_prompt_trace)}, horizon_hours=1,
                  commitment={"fractions": [0.9], "reference": {}})
    plain = load_scenario(write_scenario(tmp_path, "ref-plain", **common))
    same = load_scenario(write_scenario(tmp_path, "ref-same", engine={}, **common))
    limited = load_scenario(write_scenario(tmp_path, "ref-20", engine={"context_limit": 20}, **common))
    assert "engine" not in reference_inputs(plain) and "synthetic" not in reference_inputs(plain)["workload"]
    assert reference_key(plain) == reference_key(same)
    assert reference_inputs(limited)["engine"] == {"context_limit": 20}
    assert reference_key(limited) != reference_key(plain)
    # the reference run serves under the scenario's limit: the six long prompts never run, so it uses less energy
    assert commitments_mj(limited, use_cache=False)[0] < commitments_mj(plain, use_cache=False)[0]
    assert compute_reference(limited)["requests"] == len(PROMPTS)


# ------------------------------------------------------------------------------------------ 2. workload.synthetic
COUNTS = [30, 50, 20, 40]


def _synthetic(tmp_path, name, syn=None, **fields) -> Path:
    spec = {"hourly_counts": COUNTS, "lengths": "azure_conv", "context_limit": 64}
    spec.update(syn or {})
    wl = {"synthetic": spec, "seed": 3, "start_hour": 1}
    wl.update(fields.pop("workload", {}))
    base = dict(workload=wl, horizon_hours=2, commitment={"mj": [0.2]})
    base.update(fields)
    return write_scenario(tmp_path, name, **base)


@pytest.mark.parametrize("realism", ["ideal", "paper"])
def test_synthetic_pinned_counts_per_hour_equal_the_given_counts(tmp_path, realism):
    sc = load_scenario(_synthetic(tmp_path, f"syn-{realism}", realism=realism))
    t = scenario_workload(sc, seed=999)  # workload.seed 3 wins over the run seed
    assert _per_hour(t, 2) == COUNTS[1:3]
    assert t.arrival_s.min() >= 0 and t.arrival_s.max() < 2 * HOUR
    assert (t.prompt_tokens + t.output_tokens).max() <= 64 and t.prompt_tokens.max() <= 63  # synthetic.context_limit
    again = scenario_workload(sc, seed=5)
    np.testing.assert_array_equal(t.arrival_s, again.arrival_s)
    np.testing.assert_array_equal(t.output_tokens, again.output_tokens)
    assert t.meta["workload_seed"] == 3


def test_synthetic_minute_modulation_moves_arrivals_within_hours_only(tmp_path):
    ideal = scenario_workload(load_scenario(_synthetic(tmp_path, "m-ideal", syn={"hourly_counts": [600, 600, 600]},
                                                       realism="ideal")))
    paper = scenario_workload(load_scenario(_synthetic(tmp_path, "m-paper", syn={"hourly_counts": [600, 600, 600]},
                                                       realism="paper")))
    assert _per_hour(ideal, 2) == _per_hour(paper, 2) == [600, 600]
    assert not np.array_equal(ideal.arrival_s, paper.arrival_s)  # the realism's minute modulation is applied
    per_minute = np.bincount((paper.arrival_s // 60).astype(np.int64), minlength=120)
    flat = np.bincount((ideal.arrival_s // 60).astype(np.int64), minlength=120)
    assert per_minute.var() > flat.var()  # bursts: the modulated minutes spread more


def test_synthetic_episode_draws_per_hour_factors_from_the_run_seed(tmp_path):
    sc = load_scenario(_synthetic(tmp_path, "syn-episode", workload={"seed": None, "rate_spread": 0.2},
                                  syn={"hourly_counts": [300, 500, 200, 400]}, realism="paper"))
    for run_seed in (0, 1, 2):
        rng = np.random.default_rng(derived_seed(run_seed, "workload"))
        factors = rng.uniform(0.8, 1.2, 2)
        want = np.rint(np.array([500, 200]) * factors).astype(int).tolist()
        assert _per_hour(scenario_workload(sc, run_seed), 2) == want
    a, b = scenario_workload(sc, 0), scenario_workload(sc, 1)
    assert len(a) != len(b) or not np.array_equal(a.arrival_s, b.arrival_s)
    np.testing.assert_array_equal(scenario_workload(sc, 0).arrival_s, a.arrival_s)
    with pytest.raises(ScenarioError, match="workload.seed"):
        scenario_workload(sc, None)


def test_synthetic_rates_and_a_lengths_file(tmp_path):
    builtin_lengths("azure_code").to_json(tmp_path / "code_lengths.json")
    syn = {"hourly_counts": None, "hourly_rates": [100, 4000, 1000, 0], "lengths": "code_lengths.json",
           "context_limit": None}
    sc = load_scenario(_synthetic(tmp_path, "syn-rates", syn=syn))
    got = _per_hour(scenario_workload(sc), 2)
    assert abs(got[0] - 4000) < 8 * np.sqrt(4000) and abs(got[1] - 1000) < 8 * np.sqrt(1000)
    # the file is found next to the scenario and enters the reference key by content, not by location
    assert reference_inputs(sc)["workload"]["synthetic"]["lengths"].keys() == {"sha256"}
    _raises(_synthetic(tmp_path, "syn-nofile", syn={"lengths": "missing_lengths.json"}),
            "workload.synthetic.lengths", "not found")


def test_a_missing_or_broken_lengths_file_is_refused_when_the_scenario_loads(tmp_path):
    """Caught by `load_scenario` itself, before any env or workload is built."""
    with pytest.raises(ScenarioError, match="workload.synthetic.lengths.*not found"):
        load_scenario(_synthetic(tmp_path, "syn-nofile-load", syn={"lengths": "missing_lengths.json"}))
    (tmp_path / "broken_lengths.json").write_text("{not json")
    with pytest.raises(ScenarioError, match="workload.synthetic.lengths"):
        load_scenario(_synthetic(tmp_path, "syn-broken-load", syn={"lengths": "broken_lengths.json"}))


@pytest.mark.parametrize(
    "syn, words",
    [
        ({"hourly_rates": [1.0, 2.0, 3.0, 4.0]}, ["workload.synthetic", "exactly one of 'hourly_counts'"]),
        ({"hourly_counts": None}, ["workload.synthetic", "exactly one of 'hourly_counts'"]),
        ({"hourly_counts": [30, -5, 20, 40]}, ["workload.synthetic.hourly_counts", "-5", "index 1"]),
        ({"hourly_counts": None, "hourly_rates": [1.0, float("nan"), 1.0, 1.0]}, ["workload.synthetic.hourly_rates"]),
        ({"hourly_counts": [30, 1.5, 20, 40]}, ["workload.synthetic.hourly_counts"]),
        ({"lengths": "azure_chat"}, ["workload.synthetic.lengths", "azure_chat", "azure_code", "azure_conv"]),
        ({"burstiness_cv": 0}, ["workload.synthetic.burstiness_cv"]),
        ({"context_limit": 1}, ["workload.synthetic.context_limit"]),
        ({"smoth": True}, ["workload.synthetic.smoth", "unknown field"]),
    ],
)
def test_bad_synthetic_specs_are_rejected_naming_the_field(tmp_path, syn, words):
    _raises(_synthetic(tmp_path, "bad-syn", syn=syn), *words)


def test_synthetic_window_and_source_rules(tmp_path):
    _raises(_synthetic(tmp_path, "past-end", workload={"start_hour": 3}), "workload.start_hour", "4 hourly values")
    _raises(_synthetic(tmp_path, "slack", workload={"window_slack_h": 1.0, "seed": None, "rate_spread": 0.1},
                       commitment={"fractions": [1.0], "reference": {"workload_seed": 1}}), "workload.window_slack_h")
    _raises(_synthetic(tmp_path, "two-sources", workload={"builtin": "azure-conv-hour"}), "workload",
            "exactly one of 'builtin', 'trace' or 'synthetic'")
    # a fractional start: hours 1.5 .. 3.5 of the source, 25 + 20 + 20 arrivals expected on average, window exact
    sc = load_scenario(_synthetic(tmp_path, "half", workload={"start_hour": 1.5}, syn={"smooth": False}))
    t = scenario_workload(sc)
    assert t.arrival_s.min() >= 0 and t.arrival_s.max() < 2 * HOUR and 0 < len(t) <= 50 + 20 + 40


def test_synthetic_reference_uses_its_workload_seed(tmp_path):
    common = dict(commitment={"fractions": [0.9], "reference": {"workload_seed": 7}}, horizon_hours=1)
    sc = load_scenario(_synthetic(tmp_path, "syn-ref", syn={"hourly_counts": [2000, 2000]},
                                  workload={"start_hour": 0}, **common))
    doc = compute_reference(sc)
    assert doc["requests"] == 2000
    seven = load_scenario(_synthetic(tmp_path, "syn-seven", syn={"hourly_counts": [2000, 2000]},
                                     workload={"start_hour": 0, "seed": 7}, commitment={"mj": [0.2]}, horizon_hours=1))
    res = run_fixed(scenario_profile(sc), scenario_workload(seven), n_gpus=2, options=engine_options(sc, 0), hours=1,
                    interval_s=sc.interval_s)
    assert doc["hourly_energy_j"] == pytest.approx(list(res.hourly_energy_j), rel=1e-12)


# ------------------------------------------------------------------------------------------ 3. trace reference window
@pytest.fixture
def two_hour_trace(tmp_path) -> Path:
    """Hour 0: 40 requests; hour 1: 1,500 heavier ones (another day's volume)."""
    rng = np.random.default_rng(11)
    t0 = np.sort(rng.uniform(0, HOUR - 1, 40))
    t0[0] = 0.0
    t1 = np.sort(rng.uniform(HOUR, 2 * HOUR - 1, 1500))
    t = np.concatenate([t0, t1])
    p = np.concatenate([rng.integers(4, 12, 40), rng.integers(20, 40, 1500)])
    o = np.concatenate([rng.integers(1, 8, 40), rng.integers(10, 20, 1500)])
    return write_trace(tmp_path / "two.csv", t, p, o)


def _trace_sc(tmp_path, name, trace, reference, **fields) -> Path:
    base = dict(workload={"trace": str(trace)}, horizon_hours=1,
                commitment={"fractions": [0.9], "reference": reference})
    base.update(fields)
    return write_scenario(tmp_path, name, **base)


def test_trace_reference_start_hour_windows_the_same_trace(tmp_path, two_hour_trace):
    own = load_scenario(_trace_sc(tmp_path, "ref-own", two_hour_trace, {}))
    at0 = load_scenario(_trace_sc(tmp_path, "ref-0", two_hour_trace, {"start_hour": 0}))
    at1 = load_scenario(_trace_sc(tmp_path, "ref-1", two_hour_trace, {"start_hour": 1}))
    c_own, c0, c1 = (commitments_mj(s, use_cache=False)[0] for s in (own, at0, at1))
    assert c0 == c_own and reference_key(at0) == reference_key(own)  # start 0 is the evaluation window itself
    assert c1 > c0  # the busier hour asks for more energy
    # independently: full-capacity vLLM on hour 1 of the trace, at the toy profile's reference clock
    hour1 = time_window(load_azure_csv(two_hour_trace), HOUR, 2 * HOUR, rebase=True)
    assert len(hour1) == 1500 and compute_reference(at1)["requests"] == 1500
    res = run_fixed(load_profile(at1.pool.profile), hour1, n_gpus=2,
                    options=EngineOptions(alpha=at1.alpha, seed=0, noise=engine_options(at1, 0).noise), hours=1,
                    interval_s=at1.interval_s)
    assert c1 == pytest.approx(0.9 * res.hourly_energy_j[0] / 1e6, rel=1e-12)
    assert len(scenario_workload(at1)) == 40  # the evaluation workload is still hour 0


def test_trace_reference_rules(tmp_path, two_hour_trace):
    seeded = load_scenario(_trace_sc(tmp_path, "ref-seed", two_hour_trace, {"workload_seed": 1}))
    for build in (commitments_mj, reference_key, compute_reference):  # refused before any reference run
        with pytest.raises(ScenarioError) as ei:
            build(seeded)
        msg = str(ei.value)
        assert msg.startswith(f"{seeded.source}: commitment.reference.workload_seed: a trace workload"), msg
        assert "commitment.reference.start_hour" in msg
    for late in (2, 1.5):  # the reference window [late, late + 1) h runs past the trace's 2 h
        with pytest.raises(ScenarioError, match=r"commitment\.reference\.start_hour: the window .* spans 2 h"):
            commitments_mj(load_scenario(_trace_sc(tmp_path, f"ref-late-{late}", two_hour_trace, {"start_hour": late})),
                           use_cache=False)
    _raises(_trace_sc(tmp_path, "ref-slack", two_hour_trace, {},
                      workload={"trace": str(two_hour_trace), "seed": None, "window_slack_h": 1.0}),
            "commitment.reference.start_hour", "workload.seed is null")
    _raises(write_scenario(tmp_path, "ref-builtin", workload={"builtin": "azure-conv-hour"}, horizon_hours=1,
                           commitment={"fractions": [0.9], "reference": {"start_hour": 0}}),
            "commitment.reference.start_hour", "only for a trace workload")
    ok = load_scenario(_trace_sc(tmp_path, "ref-slack-ok", two_hour_trace, {"start_hour": 1},
                                 workload={"trace": str(two_hour_trace), "seed": None, "window_slack_h": 1.0}))
    assert compute_reference(ok)["requests"] == 1500


# ------------------------------------------------------------------------------------------ 4. loaders' time origin
def test_loaders_record_the_time_origin_they_shift_away(tmp_path):
    bg = tmp_path / "bg.csv"
    bg.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                  "5,ChatGPT,10,2,12,Conversation log\n45.5,GPT-4,20,3,23,Conversation log\n")
    t = load_burstgpt_csv(bg)
    assert t.meta["time_origin"] == 5.0 and t.meta["time_origin_unit"] == "s"
    np.testing.assert_allclose(t.arrival_s + t.meta["time_origin"], [5.0, 45.5])  # back on the file's clock

    mc = tmp_path / "m.jsonl"
    rows = [{"timestamp": ts, "input_length": 5, "output_length": 2} for ts in (1500, 4000)]
    mc.write_text("\n".join(json.dumps(r) for r in rows))
    t = load_mooncake_jsonl(mc)
    assert t.meta["time_origin"] == 1.5 and t.meta["start_time"] == 1500.0
    np.testing.assert_allclose(t.arrival_s + t.meta["time_origin"], [1.5, 4.0])

    az = tmp_path / "az.csv"
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 07:30:00.25+00:00,5,2\n"
                  "2024-05-10 08:30:00.75+00:00,6,3\n")
    t = load_azure_csv(az)
    origin = datetime.fromisoformat(t.meta["time_origin"].replace(" ", "T")[:26] + "+00:00")
    assert origin == datetime(2024, 5, 10, 7, 30, 0, 250000, tzinfo=timezone.utc)
    assert origin + timedelta(seconds=float(t.arrival_s[1])) == datetime(2024, 5, 10, 8, 30, 0, 750000,
                                                                        tzinfo=timezone.utc)
    # a window keeps the record (its own start is in window_s, relative to the origin)
    w = time_window(t, 1800.0, 7200.0)
    assert w.meta["time_origin"] == t.meta["time_origin"] and w.meta["window_s"] == [1800.0, 7200.0]


def test_engine_overrides_are_refused_when_the_file_is_loaded(tmp_path, long_prompt_trace):
    """Not only when an env is built: `load_scenario` alone names the field."""
    common = dict(workload={"trace": str(long_prompt_trace)}, horizon_hours=1, commitment={"mj": [0.2]})
    with pytest.raises(ScenarioError, match="engine.context_limit"):
        load_scenario(write_scenario(tmp_path, "too-long-at-load", engine={"context_limit": 65}, **common))
    with pytest.raises(ScenarioError, match="engine.prefix_block_tokens"):
        load_scenario(write_scenario(tmp_path, "odd-block-at-load", engine={"prefix_block_tokens": 6}, **common))


def test_a_trace_that_just_overruns_its_window_is_warned_about(tmp_path):
    """An operator's 50-request trace whose last two arrive after the one-hour window: the two are not served, and
    the run says so; a trace that goes on for more than a horizon past the window (a day windowed to an hour) is not
    warned about."""
    import warnings

    import numpy as np

    from commitenv.envs import CommitServeEnv
    from helpers.scenarios import write_scenario, write_trace

    t = np.concatenate([np.linspace(0.0, 3500.0, 48), [3600.8, 3638.3]])
    trace = write_trace(tmp_path / "mine.csv", t, np.full(50, 10), np.full(50, 5))
    path = write_scenario(tmp_path, "mine", workload={"trace": str(trace)}, horizon_hours=1, interval_s=600,
                          commitment={"mj": [0.1]})
    with pytest.warns(UserWarning, match=r"2 of the trace's 50 requests arrive after the window ends \(3600 s"):
        env = CommitServeEnv(str(path))
        env.reset(seed=0)
    assert len(env.table) == 48
    long = np.concatenate([np.linspace(0.0, 3500.0, 48), [3600.0 + 3700.0, 9000.0]])  # beyond one more horizon
    trace2 = write_trace(tmp_path / "day.csv", long, np.full(50, 10), np.full(50, 5))
    path2 = write_scenario(tmp_path, "day", workload={"trace": str(trace2)}, horizon_hours=1, interval_s=600,
                           commitment={"mj": [0.1]})
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        CommitServeEnv(str(path2)).reset(seed=0)
