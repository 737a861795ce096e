"""The GPU and serving-engine seams' contracts, on the CPU fakes (and, marked ``gpu``, on a real GPU through NVML
when one is present), plus what the fakes promise beyond the contract: the profile's power and step laws, NVML's
counter granularity and errors, clock latency; and the calibration that recovers a profile from the fakes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from commitenv.backends.calibrate import Grid, aligned_energy, calibrate, fit_energy, fit_time, Window
from commitenv.backends.clock import VirtualClock, WallClock
from commitenv.backends.engine import StepRecord
from commitenv.backends.fake_engine import SimEngine
from commitenv.backends.fake_gpu import FakeGpu
from commitenv.backends.gpu import GpuInvalidArgument, GpuPermissionError, LockedClocks
from commitenv.cli import main
from commitenv.profiles import load_profile
from commitenv.profiles.schema import Profile

PROFILE = "h200-qwen3.8-27b-fp8"


def _real_gpu():
    pytest.importorskip("pynvml")
    from commitenv.backends.nvml import NvmlGpu

    try:
        return NvmlGpu(0), WallClock()
    except Exception as e:  # noqa: BLE001  (no driver, no device)
        pytest.skip(f"no NVML GPU here ({type(e).__name__}: {e})")


@pytest.fixture(params=["fake", pytest.param("nvml", marks=pytest.mark.gpu)])
def device(request):
    if request.param == "fake":
        clock = VirtualClock()
        return FakeGpu(load_profile(PROFILE), clock), clock
    return _real_gpu()


# ================================================================================================ GpuControl
def test_gpu_clocks_lock_and_reset(device):
    gpu, clock = device
    levels = gpu.supported_clocks_mhz()
    assert levels == sorted(set(levels)) and all(isinstance(m, int) and m > 0 for m in levels)
    with LockedClocks([gpu]):
        target = levels[len(levels) // 2]
        gpu.lock_clock(target)
        t0 = clock.now()
        while gpu.current_clock_mhz() != target and clock.now() - t0 < 2.0:
            clock.sleep(0.01)
        assert gpu.current_clock_mhz() == target
        with pytest.raises(GpuInvalidArgument, match="supported"):
            gpu.lock_clock(max(levels) + 7)


def test_gpu_energy_counter_is_monotone_whole_mj_and_updates_every_20_to_100_ms(device):
    gpu, clock = device
    e0 = gpu.energy_mj()
    assert isinstance(e0, int)
    t_a, _ = aligned_energy(gpu, clock, 0.001)
    t_b, _ = aligned_energy(gpu, clock, 0.001)
    t_c, _ = aligned_energy(gpu, clock, 0.001)
    assert 0.018 <= (t_c - t_a) / 2 <= 0.11
    assert gpu.energy_mj() >= e0


# ================================================================================================ the fakes' physics
def test_fake_gpu_meters_the_idle_floor_of_the_effective_clock_in_whole_mj_at_ticks():
    prof = load_profile(PROFILE)
    clock = VirtualClock()
    gpu = FakeGpu(prof, clock, energy_update_s=0.05)
    top = prof.clocks[-1].active_idle_w
    clock.sleep(1.0)
    assert gpu.energy_mj() == math.floor(top * 1.0 * 1000 + 1e-9)
    clock.sleep(0.03)  # between ticks: the counter holds its value
    assert gpu.energy_mj() == math.floor(top * 1.0 * 1000 + 1e-9)
    gpu.lock_clock(prof.clocks[0].mhz)  # applies after the profile's latency
    assert gpu.current_clock_mhz() == prof.clocks[-1].mhz
    lat = prof.latencies.clock_change_s
    clock.sleep(1.0 - 0.03)  # now t = 2.0
    want = top * (1.03 + lat) + prof.clocks[0].active_idle_w * (2.0 - 1.03 - lat)
    assert gpu.current_clock_mhz() == prof.clocks[0].mhz
    assert abs(gpu.energy_mj() - want * 1000) <= 1.0
    gpu.set_state("standby")
    clock.sleep(1.0)
    assert abs(gpu.energy_mj() - (want + prof.standby_w) * 1000) <= 1.0


def test_fake_gpu_refuses_like_nvml():
    gpu = FakeGpu(load_profile(PROFILE), VirtualClock(), permitted=False)
    with pytest.raises(GpuPermissionError, match="nvidia-smi -acp UNRESTRICTED"):
        gpu.lock_clock(gpu.supported_clocks_mhz()[0])
    with pytest.raises(ValueError, match="20-100 ms"):
        FakeGpu(load_profile(PROFILE), VirtualClock(), energy_update_s=0.5)


def test_locked_clocks_are_reset_when_the_run_fails():
    clock = VirtualClock()
    gpu = FakeGpu(load_profile(PROFILE), clock)
    top = gpu.supported_clocks_mhz()[-1]
    with pytest.raises(RuntimeError, match="boom"):
        with LockedClocks([gpu]):
            gpu.lock_clock(gpu.supported_clocks_mhz()[0])
            clock.sleep(1.0)
            raise RuntimeError("boom")
    clock.sleep(1.0)
    assert gpu.current_clock_mhz() == top  # the driver's default (boost) again


# ================================================================================================ ServingEngine
def _engine(noise=0.0):
    prof = load_profile(PROFILE)
    clock = VirtualClock()
    gpu = FakeGpu(prof, clock)
    return SimEngine(prof, gpu, clock, noise_sigma=noise, seed=1), gpu, clock, prof


def test_engine_serves_every_token_once_with_the_profiles_step_law():
    eng, gpu, clock, prof = _engine()
    reqs = {f"r{i}": (p, o) for i, (p, o) in enumerate([(700, 12), (3000, 5), (20, 40), (1500, 1), (64, 64)])}
    for rid, (p, o) in reqs.items():
        eng.add_request(rid, p, o)
    steps: list[StepRecord] = []
    while eng.has_work():
        steps.append(eng.step())
    assert eng.step() is None
    first = [rid for s in steps for rid in s.first_token]
    done = [rid for s in steps for rid in s.finished]
    assert sorted(first) == sorted(reqs) and sorted(done) == sorted(reqs)
    when_first = {rid: i for i, s in enumerate(steps) for rid in s.first_token}
    when_done = {rid: i for i, s in enumerate(steps) for rid in s.finished}
    assert all(when_first[r] <= when_done[r] for r in reqs)
    assert sum(s.P for s in steps) == sum(p for p, _ in reqs.values())  # no preemption at this size
    assert sum(s.n for s in steps) == sum(o - 1 for _, o in reqs.values())  # one token with the prefill, then decode
    lvl = prof.clocks[-1]  # unlocked: the top level
    for s in steps:  # the time law by hand
        tl = lvl.time
        assert s.elapsed_s == pytest.approx(tl.tau0 + tl.tau1 * s.P + tl.tau2 * s.n + tl.tau3 * s.L + tl.tau4 * s.A,
                                            rel=1e-12)
    assert all(b.t_start == pytest.approx(a.t_start + a.elapsed_s) for a, b in zip(steps, steps[1:]))


def test_engine_energy_is_conserved_on_the_gpu_meter():
    """Counter delta = the energy law over the steps + the idle floor over the idle time (by hand)."""
    eng, gpu, clock, prof = _engine()
    lvl = prof.clocks[-1]
    t0, e0 = aligned_energy(gpu, clock, 0.001)
    for i in range(6):
        eng.add_request(f"q{i}", 400 * (i + 1), 10 + i)
    steps = []
    while eng.has_work():
        steps.append(eng.step())
    t1, e1 = aligned_energy(gpu, clock, 0.001)
    el = lvl.energy
    law = sum(el.a + el.c1 * s.P + el.c2 * s.A + el.b * s.n + el.kappa * s.L for s in steps)
    idle = lvl.active_idle_w * ((t1 - t0) - sum(s.elapsed_s for s in steps))
    # each end's time is known to half a poll (0.5 ms) and each reading to 1 mJ
    assert e1 - e0 == pytest.approx(law + idle, abs=2 * (0.0005 * lvl.active_idle_w + 1e-3))


def test_engine_sleep_and_wake():
    eng, gpu, clock, prof = _engine()
    eng.add_request("a", 10, 2)
    with pytest.raises(RuntimeError, match="still queued"):
        eng.sleep()
    while eng.has_work():
        eng.step()
    eng.sleep()
    with pytest.raises(RuntimeError, match="wake"):
        eng.add_request("b", 10, 2)
    t = clock.now()
    eng.wake()
    assert clock.now() - t == pytest.approx(prof.latencies.activation_s)
    with pytest.raises(ValueError, match="context limit"):
        eng.add_request("c", prof.scheduler.context_limit, 1)


# ================================================================================================ calibration
def test_the_fits_recover_known_coefficients_from_synthetic_data():
    rng = np.random.default_rng(3)
    true_t = np.array([0.01, 1e-4, 2e-4, 7e-8, 1e-8])
    steps = []
    for _ in range(300):
        P, n, L = int(rng.integers(0, 2048)), int(rng.integers(0, 64)), int(rng.integers(0, 200_000))
        A = int(rng.integers(0, 2_000_000))
        steps.append(StepRecord(0.0, float(true_t @ [1, P, n, L, A]), P, A, n, L))
    law, wape = fit_time(steps)
    assert np.allclose([law.tau0, law.tau1, law.tau2, law.tau3, law.tau4], true_t, rtol=1e-6) and wape < 1e-9
    true_e = np.array([3.0, 0.04, 3e-6, 0.05, 2.5e-5])  # a, c1, c2, b, kappa
    wins = []
    for _ in range(40):
        w = Window(int(rng.integers(5, 200)), int(rng.integers(0, 50_000)), int(rng.integers(0, 9_000_000)),
                   int(rng.integers(0, 3000)), int(rng.integers(0, 2_000_000)))
        w.busy_s, w.duration_s = 1.0, 1.2
        w.energy_j = float(true_e @ [w.steps, w.P, w.A, w.n, w.L]) + 80.0 * 0.2
        wins.append(w)
    elaw, ewape = fit_energy(wins, idle_w=80.0)
    assert np.allclose([elaw.a, elaw.c1, elaw.c2, elaw.b, elaw.kappa], true_e, rtol=1e-6) and ewape < 1e-9


SMALL = Grid(prefill_chunks=(128, 1024, 2048), prefill_batches=(1, 4), decode_contexts=(256, 2048),
             decode_batches=(1, 8, 48), decode_steps=16, repeats=1, idle_s=1.0, validation_requests=32)


def test_calibrating_the_fakes_recovers_their_profile():
    """Noise-free: the time law exactly (per-step timings), the energy law's large terms within 0.1 % and the
    per-request decode energy within 1 % (windows meter energy to 1 mJ and time to half a poll), powers within
    0.1 %, latencies to the polling step."""
    eng, gpu, clock, prof = _engine()
    levels = [prof.clocks[1].mhz, prof.reference_clock_mhz]
    cal = calibrate(gpu, eng, clock, prof, grid=SMALL, clocks_mhz=levels, name="fit")
    got = {c.mhz: c for c in cal.profile.clocks}
    for mhz in levels:
        want = prof.clocks[prof.clock_index(mhz)]
        for law, k, rel in (("time", "tau0", 1e-9), ("time", "tau1", 1e-9), ("time", "tau2", 1e-9),
                            ("time", "tau3", 1e-6), ("energy", "a", 1e-3), ("energy", "c1", 1e-3),
                            ("energy", "b", 1e-2)):
            w, g = getattr(want, law).model_dump()[k], getattr(got[mhz], law).model_dump()[k]
            assert g == pytest.approx(w, rel=rel), (mhz, k)
        assert got[mhz].active_idle_w == pytest.approx(want.active_idle_w, rel=1e-3)
    assert cal.profile.standby_w == pytest.approx(prof.standby_w, rel=1e-3)
    assert cal.profile.latencies.activation_s == pytest.approx(prof.latencies.activation_s, abs=1e-9)
    assert prof.latencies.clock_change_s <= cal.profile.latencies.clock_change_s <= prof.latencies.clock_change_s + 2e-3
    assert cal.validation["latency_wape"] < 1e-3 and cal.validation["energy_wape"] < 1e-3
    assert "commitenv calibrate" in cal.profile.sources["clocks"]


def test_calibrating_noisy_fakes_stays_within_the_stated_tolerance():
    """3 % lognormal noise per step: the fitted laws predict held-out steps within 5 % (WAPE)."""
    eng, gpu, clock, prof = _engine(noise=0.03)
    cal = calibrate(gpu, eng, clock, prof, grid=SMALL, clocks_mhz=[prof.reference_clock_mhz])
    assert cal.validation["latency_wape"] < 0.05 and cal.validation["energy_wape"] < 0.05


def test_cli_calibrate_writes_a_valid_profile_and_report(tmp_path, capsys):
    out, rep = tmp_path / "p" / "fit.yaml", tmp_path / "fit.json"
    assert main(["calibrate", "--fake", PROFILE, "--quick", "--clocks", "1710", "--out", str(out), "--report",
                 str(rep), "--name", "h200-fit"]) == 0
    prof = Profile.model_validate(yaml.safe_load(out.read_text()))
    assert prof.name == "h200-fit" and prof.clock_mhz == [1710]
    doc = json.loads(rep.read_text())
    assert doc["clocks"][0]["mhz"] == 1710 and doc["validation"]["latency_wape"] < 1e-3
    assert "validation latency WAPE" in capsys.readouterr().out
    assert main(["calibrate", "--fake", PROFILE, "--clocks", "1711", "--out", str(out)]) == 2
    assert "1711" in capsys.readouterr().err
    assert main(["calibrate", "--out", str(out)]) == 2
    assert "--template" in capsys.readouterr().err


def test_the_engine_seam_reports_preemptions_as_the_simulator_counts_them():
    # a KV cache of 256 tokens (16 blocks of 16) for four 40-token prompts growing to 120 tokens each: vLLM
    # preempts the newest running request when the blocks run out
    from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
    from commitenv.workload.table import make_table

    base = load_profile(PROFILE)
    # (the context limit shrinks with it: vLLM, and the engine, refuse a cache that cannot hold one full request)
    prof = base.model_copy(update={"scheduler": base.scheduler.model_copy(update={"kv_capacity_tokens": 256,
                                                                                  "context_limit": 256})})
    clock = VirtualClock()
    eng = SimEngine(prof, FakeGpu(prof, clock), clock)
    for i in range(4):
        eng.add_request(f"r{i}", 40, 80)
    counted = {f"r{i}": 0 for i in range(4)}
    while eng.has_work():
        for rid in eng.step().preempted:
            counted[rid] += 1
    pool = Pool(prof, PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0), closed_form=False))
    pool.attach(make_table(np.zeros(4), np.full(4, 40), np.full(4, 80)))
    pool.run_until(math.inf)
    assert sum(counted.values()) > 0
    assert [counted[f"r{i}"] for i in range(4)] == pool.preemptions.tolist()
