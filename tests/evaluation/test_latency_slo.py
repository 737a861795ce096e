"""TTFT/TBT SLO classes (Festina Table 2): classification at the class edges, mean TBT, and attainment against
hand-computed requests."""

from __future__ import annotations

import numpy as np
import pytest

from commitenv.latency_slo import attainment_by, latency_outcome, mean_tbt, slo_class


@pytest.mark.parametrize(
    "prompt, output, want",
    [
        (255, 99, 0),  # both short
        (256, 99, 1),  # input reaches medium
        (255, 100, 1),  # output reaches medium
        (1023, 349, 1),
        (1024, 10, 2),  # a long prompt with a short answer is long
        (10, 350, 2),  # a long answer is long
        (8192, 400, 2),
        (20000, 5, 2),  # beyond the table's 8,192: still long
    ],
)
def test_class_is_the_longer_of_input_and_output_class(prompt, output, want):
    assert slo_class([prompt], [output]).tolist() == [want]


def test_mean_tbt_by_hand():
    first = np.array([1.0, 2.0, 3.0, np.nan])
    fin = np.array([1.9, 2.0, np.nan, np.nan])
    out = np.array([10, 1, 5, 5])
    tbt = mean_tbt(first, fin, out)
    assert tbt[0] == pytest.approx(0.9 / 9)
    assert tbt[1] == 0.0  # one token: no gap
    assert np.isnan(tbt[2]) and np.isnan(tbt[3])  # unfinished


def test_attainment_against_hand_computed_requests():
    # arrival, first token, finish, longest gap between tokens, prompt, output
    rows = [
        (0.0, 0.20, 0.20 + 0.09 * 49, 0.095, 100, 50),  # short: TTFT 200 ms <= 250, every gap <= 100 ms: met
        (0.0, 0.30, 0.30 + 0.09 * 49, 0.095, 100, 50),  # short: TTFT 300 ms > 250: TTFT missed
        (0.0, 0.30, 0.30 + 0.11 * 199, 0.15, 500, 200),  # medium: TTFT 300 <= 400, mean 110 ms > 100: TBT missed
        (0.0, 1.90, 1.90 + 0.05 * 399, 0.08, 4000, 400),  # long: TTFT 1.9 s <= 2 s: met
        (0.0, 0.10, np.nan, np.nan, 100, 50),  # unfinished: misses both
        (0.0, 0.10, 0.10 + 0.01 * 49, 0.01, 100, 50),  # fast, but rejected (served False): misses both
        (0.0, 0.20, 0.20 + 0.05 * 49, 0.30, 100, 50),  # mean 50 ms, but one token 300 ms after the previous: missed
        (0.0, 0.20, 0.20, 0.0, 100, 1),  # one token: no gap, meets TBT
        (0.0, 0.20, 0.20 + 0.09 * 49, np.nan, 100, 50),  # the gaps are not known (an engine without progress)
    ]
    a, f, fin, g, p, d = (np.array(c) for c in zip(*rows))
    served = np.array([True, True, True, True, True, False, True, True, True])
    out = latency_outcome(a, f, fin, g, p, d, served)
    assert out.cls.tolist() == [0, 0, 1, 2, 0, 0, 0, 0, 0]
    assert out.ttft_met.tolist() == [True, False, True, True, False, False, True, True, True]
    assert out.tbt_met.tolist() == [True, True, False, True, False, False, False, True, False]
    assert out.tbt_mean_met.tolist() == [True, True, False, True, False, False, True, True, True]
    assert out.met.tolist() == [True, False, False, True, False, False, False, True, False]
    assert out.tbt_s[0] == 0.095 and np.isnan(out.tbt_s[5])  # (a rejected request has no measure)
    by = attainment_by(out.cls[:6], out.met[:6], ("short", "medium", "long"))
    assert by == {"short": {"requests": 4, "attainment_pct": 25.0},
                  "medium": {"requests": 1, "attainment_pct": 0.0},
                  "long": {"requests": 1, "attainment_pct": 100.0}}
    assert attainment_by(np.zeros(3, int), np.ones(3, bool), ("a", "b")) == {"a": {"requests": 3, "attainment_pct": 100.0}}
