"""Closed-form shares of a running `Pool`, period by period (what the environment reports and bills).

`PoolAttributor` hooks ``pool.on_step`` (per segment it only packs the entry's numbers into a bytes buffer; no
step log is kept) and, whenever a period closes, prices the buffered segments in one vectorised pass:

* every member's own law energy from the segment's ``decode`` flags (no prompt walking): a decode run of ``n``
  steps ``n*b + kappa*(n*(c+1) + n*(n-1)/2)``, a prefill chunk of ``k`` tokens ``c1*k + c2*(k*c + k(k+1)/2)``;
  the shared energy ``n*a``; coefficients at the segment's own ``clock_mhz`` and SM ``share``;
* each segment's *logged* (metered, noisy) energy split in proportion to those terms (Proposition 5.1 with
  ``scale="step"``): member i of segment k gets ``E_k * (e_ik + n_k*a/m_k) / law_k``, so the parts of a segment
  add up to its energy exactly.

Periods. ``close(t)`` (call it after ``pool.run_until(t)`` and ``pool.settle(t)``) ends the open period at ``t``.
A segment still in flight at ``t`` (after `Pool.settle`, one step per replica) is split where the meter splits
it: the part ``energy_until(t)`` the GPU meter has already counted is attributed to the closing period with the
segment's term ratios, the rest to the period in which it ends. So a period's shares are final when it closes
and add up to the energy its steps drew from the meter:

    busy_j  = sum of the (parts of) step energies inside the period  = sum of the requests' shares
    idle_j  = metered_j - busy_j                                       (the floor over time no step covers)

``idle_j`` is exactly the floor energy of the time no step covers, whatever lifecycle or clock changes happened
inside the period, because the GPU meter is the floor plus each step's energy above it. On a GPU that hosts
several instances, steps of different instances overlap and each one's energy includes the whole GPU's floor: there
a step is billed its energy above the floor plus, of the floor over each stretch of time, an equal part among the
steps running then (the Shapley value of the GPU-level game of its steps, `_share_floor`), so bills never exceed the
meter and idle is never negative. Idle energy is never billed to requests.

A request's bill is the sum of its parts over all periods (``own_j + shared_j``), final once it has finished;
it equals the closed form of the whole log (`closed_form_from_log` with ``scale="step"``) and the bills of a
run add up to its busy energy.

Reads of engine state at a close (besides the meters): each replica's in-flight segment (``seg``, ``t0``,
``run_k``, ``seg_log`` and ``energy_until``). Attach before the pool runs its first step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commitenv.attribution.law import batch_member_terms
from commitenv.sim.coeffs import coeffs_for
from commitenv.sim.devices import device_state
from commitenv.sim.pool import StepLogBatch, StepLogEntry
from commitenv.sim.states import SEG_NONE



@dataclass(frozen=True)
class PeriodSplit:
    """The attribution of one closed period ``[start, end)``. Energies in joules; ``tenant_j[t]`` is tenant
    t's share (index into the table's ``tenant_names``); ``*_gpu`` arrays hold the same per GPU."""

    start: float
    end: float
    metered_j: float
    busy_j: float
    idle_j: float
    tenant_j: np.ndarray
    metered_gpu: np.ndarray
    busy_gpu: np.ndarray
    segments: int  # log entries (and in-flight parts) priced in this period

    @property
    def idle_gpu(self) -> np.ndarray:
        return self.metered_gpu - self.busy_gpu


class PoolAttributor:
    """Step-sharing shares of ``pool`` (attached to its workload) per period and per request; see the module
    docstring. ``tenant``: tenant index per request row (default: the attached table's ``tenant``)."""

    def __init__(self, pool, tenant=None, *, n_tenants: int | None = None) -> None:
        if pool.table is None:
            raise ValueError("PoolAttributor: attach the pool to its workload first (pool.attach(table))")
        if pool.on_step is not None:
            raise ValueError("PoolAttributor: pool.on_step is already in use")
        dev = device_state(pool)
        if np.any(dev.replica_segment != SEG_NONE):
            raise ValueError("PoolAttributor: attach before the pool runs a step (a running segment is not logged)")
        self._init_bills(pool, tenant, n_tenants)
        self._rep_gpu = dev.replica_gpu
        self._rep_model = dev.replica_model
        self.n_gpus = dev.n_gpus
        self._coef: dict[tuple[int, int, float], tuple[float, float, float, float, float]] = {}
        self._carry: dict[int, tuple[float, float, float]] = {}  # replica -> (t0 in flight, J and floor J attributed)
        self._gpu_shared = dev.gpu_hosts > 1
        self._colocated = bool(self._gpu_shared.any())
        self._new_buffers()
        self._start = pool.now
        self._meter_prev = pool.gpu_energy_j(pool.now)
        self.periods = 0
        self.entries = 0
        pool.on_step = self._on_step


    def _init_bills(self, pool, tenant, n_tenants: int | None) -> None:
        """The request rows of ``pool``'s table, their tenants (``tenant``, default the table's) and empty bills."""
        n = len(pool.table)
        self.pool = pool
        ten = np.asarray(pool.table.tenant if tenant is None else tenant, dtype=np.int64)
        if len(ten) != n:
            raise ValueError(f"{type(self).__name__}: {len(ten)} tenant indices for {n} requests")
        self.tenant = ten
        nt = max(len(pool.table.tenant_names), int(ten.max()) + 1 if n else 1)
        self.n_tenants = nt if n_tenants is None else int(n_tenants)
        self.own_j = np.zeros(n)
        self.shared_j = np.zeros(n)
    def _new_buffers(self) -> None:
        """The hook only keeps each booked segment (a `StepLogEntry`, or the kernel's `StepLogBatch`); a close prices
        them all at once."""
        self._buf = _StepBuffer()
        self._on_step = self._buf

    def detach(self) -> None:
        """Stop listening to the pool (buffered segments not yet closed are dropped)."""
        if self.pool.on_step is self._on_step:
            self.pool.on_step = None
        self._buf.clear()

    @property
    def bills_j(self) -> np.ndarray:
        """Per-request shares so far (own + shared), aligned with the table's rows."""
        return self.own_j + self.shared_j

    # ------------------------------------------------------------------------------------------ pricing
    def _coeffs(self, model: int, mhz: int, share: float) -> tuple[float, float, float, float, float]:
        key = (model, mhz, share)
        c = self._coef.get(key)
        if c is None:
            prof = self.pool.profiles[model]
            k = coeffs_for(prof, prof.clock_index(mhz), share)
            c = self._coef[key] = (k.a, k.b, k.kappa, k.c1, k.c2)
        return c

    def _coeff_arrays(self, replica: np.ndarray, mhz: np.ndarray, share: np.ndarray) -> np.ndarray:
        """(E, 5) array of a, b, kappa, c1, c2 per entry."""
        model = self._rep_model[replica]
        if (mhz == mhz[0]).all() and (share == share[0]).all() and (model == model[0]).all():
            c = self._coeffs(int(model[0]), int(mhz[0]), float(share[0]))
            return np.repeat(np.array(c)[None, :], len(replica), axis=0)
        keys = list(zip(model.tolist(), mhz.tolist(), share.tolist()))
        return np.array([self._coeffs(*k) for k in keys])

    def _price(self, rows: StepLogBatch, start: float, nb: int, old: dict) -> tuple[np.ndarray, np.ndarray]:
        """Price the segments ``rows``, add the parts to the per-request totals; returns (per-tenant J, per-GPU J).
        Of the first ``nb`` rows (booked segments) those that started before ``start`` and were in flight at the last
        close (``old``: replica -> (t0, J attributed then)) only get the rest of their energy."""
        replica, t0, n_steps, mhz, share, t1 = rows.replica, rows.t0, rows.n_steps, rows.clock_mhz, rows.share, rows.t1
        energy, floor = rows.energy_j.copy(), rows.floor_j.copy()
        if old:
            for i in np.flatnonzero(t0[:nb] < start).tolist():
                c = old.get(int(replica[i]))
                if c is not None and c[0] == t0[i]:
                    energy[i] -= c[1]
                    floor[i] -= c[2]
        if self._colocated:
            energy = self._share_floor(replica, np.maximum(t0, start), t1, energy, floor)
        coef = self._coeff_arrays(replica, mhz, share)
        mt = batch_member_terms(rows, n_steps, coef)
        return self._split(replica, n_steps, energy, coef, mt)

    def _split(self, replica: np.ndarray, n_steps: np.ndarray, energy: np.ndarray, coef: np.ndarray,
               mt) -> tuple[np.ndarray, np.ndarray]:
        """Split each entry's ``energy`` among its members in proportion to their law terms (``mt``: their
        `member_terms`, ``coef``: (E, 5) coefficients), add the parts to the per-request totals; returns (per-tenant
        J, per-GPU J)."""
        ne = len(energy)
        ent, m, s, own = mt.entry, mt.m, mt.slots, mt.own
        shared, law = entry_law(n_steps, coef, mt)
        ok = law > 0
        f = np.divide(energy, law, out=np.zeros(ne), where=ok)
        sh_each = np.where(ok, shared * f, energy) / m  # a segment without law terms: split equally
        own_p = own * f[ent]
        sh_p = sh_each[ent]
        np.add.at(self.own_j, s, own_p)
        np.add.at(self.shared_j, s, sh_p)
        tj = np.bincount(self.tenant[s], weights=own_p + sh_p, minlength=self.n_tenants)
        gj = np.bincount(self._rep_gpu[replica], weights=energy, minlength=self.n_gpus)
        self.entries += ne
        return tj, gj

    def _share_floor(self, replica: np.ndarray, ts: np.ndarray, te: np.ndarray, energy: np.ndarray,
                     floor: np.ndarray) -> np.ndarray:
        """Energies of the (parts of) segments on co-located GPUs with the GPU's idle floor counted once: each
        segment keeps its energy above the floor, and the floor over every stretch of time is split equally among
        the segments running then (the Shapley value of the GPU-level game whose players are the segments, in
        which a coalition's energy is the floor over the union of its segments' times plus their energies above
        the floor). A GPU with one instance keeps its segments' energies as they are."""
        out = energy.copy()
        gpu = self._rep_gpu[replica]
        for g in np.unique(gpu[self._gpu_shared[gpu]]).tolist():
            idx = np.flatnonzero(gpu == g)
            a, b, f = ts[idx], te[idx], floor[idx]
            dur = b - a
            p = np.divide(f, dur, out=np.zeros(len(idx)), where=dur > 0)  # floor power over each segment
            pts = np.unique(np.concatenate([a, b]))
            ia, ib = np.searchsorted(pts, a), np.searchsorted(pts, b)
            m = np.zeros(len(pts))  # segments running over each piece [pts[j], pts[j + 1])
            np.add.at(m, ia, 1.0)
            np.add.at(m, ib, -1.0)
            m = np.cumsum(m)[:-1]
            per = np.divide(np.diff(pts), m, out=np.zeros(len(pts) - 1), where=m > 0)
            cum = np.concatenate([[0.0], np.cumsum(per)])
            share = p * (cum[ib] - cum[ia])  # the floor of its pieces, each split among those running then
            out[idx] = energy[idx] - f + share
        return out

    # ------------------------------------------------------------------------------------------ periods
    def close(self, t: float) -> PeriodSplit:
        """End the open period at ``t`` (after ``pool.run_until(t)`` and ``pool.settle(t)``)."""
        pool = self.pool
        if t < self._start - 1e-9:
            raise ValueError(f"close: t={t} precedes the open period's start {self._start}")
        start = self._start
        parts = list(self._buf)
        self._buf.clear()
        nb = sum(len(p) if isinstance(p, StepLogBatch) else 1 for p in parts)
        old = self._carry
        carry: dict[int, tuple[float, float, float]] = {}
        for part in pool.in_flight(t):  # in flight at t: attribute the part the meter has counted by t
            c = old.get(part.replica)
            done, f_done = (c[1], c[2]) if c is not None and c[0] == part.t0 else (0.0, 0.0)
            carry[part.replica] = (part.t0, part.energy_j, part.floor_j)
            parts.append(StepLogEntry(part.gpu, part.replica, part.t0, t, part.n_steps, part.energy_j - done,
                                      *part.entry, floor_j=part.floor_j - f_done))
        self._carry = carry
        rows = StepLogBatch.join(parts)
        nseg = len(rows)
        if nseg:
            tj, gj = self._price(rows, start, nb, old)
        else:
            tj, gj = np.zeros(self.n_tenants), np.zeros(self.n_gpus)
        meter = pool.gpu_energy_j(t)
        metered = meter - self._meter_prev
        self._meter_prev = meter
        self._start = t
        self.periods += 1
        busy = float(gj.sum())
        mt = float(metered.sum())
        return PeriodSplit(start, t, mt, busy, mt - busy, tj, metered, gj, nseg)


class _StepBuffer(list):
    """`PoolAttributor`'s hook: keeps the booked segments in order, one `StepLogEntry` at a time from the Python
    loop (``__call__``) or a `StepLogBatch` per engine call from the kernel (``take_batch``)."""

    def __call__(self, entry: StepLogEntry) -> None:
        self.append(entry)

    def take_batch(self, batch: StepLogBatch) -> None:
        self.append(batch)


def entry_law(n_steps: np.ndarray, coef: np.ndarray, mt) -> tuple[np.ndarray, np.ndarray]:
    """(shared, law) energy of every entry under the law: ``n_steps * a`` and that plus its members' own terms."""
    shared = n_steps * coef[:, 0]
    return shared, shared + np.bincount(mt.entry, weights=mt.own, minlength=len(n_steps))


def token_split_bills(prompt_tokens, output_tokens, total_j: float, served=None, output_weight: float = 5.0):
    """The Token baseline over a run: ``total_j`` split in proportion to ``p + output_weight * d`` among the
    ``served`` requests (rows with any step; the others get 0)."""
    w = np.asarray(prompt_tokens, dtype=np.float64) + output_weight * np.asarray(output_tokens, dtype=np.float64)
    if served is not None:
        w = np.where(served, w, 0.0)
    s = w.sum()
    return w * (total_j / s) if s > 0 else np.zeros_like(w)
