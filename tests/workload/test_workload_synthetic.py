"""Length tables, the synthetic generator and the built-in workloads."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

import commitenv.workload as wl
from commitenv.workload import (
    AZURE_CODE_DAY_HOURLY_COUNTS,
    EmpiricalLengths,
    WorkloadError,
    azure_code_day,
    builtin_lengths,
    builtin_workload,
    list_builtin,
    make_table,
    synthesize,
)
from commitenv.workload.build_length_tables import main as build_main
from helpers.paths import SHARED

SHARED_DATA = SHARED / "data"
TRACES = SHARED_DATA / "traces"
PKG_DATA = Path(wl.__file__).resolve().parent / "data"


def hourly(table, n_hours):
    return np.bincount((table.arrival_s // 3600).astype(np.int64), minlength=n_hours)


def gap_cv(table):
    g = np.diff(table.arrival_s)
    return g.std() / g.mean()


@pytest.fixture(scope="module")
def conv():
    return builtin_lengths("azure_conv")


# --- lengths -----------------------------------------------------------------------------------------------------

def test_length_table_fits_its_source():
    rng = np.random.default_rng(7)
    p = np.exp(rng.normal(6.5, 1.0, 40_000)).astype(np.int64) + 1
    o = np.maximum(1, (p * rng.uniform(0.05, 0.2, len(p))).astype(np.int64))  # output grows with prompt
    src = make_table(np.arange(len(p), dtype=float), p, o)
    lengths = EmpiricalLengths.from_table(src, n_bins=8)
    sp, so = lengths.sample(200_000, np.random.default_rng(1))
    for q in (0.1, 0.5, 0.9, 0.99):
        assert np.quantile(sp, q) == pytest.approx(np.quantile(p, q), rel=0.03)
        assert np.quantile(so, q) == pytest.approx(np.quantile(o, q), rel=0.05)
    # the dependence survives: mean output of the longest-prompt eighth vs the shortest eighth
    hi, lo = sp > np.quantile(sp, 7 / 8), sp < np.quantile(sp, 1 / 8)
    src_ratio = o[p > np.quantile(p, 7 / 8)].mean() / o[p < np.quantile(p, 1 / 8)].mean()
    assert so[hi].mean() / so[lo].mean() == pytest.approx(src_ratio, rel=0.1)
    assert sp.dtype == np.int64 and so.min() >= 1 and sp.min() >= 1


def test_lengths_deterministic_and_roundtrip(conv):
    a = conv.sample(1000, np.random.default_rng(3))
    b = conv.sample(1000, np.random.default_rng(3))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    again = EmpiricalLengths.from_dict(json.loads(json.dumps(conv.to_dict())))
    c = again.sample(1000, np.random.default_rng(3))
    assert all(np.array_equal(x, y) for x, y in zip(a, c))


def test_context_limit_caps_prompt_and_total():
    table = make_table(np.zeros(4), [100, 20_000, 15_000, 16_383], [50, 10, 5_000, 900])
    lengths = EmpiricalLengths.from_table(table, n_bins=2).with_context_limit(16_384)
    p, o = lengths.sample(50_000, np.random.default_rng(0))
    assert p.max() <= 16_383 and (p + o).max() <= 16_384 and o.min() >= 1
    assert p.max() == 16_383  # the cap binds on this table


def test_length_table_validation():
    good = builtin_lengths("azure_code").to_dict()
    bad = dict(good, output_quantiles=[[5.0, 3.0] + [3.0] * (len(good["output_probs"]) - 2)])
    with pytest.raises(WorkloadError, match="non-decreasing"):
        EmpiricalLengths.from_dict(bad, where="x.json")
    with pytest.raises(WorkloadError, match="lacks field 'prompt_probs'"):
        EmpiricalLengths.from_dict({k: v for k, v in good.items() if k != "prompt_probs"})
    with pytest.raises(WorkloadError, match="not a length table"):
        EmpiricalLengths.from_dict({"format": "other"})
    with pytest.raises(WorkloadError, match="no built-in length table 'nope'"):
        builtin_lengths("nope")


@pytest.mark.parametrize(
    "name, p_mean, p_med, p99, o_mean, o_med, o99",
    [("azure_code", 2048, 1469, 7436, 27.9, 13, 251), ("azure_conv", 1155, 1020, 4142, 211.13, 129, 601)],
)
def test_shipped_tables_match_published_stats(name, p_mean, p_med, p99, o_mean, o_med, o99):
    lengths = builtin_lengths(name)
    assert "CC-BY-4.0" in lengths.source and "AzurePublicDataset" in lengths.source
    s = lengths.summary
    assert s["prompt"]["mean"] == pytest.approx(p_mean, abs=1) and s["prompt"]["median"] == p_med
    assert s["output"]["mean"] == pytest.approx(o_mean, abs=0.05) and s["output"]["median"] == o_med
    p, o = lengths.sample(300_000, np.random.default_rng(0))
    assert np.median(p) == pytest.approx(p_med, rel=0.02) and np.quantile(p, 0.99) == pytest.approx(p99, rel=0.03)
    assert np.median(o) == pytest.approx(o_med, rel=0.05) and np.quantile(o, 0.99) == pytest.approx(o99, rel=0.05)
    assert p.mean() == pytest.approx(p_mean, rel=0.02) and o.mean() == pytest.approx(o_mean, rel=0.03)


@pytest.mark.skipif(not TRACES.is_dir(), reason="shared traces not present")
@pytest.mark.parametrize("kind", ["code", "conv"])
def test_build_script_reproduces_shipped_table(tmp_path, kind, capsys):
    out = tmp_path / "t.json"
    assert build_main([str(TRACES / f"AzureLLMInferenceTrace_{kind}_2023.csv"), str(out)]) == 0
    assert out.read_text() == (PKG_DATA / f"azure_{kind}_lengths.json").read_text()
    assert "wrote" in capsys.readouterr().out


def test_build_script_reports_bad_trace(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    assert build_main([str(bad), str(tmp_path / "o.json")]) == 1
    assert "bad.csv: line 1" in capsys.readouterr().err and not (tmp_path / "o.json").exists()


# --- synthetic ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cv", [1.0, 2.0])
def test_exact_hourly_counts(conv, cv):
    counts = [5, 0, 1000, 37, 1, 2500]
    t = synthesize(counts, lengths=conv, seed=1, burstiness_cv=cv)
    assert hourly(t, 6).tolist() == counts
    assert len(t) == sum(counts) and np.all(np.diff(t.arrival_s) >= 0)
    assert t.arrival_s.min() >= 0 and t.arrival_s.max() < 6 * 3600
    assert t.request_id.tolist() == list(range(len(t))) and t.tenant_names == ("default",)


def test_start_offset_and_tenant(conv):
    t = synthesize([10, 20], lengths=conv, seed=0, start_s=7200.0, tenant="code")
    assert hourly(t, 4).tolist() == [0, 0, 10, 20] and t.tenant_names == ("code",)


def test_determinism_and_seed_sensitivity(conv):
    a = synthesize([300, 400], lengths=conv, seed=5, burstiness_cv=1.5)
    b = synthesize([300, 400], lengths=conv, seed=5, burstiness_cv=1.5)
    c = synthesize([300, 400], lengths=conv, seed=6, burstiness_cv=1.5)
    for col in ("arrival_s", "prompt_tokens", "output_tokens"):
        assert np.array_equal(getattr(a, col), getattr(b, col))
        assert not np.array_equal(getattr(a, col), getattr(c, col))
    assert hourly(a, 2).tolist() == hourly(c, 2).tolist() == [300, 400]


def test_arrivals_do_not_depend_on_lengths(conv):
    a = synthesize([500], lengths=conv, seed=2)
    b = synthesize([500], lengths=builtin_lengths("azure_code"), seed=2)
    assert np.array_equal(a.arrival_s, b.arrival_s)


@pytest.mark.parametrize("cv", [0.5, 1.0, 1.5, 2.0])
def test_interarrival_cv_matches_request(conv, cv):
    t = synthesize([20_000] * 10, lengths=conv, seed=0, burstiness_cv=cv)
    assert gap_cv(t) == pytest.approx(cv, rel=0.03)
    r = synthesize(hourly_rates=[20_000] * 10, lengths=conv, seed=0, burstiness_cv=cv)
    assert gap_cv(r) == pytest.approx(cv, rel=0.03)


def test_rates_give_expected_counts(conv):
    totals = [len(synthesize(hourly_rates=[2000.0, 0.0, 6000.0], lengths=conv, seed=s)) for s in range(20)]
    assert np.mean(totals) == pytest.approx(8000, rel=0.01)  # Poisson: sd of the mean of 20 is ~20
    t = synthesize(hourly_rates=[2000.0, 0.0, 6000.0], lengths=conv, seed=0)
    h = hourly(t, 3)
    assert h[1] == 0 and h[2] / h[0] == pytest.approx(3.0, rel=0.1)


def test_smooth_rate_shapes_the_hour(conv):
    # Levels 100, 1000, 10000 at hour midpoints: in hour 1 the intensity rises linearly 550 -> 1000 -> 5500,
    # so its second half holds (1000 + 5500) / (550 + 2 * 1000 + 5500) = 0.8075 of the hour's arrivals.
    t = synthesize([100, 1000 * 100, 10_000], lengths=conv, seed=0, smooth=True)
    flat = synthesize([100, 1000 * 100, 10_000], lengths=conv, seed=0, smooth=False)
    assert hourly(t, 3).tolist() == [100, 100_000, 10_000]

    def second_half_share(table):
        x = table.arrival_s[(table.arrival_s >= 3600) & (table.arrival_s < 7200)]
        return np.mean(x >= 5400)

    assert second_half_share(flat) == pytest.approx(0.5, abs=0.01)
    # hour 1's own level is 100,000 here, so the linear ramp is 50,050 -> 100,000 -> 55,000
    expected = (100_000 + 55_000) / (50_050 + 2 * 100_000 + 55_000)
    assert second_half_share(t) == pytest.approx(expected, abs=0.01)


def test_minute_shape(conv):
    shape = np.r_[np.ones(30), np.zeros(30)]
    t = synthesize([2000, 3000], lengths=conv, seed=0, minute_shape=shape)
    assert hourly(t, 2).tolist() == [2000, 3000]
    assert np.all((t.arrival_s % 3600) <= 1800)
    with pytest.raises(WorkloadError, match="minute_shape"):
        synthesize([10], lengths=conv, seed=0, minute_shape=[1.0] * 59)
    with pytest.raises(WorkloadError, match="zero weight"):
        synthesize([10], lengths=conv, seed=0, minute_shape=np.zeros(60))


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({}, "exactly one"),
        ({"hourly_counts": [1], "hourly_rates": [1.0]}, "exactly one"),
        ({"hourly_counts": [1.5]}, "whole numbers"),
        ({"hourly_counts": [-1]}, ">= 0"),
        ({"hourly_counts": []}, "non-empty"),
        ({"hourly_counts": [1], "burstiness_cv": 0.0}, "burstiness_cv"),
        ({"hourly_counts": [1], "start_s": -1.0}, "start_s"),
    ],
)
def test_synthesize_rejects_bad_arguments(conv, kwargs, words):
    with pytest.raises(WorkloadError, match=words):
        synthesize(lengths=conv, seed=0, **kwargs)


def test_million_requests(conv):
    t = synthesize([1_000_000 // 24] * 24, lengths=conv, seed=0, burstiness_cv=1.7)
    assert len(t) == (1_000_000 // 24) * 24


# --- built-in workloads ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def day():
    return azure_code_day(seed=0)


def test_azure_code_day_counts(day):
    counts = hourly(day, 24)
    assert len(day) == 969_781 == sum(AZURE_CODE_DAY_HOURLY_COUNTS)
    assert counts.tolist() == list(AZURE_CODE_DAY_HOURLY_COUNTS)
    assert counts.argmin() == 10 and counts.argmax() == 19
    assert 150 <= counts[10] / 60 <= 300 and 900 <= counts[19] / 60 <= 1400  # requests per minute
    assert day.arrival_s.max() < 86_400
    assert (day.prompt_tokens + day.output_tokens).max() <= 16_384


def test_azure_code_day_other_seed_same_counts(day):
    other = azure_code_day(seed=1)
    assert hourly(other, 24).tolist() == list(AZURE_CODE_DAY_HOURLY_COUNTS)
    assert not np.array_equal(other.arrival_s, day.arrival_s)
    assert np.array_equal(builtin_workload("azure-code-day", 0).arrival_s, day.arrival_s)


def test_azure_code_day_burstiness(day):
    # minute counts within hour 3 (~790/min) vary far more than Poisson: index of dispersion ~ cv**2 = 4
    minute = np.bincount((day.arrival_s // 60).astype(np.int64), minlength=1440)[180:240]
    assert 2.5 < minute.var() / minute.mean() < 6.5


@pytest.mark.skipif(not (SHARED_DATA / "paper" / "epact_day_hourly.csv").is_file(), reason="shared paper data absent")
def test_hourly_counts_follow_documented_derivation():
    with open(SHARED_DATA / "paper" / "epact_day_hourly.csv") as f:
        energy = np.array([float(r["h20_reference_vllm_mj"]) for r in csv.DictReader(f)])
    share = (energy - 14.0) / (energy - 14.0).sum() * 969_781
    floor = np.floor(share).astype(np.int64)
    order = np.argsort(-(share - floor), kind="stable")
    floor[order[: 969_781 - floor.sum()]] += 1
    assert floor.tolist() == list(AZURE_CODE_DAY_HOURLY_COUNTS)


def test_builtin_registry():
    assert list_builtin() == ["azure-code-day", "azure-conv-hour"]
    hour = builtin_workload("azure-conv-hour", seed=3)
    assert len(hour) == 19_366 and hour.arrival_s.max() < 3600
    assert hour.output_tokens.mean() == pytest.approx(211, rel=0.05)
    with pytest.raises(WorkloadError, match="unknown built-in workload 'x'.*azure-code-day"):
        builtin_workload("x")


def test_builtin_data_ships_inside_the_package():
    for name in ("azure_code", "azure_conv"):
        assert (PKG_DATA / f"{name}_lengths.json").is_file()
    src = (Path(wl.__file__).resolve().parent / "builtin.py").read_text()
    assert "/work/" not in src and "open(" not in src  # nothing read from outside the package
