"""ePACT+ (``epact_plus``): the forecast-aware nominal allocation, the load trend, the energy forecast, and the
controller, which is ePACT bit for bit when its forecast is flat.

Expectations are worked out by hand from the definitions in `commitenv_controllers.epact.plus` (module
docstring), never copied from the implementation's output."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest

from commitenv.evaluation import evaluate
from commitenv_controllers import make, resolve
from commitenv_controllers.dynamollm import ClockLaws
from commitenv_controllers.epact import EPACT, EPACTPlus
from commitenv_controllers.epact.planner import check_allocation, equal_allocation, interval_target
from commitenv_controllers.epact.plus import (EnergyCalibration, EnergyModel, LoadTrend, cap_scale, capacity_caps,
                                             capped_targets, fit_trend, forecast_allocation, hour_end_cost,
                                             interval_counts)
from commitenv_controllers.epact.miss_margin import MissMargin, slack_margin
from commitenv_controllers.epact.selection import Evaluation, select
from commitenv_controllers.registry import check_kwargs
from helpers.scenarios import toy_three_hour, write_scenario, write_trace

KJ = 1e3


# ========================================================================================== allocation
@pytest.mark.parametrize("E,K,k", [(600 * KJ, 6, 0), (600 * KJ, 6, 1), (13.25e6, 60, 0), (13.25e6, 60, 37),
                                   (13.25e6, 60, 59), (1.0, 3, 2)])
def test_flat_forecast_is_the_equal_split_exactly(E, K, k):
    for level in (1.0, 208_050.0, 1e-9):
        b = forecast_allocation(E, K, k, [level] * (K - k))
        assert b == equal_allocation(E, K)  # exact, element by element
        for M in (0.0, 0.3 * E, 1.2 * E):
            assert interval_target(E, M, b, k) == interval_target(E, M, equal_allocation(E, K), k)


def _check_shape(b, E, K, k, f):
    check_allocation(E, b)  # non-negative, sums to E*, positive last mass
    assert len(b) == K and sum(b) == pytest.approx(E, rel=1e-12)
    assert all(x >= 0 for x in b) and b[-1] > 0
    assert b[:k] == [E / K] * k  # elapsed intervals keep the equal split
    assert sum(b[k:]) == pytest.approx(E * (K - k) / K, rel=1e-12)
    # proportional to the forecast: b_j / b_k = f_j / f_k
    for j in range(k, K):
        assert b[j] / b[k] == pytest.approx(f[j - k] / f[0], rel=1e-12)


@pytest.mark.parametrize("k", [0, 1, 4])
def test_rising_forecast_gives_rising_allocation(k):
    # E* = 600 kJ over K = 6; forecast 100, 120, ... kJ for the remaining intervals
    E, K = 600 * KJ, 6
    f = [100 + 20 * i for i in range(K - k)]
    b = forecast_allocation(E, K, k, f)
    _check_shape(b, E, K, k, f)
    assert all(b[j + 1] > b[j] for j in range(k, K - 1))


def test_rising_forecast_by_hand():
    # k = 0, forecast (1, 2, 3) over K = 3, E* = 600 kJ: b = 600 (1, 2, 3) / 6 = (100, 200, 300) kJ;
    # at k = 1 with M_1 = 150 kJ and forecast (2, 6): b = (200, 100, 300) kJ (remaining 400 split 1:3),
    # T_1 = 100 (600 - 150) / 400 = 112.5 kJ = (E* - M_1) f_1 / (f_1 + f_2) = 450 * 2 / 8
    assert forecast_allocation(600 * KJ, 3, 0, [1, 2, 3]) == pytest.approx([100 * KJ, 200 * KJ, 300 * KJ])
    b = forecast_allocation(600 * KJ, 3, 1, [2, 6])
    assert b == pytest.approx([200 * KJ, 100 * KJ, 300 * KJ])
    assert interval_target(600 * KJ, 150 * KJ, b, 1) == pytest.approx(112.5 * KJ)


@pytest.mark.parametrize("k", [0, 2, 4])
def test_falling_forecast_gives_falling_allocation(k):
    E, K = 13.25e6, 6
    f = [300 - 40 * i for i in range(K - k)]
    b = forecast_allocation(E, K, k, f)
    _check_shape(b, E, K, k, f)
    assert all(b[j + 1] < b[j] for j in range(k, K - 1))


def test_zero_forecast_before_the_last_interval_is_allowed():
    b = forecast_allocation(600 * KJ, 4, 1, [0.0, 0.0, 5.0])
    check_allocation(600 * KJ, b)
    assert b == pytest.approx([150 * KJ, 0.0, 0.0, 450 * KJ])


@pytest.mark.parametrize("forecast", [[1.0, 2.0], [1.0, -1.0, 2.0], [1.0, 1.0, 0.0], [1.0, math.nan, 1.0],
                                      [1.0, math.inf, 1.0]])
def test_bad_forecasts_rejected(forecast):
    with pytest.raises(ValueError):
        forecast_allocation(600 * KJ, 4, 1, forecast)


def test_bad_interval_index_rejected():
    with pytest.raises(ValueError):
        forecast_allocation(600 * KJ, 4, 4, [])


# ========================================================================================== capacity cap
def test_caps_that_do_not_bind_change_nothing():
    assert capped_targets(600.0, [1, 2, 3], [1e9, 1e9, 1e9]) == pytest.approx([100.0, 200.0, 300.0])


def test_binding_cap_moves_the_excess_to_the_others_by_weight():
    # 600 over weights (1, 2, 3): (100, 200, 300); interval 2 capped at 240 -> 360 left over weights 1 : 2
    assert capped_targets(600.0, [1, 2, 3], [1e9, 1e9, 240.0]) == pytest.approx([120.0, 240.0, 240.0])
    # then interval 1 (240 > cap 200) too: 600 - 200 - 240 = 160 for the current interval
    assert capped_targets(600.0, [1, 2, 3], [1e9, 200.0, 240.0]) == pytest.approx([160.0, 200.0, 240.0])


def test_current_interval_is_never_capped():
    t = capped_targets(900.0, [1, 1, 1], [10.0, 250.0, 250.0])
    assert t == pytest.approx([400.0, 250.0, 250.0]) and sum(t) == pytest.approx(900.0)


def test_overuse_splits_without_caps():
    assert capped_targets(-60.0, [1, 2, 3], [1.0, 1.0, 1.0]) == pytest.approx([-10.0, -20.0, -30.0])


def test_capped_targets_feed_a_valid_allocation():
    E, K, k = 13.25e6, 60, 40
    t = capped_targets(E * 0.3, list(np.linspace(0.8, 1.2, K - k)), [2.2e5] * (K - k))
    b = forecast_allocation(E, K, k, t)
    check_allocation(E, b)
    # the resulting ePACT target is the capped target of the current interval
    assert interval_target(E, E * 0.7, b, k) == pytest.approx(t[0], rel=1e-9)


# ========================================================================================== trend
def test_interval_counts_bins_by_age_oldest_first():
    # window 180 s, 60-s intervals: ages 10, 20 (newest bin), 70 (middle), 130, 170 (oldest); 185 is outside
    c = interval_counts(np.array([10.0, 20.0, 70.0, 130.0, 170.0, 185.0]), 180.0, 60.0)
    assert c.tolist() == [2.0, 1.0, 2.0]


def test_exact_line_is_recovered_without_shrinking():
    # counts 100, 110, ..., 190 (10 bins): slope 10 per interval, se 0, level at now = 190 + 10 / 2 = 195
    t = fit_trend(np.arange(100, 200, 10, dtype=float), shrink=4.0, min_bins=5)
    assert t.slope == pytest.approx(10.0) and t.se == pytest.approx(0.0, abs=1e-9)
    assert t.level == pytest.approx(195.0)
    assert t.forecast(3) == pytest.approx([200.0, 210.0, 220.0])


def test_noisy_slope_is_shrunk_towards_zero():
    y = np.array([100, 140, 90, 150, 95, 145, 100, 150, 92, 148], dtype=float)  # slope ~2, noise ~25
    raw = fit_trend(y, shrink=0.0, min_bins=5)
    shr = fit_trend(y, shrink=4.0, min_bins=5)
    assert raw.slope == pytest.approx(raw.raw_slope)
    s, se = raw.raw_slope, raw.se
    assert shr.slope == pytest.approx(s * s * s / (s * s + 4 * se * se))
    assert abs(shr.slope) < abs(raw.slope)
    assert shr.level == pytest.approx(y.mean() - shr.slope * (-len(y) / 2))  # the line through the mean


def test_few_bins_give_a_flat_trend_at_their_mean():
    t = fit_trend(np.array([10.0, 20.0, 30.0]), shrink=4.0, min_bins=5)
    assert t == LoadTrend(20.0, 0.0, 3)
    assert fit_trend(np.zeros(0), 4.0, 5).forecast(2).tolist() == [0.0, 0.0]


def test_forecast_never_negative():
    assert LoadTrend(10.0, -4.0, 10).forecast(4).tolist() == [8.0, 4.0, 0.0, 0.0]


# ========================================================================================== energy
def test_energy_model_floor_and_monotone():
    m = EnergyModel(interval_s=60.0, n_replicas=32, idle_w=94.6, standby_w=75.0, busy_s=2.0, dyn_j=80.0, util=0.85)
    # no load: one replica at active idle, 31 in standby
    assert m.energy(np.array([0.0]))[0] == pytest.approx(60 * (94.6 + 31 * 75.0))
    # 255 requests: 255 * 2 / (60 * 0.85) = 10 replicas busy; 60 (10 * 94.6 + 22 * 75) + 255 * 80
    assert m.energy(np.array([255.0]))[0] == pytest.approx(60 * (10 * 94.6 + 22 * 75.0) + 255 * 80)
    # beyond the pool: every replica active, work keeps adding
    big = m.energy(np.array([5000.0, 6000.0]))
    assert big[0] == pytest.approx(60 * 32 * 94.6 + 5000 * 80)
    lam = np.linspace(0, 3000, 50)
    assert np.all(np.diff(m.energy(lam)) > 0)


def test_capacity_caps_never_count_on_a_load_rise():
    m = EnergyModel(interval_s=60.0, n_replicas=32, idle_w=100.0, standby_w=75.0, busy_s=2.0, dyn_j=80.0, util=0.85)
    floor = 60 * 32 * 100.0
    # rising: level 100, slope 4 over 10 bins -> forecasts 102, 106, 110; the window's mean is 100 - 4 x 5 = 80
    # requests, and every cap is at those 80
    rising = capacity_caps(m, LoadTrend(100.0, 4.0, 10), 3, 1.1)
    assert rising == pytest.approx([1.1 * (floor + 80 * 80.0)] * 3)
    # falling: level 100, slope -20 -> 90, 70, 50 requests, the caps follow the forecast down
    falling = capacity_caps(m, LoadTrend(100.0, -20.0, 10), 3, 1.0)
    assert falling == pytest.approx([floor + 90 * 80.0, floor + 70 * 80.0, floor + 50 * 80.0])


def test_energy_model_minimum_by_hand():
    m = EnergyModel(interval_s=60.0, n_replicas=32, idle_w=100.0, standby_w=75.0, busy_s=2.0, dyn_j=80.0, util=0.85,
                    min_idle_w=60.0)
    # one replica idling at the lowest clock, 31 on standby, no work
    assert m.min_energy(2) == pytest.approx([60 * (60.0 + 31 * 75.0)] * 2)
    assert m.min_energy(1)[0] < m.energy(np.array([0.0]))[0]


# ========================================================================================== hour-end cost
def test_hour_end_cost_by_hand():
    # E* = 100, 40 spent, target 10 now; the later intervals can draw between 20 and 45; weights 2 / 1, W = 4
    J = hour_end_cost(100.0, 40.0, 10.0, 45.0, 20.0, 2.0, 1.0, 4.0)
    # on target: eq. 3 is 0, but 100 - 40 - 10 - 45 = 5 can never be spent: 4 x 1 x 5
    assert J(10.0) == pytest.approx(20.0)
    # 5 over the target: eq. 3 charges 2 x 5, the later intervals absorb it (40 + 15 + 20 < 100)
    assert J(15.0) == pytest.approx(10.0)
    # 5 under: eq. 3 5, unspendable 10: 5 + 4 x 10
    assert J(5.0) == pytest.approx(45.0)
    # 40 over: eq. 3 80; 40 + 50 + 20 - 100 = 10 over even at the floor: 4 x 2 x 10
    assert J(50.0) == pytest.approx(160.0)
    # inside the recoverable range the hour-end term is zero and eq. 3 alone remains
    J2 = hour_end_cost(100.0, 40.0, 10.0, 80.0, 5.0, 2.0, 1.0, 4.0)
    assert [J2(e) for e in (4.0, 10.0, 30.0)] == pytest.approx([6.0, 0.0, 40.0])


def test_hour_end_cost_in_the_last_interval_keeps_eq3s_ranking():
    # nothing after it: T = E* - M, and the term is W x eq. 3
    J = hour_end_cost(100.0, 70.0, 30.0, 0.0, 0.0, 2.0, 1.0, 3.0)
    for e, eq3 in ((20.0, 10.0), (30.0, 0.0), (36.0, 12.0)):
        assert J(e) == pytest.approx(4.0 * eq3)


def test_interval_cost_floors_later_intervals_at_what_the_slo_gate_admitted():
    from types import SimpleNamespace

    c = EPACTPlus(workers=0, hour_end_weight=4.0, cap_margin=0.2)
    c.ctx = SimpleNamespace(lambda_plus=2.0, lambda_minus=1.0)
    c._caps, c._floors = np.array([500.0, 100.0, 100.0]), np.array([10.0, 10.0, 10.0])
    # E* = 400, 150 spent, target 100; the later two intervals: caps 0.8 x 100 each, floors 10 each
    c.least_admitted_j = None
    J = c.interval_cost(400.0, 150.0, 100.0, 57)
    assert [J(e) for e in (80.0, 100.0, 120.0)] == pytest.approx([20.0 + 4 * 10.0, 0.0, 40.0])
    # the gate admitted nothing below 70 at the last decision: the later intervals cannot go below 70 each, so
    # 150 + 120 + 140 - 400 = 10 of the overuse at 120 stays: 40 + 4 x 2 x 10
    c.least_admitted_j = 70.0
    J = c.interval_cost(400.0, 150.0, 100.0, 57)
    assert [J(e) for e in (80.0, 100.0, 120.0)] == pytest.approx([60.0, 0.0, 120.0])
    # a floor above the margined cap is held at the cap
    c.least_admitted_j = 95.0
    J = c.interval_cost(400.0, 150.0, 100.0, 57)
    assert J(100.0) == pytest.approx(4 * 2 * (150 + 100 + 160 - 400))
    assert EPACTPlus(workers=0, hour_end_weight=0.0).interval_cost(400.0, 150.0, 100.0, 57) is None


def test_slack_margin_is_the_slack_quantile_at_the_observed_miss_rate():
    assert slack_margin([]) == 0.0
    assert slack_margin([(0, 100, np.array([0.5, 1.0]))]) == 0.0  # no misses observed
    assert slack_margin([(3, 0, np.array([0.5]))]) == 0.0  # no arrivals
    # 2 + 2 late of 100 + 100 arrivals = 2 %; 100 pooled slacks 0.01 .. 1.00 s: the 2 smallest (0.01, 0.02) must
    # count, so the margin is just above 0.02
    slacks = np.arange(1, 101) / 100.0
    m = slack_margin([(2, 100, slacks[:50]), (2, 100, slacks[50:])])
    assert 0.02 < m < 0.020001 and np.count_nonzero(slacks < m) == 2
    # predicted misses (negative slacks) already cover the rate: no margin (never below 0)
    assert slack_margin([(1, 100, np.array([-1.0, -0.5, 0.3, 0.7]))]) == 0.0


def test_predicted_misses_count_slacks_below_the_calibrated_margin():
    from types import SimpleNamespace

    from commitenv.sim.whatif import WhatIf

    w = WhatIf(0.0, {}, 1, -0.1, True, 3, 0, 0.05, (-0.1, 0.02, 0.04, 0.3, 0.05, 0.5))
    c = EPACTPlus(workers=0, miss_margin=True)
    c.gate = MissMargin(60)
    assert c.predicted_misses((8, 1380), w, True) == 1  # no margin yet: the predicted misses
    c.gate.margin_s = 0.045
    assert c.predicted_misses((8, 1380), w, True) == 3
    assert set(c.gate._slacks) == {(8, 1380)}
    off = EPACTPlus(workers=0)
    assert off.predicted_misses((8, 1380), w, True) == 1 and off.predicted_misses((8, 1380), w, False) == 1
    # the next decision records the applied candidate's slacks against the misses observed after it
    c.decisions = [{"chosen": (8, 1380)}]
    c.ctx = SimpleNamespace(interval_s=60.0, probe=SimpleNamespace(recent_arrivals=lambda window: [None] * 200))
    c._calibrate_gate({"new_misses": 2})  # 1 % of 6 slacks: the smallest one counts
    assert len(c.gate.rows) == 1 and c.gate.rows[0][:2] == (2, 200) and c.gate._slacks == {}
    assert c.gate.margin_s == 0.0  # the smallest slack is negative: already a predicted miss


def test_miss_margin_observes_only_the_applied_candidate_and_known_misses():
    from commitenv.sim.whatif import WhatIf

    g = MissMargin(2)
    w = WhatIf(0.0, {}, 1, 0.1, True, 0, 0, 0.1, (0.1, 0.2, 0.3, 0.4))
    g.count((4, 990), w)
    g.observe((5, 990), 3, 10)  # a candidate never counted: nothing to fit on
    assert not g.rows and g.margin_s == 0.0
    g.count((4, 990), w)
    g.observe((4, 990), None, 10)  # misses not known: nothing recorded
    assert not g.rows
    g.count((4, 990), w)
    g.observe((4, 990), 5, 10)  # half the arrivals missed: the margin passes half of the 4 slacks (0.1, 0.2)
    assert g.rows[0][:2] == (5, 10) and 0.2 < g.margin_s < 0.2001
    assert g.count((4, 990), w) == 2  # 0.1 and 0.2 are below it
    for _ in range(2):  # the window keeps the last 2 decisions
        g.observe((4, 990), 0, 10)
        g.count((4, 990), w)
    assert len(g.rows) == 2 and g.margin_s == 0.0  # two decisions without a miss: 0 of 20 arrivals


def test_selection_ranks_by_the_given_cost():
    # eq. 3 prefers 28 replicas (5 under, J 5) to 32 (4 over, J 8); with nothing spendable later the hour-end
    # term makes the underuse cost 5 + 4 x 5 = 25 and the full pool wins
    full, part = Evaluation(32, 1710, 104.0, 0, 10.0), Evaluation(28, 1710, 95.0, 0, 10.0)
    assert select([full, part], 100.0, 2.0, 1.0, 100, 0.01).active == 28
    J = hour_end_cost(1000.0, 500.0, 100.0, 400.0, 50.0, 2.0, 1.0, 4.0)
    assert select([full, part], 100.0, 2.0, 1.0, 100, 0.01, cost=J).active == 32


def test_cap_scale_is_a_ratio_of_sums_clipped():
    assert cap_scale([]) == 1.0
    # metered 300 + 270 + 330 = 900 against caps 320 + 320 + 360 = 1000 (the mean of the ratios would be 0.910)
    assert cap_scale([(300.0, 320.0), (270.0, 320.0), (330.0, 360.0)]) == pytest.approx(0.9)
    assert cap_scale([(100.0, 200.0)]) == 0.75 and cap_scale([(300.0, 200.0)]) == 1.33


def test_energy_model_from_profile(tmp_path):
    from commitenv.profiles.loader import load_profile

    laws = ClockLaws.of(load_profile("h200-qwen3.8-27b-fp8"))
    assert EnergyModel.of(laws, None, 60.0, 32, 1.0, 0.85) is None
    from commitenv.workload.table import RequestTable

    n = 40
    table = RequestTable(arrival_s=np.linspace(0, 59, n), prompt_tokens=np.full(n, 1000), output_tokens=np.full(n, 200),
                         tenant=np.zeros(n, dtype=np.int32), request_id=np.arange(n))
    m = EnergyModel.of(laws, table, 60.0, 32, 8.0, 0.85)
    assert m.busy_s > 0 and m.dyn_j > 0 and m.idle_w == pytest.approx(float(laws.idle_w[laws.top]))
    # sharing decode steps among more requests lowers the replica time per request
    assert EnergyModel.of(laws, table, 60.0, 32, 16.0, 0.85).busy_s < m.busy_s


# ========================================================================================== controller
def test_registered_with_typed_arguments():
    assert make("epact_plus").name == "epact_plus"
    assert isinstance(make("epact_plus"), EPACT)
    r = resolve("epact_plus")
    assert r.origin == "builtin"
    assert check_kwargs(r, {"forecast": "flat", "tilt": 0.2}) == {"forecast": "flat", "tilt": 0.2}
    for bad in ({"forecast": "magic"}, {"tilt": "x"}, {"static_target": True}, {"nominal": [0.5, 0.5]}):
        with pytest.raises(ValueError):
            check_kwargs(r, bad)


@pytest.mark.parametrize("kw", [{"forecast": "magic"}, {"trend_window_s": 0.0}, {"shrink": -1.0}, {"min_bins": 2},
                                {"util": 0.0}, {"util": 1.5}, {"tilt": 1.0}, {"tilt": -1.0},
                                {"calibration_weight": 0.0}, {"calibration_weight": 1.5}, {"hour_end_weight": -1.0},
                                {"hour_end_weight": math.inf}, {"cap_margin": -0.1}, {"cap_margin": 1.0}])
def test_bad_options_rejected(kw):
    with pytest.raises(ValueError):
        EPACTPlus(workers=0, **kw)


def _run(ctrl, scenario, seed=0):
    res = evaluate(ctrl, str(scenario), seed)
    return res, [(d["active"], d["clock_mhz"]) for d in res.decisions]


def test_flat_forecast_reproduces_epact_bit_for_bit(tmp_path):
    sc = toy_three_hour(tmp_path)  # three hours, six 600-s intervals each
    ep = EPACT(workers=0)
    base, base_actions = _run(ep, sc)
    plus = EPACTPlus(workers=0, forecast="flat", calibrate=False)
    res, actions = _run(plus, sc)
    assert actions == base_actions
    assert [d["target_j"] for d in plus.decisions] == [d["target_j"] for d in ep.decisions]
    assert [d["chosen"] for d in plus.decisions] == [d["chosen"] for d in ep.decisions]
    for key in ("cost_kwh_eq", "attainment_pct", "mean_abs_dev_pct", "energy_mj", "misses"):
        assert res.summary[key] == base.summary[key], key
    assert res.summary["controller"] == "epact_plus"


def _rising_scenario(folder):
    """One hour of 120-s intervals (K = 30) with arrivals rising from ~2 to ~28 a minute on the toy pool."""
    rng = np.random.default_rng(3)
    # inverse-CDF sampling of a linear rate 1 + 8 t / 3600 per minute over the hour
    u = np.sort(rng.uniform(0, 1, 900))
    a, b = 1.0, 14.0  # rate(x) = a + b x per minute, x in [0, 1] of the hour; CDF (a x + b x^2 / 2) / (a + b / 2)
    x = (-a + np.sqrt(a * a + 2 * b * u * (a + b / 2))) / b
    t = np.concatenate([[0.0], 3600 * x[x * 3600 < 3590]])
    trace = write_trace(folder / "rising.csv", t, rng.integers(4, 24, len(t)), rng.integers(1, 24, len(t)))
    return write_scenario(folder, "toy-rising", workload={"trace": str(trace)}, horizon_hours=1, interval_s=120,
                          commitment={"mj": [0.3]}, lambda_plus=2.0, lambda_minus=1.0)


def test_load_forecast_follows_a_rising_load(tmp_path):
    sc = _rising_scenario(tmp_path)
    plus = EPACTPlus(workers=0, trend_window_s=1200.0)
    res, actions = _run(plus, sc)
    ep = EPACT(workers=0)
    _run(ep, sc)
    assert len(actions) == 30 and res.summary["controller"] == "epact_plus"
    late = [f for f in plus.forecasts if 1800 <= f["t"] < 3480]  # 3480 s: the last interval, nothing after it
    assert late and all(f["slope"] > 0 and f["last_j"] > f["first_j"] for f in late)
    # the targets are no longer ePACT's equal shares of the remainder
    assert [d["target_j"] for d in plus.decisions] != [d["target_j"] for d in ep.decisions]


def test_tilt_holds_budget_for_the_hour_end():
    class Probe:
        def recent_arrivals(self, window_s):
            return None

        def snapshot(self):
            raise AssertionError("not needed for a flat forecast")

    from helpers.controllers import controller_context as _ctx

    ctx = _ctx(K=4, probe=Probe())
    plus = EPACTPlus(workers=0, forecast="flat", tilt=0.2)
    plus.reset(ctx)
    try:
        b = plus.nominal_allocation(1.0, {"interval": 0, "t": 0.0, "active": 1, "hour_energy_j": 0.0})
        # ramp 1 + 0.2 (2 (j + 1/2) / 4 - 1) = 0.85, 0.95, 1.05, 1.15 (sum 4)
        assert b == pytest.approx([0.85 / 4, 0.95 / 4, 1.05 / 4, 1.15 / 4])
        flat = EPACTPlus(workers=0, forecast="flat")
        flat.reset(ctx)
        assert flat.nominal_allocation(1.0, {"interval": 2, "t": 1800.0, "active": 1, "hour_energy_j": 0.4}) == equal_allocation(1.0, 4)
    finally:
        plus.close()


def test_calibration_learns_per_clock_by_hand():
    """Step 5 by hand: weights 1/2, 1/3, then ``weight``; a clock seen for the first time starts from the pooled
    ratio; a clock never applied takes the pooled ratio; clipped to [0.75, 1.33]."""
    cal = EnergyCalibration(0.2)
    assert cal.scale(1710) == 1.0
    cal.update(1710, 1.2)
    assert cal.scale(1710) == pytest.approx(1.1) and cal.pooled == pytest.approx(1.1)
    assert cal.scale(1035) == pytest.approx(1.1)  # not applied yet: the pooled ratio
    cal.update(1035, 1.0)  # starts from the pooled 1.1 with weight 1/2; the pooled ratio takes weight 1/3
    assert cal.scale(1035) == pytest.approx(1.05)
    assert cal.pooled == pytest.approx(1.1 * 2 / 3 + 1.0 / 3)
    cal.update(1710, 1.2)  # second observation at 1710: weight 1/3
    assert cal.scale(1710) == pytest.approx(1.1 * 2 / 3 + 1.2 / 3)
    for _ in range(3):
        cal.update(1710, 1.2)
    before = cal.scale(1710)
    cal.update(1710, 1.0)  # five observations in: the weight is 0.2
    assert cal.scale(1710) == pytest.approx(0.8 * before + 0.2 * 1.0)
    cal.update(1035, 9.0)
    assert cal.scale(1035) == 1.33  # a transient, not a bias: clipped
    hi = EnergyCalibration(1.0)
    hi.update(1710, 0.1)
    assert hi.scale(1710) == 0.75


def test_calibration_uses_the_raw_prediction_of_the_applied_candidate():
    """The ratio is metered over the applied candidate's *raw* what-if energy (its prediction divided by the scale
    it was made with), and nothing is learned with ``calibrate`` off or before a candidate was applied."""
    plus = EPACTPlus(workers=0, forecast="flat")
    plus.decisions, plus._predicted_j = [], None
    plus.calibration = EnergyCalibration(0.2)
    plus.calibrate_energy({"interval_energy_j": 120.0})
    assert plus.calibration.n == 0
    plus.calibration.by_clock[1380] = (1.1, 7)
    plus.decisions = [{"chosen": (4, 1380), "energy_scale": 1.1}]
    plus._predicted_j = 110.0  # raw 100
    plus.calibrate_energy({"interval_energy_j": 125.0})
    assert plus.energy_scale(1380) == pytest.approx(0.8 * 1.1 + 0.2 * 1.25)
    off = EPACTPlus(workers=0, calibrate=False)
    off.decisions, off._predicted_j = [{"chosen": (4, 1380), "energy_scale": 1.0}], 100.0
    off.calibration = EnergyCalibration(0.2)
    off.calibrate_energy({"interval_energy_j": 150.0})
    assert off.calibration.n == 0 and off.energy_scale(1380) == 1.0


@pytest.mark.parametrize("bias", [0.0, 0.2])
def test_calibration_learns_the_truths_energy_bias(tmp_path, bias):
    """With the hardware drawing (1 + bias) x what the predictor's energy model says (realism energy_model.bias,
    nothing else), the learned scale ends near 1 + bias, and every candidate's energy is predicted with it."""
    sc = toy_three_hour(tmp_path, realism={"level": "ideal", "energy_model": {"bias": bias}},
                        noise={"time_sigma": 0.0, "energy_sigma": 0.0})
    plus = EPACTPlus(workers=0, forecast="flat")
    _run(plus, sc)
    assert plus.calibration.n >= 15  # 18 decisions, the first with nothing applied before it
    assert plus.calibration.pooled == pytest.approx(1.0 + bias, abs=0.01)
    assert any(n >= 5 for _, n in plus.calibration.by_clock.values())
    for clock, (ratio, n) in plus.calibration.by_clock.items():
        if n >= 5:  # the bias is one factor on every clock's energy
            assert ratio == pytest.approx(1.0 + bias, abs=0.01), clock
    assert plus.decisions[-1]["energy_scale"] == pytest.approx(1.0 + bias, abs=0.01)
