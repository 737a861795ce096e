"""TTFT and TBT service-level objectives by request class (Festina Table 2, from DynamoLLM), scored next to the
end-to-end deadline.

Classes. A request's input class is short (< 256 prompt tokens), medium (< 1,024) or long (otherwise), its output
class short (< 100 output tokens), medium (< 350) or long (otherwise); its SLO class is the longer of the two (a
long prompt with a short answer still needs the long TTFT). Table 2 lists long as <= 8,192 input tokens; longer
prompts are classed long too. TTFT SLOs: 250 / 400 / 2,000 ms; TBT SLO: 100 ms for every class.

Measures. TTFT = first token - arrival (both as the client sees them: the engine's per-request overhead is
included). TBT = the request's mean time between tokens after the first, ``(finish - first) / (output - 1)``
(vLLM's TPOT; a one-token request has none and meets its TBT SLO). A request meets its latency SLO when it meets
both; a rejected or unfinished request meets neither.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CLASS_NAMES = ("short", "medium", "long")
INPUT_EDGES = (256, 1024)  # prompt tokens: short < 256 <= medium < 1024 <= long
OUTPUT_EDGES = (100, 350)  # output tokens: short < 100 <= medium < 350 <= long
TTFT_SLO_S = (0.250, 0.400, 2.000)
TBT_SLO_S = (0.100, 0.100, 0.100)


def slo_class(prompt_tokens, output_tokens) -> np.ndarray:
    """SLO class per request (0 short, 1 medium, 2 long): the longer of its input and output classes."""
    p = np.asarray(prompt_tokens)
    d = np.asarray(output_tokens)
    return np.maximum(np.searchsorted(INPUT_EDGES, p, side="right"),
                      np.searchsorted(OUTPUT_EDGES, d, side="right")).astype(np.int64)


def mean_tbt(first_s, finish_s, output_tokens) -> np.ndarray:
    """Mean time between tokens after the first (NaN where the request did not finish; 0 for one token)."""
    first = np.asarray(first_s, dtype=np.float64)
    fin = np.asarray(finish_s, dtype=np.float64)
    gaps = np.asarray(output_tokens, dtype=np.float64) - 1.0
    out = np.full(fin.shape, np.nan)
    done = ~np.isnan(fin)
    out[done] = 0.0
    many = done & (gaps > 0)
    out[many] = (fin[many] - first[many]) / gaps[many]
    return out


@dataclass(frozen=True)
class LatencyOutcome:
    """Per request: class, TTFT, mean TBT and whether each SLO was met."""

    cls: np.ndarray
    ttft_s: np.ndarray
    tbt_s: np.ndarray
    ttft_met: np.ndarray
    tbt_met: np.ndarray

    @property
    def met(self) -> np.ndarray:
        return self.ttft_met & self.tbt_met


def latency_outcome(arrival_s, first_s, finish_s, prompt_tokens, output_tokens, served=None) -> LatencyOutcome:
    """Score every request against its class's TTFT and TBT SLOs (``served``: False for rejected requests)."""
    cls = slo_class(prompt_tokens, output_tokens)
    ttft = np.asarray(first_s, dtype=np.float64) - np.asarray(arrival_s, dtype=np.float64)
    tbt = mean_tbt(first_s, finish_s, output_tokens)
    done = ~np.isnan(np.asarray(finish_s, dtype=np.float64))
    if served is not None:
        done &= np.asarray(served, dtype=bool)
    ttft_ok = done & (ttft <= np.asarray(TTFT_SLO_S)[cls] + 1e-12)
    tbt_ok = done & (tbt <= np.asarray(TBT_SLO_S)[cls] + 1e-12)
    return LatencyOutcome(cls, ttft, tbt, ttft_ok, tbt_ok)


def attainment_by(groups: np.ndarray, met: np.ndarray, names) -> dict[str, dict[str, float]]:
    """Attainment (%) and request count per group (``names[g]`` for group index g; groups without requests
    are left out)."""
    out: dict[str, dict[str, float]] = {}
    groups = np.asarray(groups)
    met = np.asarray(met, dtype=bool)
    for g, name in enumerate(names):
        sel = groups == g
        n = int(sel.sum())
        if n:
            out[str(name)] = {"requests": n, "attainment_pct": 100.0 * float(met[sel].mean())}
    return out
