"""Figures: the run overview (like the ePACT paper's Figures 5 and 6) and the env's rgb_array render."""

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
                    history: list[dict[str, float]]) -> None:
    """Four panels: arrivals, energy against commitment, signed deviation, attainment (by hour; per
    interval energy for a single-hour run), from a run's hourly rows and interval history (`EvalResult` fields)."""
    hours = np.array([r["hour"] for r in hourly])
    energy_only = all(r["deviation_pct"] is None for r in hourly)  # no commitment: nothing to deviate from
    fig = new_figure(figsize=(9, 10))
    ax = fig.subplots(4, 1, sharex=len(hours) > 1)
    title = f"{scenario} - {controller} (seed {seed})"
    ax[0].bar(hours, [r["arrivals"] for r in hourly], color="#7a9cc6")
    ax[0].set_ylabel("arrivals")
    ax[0].set_title(title)
    if len(hours) > 1:
        ax[1].bar(hours, [r["energy_mj"] for r in hourly], color="#d98c5f", label="energy")
        if not energy_only:
            ax[1].step(hours, [r["commitment_mj"] for r in hourly], where="mid", color="k", label="commitment")
        ax[1].set_ylabel("energy (MJ)")
    else:
        t = np.array([h["t"] for h in history]) / 60.0
        cum = np.cumsum([h["interval_j"] for h in history]) / 1e6
        ax[1].plot(t, cum, color="#d98c5f", label="cumulative energy")
        if not energy_only:
            ax[1].plot([0, t[-1] if len(t) else 60], [0, hourly[0]["commitment_mj"]], "k--", label="commitment pace")
        ax[1].set_ylabel("energy (MJ)")
        ax[1].set_xlabel("minute")
    ax[1].legend(loc="upper left", fontsize=8)
    dev = [r["deviation_pct"] for r in hourly]
    if energy_only:
        ax[2].text(0.5, 0.5, "energy-only settlement: no commitment, no deviation", ha="center", va="center",
                   transform=ax[2].transAxes)
        ax[2].set_xticks([])
        ax[2].set_yticks([])
    else:
        dev = [np.nan if d is None else d for d in dev]  # an hour without commitment has no deviation
        ax[2].bar(hours, dev, color=["#c44e52" if d > 0 else "#55a868" for d in dev])
        ax[2].axhspan(-5, 5, color="0.9", zorder=0)
        ax[2].axhline(0, color="k", lw=0.8)
    ax[2].set_ylabel("deviation (%)")
    ax[3].plot(hours, [r["attainment_pct"] for r in hourly], "o-", color="#4c72b0")
    ax[3].set_ylabel("SLO attainment (%)")
    ax[3].set_xlabel("hour")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


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
