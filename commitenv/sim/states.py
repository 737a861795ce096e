"""The engine's codes in one place: replica lifecycle states, segment kinds and event kinds.

Imported by `commitenv.sim.pool`, the compiled `commitenv.sim.kernel` and the tests' reference engine (numba reads them
as compile-time constants: after changing a value here, clear the numba cache so cached kernels pick it up).
"""

from __future__ import annotations

# replica lifecycle (`Replica.state`)
ACTIVE, DRAINING, STANDBY, WAKING = 0, 1, 2, 3
MOVING, LOADING = 4, 5  # leaving its GPU (finishing the requests it keeps), cold-starting on another GPU
STATE_NAMES = ("active", "draining", "standby", "waking", "moving", "loading")

# the segment a replica has in flight (`Replica.seg`): nothing, one scheduled step, a closed-form run of decode steps
SEG_NONE, SEG_STEP, SEG_RUN = 0, 1, 2

# event kinds; the heap orders same-time events by kind. LOAD: a cold start ends; LAND: a migrated request arrives
EV_SEG, EV_WAKE, EV_CLOCK, EV_LOAD, EV_LAND = 0, 1, 2, 3, 4
