"""`LoopArrays`: the state the compiled loop's `advance` works on, by name (one record, not forty positional
arrays). The columns of the 2-d arrays are named in `commitenv.sim.kernel.layout`."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class LoopArrays(NamedTuple):
    """Everything `commitenv.sim.kernel.loop.advance` reads and writes, as a `KernelState` holds it now (built per call:
    a state replaces an array when it grows one)."""

    si: np.ndarray  # int64 scalars: cursor, heap size, live and finished counts, ... (`layout.I_*`)
    sf: np.ndarray  # float64 scalars: the engine clock, the last event, the migration link (`layout.F_*`)
    ri: np.ndarray  # per replica, int64 columns: state, GPU, queue heads, segment kind, ... (`layout.R_*`)
    rf: np.ndarray  # per replica, float64 columns: segment times, energies, factors, shares (`layout.R_*`)
    qi: np.ndarray  # per request, int64 columns: prompt, output, computed, generated, blocks, replica (`layout.Q_*`)
    qf: np.ndarray  # per request, float64 columns: arrival, first token, finish, overhead, last token, max gap
    qc: np.ndarray  # per request, uint8: captured (a what-if run reports its finish)
    rejected: np.ndarray  # per request, bool: prompt at or over the context limit
    wq: np.ndarray  # per request: the next request in its waiting queue (-1: none)
    run: np.ndarray  # per replica: its running requests
    bq: np.ndarray  # per replica: the requests of its segment in flight
    bk: np.ndarray  # per replica: the new tokens of each of them
    pend: np.ndarray  # replicas waiting to start once every event at the current time is in
    ht: np.ndarray  # the event heap: times
    hk: np.ndarray  # ... kinds (`commitenv.sim.states.EV_*`)
    hs: np.ndarray  # ... sequence numbers (ties)
    hi: np.ndarray  # ... the replica, GPU or request of each event
    hv: np.ndarray  # ... the version it was pushed at (stale when it changed)
    coc: np.ndarray  # per replica and clock level: the step law's coefficients (`layout.C_*`)
    gi: np.ndarray  # per GPU, int64 columns: clock, pending clock, version, hosted count (`layout.G_*`)
    gf: np.ndarray  # per GPU, float64 columns: power factor, floor power, floor meter (`layout.GF_*`)
    gh: np.ndarray  # per GPU: the replicas it hosts, in order
    floor_tab: np.ndarray  # per GPU and clock: idle floors (active, draining, standby), with and without its factor
    ftab: np.ndarray  # per GPU and truth cell: step-time factors
    fetab: np.ndarray  # per GPU and truth cell: step-energy factors
    cell: float  # the truth's cell length (s; infinite without a truth)
    sched: np.ndarray  # scheduler switches: max sequences, logging, closed form, dispatch, ... (`layout.S_*`)
    e_dyn: np.ndarray  # per GPU: energy booked above the floor (J)
    done_out: np.ndarray  # the requests finished since the host last took them
    lgi: np.ndarray  # step log entries, int64 columns (`layout.LG_*`)
    lgf: np.ndarray  # ... float64 columns (`layout.LF_*`)
    lgm: np.ndarray  # ... their members (`layout.LM_*`)
    plan: np.ndarray  # a local policy's plan written by the host
    on_run: np.ndarray  # scratch: which requests a plan names as running
    tvi: np.ndarray  # what a local policy's task view needs: head size, slot base, first row, predictions shown
    live_slots: np.ndarray  # the slots of the requests at the head
    head_deadline: np.ndarray  # their deadlines
    row_deadline: np.ndarray  # the workload rows' deadlines
    pred_out: np.ndarray  # predicted output lengths by slot (empty when a policy sees the requests' own)
    vis_dl: np.ndarray  # visible deadlines by slot (the same)
    lp: tuple  # the compiled local policy: output row, clock levels, its arrays and function (`local_compiled`)
    pfx: tuple  # the prefix caches (`commitenv.sim.kernel.cached`; no replica rows without a cache)
