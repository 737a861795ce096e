"""Shipped profiles: loading, validation errors, physics of the derived laws, and no drift from derive.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from commitenv._paths import data_dir
from commitenv.profiles import Profile, ProfileError, list_profiles, load_profile
from commitenv.profiles import derive
from helpers.paths import SHARED

SHIPPED = ("h20-qwen3.8-27b-fp8", "h200-qwen3.8-27b-fp8", "h100-qwen2.5-7b",
           "h100-qwen2.5-7b-festina", "h100-llama2-13b", "h100-mistral-small-24b")


def _raw(name: str) -> dict[str, Any]:
    return yaml.safe_load((data_dir("profiles") / f"{name}.yaml").read_text())


def _write(tmp_path: Path, raw: dict[str, Any], fname: str = "bad.yaml") -> Path:
    p = tmp_path / fname
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    return p


def _step(prof: Profile, idx: int, P: float = 0, n: float = 0, L: float = 0, A: float = 0) -> tuple[float, float]:
    c = prof.clocks[idx]
    t, e = c.time, c.energy
    time = t.tau0 + t.tau1 * P + t.tau2 * n + t.tau3 * L + t.tau4 * A
    energy = e.a + e.c1 * P + e.c2 * A + e.b * n + e.kappa * L
    return time, energy


def _prefill(prof: Profile, idx: int, p: int = 2048) -> tuple[float, float]:
    return _step(prof, idx, P=p, A=p * (p + 1) / 2)


def _decode(prof: Profile, idx: int, n: int, ctx: int = 2060) -> tuple[float, float]:
    return _step(prof, idx, n=n, L=n * ctx)


# --- loading and validation ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_load_and_validate(name: str) -> None:
    assert name in list_profiles()
    prof = load_profile(name)
    assert prof.name == name
    assert prof.clock_mhz == sorted(prof.clock_mhz) and len(prof.clock_mhz) == 5
    assert prof.reference_clock_mhz == max(prof.clock_mhz)
    assert prof.standby_w < min(c.active_idle_w for c in prof.clocks)
    for c in prof.clocks:
        assert c.draining_idle_w == c.active_idle_w
    assert prof.kv_capacity_blocks * prof.scheduler.block_size == prof.scheduler.kv_capacity_tokens
    # every source entry is non-empty text
    assert all(v.strip() for v in prof.sources.values())


def test_numeric_field_without_source_fails_naming_it(tmp_path: Path) -> None:
    raw = _raw(SHIPPED[0])
    del raw["sources"]["standby_w"]
    path = _write(tmp_path, raw)
    with pytest.raises(ProfileError) as ei:
        load_profile(path)
    msg = str(ei.value)
    assert "standby_w" in msg and str(path.resolve()) in msg and "source" in msg


def test_coefficient_without_source_fails_naming_it(tmp_path: Path) -> None:
    raw = _raw(SHIPPED[0])
    del raw["sources"]["clocks.energy.kappa"]
    with pytest.raises(ProfileError, match=r"clocks\.energy\.kappa"):
        load_profile(_write(tmp_path, raw))


def test_non_ascending_clocks_fail(tmp_path: Path) -> None:
    raw = _raw(SHIPPED[0])
    raw["clocks"][0], raw["clocks"][1] = raw["clocks"][1], raw["clocks"][0]
    path = _write(tmp_path, raw)
    with pytest.raises(ProfileError) as ei:
        load_profile(path)
    assert "clocks" in str(ei.value) and "ascending" in str(ei.value) and path.name in str(ei.value)


def test_unsupported_reference_clock_fails(tmp_path: Path) -> None:
    raw = _raw(SHIPPED[0])
    raw["reference_clock_mhz"] = 1234
    path = _write(tmp_path, raw)
    with pytest.raises(ProfileError) as ei:
        load_profile(path)
    assert "reference_clock_mhz" in str(ei.value) and "1234" in str(ei.value) and path.name in str(ei.value)


def test_negative_coefficient_fails(tmp_path: Path) -> None:
    raw = _raw(SHIPPED[0])
    raw["clocks"][2]["time"]["tau1"] = -1e-4
    path = _write(tmp_path, raw)
    with pytest.raises(ProfileError) as ei:
        load_profile(path)
    assert "clocks.2.time.tau1" in str(ei.value) and path.name in str(ei.value)


def test_missing_field_fails(tmp_path: Path) -> None:
    raw = _raw(SHIPPED[0])
    del raw["scheduler"]["kv_capacity_tokens"]
    path = _write(tmp_path, raw)
    with pytest.raises(ProfileError) as ei:
        load_profile(path)
    assert "scheduler.kv_capacity_tokens" in str(ei.value) and "required" in str(ei.value).lower()
    assert path.name in str(ei.value)


def test_bad_yaml_fails(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nclocks: [1, 2\n  - : :\n")
    with pytest.raises(ProfileError) as ei:
        load_profile(path)
    assert "broken.yaml" in str(ei.value) and "YAML" in str(ei.value)


def test_missing_file_fails(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(ProfileError) as ei:
        load_profile(path)
    assert "nowhere.yaml" in str(ei.value) and "not found" in str(ei.value)
    with pytest.raises(ProfileError, match="unknown profile"):
        load_profile("no-such-profile")


# --- physics ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SHIPPED)
def test_prefill_scales_with_clock_decode_much_less(name: str) -> None:
    prof = load_profile(name)
    lo, top = 0, prof.reference_clock_index
    ratio_f = prof.clock_mhz[top] / prof.clock_mhz[lo]
    pre = _prefill(prof, lo)[0] / _prefill(prof, top)[0]
    assert pre == pytest.approx(ratio_f, rel=0.15)
    for n in (1, 32):
        dec = _decode(prof, lo, n)[0] / _decode(prof, top, n)[0]
        assert 1.0 < dec < 1.0 + 0.5 * (ratio_f - 1.0), (n, dec, ratio_f)
    # and every time coefficient grows (weakly) as the clock falls
    for k in ("tau0", "tau1", "tau2", "tau3", "tau4"):
        vals = [getattr(c.time, k) for c in prof.clocks]
        assert vals == sorted(vals, reverse=True), k


@pytest.mark.parametrize("name", SHIPPED)
def test_busy_power_rises_steeply_and_convexly(name: str) -> None:
    prof = load_profile(name)
    mhz = prof.clock_mhz
    for phase in ("prefill", "decode"):
        pw = []
        for i in range(len(mhz)):
            t, e = _prefill(prof, i) if phase == "prefill" else _decode(prof, i, 32)
            pw.append(e / t)
        slopes = [(pw[i + 1] - pw[i]) / (mhz[i + 1] - mhz[i]) for i in range(len(mhz) - 1)]
        assert all(s > 0 for s in slopes), (phase, pw)
        assert all(s2 >= 0.95 * s1 for s1, s2 in zip(slopes, slopes[1:])), (phase, slopes)
        assert pw[-1] > pw[0] * (3.0 if phase == "prefill" else 1.8), (phase, pw)
        assert pw[-1] <= prof.gpu.tdp_w * 1.001
        assert all(p > c.active_idle_w for p, c in zip(pw, prof.clocks))
    idle = [c.active_idle_w for c in prof.clocks]
    assert idle == sorted(idle) and idle[-1] < 1.6 * idle[0]  # mild rise with the held clock


@pytest.mark.parametrize("name", ["h20-qwen3.8-27b-fp8", "h200-qwen3.8-27b-fp8"])
def test_energy_per_token_is_u_shaped(name: str) -> None:
    prof = load_profile(name)
    per_tok = [_prefill(prof, i)[1] / 2048 for i in range(len(prof.clocks))]
    k = per_tok.index(min(per_tok))
    assert 0 < k < len(per_tok) - 1, per_tok
    if name.startswith("h20-"):
        dec = [_decode(prof, i, 32)[1] / 32 for i in range(len(prof.clocks))]
        kd = dec.index(min(dec))
        assert 0 < kd < len(dec) - 1, dec
        assert kd <= k  # decode prefers a lower clock than prefill (Festina sec. 2.2)


def test_h20_calibration_anchors() -> None:
    prof = load_profile("h20-qwen3.8-27b-fp8")
    top = prof.reference_clock_index
    assert prof.clocks[top].active_idle_w == pytest.approx(14.0e6 / (32 * 3600), rel=0.05)
    t_pre = _prefill(prof, top)[0]
    assert 0.5 <= t_pre <= 0.8
    idle = prof.clocks[top].active_idle_w
    t, e = _prefill(prof, top)
    marginal = e - idle * t
    for j in range(1, 28):
        t, e = _step(prof, top, n=1, L=2048 + j)
        marginal += e - idle * t
    assert 150.0 <= marginal <= 260.0


@pytest.mark.parametrize("gpu", ["h20", "h200"])
def test_pool_idle_floor_fits_under_the_papers_quietest_hour(gpu: str) -> None:
    """Every one of the paper's 32 GPUs is active under vLLM all hour, so its hourly reference energy is at least the
    pool's active-idle floor: the profile's floor must fit under the quietest hour with room for that hour's work
    (docs/results/realism.md, "Idle floor": this is why a 122 W H200 floor cannot hold)."""
    import csv

    from commitenv.scenarios import load_scenario

    day_csv = SHARED / "data" / "paper" / "epact_day_hourly.csv"
    if not day_csv.is_file():
        pytest.skip("../shared/data/paper/epact_day_hourly.csv not present")
    with day_csv.open() as f:
        quietest_j = min(float(row[f"{gpu}_reference_vllm_mj"]) for row in csv.DictReader(f)) * 1e6
    sc = load_scenario(f"epact-{gpu}-day")
    prof = load_profile(sc.pool.profile)
    floor_j = sc.pool.gpus * 3600.0 * prof.clocks[prof.reference_clock_index].active_idle_w
    assert floor_j < 0.9 * quietest_j  # at least 10 % of the quietest hour is serving work


def test_h100_reproduces_stepsplit() -> None:
    prof = load_profile("h100-qwen2.5-7b")
    top = prof.reference_clock_index
    assert _step(prof, top, n=1, L=512)[1] == pytest.approx(2.66, rel=0.05)
    assert _step(prof, top, n=256, L=256 * 512)[1] == pytest.approx(9.15, rel=0.05)
    assert _step(prof, top, n=1, L=512)[0] == pytest.approx(6.70e-3, rel=0.10)
    assert _prefill(prof, top, 7142)[0] == pytest.approx(0.158, rel=0.05)
    assert 0.172 * 0.99 <= prof.clocks[top].energy.a / prof.model.weight_gb <= 0.212


# --- no drift between derive.py and the shipped files ---------------------------------------------------
def test_shipped_yaml_matches_derive_exactly() -> None:
    rendered = derive.render_all()
    assert set(rendered) == set(SHIPPED)
    for name, text in rendered.items():
        assert (data_dir("profiles") / f"{name}.yaml").read_text() == text, (
            f"{name}.yaml drifted from commitenv/profiles/derive.py; rerun `python -m commitenv.profiles.derive`"
        )
