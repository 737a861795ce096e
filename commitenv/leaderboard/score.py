"""Leaderboard scores, computed from run records (summary.json fields), never from rewards.

Per episode, as Grid2Op normalizes its scores: the ``lower`` reference (vLLM) scores 0 and the ``upper`` one (the
hindsight optimum) 100, linearly in the hourly settlement cost,

    score = 100 (cost_lower - cost) / (cost_lower - cost_upper),

and an episode that fails the SLO gate (attainment >= 1 - epsilon in every arrival hour) scores

    min(score, 0) - (100 (1 - epsilon) - worst hour's attainment in %),

one point below zero per percentage point its worst arrival hour falls short of the gate, so that no controller
that fails the gate ties with one that passes it (DynamoLLM's cost at 80 % attainment would otherwise rank above
vLLM's). The suite score is the mean over episodes with a 95 % Student-t interval (`commitenv.runner.mean_ci95`).
"""

from __future__ import annotations

import math
from typing import Any

from commitenv.runner import mean_ci95

# the raw metrics kept beside the score, from each episode's summary
RAW = ("cost_kwh_eq", "attainment_pct", "misses", "energy_mj", "mean_abs_dev_pct")


def episode_score(cost: float, lower: float, upper: float, gate_pass: bool, shortfall_pct: float = 0.0) -> float:
    """The normalized score of one episode (see the module docstring); ``shortfall_pct``: how many percentage
    points the worst arrival hour's attainment falls short of the gate (used when ``gate_pass`` is False).
    ValueError when the references do not span a cost range (the upper reference must cost less)."""
    if not all(math.isfinite(x) for x in (cost, lower, upper, shortfall_pct)) or shortfall_pct < 0:
        raise ValueError(f"score: costs must be finite, got cost {cost}, lower {lower}, upper {upper}")
    span = lower - upper
    if not span > 0:
        raise ValueError(f"score: the upper reference ({upper:.6g} kWh-eq) must cost less than the lower one "
                         f"({lower:.6g} kWh-eq) on every episode")
    s = 100.0 * (lower - cost) / span
    return s if gate_pass else min(s, 0.0) - shortfall_pct


def gate_shortfall_pct(summary: dict[str, Any]) -> float:
    """Percentage points by which an episode's worst arrival hour falls short of the SLO gate (0 when it passes)."""
    gate = 100.0 * (1.0 - summary["slo_gate_epsilon"])
    return max(0.0, gate - summary["slo_gate_worst_hour_pct"])


def episode_row(label: str, scenario: str, seed: int | None, outcome: dict[str, Any], lower: dict[str, Any],
                upper: dict[str, Any]) -> dict[str, Any]:
    """One scored episode: the submission's outcome (``status``, ``reason``, ``summary``) against the two
    references' summaries."""
    s = outcome["summary"]
    gate = s.get("slo_gate_pass") is True
    short = 0.0 if gate else gate_shortfall_pct(s)
    row: dict[str, Any] = {"scenario": scenario, "seed": seed, "label": label, "status": outcome["status"],
                           "reason": outcome.get("reason"),
                           "score": episode_score(s["cost_kwh_eq"], lower["cost_kwh_eq"], upper["cost_kwh_eq"], gate,
                                                  short),
                           "cost_kwh_eq": s["cost_kwh_eq"], "lower_cost_kwh_eq": lower["cost_kwh_eq"],
                           "upper_cost_kwh_eq": upper["cost_kwh_eq"], "slo_gate_pass": gate,
                           "slo_gate_shortfall_pct": short}
    row.update({k: s[k] for k in RAW if k != "cost_kwh_eq"})
    row["wall_s"] = outcome.get("wall_s")
    return row


def _mean(values: list[Any]) -> float | None:
    """The mean of the values given (None: an energy-only episode has no deviation, so it is left out), or None."""
    vals = [v for v in values if v is not None]
    return math.fsum(vals) / len(vals) if vals else None


def suite_summary(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(score, metrics) of a suite's episode rows: the score's mean and 95 % interval; the raw metrics' means, the
    SLO gate's pass count, the episode count and how many were lost (crash, timeout, ...). A raw metric an episode
    does not have (the deviation of an energy-only scenario: None) is averaged over the episodes that have it."""
    score = mean_ci95([r["score"] for r in rows])
    metrics: dict[str, Any] = {k: _mean([r[k] for r in rows]) for k in RAW}
    metrics.update({"slo_gate_pass": sum(1 for r in rows if r["slo_gate_pass"]), "episodes": len(rows),
                    "failed": sum(1 for r in rows if r["status"] != "ok")})
    return score, metrics
