"""The oracle's miss budgets: how many misses a plan may have per arrival hour (the SLO gate's form), and the
paces that spread a budget over the hour as its requests arrive."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from commitenv.metrics import arrival_hours


def miss_pace(budget: int, arrivals_s: np.ndarray, interval_s: float, steps: int,
              reference: Sequence[int] = ()) -> tuple[int, ...]:
    """Cumulative miss allowance after each of ``steps`` intervals: the budget in proportion to the requests arrived
    by then (``arrivals_s``: the episode's true arrival times), never below a reference schedule's certain misses at
    that interval (``reference``: vLLM's, whose misses may set the budget), never above the budget."""
    arrivals_s = np.asarray(arrivals_s)
    n = max(len(arrivals_s), 1)
    ends = interval_s * np.arange(1, steps + 1)
    arrived = np.searchsorted(arrivals_s, ends, side="right")
    pace = np.ceil(budget * arrived / n).astype(np.int64)
    if len(reference):
        pace = np.maximum(pace, np.asarray(reference, dtype=np.int64)[:steps])
    pace[-1] = budget
    return tuple(int(x) for x in np.minimum(pace, budget))


def hour_miss_pace(budgets: Sequence[int], arrivals_s: np.ndarray, interval_s: float, intervals_per_hour: int,
                   reference: Sequence[Sequence[int]] = ()) -> tuple[int, ...]:
    """The allowance of each interval's arrival hour h after that interval: h's budget in proportion to h's requests
    arrived by then (``arrivals_s``: the episode's true arrival times; those at or after the horizon count in the
    last hour, as the scores count them), never below a reference schedule's certain misses of hour h at that
    interval (``reference``: vLLM's, by interval and hour), never above the budget, all of it at the hour's last
    interval."""
    H, K = len(budgets), intervals_per_hour
    arrivals_s = np.asarray(arrivals_s)
    n_h = np.bincount(arrival_hours(arrivals_s, H), minlength=H)
    out = []
    for i in range(H * K):
        h = i // K
        b = int(budgets[h])
        if (i + 1) % K == 0:
            out.append(b)
            continue
        arrived = int(np.searchsorted(arrivals_s, (i + 1) * interval_s, side="right")
                      - np.searchsorted(arrivals_s, h * 3600.0, side="left"))  # (arrival order)
        allow = math.ceil(b * arrived / n_h[h]) if n_h[h] else b
        if len(reference):
            allow = max(allow, int(reference[i][h]))
        out.append(min(allow, b))
    return tuple(out)


def miss_budget(vllm_misses: int, requests: int, epsilon: float, rule: str = "gate") -> int:
    """The most misses a plan may have among ``requests`` (an arrival hour's, or the episode's). ``"gate"``: the
    scenario's SLO gate (at most floor(epsilon x requests)), or vLLM's own misses among them where vLLM itself misses
    more; ``"vllm_minus_epsilon"``: the issue's literal rule, attainment no lower than vLLM's minus epsilon (vLLM's
    misses + floor(epsilon x requests))."""
    if not 0 <= epsilon <= 1:
        raise ValueError(f"epsilon: expected a share in [0, 1], got {epsilon}")
    allowed = int(math.floor(epsilon * requests + 1e-9))
    if rule == "gate":
        return max(vllm_misses, allowed)
    if rule == "vllm_minus_epsilon":
        return vllm_misses + allowed
    raise ValueError(f"slo_rule: expected 'gate' or 'vllm_minus_epsilon', got {rule!r}")
