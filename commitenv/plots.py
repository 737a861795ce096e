"""Figures: the run overview (an episode interval by interval: load, energy against the commitment, decisions)
and the env's rgb_array render."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def new_figure(**kwargs: Any):
    """A figure on its own Agg canvas: no pyplot state, and a user's notebook backend is left alone."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def overview_figure(path: str | Path, *, scenario: str, controller: str, seed: int, hourly: list[dict[str, Any]],
                    intervals: list[dict[str, Any]], summary: dict[str, Any]):
    """The episode interval by interval, one point per interval in every panel: arrivals and misses (by arrival
    interval), energy against the commitment's pace, the open hour's energy against its commitment, active
    replicas and clock; from a run's records (`EvalResult` fields: ``intervals`` its `interval_rows`). Saved to
    ``path``; the figure is returned (for tests and notebooks)."""
    rows = intervals
    n = len(rows)
    hours = len(hourly)
    per_hour = max(n // max(hours, 1), 1)
    t0 = np.array([r["t_start_s"] for r in rows], dtype=np.float64)
    dt = float(t0[1] - t0[0]) if n > 1 else 60.0
    unit, scale = ("minute", 60.0) if hours <= 1 else ("hour", 3600.0)
    x = t0 / scale
    width = dt / scale
    col = lambda key: np.array([np.nan if r.get(key) is None else r[key] for r in rows], dtype=np.float64)  # noqa: E731
    energy, pace = col("energy_j") / 1e6, col("commitment_pace_j") / 1e6
    energy_only = bool(np.all(np.isnan(pace)))
    fig = new_figure(figsize=(10, 12))
    ax = fig.subplots(5, 1, sharex=True)
    s = summary
    dev = s.get("mean_abs_dev_pct")
    head = [f"attainment {s['attainment_pct']:.2f} %" if "attainment_pct" in s else "",
            f"|deviation| {dev:.2f} %" if isinstance(dev, (int, float)) else "",
            f"misses {s['misses']}" if "misses" in s else "",
            f"cost {s['cost_kwh_eq']:.4f} kWh-eq" if "cost_kwh_eq" in s else ""]
    title = f"{scenario} - {controller} (seed {seed})\n" + ", ".join(h for h in head if h)
    if s.get("backend_lagging"):
        title += "\nREPLAY LAGGED BEHIND REAL TIME: these numbers do not describe the pool"
    ax[0].set_title(title, fontsize=10, color="#c44e52" if s.get("backend_lagging") else "k")
    edges = np.append(x, x[-1] + width) if n else np.zeros(1)  # one step per interval (stairs: one artist each)
    ax[0].stairs(col("arrivals"), edges, fill=True, color="#7a9cc6", label="arrivals")
    ax[0].stairs(col("misses"), edges, fill=True, color="#c44e52", label="misses (by arrival interval)")
    ax[0].set_ylabel("requests per interval")
    ax[0].legend(loc="upper right", fontsize=8)
    ax[1].stairs(energy, edges, fill=True, color="#d98c5f", label="energy")
    if not energy_only:
        ax[1].stairs(pace, edges, color="k", baseline=None, label="commitment pace")
    ax[1].set_ylabel("energy per interval (MJ)")
    ax[1].legend(loc="upper right", fontsize=8)
    hour_of = np.arange(n) // per_hour
    cum = np.zeros(n)
    for h in np.unique(hour_of):  # the open hour's energy at each interval's end, back to 0 at every hour
        sel = hour_of == h
        cum[sel] = np.cumsum(np.nan_to_num(energy[sel]))
    ax[2].plot(x + width, cum, color="#d98c5f", label="energy so far in the hour")
    if not energy_only:
        ax[2].plot(x + width, (np.arange(n) % per_hour + 1) * pace, "k--", label="commitment pace")
    ax[2].set_ylabel("hour's energy (MJ)")
    ax[2].legend(loc="upper left", fontsize=8)
    ax[3].stairs(col("active"), edges, color="#4c72b0", baseline=None)
    ax[3].set_ylabel("active replicas")
    ax[3].set_ylim(bottom=0)
    ax[4].stairs(col("clock_mhz"), edges, color="#55a868", baseline=None)
    ax[4].set_ylabel("clock (MHz)")
    ax[4].set_xlabel(unit)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return fig


def render_progress(env: Any) -> np.ndarray:
    """RGB array: this hour's cumulative energy against the commitment, and settled hours so far."""
    fig = new_figure(figsize=(8, 3))
    ax = fig.subplots(1, 2)
    K = env.K
    h = min(env.k // K, env.H - 1)
    kin = env.k - h * K
    hist = env.history[h * K : h * K + kin]
    cum = np.cumsum([x["interval_j"] for x in hist]) / 1e6 if hist else np.zeros(0)
    ax[0].plot(np.arange(1, len(cum) + 1), cum, color="#d98c5f")
    energy_only = not np.any(env.commit_j)
    if not energy_only:
        ax[0].plot([0, K], [0, env.commit_j[h] / 1e6], "k--")
    ax[0].set_title(f"hour {h}: energy (MJ)" if energy_only else f"hour {h}: energy vs commitment (MJ)", fontsize=9)
    done = env.k // K
    ax[1].bar(np.arange(done), env.hour_energy_j[:done] / 1e6, color="#d98c5f")
    if not energy_only:
        ax[1].step(np.arange(env.H), env.commit_j / 1e6, where="mid", color="k")
    ax[1].set_title("settled hours (MJ)", fontsize=9)
    fig.tight_layout()
    canvas = fig.canvas
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[:, :, :3].copy()
