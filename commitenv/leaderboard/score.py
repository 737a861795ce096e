"""Leaderboard scores, computed from run records (summary.json fields), never from rewards, by the one scoring
function every command uses (`commitenv.scoring.score`: cost, the scenario's SLO gate, the normalised score between
the lower reference at 0 and the upper at 100). The suite score is the mean over episodes with a 95 % Student-t
interval (`commitenv.runner.mean_ci95`). An episode whose upper reference costs no less than its lower one (nothing can be
gained over the lower reference: e.g. a drawn commitment so large that full-capacity vLLM is the best achievable) has
no score: it stays in the record with its gate, and the mean is over the scored episodes (``unscored`` counts them).
"""

from __future__ import annotations

import math
from typing import Any

from commitenv.runner import mean_ci95
from commitenv.scoring import normalised_score as episode_score
from commitenv.scoring import score

# the raw metrics kept beside the score, from each episode's summary
RAW = ("cost_kwh_eq", "attainment_pct", "misses", "energy_mj", "mean_abs_dev_pct")


def episode_row(label: str, scenario: str, seed: int | None, outcome: dict[str, Any], lower: dict[str, Any],
                upper: dict[str, Any]) -> dict[str, Any]:
    """One scored episode: the submission's outcome (``status``, ``reason``, ``summary``) against the two
    references' summaries."""
    s = outcome["summary"]
    spans = float(lower["cost_kwh_eq"]) - float(upper["cost_kwh_eq"]) > 0
    v = score(s, lower, upper if spans else None)  # (no span: the gate alone, no score)
    row: dict[str, Any] = {"scenario": scenario, "seed": seed, "label": label, "status": outcome["status"],
                           "reason": outcome.get("reason"), "score": v.score, "cost_kwh_eq": v.cost_kwh_eq,
                           "lower_cost_kwh_eq": float(lower["cost_kwh_eq"]),
                           "upper_cost_kwh_eq": float(upper["cost_kwh_eq"]),
                           "slo_gate_pass": v.gate.passed, "slo_gate_shortfall_pct": v.gate.shortfall_pct}
    if not spans:
        row["unscored"] = "the upper reference costs no less than the lower one: nothing to gain on this episode"
    row.update({k: s[k] for k in RAW if k != "cost_kwh_eq"})
    row["wall_s"] = outcome.get("wall_s")
    return row


def _mean(values: list[Any]) -> float | None:
    """The mean of the values given (None: an energy-only episode has no deviation, so it is left out), or None."""
    vals = [v for v in values if v is not None]
    return math.fsum(vals) / len(vals) if vals else None


def suite_summary(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(score, metrics) of a suite's episode rows: the score's mean and 95 % interval; the raw metrics' means, the
    SLO gate's pass count, the episode count, how many episodes ran and failed the gate (``gate_failures``) and how
    many were lost (``lost``, also ``failed`` as older records name it: crash, timeout, ...), and how many have no
    score (``unscored``: their references tie; left out of the score's mean). A raw metric an episode does not have
    (the deviation of an energy-only scenario: None) is averaged over the episodes that have it."""
    total = mean_ci95([r["score"] for r in rows if r["score"] is not None])
    metrics: dict[str, Any] = {k: _mean([r[k] for r in rows]) for k in RAW}
    lost = sum(1 for r in rows if r["status"] != "ok")
    metrics.update({"slo_gate_pass": sum(1 for r in rows if r["slo_gate_pass"]), "episodes": len(rows),
                    "gate_failures": sum(1 for r in rows if r["status"] == "ok" and not r["slo_gate_pass"]),
                    "lost": lost, "failed": lost, "unscored": sum(1 for r in rows if r["score"] is None)})
    return total, metrics
