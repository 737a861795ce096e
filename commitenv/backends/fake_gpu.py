"""`FakeGpu`: a `GpuControl` on a virtual clock that meters a profile's power as NVML would show it: the idle
floor of the instance's state at the effective clock plus the energy of every step the fake engine runs; a clock
lock takes effect after the profile's clock-change latency; the counter advances every ``energy_update_s`` and
reads in whole mJ; NVML-style permission and invalid-argument errors."""

from __future__ import annotations

import bisect
import math
import threading

from commitenv.backends.clock import Clock
from commitenv.backends.gpu import GpuControl, GpuInvalidArgument, GpuPermissionError
from commitenv.profiles.schema import Profile

STATES = ("active", "draining", "standby")


class FakeGpu(GpuControl):
    """See the module docstring. ``permitted=False`` refuses clock locks as an unprivileged process is refused;
    ``power_factor`` scales every power and energy (a part that draws more than the profile says)."""

    def __init__(self, profile: Profile, clock: Clock, index: int = 0, *, energy_update_s: float = 0.05,
                 permitted: bool = True, power_factor: float = 1.0) -> None:
        if not 0.02 <= energy_update_s <= 0.1:
            raise ValueError(f"energy_update_s: NVML's counter updates every 20-100 ms, got {energy_update_s}")
        self.profile, self.clock, self.index = profile, clock, index
        self.name = f"fake {profile.gpu.name}"
        self.energy_update_s = energy_update_s
        self.permitted, self.power_factor = permitted, power_factor
        self._default = len(profile.clocks) - 1  # unlocked: the driver boosts to the top level
        self._changes: list[tuple[float, int]] = [(clock.now(), self._default)]  # (effective time, clock index)
        self.state = "active"
        self._t = clock.now()  # the meter is integrated up to here
        self._bp_t = [self._t]  # breakpoints of the cumulative energy (piecewise linear in time), J
        self._bp_e = [0.0]
        self.locks: list[int] = []  # every locked MHz, in order (what a test may check)
        self._mutex = threading.RLock()  # a pool's worker thread books steps while the pool reads the counter
        self._busy_from: float | None = None  # a step started here and is not booked yet

    # ------------------------------------------------------------------------------------------ GpuControl
    def supported_clocks_mhz(self) -> list[int]:
        return [c.mhz for c in self.profile.clocks]

    def lock_clock(self, mhz: int) -> None:
        if not self.permitted:
            raise GpuPermissionError(f"GPU {self.index}: nvmlDeviceSetGpuLockedClocks: insufficient permissions "
                                     "(locking clocks needs root or `nvidia-smi -acp UNRESTRICTED`)")
        levels = self.supported_clocks_mhz()
        if mhz not in levels:
            raise GpuInvalidArgument(f"GPU {self.index}: nvmlDeviceSetGpuLockedClocks: {mhz} MHz is not a supported "
                                     f"clock; supported: {levels}")
        self._set(levels.index(mhz))
        self.locks.append(int(mhz))

    def reset_clock(self) -> None:
        if not self.permitted:
            raise GpuPermissionError(f"GPU {self.index}: nvmlDeviceResetGpuLockedClocks: insufficient permissions")
        self._set(self._default)

    def energy_mj(self) -> int:
        with self._mutex:
            return self._energy_mj()

    def _energy_mj(self) -> int:
        now = self.clock.now()
        self._idle_to(now)
        tick = math.floor(now / self.energy_update_s + 1e-9) * self.energy_update_s
        return int(math.floor(self._energy_at(min(tick, now)) * 1000.0 + 1e-9))

    def throttle_reasons(self) -> int:
        return 0

    def current_clock_mhz(self) -> int:
        return self.profile.clocks[self.clock_index_at(self.clock.now())].mhz

    # ------------------------------------------------------------------------------------------ the engine's side
    def clock_index_at(self, t: float) -> int:
        i = bisect.bisect_right([c[0] for c in self._changes], t) - 1
        return self._changes[max(i, 0)][1]

    def set_state(self, state: str) -> None:
        """The hosted instance's lifecycle state from now on (it sets the idle floor)."""
        if state not in STATES:
            raise ValueError(f"state: expected one of {STATES}, got {state!r}")
        with self._mutex:
            self._idle_to(self.clock.now())
            self.state = state

    def begin_step(self, t0: float) -> None:
        """A step starts at ``t0``: the floor is metered up to here and no further until `add_step` books it (a
        counter read meanwhile shows the energy up to the step's start)."""
        with self._mutex:
            self._idle_to(t0)
            self._busy_from = t0

    def add_step(self, t0: float, t1: float, energy_j: float) -> None:
        """A step ran over [t0, t1] and drew ``energy_j`` (whole GPU); the floor is metered up to t0."""
        with self._mutex:
            self._busy_from = None
            if t0 < self._t - 1e-12 or t1 < t0:
                raise ValueError(f"step [{t0}, {t1}] overlaps metered time up to {self._t}")
            self._idle_to(t0)
            self._t = t1
            self._bp_t.append(t1)
            self._bp_e.append(self._bp_e[-1] + energy_j * self.power_factor)

    # ------------------------------------------------------------------------------------------ internals
    def _set(self, idx: int) -> None:
        with self._mutex:
            self._set_locked(idx)

    def _set_locked(self, idx: int) -> None:
        now = self.clock.now()
        self._changes = [c for c in self._changes if c[0] <= now]  # a newer lock replaces a pending one
        self._changes.append((now + self.profile.latencies.clock_change_s, idx))

    def floor_w(self, idx: int) -> float:
        lvl = self.profile.clocks[idx]
        w = {"active": lvl.active_idle_w, "draining": lvl.draining_idle_w, "standby": self.profile.standby_w}
        return w[self.state] * self.power_factor

    def _idle_to(self, t: float) -> None:
        """Meter the idle floor from the last metered time to ``t``, split where the clock changes."""
        if self._busy_from is not None:
            t = min(t, self._busy_from)
        if t <= self._t:
            return
        cuts = [c[0] for c in self._changes if self._t < c[0] < t] + [t]
        for c in cuts:
            w = self.floor_w(self.clock_index_at(self._t))
            self._bp_t.append(c)
            self._bp_e.append(self._bp_e[-1] + w * (c - self._t))
            self._t = c

    def _energy_at(self, t: float) -> float:
        i = bisect.bisect_right(self._bp_t, t)
        if i >= len(self._bp_t):
            return self._bp_e[-1]
        t0, t1 = self._bp_t[i - 1], self._bp_t[i]
        e0, e1 = self._bp_e[i - 1], self._bp_e[i]
        return e0 + (e1 - e0) * (t - t0) / (t1 - t0) if t1 > t0 else e1
