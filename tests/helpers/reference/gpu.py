"""A GPU: device-wide clock, the model instances it hosts, and its energy meter."""

from __future__ import annotations

from typing import TYPE_CHECKING

from commitenv.sim.states import ACTIVE, DRAINING, LOADING, MOVING, WAKING

if TYPE_CHECKING:  # pragma: no cover
    from commitenv.profiles.schema import Profile
    from helpers.reference.replica import Replica


class GPU:
    """Energy meter of one device: an idle floor set by its instances' lifecycle states plus the dynamic
    (above-floor) energy of every step its instances run. For a single instance this equals the sum of step
    energies plus idle gaps at the state's idle power."""

    def __init__(self, index: int, clock_idx: int, profile: "Profile | None" = None) -> None:
        self.index = index
        self.profile = profile  # sets the idle floor (the first instance placed here; instances may move away)
        self.clock_idx = clock_idx
        self.pending_clock: int | None = None
        self.pending_t = 0.0
        self.version = 0
        self.replicas: list["Replica"] = []
        self.floor_w = 0.0
        self.t_floor = 0.0
        self.e_floor = 0.0
        self.e_dyn = 0.0
        self.power_factor = 1.0  # this part's power relative to the profile (realism: per-GPU spread)

    def floor_power(self) -> float:
        """Idle power implied by the hosted instances' states (the most awake one sets it; an instance loading its
        weights draws at least its profile's ``load_w``, one still waiting for memory nothing; a GPU hosting nothing
        draws standby power)."""
        prof = self.profile if self.profile is not None else self.replicas[0].profile
        lvl = prof.clocks[self.clock_idx]
        here = [r for r in self.replicas if not (r.state == LOADING and r.load_wait)]  # (a waiting load draws nothing)
        states = {WAKING if r.state == LOADING and r.load_ready else r.state for r in here}
        if ACTIVE in states or WAKING in states:  # (a loaded instance waiting for SMs idles like a waking one)
            w = lvl.active_idle_w
        elif DRAINING in states or MOVING in states:
            w = lvl.draining_idle_w
        else:
            w = prof.standby_w
        if LOADING in states:
            w = max([w] + [r.profile.latencies.load_w for r in here if r.state == LOADING and not r.load_ready])
        return w * self.power_factor

    def update_floor(self, t: float) -> None:
        """Close the floor meter at ``t`` and continue at the power the current states imply."""
        self.set_floor(t, self.floor_power())

    def set_floor(self, t: float, power_w: float) -> None:
        """Change the floor power at ``t``. Steps in flight track the floor they are charged against piecewise,
        so the meter stays continuous and equals step energies plus the floor over idle time."""
        self.e_floor += self.floor_w * (t - self.t_floor)
        self.t_floor = t
        if power_w != self.floor_w:
            for r in self.replicas:
                if r.seg and r.t0 <= t < r.t1:
                    r.seg_floor_acc += r.seg_floor_w * (t - r.seg_floor_t)
                    r.seg_floor_t = t
                    r.seg_floor_w = power_w
        self.floor_w = power_w

    def book(self, energy: float, floor_j: float) -> None:
        """Add a finished (part of a) segment: its energy above the floor energy it was charged against."""
        self.e_dyn += energy - floor_j

    def meter(self, t: float) -> float:
        """Energy (J) of this GPU from the start to ``t`` (t must not precede the last processed event)."""
        e = self.e_floor + self.floor_w * (t - self.t_floor) + self.e_dyn
        for r in self.replicas:
            if r.seg:
                end = r.t1 if r.t1 < t else t
                if end > r.t0:
                    e += r.energy_until(t) - r.floor_part(end)
        return e
