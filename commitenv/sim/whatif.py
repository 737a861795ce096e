"""What-if prediction: the engine itself, run on a snapshot's causal, nominal copy of the serving state
(`commitenv.sim.view`: only arrived requests, output lengths replaced by their predictions unless the scenario
grants oracle lengths, visible deadlines). `simulate` applies a candidate
configuration, optionally replays observed arrivals as the forecast, meters the interval energy over the
horizon, then continues until every captured request finishes (ePACT section 4.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from commitenv.sim.pool import REPLAY_SLOT_BASE, Pool
from commitenv.workload.table import RequestTable


class SnapshotLike(Protocol):
    """What a what-if reads of a `commitenv.sim.view.Snapshot` (declared here so that the view imports the what-if
    and not the other way round): its time, its requests' slots and visible deadlines, and its engine copy."""

    t: float
    requests: Any  # a `RequestView`: ``slot`` and ``deadline_s`` arrays
    _engine: Pool


@dataclass(frozen=True)
class WhatIf:
    """Prediction for one candidate configuration."""

    energy_j: float  # pool energy over [t, t + horizon]
    finish: dict[int, float]  # slot -> predicted completion time (inf if not done by the tail limit)
    misses: int  # captured requests predicted to finish after their deadline
    worst_margin_s: float  # min over captured of deadline - predicted finish (inf when none)
    complete: bool  # every captured request finished within the tail limit
    forecast_n: int = 0  # replayed arrivals followed (track_arrivals)
    forecast_misses: int = 0  # of those, predicted to miss their deadline
    forecast_margin_s: float = math.inf  # min deadline - predicted finish over them
    slack_s: tuple[float, ...] = ()  # deadline - predicted finish of every captured, then followed replayed, request


def observed_arrivals(pool: Pool, window_s: float, shift_s: float | None = None) -> RequestTable:
    """Arrivals of the last ``window_s`` seconds (prompt lengths, *predicted* output lengths), shifted by
    ``shift_s`` (default ``window_s``) so they replay from now on. Only arrived requests are read."""
    if pool.table is None:
        raise ValueError("pool has no workload attached")
    t = pool.now
    hi = pool.arrived
    lo = int(np.searchsorted(pool.table.arrival_s[:hi], t - window_s, side="left"))
    idx = np.arange(lo, hi)
    shift = window_s if shift_s is None else shift_s
    out = pool.out_tokens[idx] if pool.opt.oracle_lengths else pool.pred_out[idx]
    return RequestTable(
        arrival_s=pool.table.arrival_s[idx] + shift,
        prompt_tokens=pool.table.prompt_tokens[idx],
        output_tokens=out,
        tenant=pool.table.tenant[idx],
        request_id=pool.table.request_id[idx],
        tenant_names=pool.table.tenant_names,
        source="observed-replay",
    )


def simulate(
    snap: SnapshotLike,
    active: int | tuple[int, ...],
    clock_mhz: int,
    horizon_s: float,
    arrivals: RequestTable | None = None,
    *,
    max_tail_s: float = 3600.0,
    track_arrivals: bool = False,
) -> WhatIf:
    """Predict interval energy and captured requests' completions under configuration (active, clock); on a pool of
    several models ``active`` gives each model's count (replayed arrivals go to their tenants' models).

    With ``track_arrivals`` the replayed arrivals are followed to completion too and appear in ``finish``
    under slot ``REPLAY_SLOT_BASE + i``; misses and margin still cover the snapshot's requests only.
    """
    pool = snap._engine.clone(hide_lengths=False)
    t = snap.t
    pool.capture_all(arrivals=track_arrivals)
    if isinstance(active, (tuple, list)):
        if len(active) != pool.n_models:
            raise ValueError(f"what-if: expected {pool.n_models} active counts (one per model), got {active!r}")
        for m, a in enumerate(active):
            pool.set_active(t, int(a), model=m)
    elif pool.n_models > 1:
        raise ValueError(f"what-if: a pool of {pool.n_models} models takes one active count per model, got {active!r}")
    else:
        pool.set_active(t, active)
    pool.set_clock(t, clock_mhz)
    if arrivals is not None and len(arrivals):
        sel = arrivals.arrival_s < t + horizon_s
        pool.attach_replay(arrivals.take(np.flatnonzero(sel)) if not sel.all() else arrivals)
    e0 = pool.energy_j(t)
    pool.run_until(t + horizon_s)
    energy = pool.energy_j(t + horizon_s) - e0
    if pool.captured_left > 0:
        pool.run_until(t + horizon_s + max_tail_s, stop_when_captured_done=True)
    slots = snap.requests.slot.tolist()
    fin = {slot: pool.captured_finish.get(slot, math.inf) for slot in slots}
    slack: list[float] = []
    misses = 0
    margin = math.inf
    for slot, dl in zip(slots, snap.requests.deadline_s.tolist()):
        m = dl - fin[slot]
        slack.append(m)
        if m < 0:
            misses += 1
        if m < margin:
            margin = m
    f_n = f_miss = 0
    f_margin = math.inf
    if track_arrivals:
        for i in range(pool.arrived):
            f = fin[REPLAY_SLOT_BASE + i] = pool.captured_finish.get(REPLAY_SLOT_BASE + i, math.inf)
            if pool.rejected[i]:
                continue
            m = pool._deadline[i] - f
            slack.append(m)
            f_n += 1
            f_miss += m < 0
            f_margin = min(f_margin, m)
    return WhatIf(energy, fin, misses, margin, pool.captured_left == 0, f_n, int(f_miss), f_margin, tuple(slack))
