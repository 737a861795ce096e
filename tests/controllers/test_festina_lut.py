"""Festina's look-up table (`commitenv_controllers.festina.lut`, paper sec. 3.2.1, 3.3, 3.4).

Expectations are computed by hand from the profile's coefficients (the toy profiles of conftest.py, with the
SM-share scaling written out from `commitenv.profiles.schema`) or from an independent step-by-step evaluation of
the laws (one step per prefill chunk with `attention_pairs`), never copied from the implementation's output.
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest

from helpers.profiles import attn_toy_profile

from commitenv.profiles import load_profile
from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
from commitenv.sim.coeffs import attention_pairs, coeffs_for
from commitenv.workload.table import make_table
from commitenv_controllers.festina.lut import DEFAULT_SHARES, FestinaLUT, LutGrid

TOY_LENS = (2, 4, 6, 8, 12, 16, 24, 32, 48)  # toy budget 8: one chunk up to 8, then 2, 3, 4, 6 chunks


@pytest.fixture(scope="module")
def toy_lut() -> FestinaLUT:
    prof = attn_toy_profile()
    return FestinaLUT.from_profile(prof, LutGrid((500, 1000), DEFAULT_SHARES, TOY_LENS), degree=3)


@pytest.fixture(scope="module")
def h100():
    return load_profile("h100-qwen2.5-7b")


@pytest.fixture(scope="module")
def h100_lut(h100) -> FestinaLUT:
    return FestinaLUT.from_profile(h100, degree=3)


def law_prefill(k, budget: int, p: int) -> tuple[float, float]:
    """Independent evaluation: one step per chunk of at most ``budget`` tokens, attention history growing."""
    t = e = 0.0
    done = 0
    while done < p:
        c = min(budget, p - done)
        A = attention_pairs(c, done)
        t += k.step_time(c, 0, 0, A)
        e += k.step_energy(c, 0, 0, A)
        done += c
    return t, e


def midpoints(lens) -> np.ndarray:
    lens = np.asarray(lens, dtype=float)
    return np.unique(np.concatenate([np.linspace(a, b, 5)[1:-1].round() for a, b in pairwise(lens)]))


# ------------------------------------------------------------------------------------------ grid points by hand
def test_single_chunk_ttft_tbt_and_powers_by_hand(toy_lut):
    # attn toy, top clock, full share: t = 0.01 + 0.001 P + 0.0001 n + 1e-5 L + 1e-6 A, E = 1 + 0.1 P + 0.01 n
    # + 0.001 L + 1e-4 A. p = 6 <= budget 8: one step, A = 6*7/2 = 21
    ttft, e_pre = 0.01 + 0.006 + 21e-6, 1.0 + 0.6 + 21e-4
    assert toy_lut.ttft(1000, 1.0, 6) == pytest.approx(ttft, rel=1e-12)
    assert toy_lut.prefill_power(1000, 1.0, 6) == pytest.approx(e_pre / ttft, rel=1e-12)
    # TBT: one decode step at context 7: tau0 + tau2 + tau3 * 7
    tbt, e_dec = 0.01 + 0.0001 + 7e-5, 1.0 + 0.01 + 0.007
    assert toy_lut.tbt(1000, 1.0, 6) == pytest.approx(tbt, rel=1e-12)
    assert toy_lut.decode_power(1000, 1.0, 6) == pytest.approx(e_dec / tbt, rel=1e-12)
    # the stored table holds the same grid point
    ci, si, pi = 1, 9, TOY_LENS.index(6)
    assert toy_lut.ttft_s[ci, si, pi] == pytest.approx(ttft, rel=1e-12)
    assert toy_lut.tbt_s[ci, si, pi] == pytest.approx(tbt, rel=1e-12)
    assert toy_lut.prefill_w[ci, si, pi] == pytest.approx(e_pre / ttft, rel=1e-12)
    assert toy_lut.decode_w[ci, si, pi] == pytest.approx(e_dec / tbt, rel=1e-12)


def test_two_chunk_ttft_by_hand(toy_lut):
    # p = 12 > budget 8: chunk 8 after 0 (A = 36), chunk 4 after 8 (A = 4*8 + 4*5/2 = 42)
    A1, A2 = 36, 42
    ttft = (0.01 + 0.008 + 1e-6 * A1) + (0.01 + 0.004 + 1e-6 * A2)
    e_pre = (1.0 + 0.8 + 1e-4 * A1) + (1.0 + 0.4 + 1e-4 * A2)
    assert ttft == pytest.approx(0.032078) and e_pre == pytest.approx(3.2078)
    assert toy_lut.ttft(1000, 1.0, 12) == pytest.approx(ttft, rel=1e-12)
    assert toy_lut.prefill_time(1000, 1.0, 12) == pytest.approx(ttft, rel=1e-12)
    assert toy_lut.prefill_energy(1000, 1.0, 12) == pytest.approx(e_pre, rel=1e-12)
    assert toy_lut.prefill_power(1000, 1.0, 12) == pytest.approx(e_pre / ttft, rel=1e-12)
    assert toy_lut.tbt(1000, 1.0, 12) == pytest.approx(0.01 + 0.0001 + 13e-5, rel=1e-12)
    # low clock (tau0 0.012, tau1 0.002, tau4 2e-6)
    assert toy_lut.ttft(500, 1.0, 12) == pytest.approx(2 * 0.012 + 0.024 + 2e-6 * 78, rel=1e-12)


def test_sm_share_scaling_by_hand(toy_lut):
    # share 0.5: compute terms (tau1, tau4) x 0.5**-1 = 2, memory terms (tau0, tau2, tau3) x 0.5**-0.5 = sqrt 2;
    # energy keeps the dynamic part and adds idle (50 W) over the extra time
    r = math.sqrt(2.0)
    ttft_full = 0.032078
    ttft = 2 * 0.01 * r + 2 * 0.012 + 2 * 1e-6 * 78
    assert toy_lut.ttft(1000, 0.5, 12) == pytest.approx(ttft, rel=1e-12)
    e_pre = 3.2078 + 50.0 * (ttft - ttft_full)
    assert toy_lut.prefill_power(1000, 0.5, 12) == pytest.approx(e_pre / ttft, rel=1e-12)
    tbt = (0.01 + 0.0001 + 13e-5) * r
    assert toy_lut.tbt(1000, 0.5, 12) == pytest.approx(tbt, rel=1e-12)
    assert toy_lut.decode_power(1000, 0.5, 12) == pytest.approx((1.023 + 50.0 * (tbt - 0.01023)) / tbt, rel=1e-12)


def test_ttft_matches_the_engine_alone_at_top_clock(toy_lut):
    # the environment's own engine: a 20-token prompt alone (three chunks), then two decode steps
    pool = Pool(attn_toy_profile(), PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0)))
    pool.attach(make_table([0.0], [20], [3]))
    pool.run_until(5.0)
    assert pool.first_t[0] == pytest.approx(toy_lut.prefill_time(1000, 1.0, 20), abs=1e-12)
    assert pool.first_t[0] == pytest.approx(toy_lut.ttft(1000, 1.0, 20), rel=1e-9)  # off grid: the fit
    # the engine's decode contexts grow (21, 22); the LUT's TBT is the first one
    assert pool.finish_t[0] - pool.first_t[0] == pytest.approx(
        toy_lut.decode_step_time(1000, 1.0, 1, 21) + toy_lut.decode_step_time(1000, 1.0, 1, 22), abs=1e-12)


def test_tbt_is_tau0_plus_tau2_plus_tau3_context_on_h100(h100, h100_lut):
    p = np.asarray(h100_lut.grid.input_lens, dtype=float)
    for mhz in h100_lut.grid.clocks_mhz:
        for s in (0.1, 0.3, 0.7, 1.0):
            k = coeffs_for(h100, h100.clock_index(mhz), s)
            np.testing.assert_allclose(h100_lut.tbt(mhz, s, p), k.tau0 + k.tau2 + k.tau3 * (p + 1), rtol=1e-12)


# ------------------------------------------------------------------------------------------ batch helpers, energy
def test_batch_decode_helpers_by_hand(toy_lut):
    # 3 decodes, summed context 30, top clock, full share
    assert toy_lut.decode_step_time(1000, 1.0, 3, 30) == pytest.approx(0.01 + 0.0003 + 0.0003, rel=1e-12)
    assert toy_lut.decode_step_energy(1000, 1.0, 3, 30) == pytest.approx(1.0 + 0.03 + 0.03, rel=1e-12)
    np.testing.assert_allclose(toy_lut.decode_step_time(1000, 1.0, np.array([1, 2]), np.array([10, 40])),
                               [0.01 + 0.0001 + 1e-4, 0.01 + 0.0002 + 4e-4], rtol=1e-12)


def test_energy_is_power_times_latency_by_hand(toy_lut):
    # p = 12, o = 5: prefill 0.032078 s / 3.2078 J, then 4 decode steps of 0.01023 s / 1.023 J (context 13)
    assert toy_lut.latency(1000, 1.0, 12, 5) == pytest.approx(0.032078 + 4 * 0.01023, rel=1e-12)
    assert toy_lut.energy(1000, 1.0, 12, 5) == pytest.approx(3.2078 + 4 * 1.023, rel=1e-12)
    assert toy_lut.power(1000, 1.0, 12, 5) == pytest.approx((3.2078 + 4 * 1.023) / (0.032078 + 4 * 0.01023))
    assert toy_lut.energy(1000, 1.0, 12, 1) == pytest.approx(3.2078, rel=1e-12)
    assert toy_lut.power(1000, 1.0, 12) == pytest.approx(3.2078 / 0.032078, rel=1e-12)
    # vectorised over input and output lengths
    p, o = np.array([6, 12, 20]), np.array([1, 5, 9])
    np.testing.assert_allclose(toy_lut.energy(1000, 0.5, p, o),
                               [toy_lut.energy(1000, 0.5, int(a), int(b)) for a, b in zip(p, o)], rtol=1e-12)
    with pytest.raises(ValueError, match="output_len"):
        toy_lut.energy(1000, 1.0, 12, 0)


# ------------------------------------------------------------------------------------------ interpolation
def test_interpolation_exact_enough_on_h100_degree3(h100, h100_lut):
    mids = midpoints(h100_lut.grid.input_lens)
    B = h100.scheduler.token_budget
    for mhz in h100_lut.grid.clocks_mhz:
        for s in (0.1, 0.5, 1.0):
            k = coeffs_for(h100, h100.clock_index(mhz), s)
            t, e = np.array([law_prefill(k, B, int(p)) for p in mids]).T
            tb = k.tau0 + k.tau2 + k.tau3 * (mids + 1)
            eb = k.a + k.b + k.kappa * (mids + 1)
            np.testing.assert_allclose(h100_lut.ttft(mhz, s, mids), t, rtol=1e-2)
            np.testing.assert_allclose(h100_lut.prefill_power(mhz, s, mids), e / t, rtol=1e-2)
            np.testing.assert_allclose(h100_lut.tbt(mhz, s, mids), tb, rtol=1e-2)
            np.testing.assert_allclose(h100_lut.decode_power(mhz, s, mids), eb / tb, rtol=1e-2)


def test_chunked_profile_interpolation_with_and_without_chunk_term():
    # h200 27B: token budget 2048 < 8192, so long prompts run in up to 4 chunks
    prof = load_profile("h200-qwen3.8-27b-fp8")
    B = prof.scheduler.token_budget
    assert B < 8192
    aware = FestinaLUT.from_profile(prof, degree=3)
    plain = FestinaLUT.from_profile(prof, degree=3, chunk_term=False)
    assert aware.chunk_term and not plain.chunk_term
    top = prof.clock_mhz[-1]
    k = coeffs_for(prof, prof.clock_index(top), 1.0)
    mids = midpoints(aware.grid.input_lens)
    exact = np.array([law_prefill(k, B, int(p))[0] for p in mids])
    np.testing.assert_allclose(aware.ttft(top, 1.0, mids), exact, rtol=1e-2)
    np.testing.assert_allclose(plain.ttft(top, 1.0, mids), exact, rtol=5e-2)  # the paper's plain polynomial
    # just past a chunk boundary the plain polynomial smooths the new chunk's fixed cost away
    p = B + 100
    assert plain.ttft(top, 1.0, p) < law_prefill(k, B, p)[0] == pytest.approx(aware.ttft(top, 1.0, p), rel=1e-2)


def test_toy_off_grid_lengths_follow_the_law(toy_lut):
    prof = attn_toy_profile()
    for mhz, s in ((500, 0.2), (1000, 1.0)):
        k = coeffs_for(prof, prof.clock_index(mhz), s)
        for p in (3, 10, 20, 40):
            assert toy_lut.ttft(mhz, s, p) == pytest.approx(law_prefill(k, 8, p)[0], rel=1e-2)


def test_vectorised_queries_match_scalar_ones(h100_lut):
    p = np.array([[64, 100], [1000, 8192]])
    out = h100_lut.ttft(1305, 0.4, p)
    assert isinstance(out, np.ndarray) and out.shape == (2, 2)
    np.testing.assert_allclose(out, [[h100_lut.ttft(1305, 0.4, int(x)) for x in row] for row in p], rtol=1e-12)
    assert isinstance(h100_lut.tbt(1305, 0.4, 100), float)


# ------------------------------------------------------------------------------------------ monotonicity
def test_ttft_decreases_with_clock_and_share(h100_lut):
    assert np.all(np.diff(h100_lut.ttft_s, axis=0) < 0)  # clock
    assert np.all(np.diff(h100_lut.ttft_s, axis=1) < 0)  # share
    assert np.all(np.diff(h100_lut.tbt_s, axis=1) < 0)
    mids = midpoints(h100_lut.grid.input_lens)
    g = h100_lut.grid
    off = np.array([[[h100_lut.ttft(c, s, p) for p in mids[::5]] for s in g.shares] for c in g.clocks_mhz])
    assert np.all(np.diff(off, axis=0) < 0) and np.all(np.diff(off, axis=1) < 0)


# ------------------------------------------------------------------------------------------ min_share
def test_min_share_against_brute_force(h100, h100_lut):
    shares = h100_lut.grid.shares
    B = h100.scheduler.token_budget
    for mhz in (705, 1305, 1980):
        for p in (256, 1536, 8192):
            ks = [coeffs_for(h100, h100.clock_index(mhz), s) for s in shares]
            ttft = [law_prefill(k, B, p)[0] for k in ks]
            tbt = [k.tau0 + k.tau2 + k.tau3 * (p + 1) for k in ks]
            for i in range(len(shares) - 1):
                tt = 0.5 * (ttft[i] + ttft[i + 1])  # between share i and i+1: no ties
                for tb in (None, 0.5 * (tbt[0] + tbt[-1])):
                    ok = [s for s, a, b in zip(shares, ttft, tbt) if a <= tt and (tb is None or b <= tb)]
                    assert h100_lut.min_share(mhz, p, ttft_budget_s=tt, tbt_budget_s=tb) == (min(ok) if ok else None)
            # a TBT budget alone, between two shares
            tb = 0.5 * (tbt[3] + tbt[4])
            assert h100_lut.min_share(mhz, p, tbt_budget_s=tb) == shares[4]
            # infeasible: faster than the full GPU
            assert h100_lut.min_share(mhz, p, ttft_budget_s=0.99 * ttft[-1]) is None
            assert h100_lut.min_share(mhz, p, tbt_budget_s=0.99 * tbt[-1]) is None
            # exactly the full-GPU TTFT is met; no budget at all: the smallest share
            assert h100_lut.min_share(mhz, p, ttft_budget_s=ttft[-1] * (1 + 1e-9)) == 1.0
            assert h100_lut.min_share(mhz, p) == shares[0]


# ------------------------------------------------------------------------------------------ errors
def test_off_grid_clock_share_and_out_of_range_lengths(h100_lut):
    with pytest.raises(ValueError, match=r"clock_mhz: 800 .*\[705, 1005, 1305, 1605, 1980\]"):
        h100_lut.ttft(800, 1.0, 256)
    with pytest.raises(ValueError, match=r"share: 0.15 .*0\.1, 0\.2"):
        h100_lut.tbt(1305, 0.15, 256)
    with pytest.raises(ValueError, match="share"):
        h100_lut.decode_step_time(1305, 0.05, 1, 100)
    with pytest.raises(ValueError, match="clock_mhz"):
        h100_lut.min_share(800, 256, ttft_budget_s=1.0)
    for bad in (63, 8193, np.array([100, 9000]), float("nan")):
        with pytest.raises(ValueError, match=r"input_len: .*\[64, 8192\]"):
            h100_lut.ttft(1305, 1.0, bad)
    with pytest.raises(ValueError, match="input_len"):
        h100_lut.min_share(1305, 20000)
    assert h100_lut.ttft(1305, 0.30000000000000004, 64) == h100_lut.ttft(1305, 0.3, 64)  # float noise is a grid share


def test_grid_validation(h100):
    with pytest.raises(ValueError, match="not supported"):
        FestinaLUT.from_profile(h100, LutGrid((700,), (1.0,), (64, 128, 256, 512)))
    with pytest.raises(ValueError, match="min_share"):
        FestinaLUT.from_profile(h100, LutGrid((705,), (0.05, 1.0), (64, 128, 256, 512)))
    with pytest.raises(ValueError, match="context limit"):
        FestinaLUT.from_profile(h100, LutGrid((705,), (1.0,), (64, 128, 256, 512, 16384)))
    with pytest.raises(ValueError, match="degree"):
        FestinaLUT.from_profile(h100, LutGrid((705,), (1.0,), (64, 128, 256)), degree=3)
    with pytest.raises(ValueError, match="ascending"):
        LutGrid((705,), (1.0, 0.5), (64, 128))
    g = LutGrid.default(h100)
    assert g.clocks_mhz == tuple(h100.clock_mhz) and g.shares == DEFAULT_SHARES
    assert g.input_lens[0] == 64 and g.input_lens[-1] == 8192


def test_load_figures_come_from_the_profiles_cold_start():
    from commitenv.profiles import load_profile

    lut = FestinaLUT.from_profile(load_profile("h100-qwen2.5-7b-festina"))
    lat = load_profile("h100-qwen2.5-7b-festina").latencies
    assert lut.load_s == lat.load_s and lut.load_energy_j == pytest.approx(lat.load_s * lat.load_w)
    assert FestinaLUT.from_profile(load_profile("h100-qwen2.5-7b")).load_s is None  # not profiled
