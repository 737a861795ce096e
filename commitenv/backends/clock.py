"""Time sources for a backend: the wall clock of a real pool, or a virtual clock that the CPU fakes advance."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Seconds since the clock's origin; ``sleep`` waits (or, virtually, advances)."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class WallClock:
    """Monotonic wall time since construction."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class VirtualClock:
    """A clock that only moves when told: ``sleep`` and ``advance`` add to it (the fakes' time)."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = float(t)

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"clock: cannot advance by {seconds} s")
        self.t += seconds


class ScaledClock:
    """Wall time run ``speed`` times faster (seconds of this clock per real second): the CPU fakes of a whole pool
    serve a trace in real time, only sooner. Every reader and sleeper of one pool shares it."""

    def __init__(self, speed: float) -> None:
        if not speed > 0:
            raise ValueError(f"speed: expected > 0, got {speed}")
        self.speed = float(speed)
        self._t0 = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self._t0) * self.speed

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds / self.speed)
