"""TTFT and TBT service-level objectives by request class (Festina Table 2, from DynamoLLM), scored next to the
end-to-end deadline.

Classes. A request's input class is short (< 256 prompt tokens), medium (< 1,024) or long (otherwise), its output
class short (< 100 output tokens), medium (< 350) or long (otherwise); its SLO class is the longer of the two (a
long prompt with a short answer still needs the long TTFT). Table 2 lists long as <= 8,192 input tokens; longer
prompts are classed long too. TTFT SLOs: 250 / 400 / 2,000 ms; TBT SLO: 100 ms for every class.

Measures. TTFT = first token - arrival (both as the client sees them: the engine's per-request overhead is
included). TBT is per token: a request meets its TBT SLO when *every* gap between two consecutive output tokens
(after the first) is within its class's bound, i.e. its longest gap (`Pool.max_tbt_s`, recorded by the engine at
each token) is. This is the paper's: Festina's local scheduler gives each decode task its own millisecond-level
deadline, the next token's (sec. 3.4, "decode deadlines are at the millisecond level ... prioritizes decodes when TBT
slack is tight"), so one stalled token (a decode held behind a long prefill chunk, a preemption, a migration)
breaks it even when the average is fine. The request's mean time between tokens after the first,
``(finish - first) / (output - 1)`` (vLLM's TPOT), is reported beside it as a second metric (``tbt_mean_*``); it
can hide such stalls. A one-token request has no gap and meets both. A request meets its latency SLO when it meets
its TTFT and per-token TBT SLOs; a rejected or unfinished request meets none.
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
    """Per request: class, TTFT, longest and mean time between tokens, and whether each SLO was met (``tbt_met``:
    per token, the SLO; ``tbt_mean_met``: the mean against the same bound, reported only)."""

    cls: np.ndarray
    ttft_s: np.ndarray
    tbt_s: np.ndarray  # the longest gap between consecutive output tokens (NaN: not finished, or not known)
    tbt_mean_s: np.ndarray
    ttft_met: np.ndarray
    tbt_met: np.ndarray
    tbt_mean_met: np.ndarray

    @property
    def met(self) -> np.ndarray:
        return self.ttft_met & self.tbt_met


def latency_outcome(arrival_s, first_s, finish_s, max_tbt_s, prompt_tokens, output_tokens,
                    served=None) -> LatencyOutcome:
    """Score every request against its class's TTFT and per-token TBT SLOs (``max_tbt_s``: each request's longest
    gap between consecutive output tokens, 0 for one token; NaN where it is not known, which does not meet the
    SLO; ``served``: False for rejected requests)."""
    cls = slo_class(prompt_tokens, output_tokens)
    ttft = np.asarray(first_s, dtype=np.float64) - np.asarray(arrival_s, dtype=np.float64)
    gap = np.asarray(max_tbt_s, dtype=np.float64)
    mean = mean_tbt(first_s, finish_s, output_tokens)
    done = ~np.isnan(np.asarray(finish_s, dtype=np.float64))
    if served is not None:
        done &= np.asarray(served, dtype=bool)
    bound = np.asarray(TBT_SLO_S)[cls] + 1e-12
    ttft_ok = done & (ttft <= np.asarray(TTFT_SLO_S)[cls] + 1e-12)
    return LatencyOutcome(cls, ttft, np.where(done, gap, np.nan), mean, ttft_ok, done & (gap <= bound),
                          done & (mean <= bound))


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
