"""A `KernelState`'s copies (mixed into it): the arrays of `Pool.clone` (a controller's snapshot, each candidate it
simulates) made from the kernel's own, with the requests the copy captures and the hypothetical arrivals it replays;
and the forks' copies (`copy`)."""

from __future__ import annotations

import copy

import numpy as np

from commitenv.sim.kernel.heap import _live, _transit
from commitenv.sim.kernel.layout import (F_LAST, F_MIG_BYTES, F_MIG_J, F_NOW, GF_E_FLOOR, GF_FLOOR_W, GF_PENDING_T,
                                         GF_POWER, GF_T_FLOOR, G_CLOCK, G_PENDING, G_VER, INF, I_CAPARR, I_CAPLEFT,
                                         I_COLD, I_CURSOR, I_DONE, I_EVENTS, I_HEAP, I_LIVE, I_LOG, I_MIGRATED, I_PEND,
                                         I_PLAN_REP, I_SEQ, Q_ARRIVAL, Q_COMPUTED, Q_GENERATED, Q_HOFF, Q_NH, Q_OUT,
                                         Q_OVERHEAD, Q_PROMPT, R_CAP, R_ENERGY, R_FE, R_FLOOR_ACC, R_FLOOR_T, R_FLOOR_W,
                                         R_FREE, R_FT, R_GPU, R_LOAD_T, R_LOGGED, R_LREADY, R_LWAIT, R_MEM, R_MODEL,
                                         R_PENDING, R_RUN_N, R_SCLK, R_SEG, R_SHARE, R_SSHARE, R_STATE, R_T0, R_T1,
                                         R_VER, R_WLEN, S_CELL0, S_NOISE)
from commitenv.sim.kernel.lifecycle import _floor_power
from commitenv.sim.kernel.rows import _Rows
from commitenv.sim.states import EV_CLOCK, EV_LAND, EV_LOAD, EV_SEG, EV_WAKE, LOADING, SEG_NONE, WAKING


class KernelClone:
    """`KernelState`'s what-if copies (mixed into it)."""

    def can_clone(self) -> bool:
        """Whether `whatif_copy` can copy this state: its finished requests' results and step log were taken (the copy
        keeps the live requests only) and no replica waits for a start."""
        return bool(self.compact and self.taken == self.si[I_DONE] and not self.si[I_LOG] and not self.si[I_PEND])

    def whatif_copy(self, *, hide: tuple[np.ndarray, np.ndarray, int] | None, nominal: bool,
                    energy_factor: float, profiles: list) -> "KernelClone":
        """`Pool.clone`'s state: the live requests only (no workload rows, no noise, no step log, meters, counters and
        versions from zero, the event heap rebuilt as the clone pushes it). ``hide``: (predicted output lengths,
        visible deadlines, rows they cover), each covered request then runs to its prediction (at least one more
        token) and carries its visible deadline. ``nominal``: the truth's factors dropped from the segments in flight
        (`Replica.clone_into`); ``energy_factor``: the copy's constant energy and power factor."""
        now = float(self.sf[F_NOW])
        c = copy.copy(self)
        c.noise = c._truth = None
        c._compact(copy_all=True, ahead_s=-INF)  # (every array new; rows loaded ahead dropped)
        if int(c.si[I_CURSOR]) != c.n_live:
            raise RuntimeError("kernel: a what-if copy kept workload rows")
        c.src, c.row0, c.row_end, c._stopped, c.slot_base = _Rows.empty(), 0, 0, True, 0
        c._row_hoff = None  # (replayed arrivals carry no prefix blocks)
        c.done0 = c.taken = 0
        c.drop_log()
        self._copy_prefix(c)
        if c._pa is not None:
            c._own_hashes()
        c.profiles = profiles
        c._mhz, c.cap_blocks, c.n_per_model = c._mhz.copy(), c.cap_blocks.copy(), c.n_per_model.copy()
        if c._pa is None:  # (`_copy_prefix` copies a cache's arrays; these are the empty ones)
            c.pfx = tuple(a.copy() for a in c.pfx)
        c.qf[:, Q_OVERHEAD] = 0.0  # (a copy adds no serving overhead to its finish times)
        if hide is not None:
            pred_out, visible, n_rows = hide
            sel = np.flatnonzero(c.live_slots < n_rows)
            s = c.live_slots[sel]
            c.qi[sel, Q_OUT] = np.maximum(np.asarray(pred_out[s], np.int64), c.qi[sel, Q_GENERATED] + 1)
            c.head_deadline[sel] = visible[s]
        ri, rf, gi, gf = c.ri, c.rf, c.gi, c.gf
        # the factors: none but the copy's constant energy factor, in one endless cell (`KernelState.__init__`)
        c.cell = INF
        c.sched[S_NOISE] = c.sched[S_CELL0] = 0
        c.ftab, c.fetab = np.ones((c.G, 1)), np.full((c.G, 1), energy_factor)
        seg = ri[:, R_SEG] != SEG_NONE
        if nominal:  # (`Replica.clone_into`: the segment in flight restated at the nominal profile)
            pf_old = gf[ri[:, R_GPU], GF_POWER]
            rf[seg, R_ENERGY] = rf[seg, R_ENERGY] / rf[seg, R_FE] * energy_factor
            rf[seg, R_T1] = np.maximum(rf[seg, R_T0] + (rf[seg, R_T1] - rf[seg, R_T0]) / rf[seg, R_FT], now)
            rf[seg, R_FLOOR_W] = rf[seg, R_FLOOR_W] / pf_old[seg] * energy_factor
            rf[seg, R_FLOOR_ACC] = rf[seg, R_FLOOR_ACC] / pf_old[seg] * energy_factor
            idle = ~seg
            rf[idle, R_ENERGY] = rf[idle, R_FLOOR_W] = rf[idle, R_FLOOR_ACC] = 0.0
            rf[idle, R_T0] = rf[idle, R_T1] = rf[idle, R_FLOOR_T] = now
            rf[:, R_FT], rf[:, R_FE] = 1.0, energy_factor
        # the GPUs: the copy's power factor, meters from zero at ``now``, versions from zero
        c.floor_tab = c.floor_tab.copy()
        c.floor_tab[:, :, :3] = c.floor_tab[:, :, 3:] * energy_factor
        gf[:, GF_POWER] = energy_factor
        gf[:, GF_T_FLOOR], gf[:, GF_E_FLOOR] = now, 0.0
        c.e_dyn[:] = 0.0
        if nominal:
            for g in range(c.G):
                gf[g, GF_FLOOR_W] = _floor_power(g, ri, rf, gi, gf, c.gh, c.floor_tab)
        gi[:, G_VER] = 0
        ri[:, R_LOGGED], ri[:, R_PENDING] = 0, 0
        rf[:, R_SSHARE] = rf[:, R_SHARE]
        ri[:, R_SCLK] = gi[ri[:, R_GPU], G_CLOCK]
        self._rebuild_heap(c, seg)
        si = c.si
        si[I_LIVE] = c.n_live  # (the head holds the live requests only)
        si[I_EVENTS] = si[I_DONE] = si[I_COLD] = si[I_MIGRATED] = si[I_CAPLEFT] = si[I_CAPARR] = 0
        si[I_PLAN_REP] = -1
        c.sf[F_LAST] = now
        c.sf[F_MIG_BYTES] = c.sf[F_MIG_J] = 0.0
        return c

    def _own_hashes(self) -> None:
        """The hash blocks of the live requests only, in a list of the copy's own (the original's holds every
        workload row's: a what-if copy must not carry requests that have not arrived)."""
        pr, ps, nd, ent, tab, hh, pe, hout = self.pfx
        L = self.n_live
        base, nh = self.qi[:L, Q_HOFF], self.qi[:L, Q_NH]
        start = np.concatenate(([0], np.cumsum(nh)[:-1])).astype(np.int64)
        idx = np.repeat(base - start, nh) + np.arange(int(nh.sum()), dtype=np.int64)
        self.qi[:L, Q_HOFF] = start
        self.pfx = (pr, ps, nd, ent, tab, hh[idx], pe[idx], hout)
        self._hh0 = len(idx)

    def _rebuild_heap(self, c, seg: np.ndarray) -> None:
        """The copy's event heap as `Pool.clone` pushes it (sequence numbers from 1): each replica's segment end, wake
        or load end, in index order; the migrating requests' landings in the order they left; the GPUs' clock
        changes."""
        n = int(self.si[I_HEAP])
        wake = {int(x): float(t) for t, k, x, v in zip(self.ht[:n], self.hk[:n], self.hi[:n], self.hv[:n])
                if k == EV_WAKE and v == self.ri[x, R_VER]}
        ri, rf, gi, gf = c.ri, c.rf, c.gi, c.gf
        ev: list[tuple[float, int, int, int]] = []
        for x in range(c.R):
            ver = int(seg[x])
            ri[x, R_VER] = ver
            if seg[x]:
                ev.append((float(rf[x, R_T1]), EV_SEG, x, ver))
            st = ri[x, R_STATE]
            if st == WAKING:
                ev.append((wake[x], EV_WAKE, x, ver))
            elif st == LOADING and not ri[x, R_LREADY] and not ri[x, R_LWAIT]:
                ev.append((float(rf[x, R_LOAD_T]), EV_LOAD, x, ver))
        m = int(c.si[I_HEAP])
        land = {int(k): float(t) for t, kind, k in zip(c.ht[:m], c.hk[:m], c.hi[:m]) if kind == EV_LAND}
        ev.extend((land[k], EV_LAND, k, 0) for k in _transit(c.si, c.hk, c.hs, c.hi).tolist())
        ev.extend((float(gf[g, GF_PENDING_T]), EV_CLOCK, g, 0) for g in range(c.G) if gi[g, G_PENDING] >= 0)
        keyed = sorted((t, kind, s + 1, idx, v) for s, (t, kind, idx, v) in enumerate(ev))  # (sorted: a binary heap)
        size = max(c.ht.shape[0], len(keyed))
        c.ht, c.hk, c.hs, c.hi, c.hv = np.zeros(size), *(np.zeros(size, np.int64) for _ in range(4))
        for j, (t, kind, s, idx, v) in enumerate(keyed):
            c.ht[j], c.hk[j], c.hs[j], c.hi[j], c.hv[j] = t, kind, s, idx, v
        c.si[I_HEAP], c.si[I_SEQ] = len(keyed), len(ev)

    def view_rows(self) -> dict[str, np.ndarray]:
        """The live requests as `commitenv.sim.view.RequestView` lists them (each replica's running, then waiting
        requests, by index; the unrouted ones; the migrating ones), as arrays named after its fields."""
        ri, qi, qf = self.ri, self.qi, self.qf
        idx = _live(ri, self.wq, self.run, self.si, self.hk, self.hs, self.hi)
        n_run, n_wait = ri[:, R_RUN_N], ri[:, R_WLEN]
        per = np.column_stack((n_run, n_wait)).reshape(-1)  # (replica by replica: running, then waiting)
        away = len(idx) - int(per.sum())
        where = np.concatenate((np.repeat(np.repeat(np.arange(self.R), 2), per), np.full(away, -1, np.int64)))
        running = np.concatenate((np.repeat(np.tile([True, False], self.R), per), np.zeros(away, np.bool_)))
        return dict(slot=self.slots(idx), arrival_s=qf[idx, Q_ARRIVAL], prompt_tokens=qi[idx, Q_PROMPT],
                    output_tokens=qi[idx, Q_OUT], generated_tokens=qi[idx, Q_GENERATED],
                    computed_tokens=qi[idx, Q_COMPUTED], deadline_s=self.deadlines(idx), replica=where,
                    running=running)

    def view_replicas(self) -> dict[str, np.ndarray]:
        """Every replica as `commitenv.sim.view.ReplicaView` lists it (``state``: the lifecycle codes)."""
        ri, rf = self.ri, self.rf
        return dict(state=ri[:, R_STATE], gpu=ri[:, R_GPU], model=ri[:, R_MODEL], share=rf[:, R_SHARE],
                    clock_mhz=self._mhz[self.gi[ri[:, R_GPU], G_CLOCK]], running=ri[:, R_RUN_N],
                    waiting=ri[:, R_WLEN], kv_blocks=ri[:, R_CAP], free_kv_blocks=ri[:, R_FREE],
                    memory_share=rf[:, R_MEM])

    def gpu_clock_mhz(self) -> np.ndarray:
        """Every GPU's current clock (MHz)."""
        return self._mhz[self.gi[:, G_CLOCK]]

    def capture_live(self, arrivals: bool) -> None:
        """`Pool.capture_all`: every live request is captured (its finish is reported); with ``arrivals`` the ones
        arriving from now on too."""
        live = _live(self.ri, self.wq, self.run, self.si, self.hk, self.hs, self.hi)
        self.qc[live] = 1
        self.si[I_CAPLEFT] = len(live)
        self.si[I_CAPARR] = int(arrivals)

    def attach_rows(self, rows: _Rows, slot_base: int) -> None:
        """A what-if copy's replayed arrivals (``rows``, slots from ``slot_base``), loaded as the clock nears them."""
        if self.row_end != 0 or int(self.si[I_CURSOR]) != self.n_live:
            raise RuntimeError("kernel: replayed arrivals on a state that has workload rows")
        self.src, self.row0, self.row_end, self._stopped, self.slot_base = rows, 0, 0, False, slot_base
        self._load(float(self.sf[F_NOW]))
