"""The engine's event loop compiled: a pool of GPUs serving one or several models with the vLLM scheduler, on arrays.

Requests, replica queues, the segment in flight, the event heap, the truth factors (or legacy noise draws), the GPU
meters and the step log live in numpy arrays; `KernelState.advance` runs every arrival and segment end up to a time in
one numba call, and `set_active`, `set_clock`, `set_share` and `settle` act as the pool's. It is the only engine: every
`commitenv.sim.pool.Pool` runs here. tests/helpers/reference holds a step-by-step object engine that it is held to, bit
for bit, on generated cases (tests/sim/test_engine_reference.py); ``NUMBA_DISABLE_JIT=1`` runs this same source as plain
Python for debugging. Docstrings here name the reference's method each function matches (`Replica.start`,
`GPU.floor_power`, `ReferencePool._route`, ... in tests/helpers/reference).

The package, by concern: `layout` (the state arrays' columns), `arrays` (`LoopArrays`: `advance`'s state by name),
`heap` (the event heap and the waiting queues), `segment` (scheduling, KV admission, a segment's start and end),
`prefix` and `cached` (the prefix cache on arrays and the KV blocks through it), `prefix_state` (its arrays built from
new caches), `lifecycle` (the idle floor, instances leaving and cold-starting, migration), `actuate` (routing,
redistribution, `set_active`, clocks, shares, moves), `loop` (`advance`, `settle`, the meters, compaction), `rows`
(coefficients and workload rows), `fresh` (a new pool's state), `clone` (what-if copies and forks), `policies` (dispatch
and local policies answered on the host), `stepper` (one replica stepped by hand, for the fake serving engine) and
`state` (`KernelState`). Every name is importable from here."""

from __future__ import annotations

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
from commitenv.sim.kernel.arrays import LoopArrays  # noqa: F401
from commitenv.sim.kernel.rows import _COEFFS, _Rows, _clock_coefficients  # noqa: F401
from commitenv.sim.kernel.state import KernelState  # noqa: F401
