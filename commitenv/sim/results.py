"""What each call into the compiled loop hands the `Pool` back: counters, completions, captured finishes, per-request
results and step-log entries; and the pool attributes whose setting the kernel must hear of (step sinks, dispatch)."""

from __future__ import annotations

import math

import numpy as np

INF = math.inf


class _PoolAttribute:
    """A pool attribute kept in the instance's dict under ``_name``, whose setting the kernel must hear of."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = "_" + name

    def __get__(self, pool, owner: type | None = None):
        return self if pool is None else pool.__dict__[self.key]


class _StepSink(_PoolAttribute):
    """The step log or hook: a new sink starts the kernel's recording (segments started from then on are recorded);
    removing the last one stops it."""

    def __set__(self, pool, value) -> None:
        pool.__dict__[self.key] = value
        ks = pool.__dict__.get("_ks")  # (none yet while the pool is built: the new state reads the sinks)
        if ks is None:
            return
        if value is not None:
            ks.start_logging()
        elif ks.logging and pool.log is None and pool.on_step is None:
            ks.stop_logging()


class _KernelPolicy(_PoolAttribute):
    """The dispatch policy: the kernel hands each routing back to it (`commitenv.sim.kernel.policies`)."""

    def __set__(self, pool, value) -> None:
        pool.__dict__[self.key] = value
        ks = pool.__dict__.get("_ks")
        if ks is not None:
            ks.set_dispatching(value is not None)


class KernelResults:
    """`Pool`'s side of each kernel call (mixed into `Pool`)."""

    def sync_from_kernel(self, ks) -> None:
        """Counters, completions, captured finishes and per-request results of the kernel's last call, into the pool's
        own fields (`completed`, `finish_t`, `captured_finish`, ...)."""
        c0 = self._cursor
        self._cursor, self.now, self.live, self.completed, self.events = ks.counters()
        self.cold_starts, self.migrated, self.migration_bytes, self.migration_j = ks.placement_counters()
        if self.late_done is not None:
            self.count_late(c0 + np.flatnonzero(self.rejected[c0:self._cursor]))
        elif self._n_results and self._slot_base == 0:
            rej = np.flatnonzero(self.rejected[c0:self._cursor])
            if len(rej):
                self.finish_t[c0 + rej] = INF
        done = ks.take_finished()
        if len(done):
            slots = ks.slots(done)
            if self.late_done is not None:
                self.count_late(slots[~(ks.finish_t[done] <= ks.deadlines(done))] - self._slot_base)
            elif self._n_results:
                keep = slots < self._n_results
                rows = slots[keep]
                ks.results_into(done[keep], rows, self.finish_t, self.first_t, self.max_tbt_s, self.replica_of,
                                self.preemptions)
                if self.done_slots is not None:
                    self.done_slots.extend(rows.tolist())
            cap = ks.qc[done] != 0
            if cap.any():  # (captures are a what-if copy's: no serving overhead)
                self.captured_finish.update(zip(slots[cap].tolist(), ks.finish_t[done[cap]].tolist()))
        self.captured_left = int(ks.captured_left)
        self._take_log(ks)

    def _take_log(self, ks) -> None:
        """The step log entries the kernel booked in its last call, into ``log`` and to ``on_step`` (in booking order,
        once the call returns; as one `StepLogBatch` to a hook with a ``take_batch`` method)."""
        batch = ks.take_log() if ks.logging else None
        if batch is None:
            return
        hook = self.on_step
        take_batch = getattr(hook, "take_batch", None)
        entries = batch.entries() if self.log is not None or (hook is not None and take_batch is None) else []
        if self.log is not None:
            self.log.extend(entries)
        if take_batch is not None:
            take_batch(batch)
        elif hook is not None:
            for e in entries:
                hook(e)
