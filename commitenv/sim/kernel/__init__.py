"""The engine's event loop compiled: a pool of GPUs serving one or several models with the vLLM scheduler, on arrays.

Requests, replica queues, the segment in flight, the event heap, the truth factors (or legacy noise draws), the GPU
meters and the step log live in numpy arrays; `KernelState.advance` runs every arrival and segment end up to a time
in one numba call, and `set_active`, `set_clock`, `set_share` and `settle` act as the pool's. It follows
`commitenv.sim.pool.Pool` and `commitenv.sim.replica.Replica` line for line for the pools it covers
(`KernelState.covers`); `Pool` runs here while it can and `export_to` hands the state back to the Python loop for
everything else (tests/sim/test_engine_kernel.py and test_engine_kernel_shared.py hold both to bit-identical
results).

The package, by concern: `layout` (the state arrays' columns), `heap` (the event heap and the waiting queues),
`segment` (scheduling, KV admission, a segment's start and end), `prefix` and `cached` (the prefix cache on arrays
and the KV blocks through it), `prefix_state` (its import and hand-back), `lifecycle` (the idle floor, instances leaving and
cold-starting, migration), `actuate` (routing, redistribution, `set_active`, clocks, shares, moves), `loop` (`advance`, `settle`, the meters, compaction), `rows` (coefficients and workload
rows), `state` (`KernelState`) and `export` (its hand-back to the Python loop). Every name is importable from here.
"""

from __future__ import annotations

import sys
import types

from commitenv.sim.kernel.layout import *  # noqa: F401,F403  (the columns, by name)
from commitenv.sim.kernel.heap import (_cdiv, _left, _less, _live, _pop, _push, _swap, _waiting, _wpop_front,  # noqa: F401
                                       _wpush_back, _wpush_front)
from commitenv.sim.kernel.segment import (_batch_add, _cut, _decode, _decode_flags, _finish_segment,  # noqa: F401
                                          _is_decode, _kv_steps, _log_segment, _run_energy,
                                          _run_steps_done_by, _run_time, _schedule, _start_segment)
from commitenv.sim.kernel.lifecycle import _floor_changed, _floor_power, _set_floor  # noqa: F401
from commitenv.sim.kernel.actuate import (_flush, _poke, _redistribute, _route, _route_in_order, _set_clock,  # noqa: F401
                                          _set_share, _sift_down, _start, set_active)
from commitenv.sim.kernel.loop import (_compact_core, _energy_until, _floor_until, _noise_low, advance,  # noqa: F401
                                       in_flight, meter, settle)
from commitenv.sim.kernel.rows import _COEFFS, _Rows, _clock_coefficients  # noqa: F401
from commitenv.sim.kernel.export import KernelExport  # noqa: F401
from commitenv.sim.kernel.state import KernelState  # noqa: F401
from commitenv.sim.kernel import state as _state


class _Package(types.ModuleType):
    """``kernel.ENABLED`` (read, set, monkeypatched) is the switch `KernelState.covering` reads, `state.ENABLED`:
    pools run here whenever covered; COMMITENV_KERNEL=0 (or ``kernel.ENABLED = False``) keeps every pool on the
    Python loop."""

    @property
    def ENABLED(self) -> bool:
        return _state.ENABLED

    @ENABLED.setter
    def ENABLED(self, on: bool) -> None:
        _state.ENABLED = on


sys.modules[__name__].__class__ = _Package
