"""The SLO gate calibrated on the misses observed (ePACT+ step 7, also MPC's ``miss_margin``).

A what-if run predicts each request's slack (deadline - predicted finish) on the nominal profile. The hardware's slower
steps, stragglers and the arrivals no replay foresaw turn requests predicted just in time into misses, so a gate that
counts only negative slacks admits configurations whose real misses exceed epsilon. `MissMargin` counts a request as a
predicted miss when its slack is below a margin: the quantile of the applied candidates' predicted slacks (the last
hour's decisions) at the miss rate observed after them. Causal: it learns from misses already known.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import numpy as np

from commitenv.sim.whatif import WhatIf


def slack_margin(rows: Sequence[tuple[int, int, np.ndarray]]) -> float:
    """The gate's miss margin (s) from ``rows`` of applied decisions, each (misses observed in the interval after it,
    arrivals in that interval, the applied candidate's predicted slacks): the least margin below which at least the
    observed miss rate (ratio of sums) of the pooled slacks fall; 0 without misses, arrivals or slacks, and never
    below 0 (the gate is never loosened)."""
    arrivals = sum(r[1] for r in rows)
    misses = sum(r[0] for r in rows)
    pooled = np.sort(np.concatenate([r[2] for r in rows])) if rows else np.zeros(0)
    if arrivals <= 0 or misses <= 0 or len(pooled) == 0:
        return 0.0
    k = min(-(-misses * len(pooled) // arrivals), len(pooled))  # ceil(rate x slacks), in integers
    return max(float(np.nextafter(pooled[k - 1], math.inf)), 0.0)


class MissMargin:
    """Per decision: `count` the predicted misses of each candidate at the current margin (remembering its slacks);
    at the next decision `observe` the misses that followed the applied candidate, which moves the margin."""

    def __init__(self, decisions: int) -> None:
        """``decisions``: how many applied decisions the margin is fitted on (one hour's)."""
        self.rows: deque[tuple[int, int, np.ndarray]] = deque(maxlen=max(int(decisions), 1))
        self.margin_s = 0.0
        self._slacks: dict[tuple[int, int], np.ndarray] = {}

    def count(self, config: tuple[int, int], w: WhatIf) -> int:
        """Predicted slacks of ``w`` (the what-if run of ``config``: active, clock MHz) below the margin; at margin 0
        exactly the predicted misses."""
        slacks = np.asarray(w.slack_s, dtype=np.float64)
        self._slacks[(int(config[0]), int(config[1]))] = slacks
        return int(np.count_nonzero(slacks < self.margin_s))

    def observe(self, applied: tuple[int, int] | None, misses: int | None, arrivals: int) -> None:
        """The interval after the last decision ended with ``misses`` newly known misses and ``arrivals`` arrivals
        under ``applied`` (the configuration chosen then; None: nothing was chosen): record it against that
        candidate's slacks and set the margin for the decision now being made."""
        slacks = self._slacks.get((int(applied[0]), int(applied[1]))) if applied is not None else None
        if slacks is not None and misses is not None:
            self.rows.append((int(misses), int(arrivals), slacks))
        self._slacks = {}
        self.margin_s = slack_margin(self.rows)
