"""Routing, redistribution and actuation: the router (least unfinished among the model's active replicas), starting
replicas that received work, `set_active`, clock changes, SM shares, the idle-floor meter of GPUs hosting one or
several replicas (``gh[g, :gi[g, G_NHOST]]``, in the GPU's order)."""

from __future__ import annotations

import numpy as np
from numba import njit, objmode

from commitenv.sim.kernel.heap import _push, _task_rows, _upush_back, _wpush_back
from commitenv.sim.kernel.host import dispatch as _host_dispatch
from commitenv.sim.kernel.host import plan as _host_plan
from commitenv.sim.kernel.layout import (GF_CLOCK_LAT, GF_PENDING_T, G_CLOCK, G_NHOST, G_PENDING, G_VER, I_LOCAL_N,
                                         I_NMIG, I_PEND, I_PLAN_BUDGET, I_PLAN_N, I_PLAN_REP, R_BS, R_BUDGET, R_FREE,
                                         R_MAXSEQ, I_UHEAD, I_ULEN, MIG_NONE, Q_MODEL, Q_REPLICA, Q_STARTED, R_AFTER,
                                         R_DEST, R_GPU, R_LOCAL, R_LREADY, R_MIGRATE, R_MODEL, R_PENDING, R_RUN_N,
                                         R_SEG, R_SHARE, R_STATE, R_T1, R_UNF, R_VER, R_WAKE_S, R_WHEAD, R_WLEN,
                                         S_DISPATCH, S_WAKE)
from commitenv.sim.kernel.lifecycle import _detach, _floor_changed, _migrate_out
from commitenv.sim.kernel.segment import _cut, _start_segment
from commitenv.sim.local_compiled import OUT_HEADER
from commitenv.sim.states import (ACTIVE, DRAINING, EV_CLOCK, EV_SEG, EV_WAKE, LOADING, MOVING, SEG_NONE, SEG_RUN,
                                  STANDBY, WAKING)


@njit(cache=True)
def _poke(t, rep, ri, rf, si, pend, ht, hk, hs, hi, hv):
    if ri[rep, R_SEG] == SEG_NONE:
        if ri[rep, R_PENDING] == 0:
            ri[rep, R_PENDING] = 1
            pend[si[I_PEND]] = rep
            si[I_PEND] += 1
    elif ri[rep, R_SEG] == SEG_RUN and _cut(rf, ri, rep, t):
        ri[rep, R_VER] += 1
        _push(si, ht, hk, hs, hi, hv, rf[rep, R_T1], 0, rep, ri[rep, R_VER])


@njit(cache=True)
def _depart(t, rep, ri, rf, qi, wq, run, coc, gi, gf, gh, floor_tab, sf, si, e_dyn, ht, hk, hs, hi, hv, tvi, live_slots,
            pred_out, pfx):
    """The first part of `ReferencePool._start` for a moving replica: its requests that migrate leave, and left without
    work it leaves its GPU (returns True: nothing to start)."""
    if ri[rep, R_MIGRATE] != MIG_NONE:
        _migrate_out(t, rep, ri, rf, qi, wq, run, coc, gi, sf, si, e_dyn, ht, hk, hs, hi, hv, tvi, live_slots,
                     pred_out, pfx)
    if ri[rep, R_RUN_N] == 0 and ri[rep, R_WLEN] == 0:
        _detach(t, rep, ri, rf, gi, gf, gh, floor_tab, si, ht, hk, hs, hi, hv, pfx)
        return True
    return False


@njit(cache=True)
def _start(t, rep, ri, rf, qi, wq, run, bq, bk, coc, gi, gf, gh, floor_tab, ftab, fetab, cell, sched, si, ht, hk,
           hs, hi, hv, plan, on_run, pfx):
    """`ReferencePool._start` after `_depart`: start ``rep``'s next segment at ``t`` (its local plan, if it has a
    policy, already written by the host), or send a draining replica left without work to standby."""
    if ri[rep, R_STATE] == ACTIVE and ri[rep, R_RUN_N] == 0 and ri[rep, R_WLEN] == 0:
        return
    if _start_segment(t, rep, ri, rf, qi, wq, run, bq, bk, coc, gi, gf, ftab, fetab, cell, sched, si, plan, on_run,
                      pfx):
        ri[rep, R_VER] += 1
        _push(si, ht, hk, hs, hi, hv, rf[rep, R_T1], EV_SEG, rep, ri[rep, R_VER])
    elif ri[rep, R_STATE] == DRAINING and ri[rep, R_RUN_N] == 0 and ri[rep, R_WLEN] == 0:
        ri[rep, R_STATE] = STANDBY
        _floor_changed(t, ri[rep, R_GPU], ri, rf, gi, gf, gh, floor_tab)


@njit(cache=True)
def _route_to(t, r, best, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv):
    """Request ``r`` joins replica ``best``'s waiting queue at ``t`` (the router's or the dispatch policy's choice)."""
    qi[r, Q_REPLICA] = best
    _wpush_back(ri, wq, best, r)
    ri[best, R_UNF] += 1
    _poke(t, best, ri, rf, si, pend, ht, hk, hs, hi, hv)


@njit(cache=True)
def _wake(t, x, ri, rf, gi, gf, gh, floor_tab, si, ht, hk, hs, hi, hv):
    """Standby replica ``x`` starts waking at ``t``: active after its profile's activation latency (``R_WAKE_S``)."""
    ri[x, R_STATE] = WAKING
    ri[x, R_VER] += 1
    _floor_changed(t, ri[x, R_GPU], ri, rf, gi, gf, gh, floor_tab)
    _push(si, ht, hk, hs, hi, hv, t + rf[x, R_WAKE_S], EV_WAKE, x, ri[x, R_VER])


@njit(cache=True)
def _demand_wake(t, m, ri, rf, gi, gf, gh, floor_tab, si, ht, hk, hs, hi, hv):
    """`ReferencePool._demand_wake` (models scale to zero): a request of model ``m`` found no active replica. Unless one
    is waking, or moving or loading to become active, one is woken: a draining one resumes at once (returned: it takes
    the request), else a standby one wakes after its activation latency, else a moving or loading one becomes active
    once loaded (the lowest index of each kind). Returns -1 when the request must wait."""
    drain = stand = moving = -1
    for x in range(ri.shape[0]):
        if ri[x, R_MODEL] != m:
            continue
        st = ri[x, R_STATE]
        if st == WAKING or ((st == MOVING or st == LOADING) and ri[x, R_AFTER] == ACTIVE):
            return -1
        if st == DRAINING and drain < 0:
            drain = x
        elif st == STANDBY and stand < 0:
            stand = x
        elif (st == MOVING or st == LOADING) and moving < 0:
            moving = x
    if drain >= 0:
        ri[drain, R_STATE] = ACTIVE
        _floor_changed(t, ri[drain, R_GPU], ri, rf, gi, gf, gh, floor_tab)
        return drain
    if stand >= 0:
        _wake(t, stand, ri, rf, gi, gf, gh, floor_tab, si, ht, hk, hs, hi, hv)
    elif moving >= 0:
        ri[moving, R_AFTER] = ACTIVE
    return -1


@njit(cache=True)
def _route(t, r, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv, sched, gi, gf, gh, floor_tab):
    """`ReferencePool._route`: to the least unfinished among the active replicas of the request's model (ties to the
    lowest index), or where the dispatch policy chooses (called back on the host, `host.dispatch`); with no active
    replica of its model the request waits, unrouted (where models scale to zero, after waking one: `_demand_wake`)."""
    R = ri.shape[0]
    m = qi[r, Q_MODEL]
    best = -1
    for x in range(R):
        if ri[x, R_STATE] == ACTIVE and ri[x, R_MODEL] == m and (best < 0 or ri[x, R_UNF] < ri[best, R_UNF]):
            best = x
    if best < 0 and sched[S_WAKE]:
        best = _demand_wake(t, m, ri, rf, gi, gf, gh, floor_tab, si, ht, hk, hs, hi, hv)
    if best < 0:
        _upush_back(si, wq, r)
        return
    if sched[S_DISPATCH]:
        with objmode(best="int64"):
            best = _host_dispatch(r, t)
    _route_to(t, r, best, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv)


@njit(cache=True)
def _route_in_order(t, model, moved, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv):
    """`_route` of every request of ``model`` in ``moved``, in index (arrival) order: the order by marking (linear
    in the index range), the least-loaded replica from a heap of (unfinished, index) over the model's active ones
    (log R per request)."""
    lo, hi_ = moved.min(), moved.max()
    mark = np.zeros(hi_ - lo + 1, np.bool_)
    for r in moved:
        mark[r - lo] = True
    R = ri.shape[0]
    heap = np.empty(R, np.int64)  # the model's active replicas, a binary heap on (unfinished, index)
    n = 0
    for x in range(R):
        if ri[x, R_STATE] == ACTIVE and ri[x, R_MODEL] == model:
            heap[n] = x
            n += 1
    if n == 0:
        raise RuntimeError("kernel: no active replica of the model to route to")
    for j in range(n // 2 - 1, -1, -1):
        _sift_down(heap, n, j, ri)
    for k in range(hi_ - lo + 1):
        if not mark[k]:
            continue
        r = lo + k
        best = heap[0]
        qi[r, Q_REPLICA] = best
        _wpush_back(ri, wq, best, r)
        ri[best, R_UNF] += 1
        _poke(t, best, ri, rf, si, pend, ht, hk, hs, hi, hv)
        _sift_down(heap, n, 0, ri)


@njit(cache=True)
def _sift_down(heap, n, j, ri):
    while True:
        c = 2 * j + 1
        if c >= n:
            return
        if c + 1 < n and (ri[heap[c + 1], R_UNF], heap[c + 1]) < (ri[heap[c], R_UNF], heap[c]):
            c += 1
        if (ri[heap[c], R_UNF], heap[c]) < (ri[heap[j], R_UNF], heap[j]):
            heap[c], heap[j] = heap[j], heap[c]
            j = c
        else:
            return


@njit(cache=True)
def _take_unstarted(model, ri, qi, wq):
    """The first half of `ReferencePool._redistribute`: every queued request of ``model`` that has not started leaves
    its queue; returned in index (arrival) order, the order they are routed again."""
    R = ri.shape[0]
    total = 0
    for x in range(R):
        if ri[x, R_MODEL] == model:
            total += ri[x, R_WLEN]
    moved = np.empty(total, np.int64)
    nm = 0
    for x in range(R):
        if ri[x, R_MODEL] != model:
            continue
        n = ri[x, R_WLEN]
        r = ri[x, R_WHEAD]
        ri[x, R_WLEN] = 0
        for _ in range(n):
            nxt = wq[r]
            if qi[r, Q_STARTED]:
                _wpush_back(ri, wq, x, r)  # started ones keep their order
            else:
                moved[nm] = r
                nm += 1
            r = nxt
        ri[x, R_UNF] = ri[x, R_RUN_N] + ri[x, R_WLEN]
    return np.sort(moved[:nm])


@njit(cache=True)
def _take_unrouted(model, si, wq, qi):
    """The unrouted requests of ``model`` leave the unrouted list (the others keep their order)."""
    n = si[I_ULEN]
    out = np.empty(n, np.int64)
    k = 0
    r = si[I_UHEAD]
    si[I_ULEN] = 0
    for _ in range(n):
        nxt = wq[r]
        if qi[r, Q_MODEL] == model:
            out[k] = r
            k += 1
        else:
            _upush_back(si, wq, r)
        r = nxt
    return out[:k]


@njit(cache=True)
def _standby_idle(t, model, ri, rf, gi, gf, gh, floor_tab, si, ht, hk, hs, hi, hv, pfx):
    """The last part of `ReferencePool._redistribute`: ``model``'s draining replicas left without work go to standby,
    its moving ones leave their GPUs."""
    for x in range(ri.shape[0]):
        if ri[x, R_MODEL] == model and ri[x, R_SEG] == SEG_NONE and ri[x, R_RUN_N] == 0 and ri[x, R_WLEN] == 0:
            if ri[x, R_STATE] == DRAINING:
                ri[x, R_STATE] = STANDBY
                _floor_changed(t, ri[x, R_GPU], ri, rf, gi, gf, gh, floor_tab)
            elif ri[x, R_STATE] == MOVING:
                _detach(t, x, ri, rf, gi, gf, gh, floor_tab, si, ht, hk, hs, hi, hv, pfx)


@njit(cache=True)
def _redistribute(t, model, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv, gi, gf, gh, floor_tab, sched, pfx):
    """`ReferencePool._redistribute`: every queued request of ``model`` that has not started, and every unrouted one, is
    routed again in arrival order (by the default router, in one pass, or one by one through the dispatch policy); its
    draining replicas left without work go to standby."""
    moved = _take_unstarted(model, ri, qi, wq)
    if si[I_ULEN]:
        moved = np.sort(np.concatenate((moved, _take_unrouted(model, si, wq, qi))))
    if moved.shape[0]:
        routable = False
        for x in range(ri.shape[0]):
            if ri[x, R_STATE] == ACTIVE and ri[x, R_MODEL] == model:
                routable = True
                break
        if routable and not sched[S_DISPATCH]:
            _route_in_order(t, model, moved, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv)
        else:
            for r in moved:
                _route(t, r, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv, sched, gi, gf, gh, floor_tab)
    _standby_idle(t, model, ri, rf, gi, gf, gh, floor_tab, si, ht, hk, hs, hi, hv, pfx)


@njit(cache=True)
def _compiled_plan(t, rep, ints, flts, lp, ri, rf, gi, gf, si, ht, hk, hs, hi, hv, plan, on_run):
    """`KernelPolicies._plan` without the host: the compiled local policy ``lp`` (`commitenv.sim.local_compiled`: the
    output row, the clock levels, its four arrays, its function) plans replica ``rep``'s step from its tasks; the plan
    is checked as a host plan is (each row once, a budget within the replica's, a clock among the levels), a clock in
    it requested for the GPU, and the order written for `_start`."""
    out, levels, pf, pi, sf, sti, fn = lp
    g = ri[rep, R_GPU]
    n = fn(t, rep, g, ri[rep, R_MODEL], gi[g, G_CLOCK], levels, rf[rep, R_SHARE], ri[rep, R_FREE], ri[rep, R_BS],
           ri[rep, R_BUDGET], ri[rep, R_MAXSEQ], ints, flts, pf, pi, sf, sti, out)
    if n < -1:
        raise RuntimeError("kernel: a compiled local plan without its policy (KernelState.advance(..., pool=...))")
    si[I_LOCAL_N] += 1
    si[I_PLAN_REP] = rep
    if n < 0:
        si[I_PLAN_N] = -1
        return
    m = ints.shape[0]
    if n > m:
        raise ValueError("compiled local policy: a plan longer than the replica's tasks")
    budget = out[1]
    if budget < 0 or budget > ri[rep, R_BUDGET]:
        raise ValueError("compiled local policy: a token budget outside 1 .. the replica's (0: the replica's own)")
    clk = out[0]
    if clk >= levels.shape[0] or clk < -1:
        raise ValueError("compiled local policy: a clock level outside the GPU's levels (-1: none)")
    seen = np.zeros(m, np.bool_)
    for i in range(n):
        j = out[OUT_HEADER + i]
        if j < 0 or j >= m or seen[j]:
            raise ValueError("compiled local policy: a plan row outside the replica's tasks, or listed twice")
        seen[j] = True
        plan[i] = ints[j, 0]
        on_run[i] = ints[j, 2]
    if clk >= 0:
        _set_clock(t, clk, np.array([g], np.int64), gi, gf, si, ht, hk, hs, hi, hv)
    si[I_PLAN_BUDGET] = budget
    si[I_PLAN_N] = n


@njit(cache=True)
def _flush(t, ri, rf, qi, qf, wq, run, bq, bk, coc, gi, gf, gh, floor_tab, ftab, fetab, cell, sched, sf, si, e_dyn,
           pend, ht, hk, hs, hi, hv, plan, on_run, tvi, live_slots, head_deadline, row_deadline, pred_out, vis_dl, lp,
           pfx):
    """Start the replicas that received work at ``t`` (`ReferencePool._flush`: the pending list as it stands, in the
    order they received work; those that receive work meanwhile wait for the next flush); a moving one first sends off
    what migrates (`_depart`), and one whose local policy plans its steps has the host write its plan (`host.plan`,
    called back from here with the replica's tasks, `_task_rows`)."""
    n = si[I_PEND]
    if n == 0:
        return
    for i in range(n):  # (a replica that received work meanwhile is appended after pend[n - 1]: it stays pending)
        rep = pend[i]
        ri[rep, R_PENDING] = 0
        if ri[rep, R_SEG] != SEG_NONE:
            continue
        if ri[rep, R_STATE] == MOVING and _depart(t, rep, ri, rf, qi, wq, run, coc, gi, gf, gh, floor_tab, sf, si,
                                                  e_dyn, ht, hk, hs, hi, hv, tvi, live_slots, pred_out, pfx):
            continue
        if ri[rep, R_LOCAL] and si[I_PLAN_REP] != rep and (ri[rep, R_RUN_N] > 0 or ri[rep, R_WLEN] > 0):
            ints, flts = _task_rows(rep, ri, qi, qf, wq, run, tvi, live_slots, head_deadline, row_deadline, pred_out,
                                    vis_dl)
            if ri[rep, R_LOCAL] == 2:
                _compiled_plan(t, rep, ints, flts, lp, ri, rf, gi, gf, si, ht, hk, hs, hi, hv, plan, on_run)
            else:
                with objmode():
                    _host_plan(rep, t, ints, flts)
        _start(t, rep, ri, rf, qi, wq, run, bq, bk, coc, gi, gf, gh, floor_tab, ftab, fetab, cell, sched, si, ht, hk,
               hs, hi, hv, plan, on_run, pfx)
    k = si[I_PEND] - n
    if k:
        pend[:k] = pend[n: n + k].copy()
    si[I_PEND] = k


@njit(cache=True)
def _loaded(t, rep, ri, rf, qi, qf, wq, run, bq, bk, coc, gi, gf, gh, floor_tab, ftab, fetab, cell, sched, sf, si,
            e_dyn, pend, ht, hk, hs, hi, hv, plan, on_run, tvi, live_slots, head_deadline, row_deadline, pred_out,
            vis_dl, lp, pfx):
    """`Placement._loaded`: ``rep``'s cold start is over; it serves (or stands by) once the SMs of its share are free
    beside the GPU's other instances (else it waits, loaded); active, its model's queues are routed again and the
    replicas that received work start."""
    g = ri[rep, R_GPU]
    busy = 0.0
    for j in range(gi[g, G_NHOST]):
        x = gh[g, j]
        st = ri[x, R_STATE]
        if x != rep and (st == ACTIVE or st == DRAINING or st == MOVING or st == WAKING):
            busy += rf[x, R_SHARE]
    if busy + rf[rep, R_SHARE] > 1.0 + 1e-9:
        if not ri[rep, R_LREADY]:
            ri[rep, R_LREADY] = 1
            _floor_changed(t, g, ri, rf, gi, gf, gh, floor_tab)
        return
    ri[rep, R_STATE] = ri[rep, R_AFTER]
    ri[rep, R_LREADY] = 0
    _floor_changed(t, g, ri, rf, gi, gf, gh, floor_tab)
    if ri[rep, R_STATE] == ACTIVE:
        _redistribute(t, ri[rep, R_MODEL], ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv, gi, gf, gh, floor_tab, sched, pfx)
        _flush(t, ri, rf, qi, qf, wq, run, bq, bk, coc, gi, gf, gh, floor_tab, ftab, fetab, cell, sched, sf, si, e_dyn,
               pend, ht, hk, hs, hi, hv, plan, on_run, tvi, live_slots, head_deadline, row_deadline, pred_out, vis_dl,
               lp, pfx)


@njit(cache=True)
def set_active(t, model, count, ri, rf, gi, gf, gh, floor_tab, si, ht, hk, hs, hi, hv):
    """The state changes of `Pool.set_active` for ``model``: its first ``count`` replicas (in index order) active (a
    standby one wakes after its activation latency, a draining one resumes at once), the rest draining. Returns
    whether the set changed (the host then re-routes the model's queues and starts the replicas that received work)."""
    R = ri.shape[0]
    changed = False
    i = 0  # the replica's place among the model's
    for x in range(R):
        if ri[x, R_MODEL] != model:
            continue
        st = ri[x, R_STATE]
        g = ri[x, R_GPU]
        if st == MOVING or st == LOADING:  # (a move in progress: the state it takes once loaded)
            ri[x, R_AFTER] = ACTIVE if i < count else STANDBY
        elif i < count:
            if st == DRAINING:
                ri[x, R_STATE] = ACTIVE
                _floor_changed(t, g, ri, rf, gi, gf, gh, floor_tab)
            elif st == STANDBY:
                _wake(t, x, ri, rf, gi, gf, gh, floor_tab, si, ht, hk, hs, hi, hv)
        else:
            if st == ACTIVE:
                ri[x, R_STATE] = DRAINING
                _floor_changed(t, g, ri, rf, gi, gf, gh, floor_tab)
            elif st == WAKING:
                ri[x, R_VER] += 1
                ri[x, R_STATE] = STANDBY
                _floor_changed(t, g, ri, rf, gi, gf, gh, floor_tab)
        changed |= ri[x, R_STATE] != st
        i += 1
    return changed


@njit(cache=True)
def _set_clock(t, idx, gpus, gi, gf, si, ht, hk, hs, hi, hv):
    """`Pool.set_clock` on ``gpus`` (in that order): clock level ``idx`` from ``t`` plus each GPU's clock-change
    latency (a pending change superseded, one back to the current clock cancelled)."""
    for g in gpus:
        target = gi[g, G_PENDING] if gi[g, G_PENDING] >= 0 else gi[g, G_CLOCK]
        if idx == target:
            continue
        gi[g, G_VER] += 1
        if idx == gi[g, G_CLOCK]:
            gi[g, G_PENDING] = -1
            continue
        gi[g, G_PENDING] = idx
        gf[g, GF_PENDING_T] = t + gf[g, GF_CLOCK_LAT]
        _push(si, ht, hk, hs, hi, hv, gf[g, GF_PENDING_T], EV_CLOCK, g, gi[g, G_VER])


@njit(cache=True)
def _set_share(t, rep, share, coef, ri, rf, coc, si, ht, hk, hs, hi, hv):
    """`Pool.set_share`: replica ``rep`` steps under the coefficients ``coef`` (its profile at ``share``) from its
    next step on; a decode run in flight is cut at its next step end."""
    rf[rep, R_SHARE] = share
    coc[rep] = coef
    if ri[rep, R_SEG] == SEG_RUN and _cut(rf, ri, rep, t):
        ri[rep, R_VER] += 1
        _push(si, ht, hk, hs, hi, hv, rf[rep, R_T1], EV_SEG, rep, ri[rep, R_VER])




@njit(cache=True)
def move(t, rep, dest, mode, ri, rf, qi, qf, wq, run, bq, bk, coc, gi, gf, gh, floor_tab, ftab, fetab, cell, sched, sf,
         si, e_dyn, pend, ht, hk, hs, hi, hv, plan, on_run, tvi, live_slots, head_deadline, row_deadline, pred_out,
         vis_dl, lp, pfx):
    """`Placement._move` of replica ``rep`` to GPU ``dest`` with migration mode ``mode`` (checked by the host):
    a moving one called back serves on where it is, one loading goes on to its new GPU, any other stops taking requests
    (its queued ones are routed anew), sends off what migrates and leaves once idle. Returns whether it counts as a
    move (the GPU it is on or going to changes)."""
    st = ri[rep, R_STATE]
    if dest == (ri[rep, R_DEST] if st == MOVING else ri[rep, R_GPU]):
        return False
    if st == MOVING:
        if dest == ri[rep, R_GPU]:  # called back before it left: it stays and serves as before
            ri[rep, R_STATE] = ACTIVE if ri[rep, R_AFTER] == ACTIVE else DRAINING
            ri[rep, R_DEST] = -1
            si[I_NMIG] -= 1
            _floor_changed(t, ri[rep, R_GPU], ri, rf, gi, gf, gh, floor_tab)
            _redistribute(t, ri[rep, R_MODEL], ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv, gi, gf, gh, floor_tab,
                          sched, pfx)
            _flush(t, ri, rf, qi, qf, wq, run, bq, bk, coc, gi, gf, gh, floor_tab, ftab, fetab, cell, sched, sf, si,
                   e_dyn, pend, ht, hk, hs, hi, hv, plan, on_run, tvi, live_slots, head_deadline, row_deadline,
                   pred_out, vis_dl, lp, pfx)
        else:
            ri[rep, R_DEST] = dest
            ri[rep, R_MIGRATE] = mode
        return True
    if st == LOADING:  # the load so far is lost
        ri[rep, R_DEST] = dest
        _detach(t, rep, ri, rf, gi, gf, gh, floor_tab, si, ht, hk, hs, hi, hv, pfx)
        return True
    if st == WAKING:
        ri[rep, R_VER] += 1  # (cancels the wake)
    ri[rep, R_AFTER] = ACTIVE if st == ACTIVE or st == WAKING else STANDBY
    ri[rep, R_STATE] = MOVING
    ri[rep, R_DEST] = dest
    ri[rep, R_MIGRATE] = mode
    si[I_NMIG] += 1
    _floor_changed(t, ri[rep, R_GPU], ri, rf, gi, gf, gh, floor_tab)
    if ri[rep, R_SEG] == SEG_NONE:
        if mode != MIG_NONE:
            _migrate_out(t, rep, ri, rf, qi, wq, run, coc, gi, sf, si, e_dyn, ht, hk, hs, hi, hv, tvi, live_slots,
                         pred_out, pfx)
    elif mode != MIG_NONE and ri[rep, R_SEG] == SEG_RUN and _cut(rf, ri, rep, t):  # (leaves at the next step end)
        ri[rep, R_VER] += 1
        _push(si, ht, hk, hs, hi, hv, rf[rep, R_T1], EV_SEG, rep, ri[rep, R_VER])
    _redistribute(t, ri[rep, R_MODEL], ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv, gi, gf, gh, floor_tab, sched, pfx)
    _flush(t, ri, rf, qi, qf, wq, run, bq, bk, coc, gi, gf, gh, floor_tab, ftab, fetab, cell, sched, sf, si, e_dyn,
           pend, ht, hk, hs, hi, hv, plan, on_run, tvi, live_slots, head_deadline, row_deadline, pred_out, vis_dl, lp,
           pfx)
    return True
