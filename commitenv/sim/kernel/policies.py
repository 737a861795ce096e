"""The compiled loop's calls back to the host answered: a dispatch policy's choice of replica for an arrival (or a
re-routed request) and a local policy's plan for a replica's next step, from views built off the kernel's arrays
as the step-by-step reference engine (tests/helpers/reference) builds them off its objects, timed into the
pool's counters (`dispatch_s`, `local_s`)."""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from commitenv.sim.dispatch import ArrivalView, CandidateView
from commitenv.sim.kernel.actuate import _flush, _set_clock
from commitenv.sim.kernel.heap import _waiting
from commitenv.sim.kernel.host import CURRENT
from commitenv.sim.kernel.layout import Q_HOFF, Q_NH
from commitenv.sim.kernel.prefix import hit_count
from commitenv.sim.kernel.layout import (G_CLOCK, G_PENDING, I_PLAN_BUDGET, I_PLAN_N, I_PLAN_REP, Q_COMPUTED,
                                         Q_GENERATED, Q_MODEL, Q_OUT, Q_PROMPT, R_BS, R_BUDGET, R_FREE, R_GPU, R_LOCAL,
                                         R_MAXSEQ, R_MODEL, R_RUN_N, R_SHARE, R_STATE, R_UNF, R_WLEN, S_DISPATCH)
from commitenv.sim.local import LocalView, TaskView, check_plan, plan_budget
from commitenv.sim.local_compiled import OUT_HEADER, check_compiled, none
from commitenv.sim.states import ACTIVE


@njit(cache=True)
def _token_loads(x, ri, qi, wq, run):
    """`commitenv.sim.hooks._token_loads` of replica ``x``: (tokens still to compute before the first output token,
    summed context of the requests past their prefill)."""
    pre = dec = 0
    for r in np.concatenate((run[x, : ri[x, R_RUN_N]], _waiting(ri, wq, x))):
        left = qi[r, Q_PROMPT] + qi[r, Q_GENERATED] - qi[r, Q_COMPUTED]
        if qi[r, Q_GENERATED] >= 1 and left <= 1:
            dec += qi[r, Q_COMPUTED] + 1
        else:
            pre += left
    return pre, dec


class KernelPolicies:
    """`KernelState`'s answers to the compiled loop's policy hand-backs (mixed into `KernelState`); ``pool`` is the
    `Pool` the state runs (its policies, what they may know of a request, its timing counters)."""

    _EMPTY = (np.zeros(0, np.int64), np.zeros(0))

    def set_dispatching(self, on: bool) -> None:
        """Whether a dispatch policy routes (each arrival called back to the host)."""
        self.sched = self.sched.copy()  # (copies share it)
        self.sched[S_DISPATCH] = int(on)

    # ------------------------------------------------------------------------------------------ dispatch
    @staticmethod
    def _seen_in_pool(pool) -> bool:
        """Whether a policy sees the pool's predicted lengths and visible deadlines by slot (`ReferenceHooks._seen`);
        else, in a what-if copy or a replay, the lengths and deadlines the requests run to."""
        return pool is not None and pool._slot_base == 0 and pool.pred_out is not None

    def _seen(self, pool, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """What a policy may know of the requests ``idx``: predicted outputs and visible deadlines."""
        if self._seen_in_pool(pool):
            slots = self.slots(idx)
            return pool.pred_out[slots], pool.visible_deadline[slots]
        return self.qi[idx, Q_OUT], self.deadlines(idx)

    def _choose(self, pool, r: int, t: float) -> int:
        """`ReferenceHooks._dispatched` for request ``r`` at ``t``: the active replica of its model the dispatch policy
        chooses (the loop routes it there; it called only with one active replica at least)."""
        ri, qi = self.ri, self.qi
        model = int(qi[r, Q_MODEL])
        cands = np.flatnonzero((ri[:, R_STATE] == ACTIVE) & (ri[:, R_MODEL] == model))
        c0 = time.perf_counter()
        pol = pool.dispatch
        pred, dl = self._seen(pool, np.array([r]))
        nh = int(qi[r, Q_NH])
        req = ArrivalView(int(self.slots(np.array([r]))[0]), t, int(qi[r, Q_PROMPT]), int(pred[0]), float(dl[0]),
                          model, nh)
        hashes = self.pfx[5][qi[r, Q_HOFF]: qi[r, Q_HOFF] + nh] if pol.wants_prefix and nh else None
        load = pol.wants_load
        views = tuple(
            CandidateView(int(x), int(ri[x, R_GPU]), int(ri[x, R_UNF]), int(ri[x, R_RUN_N]), int(ri[x, R_WLEN]),
                          int(ri[x, R_FREE]), int(self.cap_blocks[x]), int(self._mhz[self.gi[ri[x, R_GPU], G_CLOCK]]),
                          float(self.rf[x, R_SHARE]),
                          0 if hashes is None else hit_count(self.pfx[3], self.pfx[4], x, hashes), int(ri[x, R_BS]),
                          *(_token_loads(x, ri, qi, self.wq, self.run) if load else (0, 0)))
            for x in cands.tolist())
        pick = pol.choose(req, views)
        pool.dispatch_s += time.perf_counter() - c0
        pool.dispatch_calls += 1
        if pick not in cands.tolist():
            raise ValueError(f"dispatch policy {pol.name!r} chose replica {pick!r}, not one of the active replicas "
                             f"{cands.tolist()} of model {model}")
        return int(pick)

    # ------------------------------------------------------------------------------------------ local plans
    def _plan(self, pool, x: int, t: float, ints: np.ndarray, flts: np.ndarray) -> None:
        """`ReferenceHooks._local_order` for replica ``x`` at ``t``: its local policy's plan, a clock in it requested
        for the replica's GPU, the order checked and written for the compiled loop (``plan``, ``on_run``)."""
        c0 = time.perf_counter()
        rows = ints.tolist()
        tasks = tuple([TaskView(s, rn == 1, d == 1, lf, c, p, g, pr, a, v, b, last)
                       for (_, s, rn, d, lf, c, p, g, pr, b), (a, v, last) in zip(rows, flts.tolist())])
        r = self.ri[x].tolist()
        g = r[R_GPU]
        levels = self.clock_mhz
        view = LocalView(t, x, g, r[R_MODEL], levels[self.gi[g, G_CLOCK]], levels, self.rf[x, R_SHARE].item(), r[R_FREE],
                         r[R_BS], r[R_BUDGET], r[R_MAXSEQ], tasks)
        policy = pool.local_policies[x]
        plan = policy.plan(view)
        pool.local_s += time.perf_counter() - c0
        pool.local_calls += 1
        si = self.si
        si[I_PLAN_REP] = x
        if plan is None:
            si[I_PLAN_N] = -1
            return
        si[I_PLAN_BUDGET] = plan_budget(plan, r[R_BUDGET], policy.name, x)
        mhz = plan.clock_mhz
        if mhz is not None:
            if mhz not in levels:
                raise ValueError(f"local policy {policy.name!r}: clock {mhz} MHz is not one of the GPU's levels "
                                 f"{list(levels)}")
            idx = levels.index(mhz)
            gi = self.gi
            if idx != (gi[g, G_PENDING] if gi[g, G_PENDING] >= 0 else gi[g, G_CLOCK]):  # (else nothing to request)
                _set_clock(t, idx, np.array([g], np.int64), gi, self.gf, si, self.ht, self.hk, self.hs, self.hi,
                           self.hv)
        where = dict(zip([row[1] for row in rows], range(len(rows))))
        order = plan.order
        try:
            pos = [where[s] for s in order]
        except (KeyError, TypeError):
            pos = None
        if pos is None or len(set(order)) != len(pos):
            check_plan(order, where, x)
        n = len(pos)
        if n > len(self.plan):  # (never: the plan arrays hold as many entries as the request arrays)
            raise RuntimeError(f"kernel: a plan of {n} entries, the plan arrays hold {len(self.plan)}")
        self.plan[:n] = [rows[j][0] for j in pos]
        self.on_run[:n] = [rows[j][2] for j in pos]
        si[I_PLAN_N] = n

    def _flush_all(self, pool, t: float) -> None:
        """`ReferencePool._flush` at ``t`` on the host side of an actuation: start the replicas that received work,
        planning the steps of those with a local policy."""
        CURRENT.append((self, pool))
        try:
            _flush(t, self.ri, self.rf, self.qi, self.qf, self.wq, self.run, self.bq, self.bk, self.coc, self.gi,
                   self.gf, self.gh, self.floor_tab, self.ftab, self.fetab, self.cell, self.sched, self.sf, self.si,
                   self.e_dyn, self.pend, self.ht, self.hk, self.hs, self.hi, self.hv, self.plan, self.on_run,
                   *self._task_args(pool), self.pfx)
        finally:
            CURRENT.pop()

    def _task_args(self, pool) -> tuple:
        """The `LoopArrays` fields after ``on_run`` (and the arguments after ``on_run`` of `_flush`): what
        `heap._task_rows` needs to build a replica's tasks as its local policy sees them (`ReferenceHooks._seen`: the
        pool's predictions and visible deadlines by slot, or in a what-if copy or a replay the lengths and deadlines the
        requests run to)."""
        seen_pool = self._seen_in_pool(pool)
        tvi = np.array([self.n_live, self.slot_base + self.row0, self.row0, seen_pool], np.int64)
        po, vd = (pool.pred_out, pool.visible_deadline) if seen_pool else self._EMPTY
        return tvi, self.live_slots, self.head_deadline, self.src.deadline, po, vd, self._compiled_local(pool)

    def set_local_modes(self, modes: list[int]) -> None:
        """How each replica's steps are planned from its next start on: 0 the vLLM scheduler, 1 its local policy on the
        host, 2 the compiled local policy in the loop (`Pool.set_local_policy` decides)."""
        self.ri[:, R_LOCAL] = modes

    def compiled_sizes(self) -> tuple[int, int, int]:
        """(replicas, GPUs, the most sequences a step holds): what a compiled local policy sizes its arrays for."""
        return self.R, self.G, int(self.ri[:, R_MAXSEQ].max()) if self.R else 0

    def _compiled_local(self, pool) -> tuple:
        """What the loop carries of the compiled local policy (`commitenv.sim.local_compiled`): an output row as long
        as the plan arrays, the GPU's clock levels, the policy's four arrays and its function; the placeholder (which
        makes a compiled plan an error) when no replica plans in the loop or no pool answers for its policies."""
        out = np.empty(self.plan.shape[0] + OUT_HEADER, np.int64)  # (a scratch row per call: nothing a copy shares)
        levels = np.array(self.clock_mhz, np.int64)
        cp = none()
        if pool is not None:
            xs = np.flatnonzero(self.ri[:, R_LOCAL] == 2)
            if len(xs):
                policy = pool.local_policies[int(xs[0])]
                cp = None if policy is None else policy.compiled(*self.compiled_sizes())
                if cp is None:
                    raise RuntimeError(f"kernel: replica {int(xs[0])} plans in the loop, but its local policy "
                                       f"{getattr(policy, 'name', None)!r} offers no compiled plan now")
                check_compiled(cp, policy.name)
        # (the function last: numba warns about first-class functions whenever a tuple's first item is one)
        return (out, levels, cp.pf, cp.pi, cp.sf, cp.si, cp.fn)
