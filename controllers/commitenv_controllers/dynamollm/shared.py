"""DynamoLLM on shared pools: one model's view of the snapshot, and the GPU clocks of per-model decisions."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import numpy as np

from commitenv.control import ReplicaView, RequestView, Snapshot


def model_view(snap: Snapshot, model: int) -> Snapshot:
    """``snap`` restricted to the replicas of ``model`` (renumbered from 0, in index order) and the requests routed to
    them; ``active`` counts its active and waking replicas, ``clock_mhz`` is the fastest of their GPUs' clocks.
    Unrouted requests are left out (the snapshot does not say their model)."""
    reps, req = snap.replicas, snap.requests
    own = np.flatnonzero(reps.model == model)
    renum = np.full(len(reps), -1, dtype=np.int64)
    renum[own] = np.arange(len(own))
    routed = req.replica >= 0
    keep = np.flatnonzero(routed & (renum[np.where(routed, req.replica, 0)] >= 0))
    cols = {f.name: getattr(req, f.name)[keep] for f in fields(RequestView)}
    cols["replica"] = renum[req.replica[keep]]
    rep_cols = {f.name: getattr(reps, f.name)[own] for f in fields(ReplicaView) if f.name != "state"}
    view = ReplicaView(state=tuple(reps.state[i] for i in own), **rep_cols)
    active = sum(1 for st in view.state if st in ("active", "waking"))
    clock = int(view.clock_mhz.max()) if len(own) else snap.clock_mhz
    return replace(snap, active=active, clock_mhz=clock, requests=RequestView(**cols), replicas=view)


def gpu_clocks_mhz(placement: Any, decisions: Any, clocks_mhz: tuple[int, ...]) -> list[int]:
    """Per GPU, the highest clock any of its active instances needs (``decisions``: (active, clock MHz) per model;
    a model's first ``active`` instances in placement order are its active ones); the lowest clock if none is."""
    seen = [0] * len(decisions)
    out = []
    for gpu in placement:
        need = []
        for m, _ in gpu:
            if seen[m] < decisions[m][0]:
                need.append(decisions[m][1])
            seen[m] += 1
        out.append(max(need, default=min(clocks_mhz)))
    return out
