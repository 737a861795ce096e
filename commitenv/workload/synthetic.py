"""Synthetic request streams: hour-by-hour arrival counts or rates, renewal burstiness, empirical lengths.

Arrivals are built in "operational time" and mapped to clock time through a within-hour intensity:

* **Burstiness.** Inter-arrival gaps are gamma distributed with coefficient of variation ``burstiness_cv``
  (shape ``1/cv**2``); ``cv = 1`` is a Poisson process, ``cv > 1`` clusters arrivals into bursts.
* **Exact counts** (``hourly_counts``): hour ``h`` draws ``n_h + 1`` gaps and rescales their partial sums into
  the hour, so it gets exactly ``n_h`` arrivals and keeps the gaps' CV (for ``cv = 1`` this is exactly a
  Poisson process conditioned on its count).
* **Rates** (``hourly_rates``, expected requests per hour): one renewal process over the whole horizon in
  operational time; hour ``h`` holds ``rate_h`` units of it, so counts vary from run to run.
* **Within-hour shape.** With ``smooth=True`` the intensity interpolates linearly between hourly levels placed
  at hour midpoints (flat before the first and after the last midpoint); ``minute_shape`` (60 weights, or 60
  per hour) multiplies it minute by minute. The shape moves arrivals inside an hour, never across hours.

Everything is deterministic given ``seed``: arrivals and lengths use independent child streams of
``numpy.random.SeedSequence(seed)``, so changing the lengths never changes the arrival times.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .lengths import EmpiricalLengths
from .table import RequestTable, WorkloadError
from .transforms import time_window

HOUR_S = 3600.0
_MINUTES = 60
_EDGE_S = 1e-6  # keep arrivals strictly inside their hour under float rounding


def _minute_weights(levels: np.ndarray, smooth: bool, minute_shape: Sequence[float] | None,
                    edge_levels: tuple[float | None, float | None] = (None, None)) -> np.ndarray:
    """(H, 60) non-negative intensity weights of every minute of every hour (``edge_levels``: the levels of the
    hours just before and after, which shape a smooth intensity near the edges as in a longer source)."""
    n_hours = len(levels)
    before, after = edge_levels
    knots = np.arange(n_hours) + 0.5
    vals = levels
    if before is not None:
        knots, vals = np.concatenate([[-0.5], knots]), np.concatenate([[before], vals])
    if after is not None:
        knots, vals = np.concatenate([knots, [n_hours + 0.5]]), np.concatenate([vals, [after]])
    if smooth and len(vals) > 1:
        t = np.arange(n_hours * _MINUTES, dtype=np.float64) / _MINUTES + 0.5 / _MINUTES  # minute midpoints, h
        w = np.interp(t, knots, vals).reshape(n_hours, _MINUTES)
    else:
        w = np.repeat(levels[:, None], _MINUTES, axis=1).astype(np.float64)
    if minute_shape is not None:
        shape = np.asarray(minute_shape, dtype=np.float64)
        if shape.size not in (_MINUTES, n_hours * _MINUTES) or np.any(~np.isfinite(shape)) or np.any(shape < 0):
            raise WorkloadError(f"minute_shape must hold 60 or {n_hours * _MINUTES} finite weights >= 0, "
                                f"got {shape.size}")
        w = w * shape.reshape(-1, _MINUTES)
    return w


def _within_hour(u: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Map fractions ``u`` in [0, 1) of an hour's mass to seconds in [0, 3600) under per-minute ``weights``."""
    cdf = np.concatenate([[0.0], np.cumsum(weights)])
    if cdf[-1] <= 0:
        raise WorkloadError("synthesize: minute_shape gives an hour with arrivals zero weight in every minute")
    cdf /= cdf[-1]
    sec = np.interp(u, cdf, np.linspace(0.0, HOUR_S, _MINUTES + 1))
    return np.clip(sec, 0.0, HOUR_S - _EDGE_S)


def _gaps(rng: np.random.Generator, n: int, cv: float) -> np.ndarray:
    shape = 1.0 / cv**2
    return rng.standard_gamma(shape, size=n) / shape  # mean 1, CV = cv


def _positions_counts(counts: np.ndarray, rng: np.random.Generator, cv: float) -> np.ndarray:
    """Fractions of each hour (hour-major order) for exactly ``counts[h]`` arrivals per hour."""
    n_hours = len(counts)
    g = _gaps(rng, int(counts.sum()) + n_hours, cv)
    c = np.cumsum(g)
    ends = np.cumsum(counts + 1) - 1  # index of each hour's closing gap
    base = np.concatenate([[0.0], c[ends[:-1]]])
    total = c[ends] - base
    keep = np.ones(len(g), dtype=bool)
    keep[ends] = False
    hour = np.repeat(np.arange(n_hours), counts)
    return (c[keep] - base[hour]) / total[hour]


def _positions_rates(rates: np.ndarray, rng: np.random.Generator, cv: float) -> tuple[np.ndarray, np.ndarray]:
    """(hour, fraction) of a renewal process whose hour ``h`` spans ``rates[h]`` operational units."""
    mass = float(rates.sum())
    edges = np.concatenate([[0.0], np.cumsum(rates)])
    n_guess = int(mass + 8 * cv * np.sqrt(mass + 1) + 16)
    s = np.cumsum(_gaps(rng, n_guess, cv))
    while len(s) and s[-1] < mass:
        s = np.concatenate([s, s[-1] + np.cumsum(_gaps(rng, n_guess, cv))])
    s = s[s < mass]
    hour = np.clip(np.searchsorted(edges, s, side="right") - 1, 0, len(rates) - 1)
    frac = (s - edges[hour]) / np.where(rates[hour] > 0, rates[hour], 1.0)
    return hour, np.clip(frac, 0.0, 1.0)


def synthesize(
    hourly_counts: Sequence[int] | None = None,
    *,
    hourly_rates: Sequence[float] | None = None,
    lengths: EmpiricalLengths,
    seed: int,
    burstiness_cv: float = 1.0,
    smooth: bool = True,
    minute_shape: Sequence[float] | None = None,
    tenant: str = "default",
    start_s: float = 0.0,
    edge_levels: tuple[float | None, float | None] = (None, None),
) -> RequestTable:
    """A synthetic request table over ``len(hourly_counts or hourly_rates)`` hours starting at ``start_s``.

    Give exactly one of ``hourly_counts`` (exact arrivals per hour) or ``hourly_rates`` (expected arrivals per
    hour). Lengths are sampled from ``lengths`` (its ``context_limit`` applies). See the module docstring.
    """
    if (hourly_counts is None) == (hourly_rates is None):
        raise WorkloadError("synthesize: give exactly one of hourly_counts or hourly_rates")
    if not (np.isfinite(burstiness_cv) and burstiness_cv > 0):
        raise WorkloadError(f"synthesize: burstiness_cv must be > 0, got {burstiness_cv}")
    if not (np.isfinite(start_s) and start_s >= 0):
        raise WorkloadError(f"synthesize: start_s must be >= 0, got {start_s}")
    raw = hourly_counts if hourly_counts is not None else hourly_rates
    levels = np.asarray(raw, dtype=np.float64).reshape(-1)
    label = "hourly_counts" if hourly_counts is not None else "hourly_rates"
    if len(levels) == 0 or np.any(~np.isfinite(levels)) or np.any(levels < 0):
        raise WorkloadError(f"synthesize: {label} must be a non-empty sequence of finite values >= 0")
    if hourly_counts is not None and np.any(levels != np.floor(levels)):
        raise WorkloadError("synthesize: hourly_counts must be whole numbers (use hourly_rates for expected counts)")
    arrival_rng, length_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    weights = _minute_weights(levels, smooth, minute_shape, edge_levels)
    if hourly_counts is not None:
        counts = levels.astype(np.int64)
        frac = _positions_counts(counts, arrival_rng, burstiness_cv)
        hour = np.repeat(np.arange(len(counts)), counts)
    else:
        hour, frac = _positions_rates(levels, arrival_rng, burstiness_cv)
        counts = np.bincount(hour, minlength=len(levels))
    arrival = np.empty(len(frac), dtype=np.float64)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    for h in np.flatnonzero(counts):
        sl = slice(bounds[h], bounds[h + 1])
        arrival[sl] = start_s + h * HOUR_S + _within_hour(frac[sl], weights[h])
    np.maximum.accumulate(arrival, out=arrival)  # guard against float ties at minute edges
    prompt, output = lengths.sample(len(arrival), length_rng)
    n = len(arrival)
    return RequestTable(
        arrival_s=arrival,
        prompt_tokens=prompt,
        output_tokens=output,
        tenant=np.zeros(n, dtype=np.int32),
        request_id=np.arange(n, dtype=np.int64),
        tenant_names=(tenant,),
        source=f"synthetic(seed={seed})",
        meta={
            "generator": "synthetic", "seed": seed, "burstiness_cv": burstiness_cv, "smooth": smooth,
            "hourly_counts": [int(x) for x in counts], "start_s": start_s, "lengths_source": lengths.source,
        },
    )


def window_hours(start_hour: float, hours: int) -> tuple[int, int]:
    """The whole source hours ``[h0, h1)`` that a window ``[start_hour, start_hour + hours)`` touches."""
    return int(np.floor(start_hour)), int(np.ceil(start_hour + hours - 1e-9))


def synthesize_window(
    levels: Sequence[float],
    *,
    counts: bool,
    start_hour: float,
    hours: int,
    lengths: EmpiricalLengths,
    seed: int,
    burstiness_cv: float = 1.0,
    smooth: bool = True,
    rate_factors: Sequence[float] | None = None,
    minute_shape: Sequence[float] | None = None,
) -> RequestTable:
    """Hours ``[start_hour, start_hour + hours)`` of a source with hourly ``levels`` (exact counts or expected
    rates), drawn afresh from ``seed`` and rebased to time 0: only the hours touched are generated, the hours just
    outside shape a smooth intensity at the edges as in the whole source. ``rate_factors`` (one per hour touched)
    scale the levels, the neighbours taking their edge's factor; ``minute_shape`` (60 weights per hour touched)
    modulates arrivals within each hour."""
    lv_all = np.asarray(levels, dtype=np.float64)
    n = len(lv_all)
    h0, h1 = window_hours(start_hour, hours)
    if h0 < 0 or h1 > n:
        raise WorkloadError(f"window [{start_hour:g} h, {start_hour + hours:g} h) runs past the source's {n} h")
    f = np.ones(h1 - h0)
    if rate_factors is not None:
        f = np.asarray(rate_factors, dtype=np.float64)
        if f.shape != (h1 - h0,) or np.any(~np.isfinite(f)) or np.any(f <= 0):
            raise WorkloadError(f"rate_factors: expected {h1 - h0} finite factors > 0, got {f.shape}")
    if minute_shape is not None:
        minute_shape = np.asarray(minute_shape, dtype=np.float64).reshape(-1)
        if minute_shape.size != _MINUTES * (h1 - h0):
            raise WorkloadError(f"minute_shape: expected {_MINUTES * (h1 - h0)} weights, got {minute_shape.size}")
    lv = lv_all[h0:h1] * f
    edges = (float(lv_all[h0 - 1] * f[0]) if h0 > 0 else None, float(lv_all[h1] * f[-1]) if h1 < n else None)
    kw = dict(lengths=lengths, seed=seed, burstiness_cv=burstiness_cv, smooth=smooth, minute_shape=minute_shape,
              edge_levels=edges)
    table = synthesize(np.rint(lv).astype(np.int64).tolist(), **kw) if counts else synthesize(hourly_rates=lv.tolist(), **kw)
    t0 = (start_hour - h0) * HOUR_S
    out = time_window(table, t0, t0 + hours * HOUR_S, rebase=True)
    out.meta.update({"window_start_hour": start_hour, "episode_seed": seed})
    return out
