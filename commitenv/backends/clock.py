"""Time sources for a backend: the wall clock of a real pool, a virtual clock that the CPU fakes advance, and a
virtual clock that several threads share in lockstep (a pool of fakes that replays a trace the same on a loaded
machine as on an idle one)."""

from __future__ import annotations

import contextlib
import heapq
import threading
import time
from collections.abc import Iterator
from typing import Protocol


class Clock(Protocol):
    """Seconds since the clock's origin; ``sleep`` waits (or, virtually, advances). The hooks below let a clock that
    threads share in lockstep (`LockstepClock`) know which threads still run; other clocks ignore them."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def enter(self) -> None: ...

    def leave(self) -> None: ...

    def park(self, token: object) -> None: ...

    def unpark(self, token: object) -> None: ...

    def released(self) -> contextlib.AbstractContextManager[None]: ...


class _Unshared:
    """The lockstep hooks of a clock that does not wait for its threads: nothing to do."""

    def enter(self) -> None:
        """A thread starts running on this clock."""

    def leave(self) -> None:
        """A thread stops running on this clock (it exits)."""

    def park(self, token: object) -> None:
        """The calling thread waits for work (call before it blocks on its own condition)."""

    def unpark(self, token: object) -> None:
        """The parked thread ``token`` has work again (call before notifying it)."""

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        """The calling thread blocks on something other than the clock (a join) while the block runs."""
        yield


class WallClock(_Unshared):
    """Monotonic wall time since construction."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class VirtualClock(_Unshared):
    """A clock that only moves when told: ``sleep`` and ``advance`` add to it (the fakes' time; one thread)."""

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


class ScaledClock(_Unshared):
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


class LockstepClock:
    """Virtual time shared by threads: it moves only when every thread on it waits (in `sleep`, parked for work, or
    `released`), and then straight to the earliest wake-up. A pool of fakes on it serves a trace the same however
    slowly the machine runs its threads (a controller's thinking takes no time). The constructing thread runs on it;
    others `enter` (counted before they start) and `leave` when they exit."""

    def __init__(self, t: float = 0.0, poll_s: float = 0.05) -> None:
        self.t = float(t)
        self.poll_s = poll_s  # the pool's thread looks at its workers at least this often (virtual seconds)
        self._cv = threading.Condition()
        self._running = 1  # threads on the clock that neither sleep nor wait
        self._wakes: list[tuple[float, int]] = []  # sleepers' (wake-up time, ticket), a heap
        self._woken: set[int] = set()  # tickets whose time has come (counted as running again)
        self._parked: set[int] = set()  # ids of the tokens parked for work
        self._ticket = 0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        if not seconds > 0:
            return
        with self._cv:
            self._ticket += 1
            me = self._ticket
            heapq.heappush(self._wakes, (self.t + seconds, me))
            self._running -= 1
            self._advance()
            while me not in self._woken:
                self._cv.wait()
            self._woken.discard(me)

    def _advance(self) -> None:
        """With nothing running, move to the earliest wake-up and count its sleepers as running (call locked)."""
        if self._running > 0 or not self._wakes:
            return
        self.t = max(self.t, self._wakes[0][0])
        while self._wakes and self._wakes[0][0] <= self.t:
            self._woken.add(heapq.heappop(self._wakes)[1])
            self._running += 1
        self._cv.notify_all()

    def enter(self) -> None:
        with self._cv:
            self._running += 1

    def leave(self) -> None:
        with self._cv:
            self._running -= 1
            self._advance()

    def park(self, token: object) -> None:
        with self._cv:
            if id(token) not in self._parked:
                self._parked.add(id(token))
                self._running -= 1
                self._advance()

    def unpark(self, token: object) -> None:
        with self._cv:
            if id(token) in self._parked:
                self._parked.discard(id(token))
                self._running += 1

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        self.leave()
        try:
            yield
        finally:
            self.enter()
