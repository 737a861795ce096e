"""Scores by hand: settlement cost per hour (no netting), signed deviation, SLO outcomes by arrival hour
(unfinished NaN and rejected inf are misses), and the Table 1 summary."""

from __future__ import annotations

import math

import numpy as np
import pytest

from commitenv.metrics import J_PER_KWH, deviation_cost_kwh, signed_deviation_pct, slo_outcome, summarize

MJ = 1e6


def test_kwh_constant():
    assert J_PER_KWH == 3.6e6


def test_deviation_cost_overuse_and_underuse_weights():
    # 3.6 MJ = 1 kWh. Over by 1 kWh at weight 2 costs 2; under by 1 kWh at weight 1 costs 1.
    assert deviation_cost_kwh(7.2 * MJ, 3.6 * MJ) == pytest.approx(2.0)
    assert deviation_cost_kwh(3.6 * MJ, 7.2 * MJ) == pytest.approx(1.0)
    assert deviation_cost_kwh(3.6 * MJ, 3.6 * MJ) == 0.0
    # custom weights
    assert deviation_cost_kwh(10.8 * MJ, 3.6 * MJ, 3.0, 0.5) == pytest.approx(6.0)
    assert deviation_cost_kwh(0.0, 3.6 * MJ, 3.0, 0.5) == pytest.approx(0.5)


def test_deviation_cost_is_per_hour_without_netting():
    e = np.array([7.2, 1.8, 3.6]) * MJ  # +1 kWh, -0.5 kWh, exact
    c = np.array([3.6, 3.6, 3.6]) * MJ
    cost = deviation_cost_kwh(e, c, 2.0, 1.0)
    np.testing.assert_allclose(cost, [2.0, 0.5, 0.0])
    assert float(cost.sum()) == pytest.approx(2.5)
    netted = deviation_cost_kwh(e.sum(), c.sum(), 2.0, 1.0)  # +0.5 kWh net
    assert float(netted) == pytest.approx(1.0)
    assert float(cost.sum()) != pytest.approx(float(netted))


def test_signed_deviation_pct():
    np.testing.assert_allclose(signed_deviation_pct([110.0, 90.0, 100.0], [100.0, 100.0, 100.0]), [10.0, -10.0, 0.0])
    assert signed_deviation_pct(1.0, 0.85) == pytest.approx(100 * (1 / 0.85 - 1))


def test_slo_outcome_counts_requests_in_their_arrival_hour():
    arrival = np.array([10.0, 3599.0, 3600.0, 4000.0, 7300.0, 7400.0])
    finish = np.array([20.0, 3700.0, 3610.0, np.nan, 7350.0, np.inf])
    deadline = np.array([30.0, 3800.0, 3605.0, 4100.0, 7350.0, 7500.0])
    out = slo_outcome(arrival, finish, deadline, hours=3)
    # request 1 arrives in hour 0 and finishes in hour 1: it belongs to hour 0
    np.testing.assert_array_equal(out.arrivals, [2, 2, 2])
    # hour 0: both met; hour 1: late (3610 > 3605) and unfinished (NaN) miss; hour 2: exactly at the deadline
    # meets, rejected (inf) misses
    np.testing.assert_array_equal(out.met, [2, 0, 1])
    assert out.pooled_pct == pytest.approx(100 * 3 / 6)
    np.testing.assert_allclose(out.by_hour_pct, [100.0, 0.0, 50.0])
    assert out.arrivals.dtype.kind == "i" and out.met.dtype.kind == "i"


def test_slo_outcome_edges():
    # arrivals at or after the horizon go to the last hour; empty hours read 100 %
    out = slo_outcome(np.array([100.0, 7200.0, 9000.0]), np.array([101.0, 7201.0, np.nan]),
                      np.array([102.0, 7202.0, 9100.0]), hours=2)
    np.testing.assert_array_equal(out.arrivals, [1, 2])
    np.testing.assert_array_equal(out.met, [1, 1])
    out = slo_outcome(np.array([10.0]), np.array([11.0]), np.array([12.0]), hours=3)
    np.testing.assert_allclose(out.by_hour_pct, [100.0, 100.0, 100.0])
    empty = slo_outcome(np.zeros(0), np.zeros(0), np.zeros(0), hours=2)
    assert empty.pooled_pct == 100.0
    np.testing.assert_array_equal(empty.arrivals, [0, 0])
    # an unfinished request (NaN) misses even an infinite deadline
    assert slo_outcome(np.array([0.0]), np.array([np.nan]), np.array([math.inf]), 1).met[0] == 0


def test_summarize_matches_hand_numbers():
    e = np.array([7.2, 1.8, 3.6, 3.78]) * MJ
    c = np.array([3.6, 3.6, 3.6, 3.6]) * MJ
    slo = slo_outcome(np.array([0.0, 4000.0]), np.array([1.0, np.nan]), np.array([2.0, 4010.0]), hours=4)
    s = summarize(e, c, 2.0, 1.0, slo)
    assert set(s) == {"attainment_pct", "mean_abs_dev_pct", "hours_within_5pct", "cost_kwh_eq", "energy_mj",
                      "commitment_mj"}
    assert s["attainment_pct"] == pytest.approx(50.0)
    assert s["mean_abs_dev_pct"] == pytest.approx((100 + 50 + 0 + 5) / 4)
    assert s["hours_within_5pct"] == 2  # 0 % and exactly 5 %
    assert s["cost_kwh_eq"] == pytest.approx(2.0 + 0.5 + 0.0 + 2 * 0.05)
    assert s["energy_mj"] == pytest.approx(7.2 + 1.8 + 3.6 + 3.78)
    assert s["commitment_mj"] == pytest.approx(14.4)
    assert isinstance(s["hours_within_5pct"], int)
