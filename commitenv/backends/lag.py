"""How far a hardware run falls behind real time, and the bound past which it stops describing the pool.

A `HardwarePool` replays the trace in real time. Two delays make its numbers wrong without any error: arrivals
routed late (the pool's thread was not scheduled in time: each request loses that much of its SLO budget), and,
on the CPU fakes, engine steps that take longer than the profile's law says (the worker threads cannot keep up
with a clock running SPEED times real time: every request is served that much slower). `LagMeter` measures both;
`LagBound` states how much is tolerated and whether a run past it aborts or is marked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

ON_EXCEED = ("abort", "warn")


class ReplayLagError(ValueError):
    """The replay fell behind real time past the bound (the speed or pool size cannot be replayed faithfully here)."""


@dataclass(frozen=True)
class LagBound:
    """The lag a run may have: at most ``max_late_arrivals_pct`` % of the arrivals routed more than
    ``late_arrival_s`` (trace seconds) after their time, and the fakes' steps at most ``max_step_overrun_pct`` %
    longer than their modelled time (summed over the run so far). ``on_exceed``: ``warn`` (log once at the
    interval boundary where it is first exceeded, finish, mark the run ``backend_lagging``) or ``abort`` (raise
    `ReplayLagError` there)."""

    late_arrival_s: float = 1.0
    max_late_arrivals_pct: float = 1.0
    max_step_overrun_pct: float = 25.0
    on_exceed: str = "warn"

    def __post_init__(self) -> None:
        for name in ("late_arrival_s", "max_late_arrivals_pct", "max_step_overrun_pct"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"lag bound: {name} must be a finite number >= 0, got {v!r}")
        if self.on_exceed not in ON_EXCEED:
            raise ValueError(f"lag bound: on_exceed must be one of {ON_EXCEED}, got {self.on_exceed!r}")


@dataclass
class LagMeter:
    """The lag measured so far: arrivals routed, how many more than ``late_arrival_s`` (trace s) after their time,
    the largest delay and the arrival it delayed; the fakes' modelled step time and the time their steps took
    beyond it (s). Counted as they come (a day has hundreds of thousands of arrivals)."""

    late_arrival_s: float = 1.0
    arrivals: int = 0
    late_arrivals: int = 0
    max_arrival_lag_s: float = 0.0
    worst_arrival_t: float = 0.0
    modelled_step_s: float = 0.0
    step_overrun_s: float = 0.0
    exceeded: str | None = None  # why the bound was first exceeded (None: within it so far)

    def routed(self, arrival_t: float, now: float) -> None:
        """An arrival due at ``arrival_t`` was routed at ``now`` (trace time)."""
        lag = now - arrival_t
        self.arrivals += 1
        if lag > self.late_arrival_s:
            self.late_arrivals += 1
        if lag > self.max_arrival_lag_s:
            self.max_arrival_lag_s, self.worst_arrival_t = lag, arrival_t

    @property
    def late_arrivals_pct(self) -> float:
        return 100.0 * self.late_arrivals / self.arrivals if self.arrivals else 0.0

    @property
    def step_overrun_pct(self) -> float:
        return 100.0 * self.step_overrun_s / self.modelled_step_s if self.modelled_step_s > 0 else 0.0

    def check(self, bound: LagBound, t: float) -> str | None:
        """Compare with ``bound`` at trace time ``t``: why it is exceeded (the first reason is kept), or None."""
        if bound.late_arrival_s != self.late_arrival_s:
            raise ValueError(f"lag bound: late_arrival_s {bound.late_arrival_s:g} s, but the meter counts arrivals "
                             f"more than {self.late_arrival_s:g} s late")
        why = []
        late = self.late_arrivals_pct
        if late > bound.max_late_arrivals_pct:
            why.append(f"{late:.1f} % of the arrivals were routed more than {bound.late_arrival_s:g} s late (bound "
                       f"{bound.max_late_arrivals_pct:g} %; the latest {self.max_arrival_lag_s:.2f} s, due at "
                       f"{self.worst_arrival_t:.1f} s)")
        if self.step_overrun_pct > bound.max_step_overrun_pct:
            why.append(f"the fake engines' steps took {self.step_overrun_pct:.0f} % longer than their modelled time "
                       f"(bound {bound.max_step_overrun_pct:g} %)")
        if not why:
            return None
        text = f"by trace time {t:.0f} s, " + " and ".join(why)
        if self.exceeded is None:
            self.exceeded = text
        return text

    def summary(self) -> dict[str, Any]:
        """The run record's fields (summary.json)."""
        return {"backend_late_arrivals_pct": self.late_arrivals_pct, "backend_late_arrival_s": self.late_arrival_s,
                "backend_max_arrival_lag_s": self.max_arrival_lag_s,
                "backend_step_overrun_pct": self.step_overrun_pct,
                "backend_lagging": self.exceeded is not None,
                **({"backend_lag_reason": self.exceeded} if self.exceeded else {})}
