"""The one scoring function: an episode's summary (summary.json) against the scenario's objective and its two
reference runs gives the settlement cost, the SLO gate (pass / shortfall) and the normalised score. `run`,
`compare`, the leaderboard and the docs tables all call `score`, so they give the same number for one episode.

The objective (``scenario.objective``, ePACT eq. 1): minimise the hourly settlement cost subject to the SLO gate,
checked per arrival hour h with N_h arrivals and m_h misses:

* ``absolute``: m_h <= epsilon N_h (attainment >= 100 (1 - epsilon) %);
* ``relative``: m_h <= m_h^ref + tolerance_pp / 100 x N_h, the ``lower`` reference run's own misses in that hour
  (the same episode) plus the tolerance: attainment no lower than the reference's minus ``tolerance_pp``.

Counts are compared with a 1e-9 slack, so float rounding cannot fail an hour exactly on its boundary (a miss count
is an integer: the slack never admits one more miss). As Grid2Op normalises its scores, the ``lower`` reference
(vLLM) scores 0 and the ``upper`` one (the hindsight optimum) 100, linearly in the cost:

    score = 100 (cost_lower - cost) / (cost_lower - cost_upper),

and an episode that fails the gate scores ``min(score, 0) - shortfall``, one point below zero per percentage
point by which its worst arrival hour falls short of its threshold, so that no controller that fails the gate
ties with one that passes it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

__all__ = ["GateOutcome", "EpisodeScore", "apply_score", "gate_outcome", "normalised_score", "score",
           "summary_objective"]


@dataclass(frozen=True)
class GateOutcome:
    """An episode's SLO gate: per arrival hour the misses allowed and the attainment threshold (%)."""

    kind: str  # "absolute" | "relative"
    passed: bool
    allowed_misses: tuple[float, ...]  # per arrival hour
    threshold_pct: tuple[float, ...]  # per arrival hour (100 for an hour without arrivals)
    failed_hours: tuple[int, ...]
    shortfall_pct: float  # the worst hour's attainment below its threshold, percentage points (0 when passed)


@dataclass(frozen=True)
class EpisodeScore:
    """The verdict on one episode: its cost, its gate and, with both references, its normalised score."""

    cost_kwh_eq: float
    gate: GateOutcome
    score: float | None  # None without the references' costs
    lower_cost_kwh_eq: float | None = None
    upper_cost_kwh_eq: float | None = None

    def fields(self) -> dict[str, Any]:
        """The summary.json / results fields this verdict sets."""
        return {"score": self.score, "slo_gate_kind": self.gate.kind, "slo_gate_pass": self.gate.passed,
                "slo_gate_shortfall_pct": self.gate.shortfall_pct, "slo_gate_failed_hours": list(self.gate.failed_hours),
                "lower_cost_kwh_eq": self.lower_cost_kwh_eq, "upper_cost_kwh_eq": self.upper_cost_kwh_eq}


def summary_objective(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The objective an episode was run under, as its summary records it (``objective``: gate kind, tolerance,
    epsilon, references)."""
    obj = summary.get("objective")
    if not isinstance(obj, Mapping) or "gate" not in obj or "epsilon" not in obj:
        raise ValueError(f"score: the summary of {summary.get('controller')!r} on {summary.get('scenario')!r} records "
                         f"no objective (field 'objective'); re-run it with this version of commitenv")
    return dict(obj)


def _hourly(summary: Mapping[str, Any], who: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        n = np.asarray(summary["slo_arrivals_by_hour"], dtype=np.int64)
        m = np.asarray(summary["slo_misses_by_hour"], dtype=np.int64)
    except KeyError as e:
        raise ValueError(f"score: the {who} summary has no {e.args[0]!r} (per-arrival-hour SLO counts); re-run it "
                         f"with this version of commitenv") from None
    if n.shape != m.shape or n.ndim != 1 or np.any(m < 0) or np.any(m > n):
        raise ValueError(f"score: the {who} summary's per-hour SLO counts are inconsistent (arrivals {n.tolist()}, "
                         f"misses {m.tolist()})")
    return n, m


def gate_outcome(summary: Mapping[str, Any], lower: Mapping[str, Any] | None = None) -> GateOutcome:
    """The SLO gate of the episode ``summary`` under its recorded objective; a relative gate needs the ``lower``
    reference's summary of the same episode (ValueError without it, or when its arrivals differ)."""
    obj = summary_objective(summary)
    gate = obj["gate"]
    n, m = _hourly(summary, "episode's")
    kind = gate.get("kind", "absolute")
    if kind == "absolute":
        eps = float(obj["epsilon"])
        allowed = eps * n
    elif kind == "relative":
        if lower is None:
            raise ValueError(f"score: {summary.get('scenario')!r} declares a relative gate; its check needs the "
                             f"reference run ({obj.get('lower', 'vllm')}) of the same episode")
        n_ref, m_ref = _hourly(lower, "reference's")
        if not np.array_equal(n_ref, n):
            raise ValueError(f"score: the reference run has other arrivals per hour ({n_ref.tolist()}) than the "
                             f"episode ({n.tolist()}): it is not a run of the same episode")
        allowed = m_ref + float(gate["tolerance_pp"]) / 100.0 * n
    else:
        raise ValueError(f"score: unknown gate kind {kind!r} in the summary's objective; expected 'absolute' or "
                         f"'relative'")
    ok = m <= allowed + 1e-9
    threshold = np.divide(100.0 * (n - allowed), n, out=np.full(len(n), 100.0), where=n > 0)
    threshold = np.minimum(threshold, 100.0)
    att = np.divide(100.0 * (n - m), n, out=np.full(len(n), 100.0), where=n > 0)
    failed = tuple(int(h) for h in np.flatnonzero(~ok))
    short = max((float(threshold[h] - att[h]) for h in failed), default=0.0)
    return GateOutcome(kind, not failed, tuple(float(a) for a in allowed), tuple(float(t) for t in threshold), failed,
                       max(short, 0.0))


def normalised_score(cost: float, lower: float, upper: float, gate_pass: bool, shortfall_pct: float = 0.0) -> float:
    """The normalised score of one episode's ``cost`` between the references' costs (see the module docstring).
    ValueError when the costs are not finite or the references do not span a cost range."""
    if not all(math.isfinite(x) for x in (cost, lower, upper, shortfall_pct)) or shortfall_pct < 0:
        raise ValueError(f"score: costs must be finite, got cost {cost}, lower {lower}, upper {upper}")
    span = lower - upper
    if not span > 0:
        raise ValueError(f"score: the upper reference ({upper:.6g} kWh-eq) must cost less than the lower one "
                         f"({lower:.6g} kWh-eq) on every episode: here nothing can be gained over the lower "
                         "reference (e.g. full-capacity vLLM already stays under a commitment that is too large; "
                         "lower the commitment), so the episode has no score")
    s = 100.0 * (lower - cost) / span
    return s if gate_pass else min(s, 0.0) - shortfall_pct


def score(summary: Mapping[str, Any], lower: Mapping[str, Any] | None = None,
          upper: Mapping[str, Any] | None = None) -> EpisodeScore:
    """Judge one episode: its cost, its gate (a relative gate needs ``lower``) and, given both references' summaries
    of the same episode, its normalised score (else None)."""
    gate = gate_outcome(summary, lower)
    cost = float(summary["cost_kwh_eq"])
    if lower is None or upper is None:
        return EpisodeScore(cost, gate, None, None if lower is None else float(lower["cost_kwh_eq"]),
                            None if upper is None else float(upper["cost_kwh_eq"]))
    lo, up = float(lower["cost_kwh_eq"]), float(upper["cost_kwh_eq"])
    return EpisodeScore(cost, gate, normalised_score(cost, lo, up, gate.passed, gate.shortfall_pct), lo, up)


def apply_score(summary: dict[str, Any], refs: tuple[Mapping[str, Any], Mapping[str, Any]] | None) -> bool:
    """Set the score and the gate fields of ``summary`` (`EpisodeScore.fields`) from its episode's (lower, upper)
    references; without references, or when they cannot score it (a warning says why), leave it as it is."""
    if refs is None:
        return False
    try:
        summary.update(score(summary, *refs).fields())
    except ValueError as e:
        logging.getLogger("commitenv").warning("%s seed %s: no score (%s)", summary.get("controller"),
                                               summary.get("seed"), e)
        return False
    return True
