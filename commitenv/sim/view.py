"""What a controller sees of the serving state: `Snapshot`, a read-only view of a decision boundary.

A snapshot holds the arrived, unfinished requests (prompt, predicted output length, progress, visible deadline,
queue position), the replicas' states and clocks and the controller meter's reading, as frozen records of
read-only arrays. `Snapshot.simulate` runs the engine on a private nominal copy of that state for what-if
prediction (`commitenv.sim.whatif`); the copy holds predicted lengths and visible deadlines only, no trace, no
truth model and no noise, so nothing reachable from a snapshot says more than the view itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from commitenv.sim.pool import Pool
from commitenv.sim.states import STATE_NAMES

if TYPE_CHECKING:  # pragma: no cover
    from commitenv.sim.whatif import WhatIf
    from commitenv.workload.table import RequestTable


def _frozen(values, dtype) -> np.ndarray:
    a = np.array(values, dtype=dtype)
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class RequestView:
    """Arrived, unfinished requests in queue order: replica by replica (by index) its running batch, then its
    waiting queue in admission order; then the requests no active replica could take yet and those migrating between GPUs (``replica == -1``)."""

    slot: np.ndarray  # int64: the request's index in the episode's trace order (arrival order)
    arrival_s: np.ndarray  # float64
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64: the *predicted* output length (at least generated + 1); true only
    # when the scenario grants oracle lengths (``observation.oracle_lengths``)
    generated_tokens: np.ndarray  # int64: output tokens produced so far
    computed_tokens: np.ndarray  # int64: tokens whose KV cache is computed (prompt and generated)
    deadline_s: np.ndarray  # float64: the deadline a controller sees (predicted when deadlines are predicted)
    replica: np.ndarray  # int64: replica index, -1 while unrouted
    running: np.ndarray  # bool: in its replica's running batch (False: waiting or unrouted)

    def __len__(self) -> int:
        return len(self.slot)


@dataclass(frozen=True, eq=False)
class ReplicaView:
    """One entry per replica, by index."""

    state: tuple[str, ...]  # "active", "draining", "standby", "waking", "moving" (leaving its GPU) or "loading"
    gpu: np.ndarray  # int64: the GPU the replica runs on
    model: np.ndarray  # int64: the model it serves
    share: np.ndarray  # float64: its SM share of the GPU (1 on a dedicated GPU)
    clock_mhz: np.ndarray  # int64: its GPU's current clock
    running: np.ndarray  # int64: requests in its running batch
    waiting: np.ndarray  # int64: requests in its waiting queue
    kv_blocks: np.ndarray  # int64: KV blocks it reserved where it loaded (`commitenv.sim.memory`)
    free_kv_blocks: np.ndarray  # int64: of those, free now
    memory_share: np.ndarray  # float64: the part of its GPU's usable memory it reserved (footprint + KV cache)

    def __len__(self) -> int:
        return len(self.state)


@dataclass(frozen=True, eq=False)
class Snapshot:
    """Causal serving state at time ``t`` (read-only: attributes cannot be set, arrays cannot be written)."""

    t: float
    active: int  # active replicas of model 0 (draining and waking ones not counted)
    clock_mhz: int  # GPU 0's current clock
    requests: RequestView
    replicas: ReplicaView
    meter_j: float | None  # pool energy as the controller's counters read it at the last decision boundary
    # (None outside an environment)
    _engine: Pool = field(repr=False)  # nominal engine copy that `simulate` starts from (never mutated)

    @property
    def n_requests(self) -> int:
        """|I_k|: the arrived, unfinished requests."""
        return len(self.requests)

    @property
    def deadlines(self) -> dict[int, float]:
        """Visible deadline by request slot (a new dict each call)."""
        return dict(zip(self.requests.slot.tolist(), self.requests.deadline_s.tolist()))

    def simulate(self, active: int | tuple[int, ...], clock_mhz: int, horizon_s: float, arrivals: "RequestTable | None" = None, *,
                 max_tail_s: float = 3600.0, track_arrivals: bool = False) -> "WhatIf":
        """What-if run from this state under (active, clock); see `commitenv.sim.whatif.simulate`. ValueError
        naming the argument for a negative, NaN or infinite horizon or tail, or an ``active`` that is not a whole
        number (4.0 and True are not) or a tuple of them."""
        from commitenv.sim.whatif import simulate

        _check_simulate_args(active, horizon_s, max_tail_s)
        return simulate(self, active, clock_mhz, horizon_s, arrivals, max_tail_s=max_tail_s,
                        track_arrivals=track_arrivals)


def _whole(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _check_simulate_args(active: object, horizon_s: object, max_tail_s: object) -> None:
    """`Snapshot.simulate`'s arguments checked before the engine sees them (a controller's typo, not a crash)."""
    for name, v in (("horizon_s", horizon_s), ("max_tail_s", max_tail_s)):
        if (not isinstance(v, (int, float, np.integer, np.floating)) or isinstance(v, (bool, np.bool_))
                or not np.isfinite(v) or v < 0):
            raise ValueError(f"simulate: {name} must be a finite number of seconds >= 0, got {v!r}")
    counts = tuple(active) if isinstance(active, (tuple, list)) else (active,)
    if not counts or not all(_whole(a) for a in counts):
        raise ValueError(f"simulate: active must be a whole number of replicas (or a tuple of them, one per model), "
                         f"got {active!r}")


def take_snapshot(pool: Pool, model: int = 0, meter_j: float | None = None) -> Snapshot:
    """Capture the causal state of ``pool`` at its current time (after `Pool.settle`)."""
    clone = pool.clone(hide_lengths=not pool.opt.oracle_lengths, own_profiles=True)
    ks = clone._ks
    rows = ks.view_rows()
    requests = RequestView(**{k: _frozen(v, v.dtype) for k, v in rows.items()})
    reps = ks.view_replicas()
    state = tuple(STATE_NAMES[s] for s in reps.pop("state").tolist())
    replicas = ReplicaView(state, **{k: _frozen(v, v.dtype) for k, v in reps.items()})
    clock = int(ks.gpu_clock_mhz()[0])
    return Snapshot(pool.now, clone.active_count(model), clock, requests, replicas, meter_j, clone)
