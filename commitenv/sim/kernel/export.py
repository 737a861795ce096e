"""Handing a kernel's state back: `KernelState.export_to` writes it into the pool's Python objects (the Python loop
continues exactly there) and `results_into` writes finished requests' results into the pool's arrays."""

from __future__ import annotations

import numpy as np

from commitenv.sim.kernel.heap import _live, _transit, _unrouted
from commitenv.sim.kernel.layout import (GF_E_FLOOR, GF_FLOOR_W, GF_PENDING_T, GF_T_FLOOR, G_CLOCK, G_NHOST, G_PENDING,
                                         G_VER, I_HEAP, I_PEND, I_SEQ, Q_ARRIVAL, Q_BLOCKS, Q_COMPUTED, Q_FINISH,
                                         Q_FIRST, Q_GENERATED, Q_MODEL, Q_OUT, Q_PREEMPT, Q_PROMPT, Q_REPLICA,
                                         Q_STARTED, R_AFTER, R_BATCH_N, R_BT0, R_D, R_DEST, R_E0, R_ENERGY, R_F, R_FE,
                                         R_FLOOR_ACC, R_FLOOR_T, R_FLOOR_W, R_FREE, R_FT, R_GPU, R_K, R_LOAD_T,
                                         R_LOGGED, R_LREADY, R_LWAIT, R_MIGRATE, R_RUN_N, R_SEG, R_SHARE, R_STATE, R_T0,
                                         R_T1, R_UNF, R_VER)
from commitenv.sim.migration import MIGRATE_MODES
from commitenv.sim.states import EV_LAND, EV_WAKE, SEG_NONE, SEG_RUN, SEG_STEP


class KernelExport:
    """`KernelState`'s hand-back to the Python loop (mixed into `KernelState`)."""

    def export_to(self, pool) -> None:
        """Write the kernel's state back into ``pool`` (the pool it was taken from), so the Python engine continues
        exactly where the kernel stopped: live requests as `Req` objects in the replicas' queues and segments,
        replica, GPU and heap state, counters, captured completions and the per-request results of the finished
        requests."""
        import heapq
        from collections import deque

        from commitenv.sim.request import Req

        qi, qf, ri, rf, gi, gf = self.qi, self.qf, self.ri, self.rf, self.gi, self.gf
        if self.si[I_PEND]:
            raise RuntimeError("kernel: export with replicas pending a start")
        live = _live(ri, self.wq, self.run, self.si, self.hk, self.hs, self.hi)  # (every request the pool holds)
        reqs: dict[int, Req] = {}
        for k, slot, dl, q, f, cap in zip(live.tolist(), self.slots(live).tolist(), self.deadlines(live).tolist(),
                                          qi[live].tolist(), qf[live].tolist(), self.qc[live].tolist()):
            r = Req(slot, f[Q_ARRIVAL], q[Q_PROMPT], q[Q_OUT], dl, q[Q_MODEL])
            r.computed, r.generated, r.blocks = q[Q_COMPUTED], q[Q_GENERATED], q[Q_BLOCKS]
            r.replica, r.started = q[Q_REPLICA], bool(q[Q_STARTED])
            r.first_t, r.preemptions, r.captured = f[Q_FIRST], q[Q_PREEMPT], bool(cap)
            reqs[k] = r
        req = reqs.__getitem__

        heap = [(float(self.ht[j]), int(self.hk[j]), int(self.hs[j]), int(self.hi[j]), int(self.hv[j]))
                for j in range(int(self.si[I_HEAP]))]
        gpus = pool._gpus
        for g, gpu in enumerate(gpus):  # (instances move: each GPU's list as the kernel holds it)
            gpu.replicas = [pool._replicas[x] for x in self.gh[g, : gi[g, G_NHOST]].tolist()]
        for x, rep in enumerate(pool._replicas):
            rep.gpu = gpus[int(ri[x, R_GPU])]
            rep.dest = None if ri[x, R_DEST] < 0 else gpus[int(ri[x, R_DEST])]
            rep.migrate = MIGRATE_MODES[int(ri[x, R_MIGRATE])]
            rep.after_load, rep.load_ready, rep.load_wait = (int(ri[x, R_AFTER]), bool(ri[x, R_LREADY]),
                                                             bool(ri[x, R_LWAIT]))
            rep.load_t = float(rf[x, R_LOAD_T])
            rep.running = [req(int(i)) for i in self.run[x, : ri[x, R_RUN_N]]]
            rep.waiting = deque(req(i) for i in self.waiting_ids(x))
            rep.unf, rep.free_blocks = int(ri[x, R_UNF]), int(ri[x, R_FREE])
            rep.state, rep.version, rep.pending_start = int(ri[x, R_STATE]), int(ri[x, R_VER]), False
            for t, kind, _, idx, ver in heap:
                if kind == EV_WAKE and idx == x and ver == rep.version:
                    rep.wake_t = t
            seg = int(ri[x, R_SEG])
            rep.seg = seg
            members = [req(int(i)) for i in self.bq[x, : ri[x, R_BATCH_N]]]
            rep.batch = list(zip(members, (int(k) for k in self.bk[x, : ri[x, R_BATCH_N]]))) if seg == SEG_STEP else []
            rep.run_reqs = members if seg == SEG_RUN else []
            rep.run_k = int(ri[x, R_K])
            rep.t0, rep.t1 = float(rf[x, R_T0]), float(rf[x, R_T1])
            rep.T0, rep.D, rep.E0, rep.F = (float(rf[x, c]) for c in (R_BT0, R_D, R_E0, R_F))
            rep.ft, rep.fe, rep.seg_energy = float(rf[x, R_FT]), float(rf[x, R_FE]), float(rf[x, R_ENERGY])
            rep.seg_floor_w, rep.seg_floor_t = float(rf[x, R_FLOOR_W]), float(rf[x, R_FLOOR_T])
            rep.seg_floor_acc = float(rf[x, R_FLOOR_ACC])
            rep.seg_log = self._seg_log(x) if seg != SEG_NONE and ri[x, R_LOGGED] else None
            rep.share = float(rf[x, R_SHARE])
            rep.invalidate_coeffs()
        for g, gpu in enumerate(pool._gpus):
            gpu.clock_idx = int(gi[g, G_CLOCK])
            gpu.pending_clock = None if gi[g, G_PENDING] < 0 else int(gi[g, G_PENDING])
            gpu.pending_t, gpu.version = float(gf[g, GF_PENDING_T]), int(gi[g, G_VER])
            gpu.floor_w, gpu.t_floor, gpu.e_floor = (float(gf[g, c]) for c in (GF_FLOOR_W, GF_T_FLOOR, GF_E_FLOOR))
            gpu.e_dyn = float(self.e_dyn[g])
        self._export_prefix(pool, reqs)
        pool.unrouted = [req(i) for i in _unrouted(self.si, self.wq).tolist()]
        pool.transit = {}
        for k in _transit(self.si, self.hk, self.hs, self.hi).tolist():  # (in the order they left)
            pool.transit[reqs[k].slot] = (next(e[0] for e in heap if e[1] == EV_LAND and e[3] == k), reqs[k])
        heap = [e if e[1] != EV_LAND else (e[0], e[1], e[2], reqs[e[3]].slot, e[4]) for e in heap]
        heapq.heapify(heap)
        pool._heap = heap
        pool._seq = int(self.si[I_SEQ])
        pool._pending = []
        for m in range(pool.n_models):
            pool._refresh_routable(m)
        if self.noise is not None:  # (the source continues with the draws the kernel took and did not use)
            for x in range(self.R):
                self.noise.put_back(x, self._draws(x))
            pool.noise = self.noise
        pool.sync_from_kernel(self)

    def results_into(self, done: np.ndarray, rows: np.ndarray, finish_t, first_t, replica_of, preemptions) -> None:
        """Per-request results of the finished requests ``done`` (kernel indices) into the pool's result arrays at
        ``rows``, as `Pool._complete` records them."""
        finish_t[rows] = self.qf[done, Q_FINISH]
        first_t[rows] = self.qf[done, Q_FIRST]
        replica_of[rows] = self.qi[done, Q_REPLICA]
        preemptions[rows] = self.qi[done, Q_PREEMPT]
