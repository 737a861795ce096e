"""What a pool reads of a `KernelState` (mixed into it): its queues, live requests, counters, meters and shares, the
step log drained into records, and the request slots and deadlines behind the kernel's indices."""

from __future__ import annotations

import numpy as np

from commitenv.sim.kernel.heap import _left, _live, _waiting
from commitenv.sim.kernel.layout import (F_MIG_BYTES, F_MIG_J, F_NOW, I_CAPLEFT, I_COLD, I_CURSOR, I_DONE, I_EVENTS,
                                         I_HEAP, I_LIVE, I_LOG, I_LOGM, I_MIGRATED, I_N, I_ULEN, LF_ENERGY, LF_FLOOR,
                                         LF_SHARE, LF_T0, LF_T1, LG_CLOCK, LG_GPU, LG_N, LG_REP, LG_STEPS, LM_COMPUTED,
                                         LM_DECODE, LM_NEW, LM_REQ, Q_COMPUTED, Q_FINISH, Q_FIRST, Q_MAXGAP, Q_PREEMPT,
                                         Q_REPLICA, R_AFTER, R_BATCH_N, R_DEST,
                                         R_GPU, R_K, R_MEM, R_MODEL, R_RUN_N, R_SCLK, R_SEG, R_SHARE, R_SSHARE, R_STATE,
                                         R_T0, R_WLEN, S_CLOSED, S_LOG, S_MAX_SEQS)
from commitenv.sim.kernel.loop import in_flight, meter
from commitenv.sim.kernel.segment import _decode_flags
from commitenv.sim.records import InFlightPart, SegmentLog, StepLogBatch
from commitenv.sim.states import ACTIVE, EV_LAND, LOADING, MOVING, SEG_RUN, WAKING


class KernelReads:
    """`KernelState`'s reads and its step log (mixed into `KernelState`)."""

    LOG_ENTRIES = 4096  # step log entries, and their members, the compiled loop writes between two drains
    LOG_MEMBERS = 1 << 16

    @property
    def closed_form(self) -> bool:
        """Whether the segments that start from now on advance decode runs in closed form (`EngineOptions.closed_form`;
        segments in flight keep the form they started with)."""
        return bool(self.sched[S_CLOSED])

    @closed_form.setter
    def closed_form(self, on: bool) -> None:
        self.sched[S_CLOSED] = int(on)

    @property
    def logging(self) -> bool:
        """Whether the compiled loop writes the step log."""
        return bool(self.sched[S_LOG])

    def _drain_log(self) -> None:
        """The entries written since the last drain, as a `StepLogBatch` (request slots, clock in MHz), onto the list
        `take_log` hands out; the arrays are empty again."""
        n, nm = int(self.si[I_LOG]), int(self.si[I_LOGM])
        if n == 0:
            return
        lgi, lgf, lgm = self.lgi[:n], self.lgf[:n], self.lgm[:nm]
        rep = lgi[:, LG_REP].copy()
        self._log_out.append(StepLogBatch(
            lgi[:, LG_GPU].copy(), rep, lgf[:, LF_T0].copy(), lgf[:, LF_T1].copy(), lgi[:, LG_STEPS].copy(),
            lgf[:, LF_ENERGY].copy(), self._mhz[lgi[:, LG_CLOCK]], lgf[:, LF_SHARE].copy(), lgf[:, LF_FLOOR].copy(),
            lgi[:, LG_N].copy(),
            self.slots(lgm[:, LM_REQ]), lgm[:, LM_NEW].copy(), lgm[:, LM_COMPUTED].copy(), lgm[:, LM_DECODE] != 0))
        self.si[I_LOG] = self.si[I_LOGM] = 0

    def take_log(self):
        """The step log entries booked since the last call, in booking order, as one `StepLogBatch` (None: none)."""
        out, self._log_out = self._log_out, []
        return StepLogBatch.join(out) if out else None

    def _new_log_arrays(self, on: bool) -> None:
        """Empty step log arrays: room for a drain's worth of entries and members when ``on``, none otherwise."""
        R, max_seqs = self.R, int(self.sched[S_MAX_SEQS])
        n_ent, n_mem = (max(self.LOG_ENTRIES, R + 1), max(self.LOG_MEMBERS, (R + 1) * (max_seqs + 1))) if on \
            else (0, 0)
        self.lgi, self.lgf = np.zeros((n_ent, 5), np.int64), np.zeros((n_ent, 5))
        self.lgm = np.zeros((n_mem, 4), np.int64)

    def start_logging(self) -> None:
        """Write the step log from here on: the segments that start from now are logged (those in flight are not, as
        as a segment carries its log record from its start)."""
        if self.logging:
            return
        self._new_log_arrays(True)
        self.sched = self.sched.copy()  # (copies share it)
        self.sched[S_LOG] = 1
        self.si[I_LOG] = self.si[I_LOGM] = 0
        self._log_out = []

    def stop_logging(self) -> None:
        """Write no step log from here on (a fork keeps none); entries not taken are dropped."""
        self.sched = self.sched.copy()  # (copies share it)
        self.sched[S_LOG] = 0
        self.si[I_LOG] = self.si[I_LOGM] = 0
        self._log_out = []

    def drop_log(self) -> None:
        """No step log from here on, and no arrays for one (a fork or a what-if copy keeps none)."""
        self._new_log_arrays(False)
        self.stop_logging()

    def _seg_log(self, x: int) -> SegmentLog:
        """`Replica.seg_log` of replica ``x``'s segment in flight, as recorded at its start (a run's
        computed tokens advanced by the steps already booked, as `Pool.settle` advances them)."""
        nb, ri = int(self.ri[x, R_BATCH_N]), self.ri
        members = self.bq[x, :nb]
        new = np.ones(nb, np.int64) if ri[x, R_SEG] == SEG_RUN else self.bk[x, :nb]
        return SegmentLog(tuple(self.slots(members).tolist()), tuple(new.tolist()),
                          tuple(self.qi[members, Q_COMPUTED].tolist()), tuple(_decode_flags(self.qi, members, new).tolist()),
                          int(self._mhz[ri[x, R_SCLK]]), float(self.rf[x, R_SSHARE]))

    def slots(self, idx: np.ndarray) -> np.ndarray:
        """The pool's request slots of kernel indices ``idx``."""
        idx = np.asarray(idx, np.int64)
        L = self.n_live
        out = idx - L + (self.slot_base + self.row0)
        low = idx < L
        if low.any():
            out[low] = self.live_slots[idx[low]]
        return out

    def deadlines(self, idx: np.ndarray) -> np.ndarray:
        """The deadlines the requests at kernel indices ``idx`` carry (`Req.deadline`)."""
        idx = np.asarray(idx, np.int64)
        L = self.n_live
        out = np.empty(len(idx))
        low = idx < L
        out[low] = self.head_deadline[idx[low]]
        out[~low] = self.src.deadline[idx[~low] - L + self.row0]
        return out

    def take_finished(self) -> np.ndarray:
        """Kernel indices of the requests finished since the last call (the caller records their results now: a
        compaction may drop them later)."""
        end = int(self.si[I_DONE])
        out = self.done_out[self.taken : end].copy()
        self.taken = end
        return out

    def shares(self) -> np.ndarray:
        """Every replica's SM share now."""
        return self.rf[:, R_SHARE].copy()

    def gpu_of(self) -> np.ndarray:
        """The GPU hosting each replica."""
        return self.ri[:, R_GPU].copy()

    def states(self) -> np.ndarray:
        """Every replica's lifecycle state now (`commitenv.sim.states`)."""
        return self.ri[:, R_STATE].copy()

    def active_count(self, model: int) -> int:
        """`Pool.active_count`: replicas of ``model`` active or waking, or moving or loading to become active."""
        sel = self.ri[:, R_MODEL] == model
        st, after = self.ri[sel, R_STATE], self.ri[sel, R_AFTER]
        return int(((st == ACTIVE) | (st == WAKING) | (((st == MOVING) | (st == LOADING)) & (after == ACTIVE))).sum())

    def targets(self) -> np.ndarray:
        """The GPU each replica is on or, moving, goes to."""
        ri = self.ri
        return np.where(ri[:, R_STATE] == MOVING, ri[:, R_DEST], ri[:, R_GPU])

    def mem_shares(self) -> np.ndarray:
        """The memory share each replica reserves (`Replica.mem_share`)."""
        return self.rf[:, R_MEM].copy()

    def waiting_ids(self, x: int) -> list[int]:
        """The requests in replica ``x``'s waiting queue, front first."""
        return _waiting(self.ri, self.wq, x).tolist()

    def queue_counts(self) -> tuple[int, int]:
        """(waiting, running) requests over the pool (waiting: queued, unrouted or migrating, as `Pool.counts`)."""
        moving = int(np.count_nonzero(self.hk[: self.si[I_HEAP]] == EV_LAND))
        return int(self.ri[:, R_WLEN].sum()) + int(self.si[I_ULEN]) + moving, int(self.ri[:, R_RUN_N].sum())

    def live_state(self) -> tuple[np.ndarray, np.ndarray]:
        """`Pool.live_state`: slots and tokens left of the live requests, each replica's running then waiting."""
        idx = _live(self.ri, self.wq, self.run, self.si, self.hk, self.hs, self.hi)
        return self.slots(idx), _left(idx, self.qi)

    def live_deadlines(self) -> tuple[np.ndarray, np.ndarray]:
        """The live requests' pool slots and deadlines (`Pool.live_deadlines`)."""
        idx = _live(self.ri, self.wq, self.run, self.si, self.hk, self.hs, self.hi)
        return self.slots(idx), self.deadlines(idx)

    def counters(self) -> tuple[int, float, int, int, int]:
        """(arrived, now, live, completed, events), as `Pool` keeps them (arrived counts the workload's rows)."""
        si = self.si
        return (self.row0 + int(si[I_CURSOR]) - self.n_live, float(self.sf[F_NOW]), int(si[I_LIVE]),
                self.done0 + int(si[I_DONE]), int(si[I_EVENTS]))

    def placement_counters(self) -> tuple[int, int, float, float]:
        """(cold starts begun, requests migrated, KV bytes migrated, link energy J), as `Pool` keeps them."""
        return (int(self.si[I_COLD]), int(self.si[I_MIGRATED]), float(self.sf[F_MIG_BYTES]),
                float(self.sf[F_MIG_J]))

    def meter(self, t: float) -> np.ndarray:
        return meter(t, self.ri, self.rf, self.gi, self.gf, self.gh, self.e_dyn)

    def in_flight(self, t: float) -> list:
        """`Pool.in_flight`: the logged segments in flight that started before ``t``."""
        if not self.logging:
            return []
        ri, rf = self.ri, self.rf
        return [InFlightPart(x, int(ri[x, R_GPU]), float(rf[x, R_T0]), int(ri[x, R_K]) if ri[x, R_SEG] == SEG_RUN else 1, e, f,
                             self._seg_log(x))
                for x, e, f in ((int(row[0]), float(row[1]), float(row[2])) for row in in_flight(t, ri, rf))]

    @property
    def events(self) -> int:
        return int(self.si[I_EVENTS])

    @property
    def captured_left(self) -> int:
        return int(self.si[I_CAPLEFT])

    @property
    def finish_t(self) -> np.ndarray:
        """Finish time (client side) by kernel index of the requests loaded (nan: not finished, inf: rejected)."""
        return self.qf[: self.si[I_N], Q_FINISH]

    def results_into(self, done: np.ndarray, rows: np.ndarray, finish_t, first_t, max_tbt_s, replica_of,
                     preemptions) -> None:
        """Per-request results of the finished requests ``done`` (kernel indices) into the pool's result arrays at
        ``rows``, as `ReferencePool._complete` records them."""
        finish_t[rows] = self.qf[done, Q_FINISH]
        first_t[rows] = self.qf[done, Q_FIRST]
        max_tbt_s[rows] = self.qf[done, Q_MAXGAP]
        replica_of[rows] = self.qi[done, Q_REPLICA]
        preemptions[rows] = self.qi[done, Q_PREEMPT]
