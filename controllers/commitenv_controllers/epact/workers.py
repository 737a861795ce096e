"""Persistent worker processes that evaluate what-if candidates in parallel (ePACT section 4.4).

Each decision's snapshot and forecast are pickled once and shipped with every task; a worker unpickles
a decision's payload once and keeps it for the rest of that decision's candidates. Results do not depend
on the number of workers (the what-if engine is deterministic)."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
from typing import Any

from commitenv.sim.whatif import WhatIf, simulate

_CACHE: dict[str, Any] = {"id": None, "payload": None}


def _evaluate(args: tuple[int, bytes, int, int]) -> WhatIf:
    decision_id, blob, active, clock = args
    if _CACHE["id"] != decision_id:
        _CACHE["id"] = decision_id
        _CACHE["payload"] = pickle.loads(blob)
    snap, replay, horizon, max_tail, track = _CACHE["payload"]
    return simulate(snap, active, clock, horizon, replay, max_tail_s=max_tail, track_arrivals=track)


class WhatIfWorkers:
    """A pool of ``n`` persistent processes (``n=0``: evaluate in this process)."""

    def __init__(self, n: int | None = None) -> None:
        self.n = (os.cpu_count() or 1) if n is None else int(n)
        if self.n < 0:
            raise ValueError(f"workers: expected >= 0, got {n}")
        self._pool = None
        self._decision = 0

    def _ensure(self) -> None:
        if self._pool is None and self.n > 0:
            method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
            self._pool = mp.get_context(method).Pool(self.n)

    def begin(self, snap: Any, replay: Any, horizon_s: float, max_tail_s: float = 3600.0,
              track_arrivals: bool = False) -> None:
        """Start a decision: its snapshot and forecast are pickled once for all of its batches."""
        self._decision += 1
        self._args = (snap, replay, horizon_s, max_tail_s, track_arrivals)
        self._blob: bytes | None = None

    def evaluate(self, configs: list[tuple[int, int]]) -> list[WhatIf]:
        """Predictions for ``configs`` ((active, clock MHz) pairs) of the current decision, in order."""
        snap, replay, horizon_s, max_tail_s, track = self._args
        if self.n == 0 or len(configs) == 1:
            return [simulate(snap, a, c, horizon_s, replay, max_tail_s=max_tail_s, track_arrivals=track)
                    for a, c in configs]
        self._ensure()
        if self._blob is None:
            self._blob = pickle.dumps(self._args, protocol=pickle.HIGHEST_PROTOCOL)
        tasks = [(self._decision, self._blob, a, c) for a, c in configs]
        return self._pool.map(_evaluate, tasks, chunksize=1)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            if self._pool is not None:
                self._pool.terminate()
        except Exception:
            pass
