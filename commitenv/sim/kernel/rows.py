"""Read-only inputs of a `KernelState`: the step laws' coefficients per clock level and a pool's workload rows as
arrays."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from commitenv.sim.coeffs import coeffs_for


# id(profile) -> {share: coefficients}, dropped with the profile (one pop, atomic: a finalizer can run while another
# profile's entry is being added, during any allocation)
_COEFFS: dict[int, dict[float, np.ndarray]] = {}


def _clock_coefficients(prof, share: float = 1.0) -> np.ndarray:
    """The step laws' coefficients at each clock level of ``prof`` at SM share ``share`` (one replica's rows of
    ``coc``; read only, cached per profile object and share as `coeffs_for` caches them: a profile is not changed
    once an engine used it)."""
    per = _COEFFS.get(id(prof))
    if per is None:
        per = _COEFFS[id(prof)] = {}
        weakref.finalize(prof, _COEFFS.pop, id(prof), None)
    key = round(float(share), 6)
    coc = per.get(key)
    if coc is None:
        coc = np.zeros((len(prof.clocks), 10))
        for ci in range(len(prof.clocks)):
            c = coeffs_for(prof, ci, share)
            coc[ci] = (c.tau0, c.tau1, c.tau2, c.tau3, c.tau4, c.a, c.c1, c.c2, c.b, c.kappa)
        per[key] = coc
    return coc


@dataclass(frozen=True)
class _Rows:
    """A pool's workload rows as arrays (read only; shared by every copy of a kernel state)."""

    arrival: np.ndarray
    prompt: np.ndarray
    out: np.ndarray  # the output length the engine runs to
    rejected: np.ndarray
    deadline: np.ndarray  # what `Req.deadline` carries
    model: np.ndarray  # the model serving it (int64)
    overhead: np.ndarray | None  # serving overhead added to the finish time (None: none)

    @classmethod
    def empty(cls) -> "_Rows":
        """No rows (a what-if copy's workload)."""
        e = np.zeros(0)
        return cls(e, e.astype(np.int64), e.astype(np.int64), e.astype(np.bool_), e, e.astype(np.int64), None)

    @classmethod
    def of(cls, pool) -> "_Rows":
        n = pool._n
        if n and pool.table is not None and pool._slot_base == 0 and len(pool.table) == n:
            return cls(pool.table.arrival_s, pool.table.prompt_tokens, np.asarray(pool.out_tokens),
                       np.asarray(pool.rejected, np.bool_), np.asarray(pool.deadline, np.float64),
                       np.asarray(pool.model_of, np.int64), pool.overhead_s)
        if not n:
            return cls.empty()
        oh = pool.overhead_s if pool._slot_base == 0 else None
        return cls(np.asarray(pool._arr[:n], np.float64), np.asarray(pool._prompt[:n], np.int64),
                   np.asarray(pool._out[:n], np.int64), np.asarray(pool.rejected[:n], np.bool_),
                   np.asarray(pool._deadline[:n], np.float64), np.asarray(pool._model[:n], np.int64), oh)
