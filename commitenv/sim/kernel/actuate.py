"""Routing, redistribution and actuation: the router (least unfinished among the model's active replicas), starting
replicas that received work, `set_active`, clock changes, SM shares, the idle-floor meter of GPUs hosting one or
several replicas (``gh[g, :gi[g, G_NHOST]]``, in the GPU's order)."""

from __future__ import annotations

import numpy as np
from numba import njit, objmode

from commitenv.sim.kernel.heap import _push, _task_rows, _upush_back, _wpush_back
from commitenv.sim.kernel.host import dispatch as _host_dispatch
from commitenv.sim.kernel.host import plan as _host_plan
from commitenv.sim.kernel.layout import (GF_CLOCK_LAT, GF_E_FLOOR, GF_FLOOR_W, GF_PENDING_T, GF_T_FLOOR, G_CLOCK,
                                         G_NHOST, G_PENDING, G_VER, I_PEND, I_PLAN_REP, I_UHEAD, I_ULEN, Q_MODEL, Q_REPLICA,
                                         Q_STARTED, R_FLOOR_ACC, R_FLOOR_T, R_FLOOR_W, R_GPU, R_LOCAL, R_MODEL,
                                         R_PENDING, R_RUN_N, R_SEG, R_SHARE, R_STATE, R_T0, R_T1, R_UNF, R_VER, R_WHEAD,
                                         R_WLEN, S_DISPATCH)
from commitenv.sim.kernel.segment import _cut, _start_segment
from commitenv.sim.states import ACTIVE, DRAINING, EV_CLOCK, EV_SEG, EV_WAKE, SEG_NONE, SEG_RUN, STANDBY, WAKING


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
def _floor_power(g, ri, gi, gh, floor_tab):
    """`GPU.floor_power`: the most awake of its instances' lifecycle states sets it (active or waking, then draining,
    else standby), at the GPU's clock."""
    col = 2
    for j in range(gi[g, G_NHOST]):
        st = ri[gh[g, j], R_STATE]
        c = 0 if st == ACTIVE or st == WAKING else (1 if st == DRAINING else 2)
        if c < col:
            col = c
    return floor_tab[g, gi[g, G_CLOCK], col]


@njit(cache=True)
def _floor_changed(t, g, ri, rf, gi, gf, gh, floor_tab):
    """`Pool._floor_changed`: re-evaluate GPU ``g``'s floor power at ``t`` after a lifecycle change."""
    p = _floor_power(g, ri, gi, gh, floor_tab)
    if p != gf[g, GF_FLOOR_W]:
        _set_floor(t, g, p, ri, rf, gi, gf, gh)


@njit(cache=True)
def _start(t, rep, ri, rf, qi, wq, run, bq, bk, coc, gi, gf, gh, floor_tab, ftab, fetab, cell, sched, si, ht, hk,
           hs, hi, hv, plan, on_run):
    """`Pool._start`: start ``rep``'s next segment at ``t`` (its local plan, if it has a policy, already written by
    the host), or send a draining replica left without work to standby."""
    if ri[rep, R_STATE] == ACTIVE and ri[rep, R_RUN_N] == 0 and ri[rep, R_WLEN] == 0:
        return
    if _start_segment(t, rep, ri, rf, qi, wq, run, bq, bk, coc, gi, gf, ftab, fetab, cell, sched, si, plan, on_run):
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
def _route(t, r, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv, sched):
    """`Pool._route`: to the least unfinished among the active replicas of the request's model (ties to the lowest
    index), or where the dispatch policy chooses (called back on the host, `host.dispatch`); with no active replica
    of its model the request waits, unrouted."""
    R = ri.shape[0]
    m = qi[r, Q_MODEL]
    best = -1
    for x in range(R):
        if ri[x, R_STATE] == ACTIVE and ri[x, R_MODEL] == m and (best < 0 or ri[x, R_UNF] < ri[best, R_UNF]):
            best = x
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
    """The first half of `Pool._redistribute`: every queued request of ``model`` that has not started leaves its
    queue; returned in index (arrival) order, the order they are routed again."""
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
def _standby_idle(t, model, ri, rf, gi, gf, gh, floor_tab):
    """The last part of `Pool._redistribute`: ``model``'s draining replicas left without work go to standby."""
    for x in range(ri.shape[0]):
        if (ri[x, R_MODEL] == model and ri[x, R_SEG] == SEG_NONE and ri[x, R_RUN_N] == 0 and ri[x, R_WLEN] == 0
                and ri[x, R_STATE] == DRAINING):
            ri[x, R_STATE] = STANDBY
            _floor_changed(t, ri[x, R_GPU], ri, rf, gi, gf, gh, floor_tab)


@njit(cache=True)
def _redistribute(t, model, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv, gi, gf, gh, floor_tab, sched):
    """`Pool._redistribute`: every queued request of ``model`` that has not started, and every unrouted one, is routed
    again in arrival order (by the default router, in one pass, or one by one through the dispatch policy); its
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
                _route(t, r, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv, sched)
    _standby_idle(t, model, ri, rf, gi, gf, gh, floor_tab)


@njit(cache=True)
def _flush(t, ri, rf, qi, qf, wq, run, bq, bk, coc, gi, gf, gh, floor_tab, ftab, fetab, cell, sched, si, pend, ht,
           hk, hs, hi, hv, plan, on_run, tvi, live_slots, head_deadline, row_deadline, pred_out, vis_dl):
    """Start the replicas that received work at ``t`` (`Pool._flush`: the pending list as it stands, in the order
    they received work; those that receive work meanwhile wait for the next flush); a replica whose local policy plans
    its steps has the host write its plan first (`host.plan`, called back from here with the replica's tasks,
    `_task_rows`)."""
    n = si[I_PEND]
    if n == 0:
        return
    todo = pend[:n].copy()
    si[I_PEND] = 0
    for rep in todo:
        ri[rep, R_PENDING] = 0
        if ri[rep, R_SEG] != SEG_NONE:
            continue
        if ri[rep, R_LOCAL] and si[I_PLAN_REP] != rep and (ri[rep, R_RUN_N] > 0 or ri[rep, R_WLEN] > 0):
            ints, flts = _task_rows(rep, ri, qi, qf, wq, run, tvi, live_slots, head_deadline, row_deadline, pred_out,
                                    vis_dl)
            with objmode():
                _host_plan(rep, t, ints, flts)
        _start(t, rep, ri, rf, qi, wq, run, bq, bk, coc, gi, gf, gh, floor_tab, ftab, fetab, cell, sched, si, ht, hk,
               hs, hi, hv, plan, on_run)


@njit(cache=True)
def set_active(t, model, count, latency_s, ri, rf, gi, gf, gh, floor_tab, si, ht, hk, hs, hi, hv):
    """The state changes of `Pool.set_active` for ``model``: its first ``count`` replicas (in index order) active (a
    standby one wakes after ``latency_s``, a draining one resumes at once), the rest draining. Returns whether the
    set changed (the host then re-routes the model's queues and starts the replicas that received work)."""
    R = ri.shape[0]
    changed = False
    i = 0  # the replica's place among the model's
    for x in range(R):
        if ri[x, R_MODEL] != model:
            continue
        st = ri[x, R_STATE]
        g = ri[x, R_GPU]
        if i < count:
            if st == DRAINING:
                ri[x, R_STATE] = ACTIVE
                _floor_changed(t, g, ri, rf, gi, gf, gh, floor_tab)
            elif st == STANDBY:
                ri[x, R_STATE] = WAKING
                ri[x, R_VER] += 1
                _floor_changed(t, g, ri, rf, gi, gf, gh, floor_tab)
                _push(si, ht, hk, hs, hi, hv, t + latency_s, EV_WAKE, x, ri[x, R_VER])
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
def _set_floor(t, g, power_w, ri, rf, gi, gf, gh):
    """`GPU.set_floor`: close GPU ``g``'s floor meter at ``t``; its instances' segments in flight are charged the new
    floor from ``t`` on."""
    gf[g, GF_E_FLOOR] += gf[g, GF_FLOOR_W] * (t - gf[g, GF_T_FLOOR])
    gf[g, GF_T_FLOOR] = t
    if power_w != gf[g, GF_FLOOR_W]:
        for j in range(gi[g, G_NHOST]):
            x = gh[g, j]
            if ri[x, R_SEG] != SEG_NONE and rf[x, R_T0] <= t < rf[x, R_T1]:
                rf[x, R_FLOOR_ACC] += rf[x, R_FLOOR_W] * (t - rf[x, R_FLOOR_T])
                rf[x, R_FLOOR_T] = t
                rf[x, R_FLOOR_W] = power_w
    gf[g, GF_FLOOR_W] = power_w
