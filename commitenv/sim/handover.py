"""A `Pool` and the compiled loop (`commitenv.sim.kernel`): entering the kernel, handing its state back to the
Python loop on first use of anything only that loop keeps (the descriptors below), and taking each kernel call's
counters, results and step log."""

from __future__ import annotations

import math

import numpy as np

from commitenv.sim.copies import DeviceSpec, copy_devices

INF = math.inf


class _PythonLoopState:
    """State only the Python loop keeps: reading it makes a pool the kernel runs hand over to the Python loop."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = "_" + name

    def __get__(self, pool: "KernelHandover | None", owner: type | None = None):
        if pool is None:
            return self
        if pool._ks is not None:
            pool._leave_kernel()
        return pool.__dict__[self.key]

    def __set__(self, pool: "KernelHandover", value) -> None:
        pool.__dict__[self.key] = value


class _StepSink(_PythonLoopState):
    """The step log or hook: a new sink starts the kernel's recording (segments started from then on are recorded, as
    on the Python loop); removing the last one stops it."""

    def __get__(self, pool: "KernelHandover | None", owner: type | None = None):
        return self if pool is None else pool.__dict__[self.key]

    def __set__(self, pool: "KernelHandover", value) -> None:
        pool.__dict__[self.key] = value
        ks = pool._ks
        if ks is None:
            return
        if value is not None:
            ks.start_logging()
        elif ks.logging and pool.log is None and pool.on_step is None:
            ks.stop_logging()


class _KernelPolicy(_PythonLoopState):
    """The dispatch policy: the kernel hands each routing back to it (`commitenv.sim.kernel.policies`)."""

    def __get__(self, pool: "KernelHandover | None", owner: type | None = None):
        return self if pool is None else pool.__dict__[self.key]

    def __set__(self, pool: "KernelHandover", value) -> None:
        pool.__dict__[self.key] = value
        if pool._ks is not None:
            pool._ks.set_dispatching(value is not None)


class KernelHandover:
    """`Pool`'s side of the kernel hand-over (mixed into `Pool`)."""

    def __getattr__(self, name: str):
        """A pool the kernel runs from the start (a new pool, a what-if copy made on the kernel) has no device objects:
        the first read of them builds them from its arrays (idle objects, as a fork's shared ones are, until a
        hand-back writes their state)."""
        d = self.__dict__
        spec = d.get("_devices_shared")
        if name in ("_replicas", "_gpus") and d.get("_ks") is not None and isinstance(spec, DeviceSpec):
            self.build_devices(d["_ks"], spec)
            return d[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _enter_kernel(self) -> None:
        """Run this pool's event loop in the kernel from here on if the kernel covers it (see `Pool`'s docstring)."""
        from commitenv.sim.kernel import KernelState

        self._ks = KernelState.covering(self)

    def _leave_kernel(self) -> None:
        """Write the kernel's state back into the replicas, GPUs and heap; the Python loop continues from there."""
        ks, self._ks = self._ks, None
        shared = self.__dict__.pop("_devices_shared", False)
        if shared is True:  # (a fork shares its original's idle objects until now)
            rmap = copy_devices(self._gpus, self._replicas, self, None)
            self.routable = [[rmap[id(r)] for r in lst] for lst in self.routable]
        elif shared is not False:  # (a what-if copy made on the kernel has none: `Copies.build_devices`)
            self.build_devices(ks, shared)
        ks.export_to(self)

    def use_kernel(self) -> bool:
        """Run the event loop in the kernel from the current state on, if the kernel covers this pool (a what-if copy
        calls it once set up); whether it does."""
        if self._ks is None:
            self._enter_kernel()
        return self._ks is not None

    def _sync_kernel(self) -> None:
        self.sync_from_kernel(self._ks)

    def sync_from_kernel(self, ks) -> None:
        """Counters, completions, captured finishes and per-request results of the kernel's last call, as the Python
        loop keeps them."""
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
                ks.results_into(done[keep], rows, self.finish_t, self.first_t, self.replica_of, self.preemptions)
                if self.done_slots is not None:
                    self.done_slots.extend(rows.tolist())
            cap = ks.qc[done] != 0
            if cap.any():  # (a captured request's finish carries no overhead: `KernelState.covers`)
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
