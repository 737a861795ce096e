"""A new pool's `KernelState`, built from its layout, profiles and options (no replica or GPU object read): every
instance active and idle at the pool's initial clock, its KV blocks all free, no request and no event. The workload
comes later (`KernelState.attach_workload`)."""

from __future__ import annotations

import numpy as np

from commitenv.sim import memory
from commitenv.sim.kernel.layout import (F_LAST, F_NOW, G_CLOCK, G_NHOST, G_PENDING, GF_CLOCK_LAT, GF_FLOOR_W,
                                         GF_POWER, I_LIVE, I_CURSOR, I_HEAP, I_N, N_QF, N_QI, N_RF, N_RI, R_AFTER, R_BS,
                                         R_BUDGET, R_CAP, R_DEST, R_FE, R_FREE, R_FT, R_GPU, R_KVB, R_LOAD_S, R_WAKE_S,
                                         R_LOAD_W, R_MAXSEQ, R_MEM, R_MIGRATE, R_MODEL, R_RESERVE, R_RUN_N, R_SCLK,
                                         R_UNF, R_SHARE, R_SSHARE, R_STATE, S_LOG)
from commitenv.sim.kernel.prefix_state import _no_cache
from commitenv.sim.kernel.rows import _Rows, _clock_coefficients
from commitenv.sim.migration import MIGRATE_MODES
from commitenv.sim.states import ACTIVE, DRAINING

__all__ = ["fresh_state", "place_requests", "placement_caps", "placement_memory"]


def placement_memory(profiles, layout, where: str = "layout.gpus") -> tuple[list[float], list[int]]:
    """Each instance's memory share and KV blocks, in layout order (`commitenv.sim.memory.instance_memory`); raises
    naming the GPU (``where[g]``) for an instance that cannot hold one request, or a GPU whose instances reserve more
    than its usable memory."""
    mem: list[float] = []
    caps: list[int] = []
    for g, insts in enumerate(layout.gpus):
        held = 0.0
        for j, inst in enumerate(insts):
            m, c = memory.instance_memory(profiles[inst.model], inst.share, inst.kv_tokens, f"{where}[{g}][{j}]")
            mem.append(m)
            caps.append(c)
            held += m
        if held > 1.0 + 1e-9:
            raise memory.PlacementMemoryError(
                f"{where}[{g}]: its instances reserve {held:.3f} > 1 of its usable memory (footprints plus "
                "declared KV budgets; without kv_tokens an instance reserves its SM share)")
    return mem, caps


def placement_caps(profiles, layout) -> list[int]:
    """Each instance's KV blocks, in layout order (`placement_memory`)."""
    return placement_memory(profiles, layout)[1]


def fresh_state(pool, power: tuple[float, ...]):
    """The kernel state of ``pool`` (a `Pool` being built: layout, profiles, options, initial clock level
    ``pool._clock0``, truth and noise sources set, no workload) with GPU power factors ``power``."""
    from commitenv.sim.kernel.state import KernelState

    ks = KernelState.__new__(KernelState)
    profiles, layout, cidx = pool.profiles, pool.layout, pool._clock0
    insts = [(g, inst) for g, hosted in enumerate(layout.gpus) for inst in hosted]
    R, G = len(insts), len(layout.gpus)
    ks.R, ks.G = R, G
    rep_prof = [profiles[inst.model] for _, inst in insts]
    share = [inst.share for _, inst in insts]
    mem, caps = placement_memory(profiles, layout)
    max_seqs = max(p.scheduler.max_seqs for p in rep_prof)
    # no request yet: the head is empty, the workload's rows come with `attach_workload`
    ks.src = _Rows.of(pool)
    ks.slot_base = pool._slot_base
    ks.n_live = 0
    ks.live_slots = np.zeros(0, np.int64)
    ks.head_deadline = np.zeros(0, np.float64)
    ks.row0 = ks.row_end = pool._cursor
    ks._stopped = False
    ks.lookahead_s = KernelState.LOOKAHEAD_S
    ks.compact = True
    ks.taken = 0
    ks.done0 = pool.completed
    cap = 64
    ks.qi, ks.qf = np.zeros((cap, N_QI), np.int64), np.zeros((cap, N_QF))
    ks.qc, ks.rejected = np.zeros(cap, np.uint8), np.zeros(cap, np.bool_)
    ks.wq, ks.done_out = np.full(cap, -1, np.int64), np.zeros(cap, np.int64)
    ks._pa, ks._row_hoff, ks.pfx = None, None, _no_cache()
    ks.profiles = profiles
    ks.clock_mhz = tuple(profiles[0].clock_mhz)
    ks.coc = np.stack([_clock_coefficients(p, s) for p, s in zip(rep_prof, share)])
    ks.sched = np.array([max_seqs, 0, 0, int(pool.log is not None or pool.on_step is not None),
                         int(pool.opt.closed_form), int(pool.dispatch is not None), int(pool.opt.scale_to_zero)],
                        np.int64)
    ks.run, ks.bq, ks.bk = (np.zeros((R, max_seqs + 1), np.int64) for _ in range(3))
    ri, rf = np.zeros((R, N_RI), np.int64), np.zeros((R, N_RF))
    ks.ri, ks.rf = ri, rf
    sch = [p.scheduler for p in rep_prof]
    ri[:, R_MODEL] = [inst.model for _, inst in insts]
    ri[:, R_BUDGET] = [s.token_budget for s in sch]
    ri[:, R_MAXSEQ] = [s.max_seqs for s in sch]
    ri[:, R_BS] = [s.block_size for s in sch]
    ri[:, R_RESERVE] = [s.reserve_full_sequence for s in sch]
    ri[:, R_FREE] = ri[:, R_CAP] = caps
    ri[:, R_STATE] = ri[:, R_AFTER] = ACTIVE
    ri[:, R_GPU] = [g for g, _ in insts]
    ri[:, R_DEST] = -1
    ri[:, R_MIGRATE] = MIGRATE_MODES.index("none")
    ri[:, R_SCLK] = cidx
    rf[:, R_SHARE] = rf[:, R_SSHARE] = share
    rf[:, R_MEM] = mem
    rf[:, R_LOAD_S] = [np.nan if p.latencies.load_s is None else p.latencies.load_s for p in rep_prof]
    rf[:, R_LOAD_W] = [np.nan if p.latencies.load_w is None else p.latencies.load_w for p in rep_prof]
    rf[:, R_KVB] = [p.model.kv_bytes_per_token for p in rep_prof]
    rf[:, R_WAKE_S] = [p.latencies.activation_s for p in rep_prof]
    rf[:, R_FT] = rf[:, R_FE] = 1.0
    ks.n_per_model = np.bincount(ri[:, R_MODEL], minlength=pool.n_models)
    ks.cap_blocks = np.array(caps, np.int64)
    ks.plan, ks.on_run = np.zeros(cap, np.int64), np.zeros(cap, np.int64)
    ks.gi, ks.gf = np.zeros((G, 4), np.int64), np.zeros((G, 6))
    ks.gh = np.full((G, R), -1, np.int64)
    x = 0
    for g, hosted in enumerate(layout.gpus):
        ks.gh[g, : len(hosted)] = np.arange(x, x + len(hosted))
        x += len(hosted)
    ks.gi[:, G_NHOST] = [len(hosted) for hosted in layout.gpus]
    gprof = [profiles[hosted[0].model] for hosted in layout.gpus]  # (the first instance placed sets the floor)
    ks.floor_tab = ks._floor_table(power, gprof)
    ks.gf[:, GF_POWER] = power
    ks.gf[:, GF_CLOCK_LAT] = [p.latencies.clock_change_s for p in gprof]
    ks.gi[:, G_CLOCK] = cidx
    ks.gi[:, G_PENDING] = -1
    ks.gf[:, GF_FLOOR_W] = [p.clocks[cidx].active_idle_w * f for f, p in zip(power, gprof)]  # (every instance active)
    ks.e_dyn = np.zeros(G, np.float64)
    ks._sources(pool)
    ks._counters(pool)
    ks._ensure(pool.now)
    ks.pend = np.zeros(R, np.int64)
    size = 8 * R + 64
    ks.ht = np.zeros(size)
    ks.hk, ks.hs, ks.hi, ks.hv = (np.zeros(size, np.int64) for _ in range(4))
    ks._load(pool.now)
    ks._mhz = np.array(ks.clock_mhz, np.int64)
    ks._log_out = []
    ks._new_log_arrays(bool(ks.sched[S_LOG]))
    return ks


def place_requests(ks, pool, running: list[list], waiting: list[list], unrouted: list, states: list[int]) -> None:
    """A serving state assembled outside the engine (a hardware pool's mirror, `HardwarePool.clone`) written into the
    new state ``ks`` of ``pool`` at ``pool.now``: each replica's lifecycle state (``states``: ACTIVE, DRAINING or
    STANDBY), its running requests (`Req` records holding their KV blocks) and waiting ones, in order, and the
    requests no replica took; no segment in flight. `KernelState.resume` then starts what has work."""
    from commitenv.sim.kernel.heap import _upush_back, _wpush_back

    if not ks.unused or ks.si[I_HEAP]:
        raise RuntimeError("kernel: requests placed into a state that has served")
    live = sorted([r for q in running + waiting for r in q] + list(unrouted), key=lambda r: r.slot)
    index = ks._head(pool, live)
    ks._new_prefix_caches(pool, None)  # (a mirror's requests bring no cache)
    ks.plan, ks.on_run = np.zeros(len(live) + 64, np.int64), np.zeros(len(live) + 64, np.int64)
    ri = ks.ri
    for x in range(ks.R):
        run = [index[id(r)] for r in running[x]]
        if len(run) > ri[x, R_MAXSEQ]:
            raise ValueError(f"kernel: replica {x} runs {len(run)} requests, above max_seqs {ri[x, R_MAXSEQ]}")
        ks.run[x, : len(run)] = run
        ri[x, R_RUN_N] = len(run)
        for r in waiting[x]:
            _wpush_back(ri, ks.wq, x, index[id(r)])
        ri[x, R_UNF] = len(running[x]) + len(waiting[x])
        ri[x, R_FREE] -= sum(r.blocks for r in running[x])
        ri[x, R_STATE] = states[x]
    for r in unrouted:
        _upush_back(ks.si, ks.wq, index[id(r)])
    ks.si[I_N] = ks.si[I_CURSOR] = ks.si[I_LIVE] = len(live)
    for g in range(ks.G):  # (the most awake instance sets the idle floor: `GPU.floor_power`)
        hosted = ri[ks.gh[g, : ks.gi[g, G_NHOST]], R_STATE]
        col = 0 if (hosted == ACTIVE).any() else 1 if (hosted == DRAINING).any() else 2
        ks.gf[g, GF_FLOOR_W] = ks.floor_tab[g, ks.gi[g, G_CLOCK], col]
    ks.sf[F_NOW] = ks.sf[F_LAST] = pool.now
