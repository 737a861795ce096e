"""H100 profiles of Festina's three co-hosted models (Qwen2.5-7B, Llama-2-13B, Mistral-Small-24B) and their
cold-start (model load) figures.

Architecture arithmetic is written out here from the models' public config.json shapes, not taken from derive.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from commitenv._paths import data_dir
from commitenv.profiles import Profile, ProfileError, load_profile
from commitenv.profiles.schema import Latencies
from helpers.paths import ROOT as REPO

FESTINA = ("h100-qwen2.5-7b-festina", "h100-llama2-13b", "h100-mistral-small-24b")  # ascending model size
OLD = ("h100-qwen2.5-7b", "h20-qwen3.8-27b-fp8", "h200-qwen3.8-27b-fp8")

# (layers, KV heads, head dim, parameter count) from the public config.json files
ARCH = {
    "h100-qwen2.5-7b-festina": (28, 4, 128, None),
    "h100-llama2-13b": (40, 40, 128, 40 * (4 * 5120**2 + 3 * 5120 * 13824 + 2 * 5120) + 2 * 32000 * 5120 + 5120),
    "h100-mistral-small-24b": (40, 8, 128, 40 * (5120 * (4096 + 2 * 1024) + 4096 * 5120 + 3 * 5120 * 32768 + 2 * 5120)
                               + 2 * 131072 * 5120 + 5120),
}
PCIE_GBS, PCIE_EFF, INIT_S = 64.0, 0.8, 30.0  # the stated cold-start assumptions


@pytest.fixture(scope="module", params=FESTINA)
def prof(request) -> Profile:
    return load_profile(request.param)


def test_profiles_load_validate_and_source_load_figures(prof: Profile) -> None:
    assert prof.gpu.name.startswith("NVIDIA H100")
    assert prof.reference_clock_mhz == max(prof.clock_mhz)
    for key in ("latencies.load_s", "latencies.load_w", "model.kv_bytes_per_token", "scheduler.kv_capacity_tokens"):
        assert prof.sources[key].strip(), key
    assert prof.latencies.load_s is not None and prof.latencies.load_w is not None


def test_kv_bytes_and_capacity_by_hand(prof: Profile) -> None:
    layers, kv_heads, head_dim, _ = ARCH[prof.name]
    kv = 2 * layers * kv_heads * head_dim * 2  # K and V, 16-bit
    assert prof.model.kv_bytes_per_token == kv
    # vLLM gpu_memory_utilization 0.9 of 80 GB, minus weights and 4 GB of activations, in whole 16-token blocks
    free = 0.9 * 80e9 - prof.model.weight_gb * 1e9 - 4e9
    tokens = int(free // kv) // 16 * 16
    assert prof.scheduler.kv_capacity_tokens == tokens
    assert prof.scheduler.kv_capacity_tokens >= prof.scheduler.context_limit


def test_llama2_kv_and_params_by_hand() -> None:
    p = load_profile("h100-llama2-13b")
    assert p.model.kv_bytes_per_token == 819_200  # no GQA: 2 x 40 x 40 x 128 x 2 B
    assert ARCH[p.name][3] == 13_015_864_320
    assert p.model.params_b == pytest.approx(13.016, abs=5e-4)
    assert p.model.weight_gb == pytest.approx(2 * 13.015864320, abs=0.01)
    assert p.scheduler.kv_capacity_tokens == 51_232  # (72 - 26.03 - 4) GB / 819,200 B, floored to 16


def test_mistral_params_by_hand() -> None:
    p = load_profile("h100-mistral-small-24b")
    assert p.model.kv_bytes_per_token == 163_840  # 2 x 40 x 8 x 128 x 2 B
    assert ARCH[p.name][3] == 23_572_403_200
    assert p.model.params_b == pytest.approx(23.572, abs=5e-4)
    assert p.model.weight_gb == pytest.approx(2 * 23.5724032, abs=0.01)


def test_context_limits() -> None:
    assert load_profile("h100-llama2-13b").scheduler.context_limit <= 4096
    assert load_profile("h100-mistral-small-24b").scheduler.context_limit <= 32768
    assert load_profile("h100-qwen2.5-7b-festina").scheduler.context_limit <= 32768


def test_decode_energy_grows_with_model_size_at_reference_clock() -> None:
    profs = [load_profile(n) for n in FESTINA]
    ref = [p.clocks[p.reference_clock_index].energy for p in profs]
    assert ref[0].a < ref[1].a < ref[2].a  # weight read per decode step
    # decode-step energy per request: one request alone, and a batch of 32, at context 1,024
    for n in (1, 32):
        per_req = [(e.a + e.b * n + e.kappa * n * 1024) / n for e in ref]
        assert per_req[0] < per_req[1] < per_req[2], (n, per_req)
    # weights (and so tau0) ordered the same way
    w = [p.model.weight_gb for p in profs]
    assert w == sorted(w)


def test_load_time_and_energy_by_hand(prof: Profile) -> None:
    want = prof.model.weight_gb / (PCIE_GBS * PCIE_EFF) + INIT_S
    assert prof.latencies.load_s == pytest.approx(want, rel=1e-5)
    ref = prof.clocks[prof.reference_clock_index]
    assert prof.latencies.load_w == pytest.approx(ref.active_idle_w, rel=1e-6)
    assert prof.latencies.load_energy_j == pytest.approx(want * ref.active_idle_w, rel=1e-5)


def test_qwen_variant_keeps_the_original_laws() -> None:
    old, new = load_profile("h100-qwen2.5-7b"), load_profile("h100-qwen2.5-7b-festina")
    assert old.clocks == new.clocks and old.model == new.model and old.standby_w == new.standby_w
    assert old.latencies.load_s is None and old.latencies.load_energy_j is None


def test_load_fields_optional_both_or_neither() -> None:
    lat = Latencies(clock_change_s=0.05, activation_s=3.0)
    assert lat.load_s is None and lat.load_w is None and lat.load_energy_j is None
    assert lat.model_dump() == {"clock_change_s": 0.05, "activation_s": 3.0}  # unprofiled: not serialised
    with pytest.raises(ValueError, match="load_s and load_w"):
        Latencies(clock_change_s=0.05, activation_s=3.0, load_s=10.0)
    with pytest.raises(ValueError):
        Latencies(clock_change_s=0.05, activation_s=3.0, load_s=-1.0, load_w=100.0)


def test_load_figure_without_source_fails(tmp_path: Path) -> None:
    import yaml

    raw = yaml.safe_load((data_dir("profiles") / "h100-llama2-13b.yaml").read_text())
    del raw["sources"]["latencies.load_s"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ProfileError, match=r"latencies\.load_s"):
        load_profile(path)


@pytest.mark.parametrize("name", OLD)
def test_existing_profile_files_unchanged(name: str) -> None:
    text = (data_dir("profiles") / f"{name}.yaml").read_bytes()
    head = subprocess.run(["git", "show", f"HEAD:profiles/{name}.yaml"], cwd=REPO, capture_output=True)
    if head.returncode != 0:
        pytest.skip(f"git show unavailable: {head.stderr.decode()[:200]}")
    assert text == head.stdout
    assert "load_s" not in text.decode()
