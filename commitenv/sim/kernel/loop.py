"""The event loop (`advance`), `settle`, the energy meters, the segments in flight and the compaction of finished
requests."""

from __future__ import annotations

import numpy as np
from numba import njit

from commitenv.sim.kernel.actuate import _depart, _flush, _loaded, _redistribute, _route, _start
from commitenv.sim.kernel.heap import _live, _pop, _push, _upush_back, _wpush_back
from commitenv.sim.kernel.layout import (ASK_HEAP, ASK_LOG, ASK_NOISE, DONE, F_LAST, F_NOW, GF_E_FLOOR, GF_FLOOR_W,
                                         GF_T_FLOOR, G_CLOCK, G_NHOST, G_PENDING, G_VER, INF, I_CAPARR, I_CAPLEFT,
                                         I_CURSOR, I_DONE, I_EVENTS, I_HEAP, I_LIVE, I_LOG, I_LOGM, I_N, I_NMIG, I_PEND,
                                         I_UHEAD, I_ULEN, Q_ARRIVAL, Q_FINISH, R_BATCH_N, R_BS, R_BT0, R_D, R_E0,
                                         R_ENERGY, R_F, R_FE, R_FLOOR_ACC, R_FLOOR_T, R_FLOOR_W, R_FT, R_GPU, R_K,
                                         R_LOCAL, R_LOGGED, R_MODEL, R_NEND, R_NPOS, R_PENDING, R_RUN_N, R_SEG, R_STATE,
                                         R_T0, R_T1, R_VER, R_WHEAD, R_WLEN, S_LOG, S_MAX_SEQS, S_NOISE)
from commitenv.sim.kernel.lifecycle import _floor_changed, _floor_power, _set_floor
from commitenv.sim.kernel.segment import (_cut, _decode, _finish_segment, _log_segment, _run_energy, _run_steps_done_by,
                                          _run_time)
from commitenv.sim.states import (ACTIVE, EV_CLOCK, EV_LAND, EV_LOAD, EV_SEG, EV_WAKE, LOADING, MOVING, SEG_NONE, SEG_RUN,
                                  SEG_STEP, WAKING)


@njit(cache=True)
def _noise_low(ri):
    for x in range(ri.shape[0]):
        if ri[x, R_NPOS] >= ri[x, R_NEND]:
            return True
    return False


@njit(cache=True)
def advance(t_end, stop_captured, a):
    """Run every arrival and segment end at or before ``t_end`` (`Pool.run_until`) on the state ``a`` (`LoopArrays`);
    with ``stop_captured``, stop at the segment end that finishes the last captured request. Returns `DONE`, or a
    question for the host (`ASK_HEAP`, `ASK_NOISE`, `ASK_LOG`, see `layout`), asked before anything it depends on is
    done: the host answers and calls again, and the loop continues exactly there."""
    (si, sf, ri, rf, qi, qf, qc, rejected, wq, run, bq, bk, pend, ht, hk, hs, hi, hv, coc, gi, gf, gh, floor_tab, ftab,
     fetab, cell, sched, e_dyn, done_out, lgi, lgf, lgm, plan, on_run, tvi, live_slots, head_deadline, row_deadline,
     pred_out, vis_dl, lp, pfx) = a
    n = si[I_N]
    # the most entries one event pushes: a wake re-routes to every replica, then starts; an instance's load ends,
    # others leave and load; migrating requests, one landing each
    room = 4 * ri.shape[0] + 8
    last = sf[F_NOW]
    while True:
        if si[I_HEAP] + room + (si[I_LIVE] if si[I_NMIG] else 0) > ht.shape[0]:
            sf[F_NOW] = max(sf[F_NOW], last)
            return ASK_HEAP  # the caller grows the heap and calls again (nothing of the next event is done yet)
        if sched[S_NOISE] and _noise_low(ri):
            sf[F_NOW] = max(sf[F_NOW], last)
            return ASK_NOISE  # the caller refills the noise draws and calls again (one event starts one segment per replica)
        if sched[S_LOG] and (si[I_LOG] >= lgi.shape[0] or si[I_LOGM] + sched[S_MAX_SEQS] + 1 > lgm.shape[0]):
            sf[F_NOW] = max(sf[F_NOW], last)
            return ASK_LOG  # the caller drains the step log and calls again (one event books at most one segment)
        cur = si[I_CURSOR]
        ta = qf[cur, Q_ARRIVAL] if cur < n else INF
        th = ht[0] if si[I_HEAP] > 0 else INF
        if si[I_PEND] > 0 and (th if th < ta else ta) > last:
            _flush(last, ri, rf, qi, qf, wq, run, bq, bk, coc, gi, gf, gh, floor_tab, ftab, fetab, cell, sched, sf, si,
                   e_dyn, pend, ht, hk, hs, hi, hv, plan, on_run, tvi, live_slots, head_deadline, row_deadline,
                   pred_out, vis_dl, lp, pfx)
            continue
        if th == INF and ta == INF:
            break
        if th <= ta:
            if th > t_end:
                break
            j = _pop(si, ht, hk, hs, hi, hv)
            t, kind, rep, ver = ht[j], hk[j], hi[j], hv[j]
            last = t
            sf[F_LAST] = t
            si[I_EVENTS] += 1
            if kind == EV_CLOCK:  # `ReferencePool._apply_clock`: a step in flight keeps its law, a run is cut
                g = rep
                if gi[g, G_VER] != ver:
                    continue
                for j in range(gi[g, G_NHOST]):
                    x = gh[g, j]
                    if ri[x, R_SEG] == SEG_RUN and _cut(rf, ri, x, t):
                        ri[x, R_VER] += 1
                        _push(si, ht, hk, hs, hi, hv, rf[x, R_T1], EV_SEG, x, ri[x, R_VER])
                gi[g, G_CLOCK] = gi[g, G_PENDING]
                gi[g, G_PENDING] = -1
                _set_floor(t, g, _floor_power(g, ri, rf, gi, gf, gh, floor_tab), ri, rf, gi, gf, gh)
                continue
            if kind == EV_LOAD:
                if ri[rep, R_VER] != ver or ri[rep, R_STATE] != LOADING:
                    continue
                _loaded(t, rep, ri, rf, qi, qf, wq, run, bq, bk, coc, gi, gf, gh, floor_tab, ftab, fetab, cell, sched,
                        sf, si, e_dyn, pend, ht, hk, hs, hi, hv, plan, on_run, tvi, live_slots, head_deadline,
                        row_deadline, pred_out, vis_dl, lp, pfx)
                continue
            if kind == EV_LAND:  # (``rep``: the request)
                _route(t, rep, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv, sched, gi, gf, gh, floor_tab)
                continue
            if kind == EV_WAKE:
                if ri[rep, R_VER] != ver or ri[rep, R_STATE] != WAKING:
                    continue
                ri[rep, R_STATE] = ACTIVE
                _floor_changed(t, ri[rep, R_GPU], ri, rf, gi, gf, gh, floor_tab)
                _redistribute(t, ri[rep, R_MODEL], ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv, gi, gf, gh, floor_tab,
                              sched, pfx)
                continue
            if ri[rep, R_VER] != ver:
                continue
            _finish_segment(t, rep, ri, rf, qi, qf, qc, run, bq, bk, e_dyn, sched, done_out, si, lgi, lgf, lgm, pfx)
            if stop_captured and si[I_CAPLEFT] == 0:
                sf[F_NOW] = t
                return DONE
            cur = si[I_CURSOR]
            if ((cur < n and qf[cur, Q_ARRIVAL] == t) or (si[I_HEAP] > 0 and ht[0] == t) or si[I_PEND] > 0
                    or ri[rep, R_LOCAL]):  # (a local policy plans the start: through the pending list, at t)
                if ri[rep, R_PENDING] == 0:
                    ri[rep, R_PENDING] = 1
                    pend[si[I_PEND]] = rep
                    si[I_PEND] += 1
            elif not (ri[rep, R_STATE] == MOVING and _depart(t, rep, ri, rf, qi, wq, run, coc, gi, gf, gh, floor_tab,
                                                              sf, si, e_dyn, ht, hk, hs, hi, hv, tvi, live_slots,
                                                              pred_out, pfx)):
                _start(t, rep, ri, rf, qi, wq, run, bq, bk, coc, gi, gf, gh, floor_tab, ftab, fetab, cell, sched, si,
                       ht, hk, hs, hi, hv, plan, on_run, pfx)
        else:
            if ta > t_end:
                break
            i = cur
            si[I_CURSOR] = cur + 1
            si[I_EVENTS] += 1
            last = ta
            sf[F_LAST] = ta
            if rejected[i]:
                qf[i, Q_FINISH] = INF
                continue
            if si[I_CAPARR]:
                qc[i] = 1
                si[I_CAPLEFT] += 1
            si[I_LIVE] += 1
            _route(ta, i, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv, sched, gi, gf, gh, floor_tab)
    sf[F_NOW] = max(sf[F_NOW], t_end if t_end < INF else last)
    return DONE


@njit(cache=True)
def settle(t, ri, rf, qi, qf, bk, bq, e_dyn, sched, si, ht, hk, hs, hi, hv, lgi, lgf, lgm, pfx):
    """`Pool.settle`: cut every decode run at the first step end >= ``t`` and apply (and meter, and log) the steps
    that ended before, leaving one step in flight (replica ``g`` here, its GPU's meter ``e_dyn[ri[g, R_GPU]]``)."""
    for g in range(ri.shape[0]):
        if ri[g, R_SEG] != SEG_RUN:
            continue
        if _cut(rf, ri, g, t):
            ri[g, R_VER] += 1
            _push(si, ht, hk, hs, hi, hv, rf[g, R_T1], EV_SEG, g, ri[g, R_VER])
        m = _run_steps_done_by(rf, ri, t, g)
        if m >= ri[g, R_K]:
            m = ri[g, R_K] - 1
        if m <= 0:
            continue
        dt = _run_time(rf, g, m)
        de = _run_energy(rf, g, m)
        t_mid = rf[g, R_T0] + dt
        floor_j = rf[g, R_FLOOR_ACC] + rf[g, R_FLOOR_W] * (t_mid - rf[g, R_FLOOR_T])
        if sched[S_LOG] and ri[g, R_LOGGED]:
            _log_segment(g, rf[g, R_T0], t_mid, m, de, floor_j, ri, rf, qi, bq, bk, si, lgi, lgf, lgm)
        _decode(ri, rf, qi, qf, bq, g, m, ri[g, R_BS], pfx)
        rf[g, R_BT0] += rf[g, R_D] * m
        rf[g, R_E0] += rf[g, R_F] * m
        ri[g, R_K] -= m
        rf[g, R_T0] = t_mid
        rf[g, R_FLOOR_ACC] = 0.0
        rf[g, R_FLOOR_T] = t_mid
        rf[g, R_ENERGY] -= de
        e_dyn[ri[g, R_GPU]] += de - floor_j


@njit(cache=True)
def _energy_until(t, ri, rf, g):
    """`Replica.energy_until`: energy of replica ``g``'s segment in flight from its start to ``t`` (``t`` > t0)."""
    t0, t1 = rf[g, R_T0], rf[g, R_T1]
    if t >= t1:
        return rf[g, R_ENERGY]
    if ri[g, R_SEG] == SEG_STEP:
        return rf[g, R_ENERGY] * (t - t0) / (t1 - t0)
    m = _run_steps_done_by(rf, ri, t, g)
    ts = t0 + _run_time(rf, g, m)
    step_t = rf[g, R_FT] * (rf[g, R_BT0] + rf[g, R_D] * m)
    step_e = rf[g, R_FE] * (rf[g, R_E0] + rf[g, R_F] * m)
    return _run_energy(rf, g, m) + step_e * (t - ts) / step_t


@njit(cache=True)
def _floor_until(rf, g, end):
    """`Replica.floor_part`: the GPU floor energy replica ``g``'s segment is charged over [t0, ``end``]."""
    return rf[g, R_FLOOR_ACC] + rf[g, R_FLOOR_W] * (end - rf[g, R_FLOOR_T])


@njit(cache=True)
def meter(t, ri, rf, gi, gf, gh, e_dyn):
    """Energy (J) of every GPU from the start to ``t`` (`GPU.meter`: its floor, its booked energy above the floor and
    its instances' segments in flight, in the GPU's order)."""
    G = gi.shape[0]
    out = np.empty(G)
    for g in range(G):
        e = gf[g, GF_E_FLOOR] + gf[g, GF_FLOOR_W] * (t - gf[g, GF_T_FLOOR]) + e_dyn[g]
        for j in range(gi[g, G_NHOST]):
            x = gh[g, j]
            if ri[x, R_SEG] != SEG_NONE:
                end = rf[x, R_T1] if rf[x, R_T1] < t else t
                if end > rf[x, R_T0]:
                    e += _energy_until(t, ri, rf, x) - _floor_until(rf, x, end)
        out[g] = e
    return out


@njit(cache=True)
def in_flight(t, ri, rf):
    """Per replica whose logged segment in flight started before ``t``: (replica, energy until ``t``, floor until
    min(``t``, t1)) as rows of a float array."""
    R = ri.shape[0]
    out = np.empty((R, 3))
    n = 0
    for g in range(R):
        if ri[g, R_SEG] != SEG_NONE and ri[g, R_LOGGED] and rf[g, R_T0] < t:
            out[n, 0] = g
            out[n, 1] = _energy_until(t, ri, rf, g)
            out[n, 2] = _floor_until(rf, g, min(t, rf[g, R_T1]))
            n += 1
    return out[:n]


@njit(cache=True)
def _compact_core(ri, wq, run, bq, qi, qf, qc, rejected, si, hk, hs, hi, head_deadline, head_slots, row_deadline,
                  row0, L, slot_base):
    """`KernelState._compact`'s work: new request arrays holding the live requests (in index order) then the rows
    loaded but not arrived; queues, batches and running lists re-indexed in place. Returns the new arrays and the
    new head's deadlines and slots."""
    cur, N = si[I_CURSOR], si[I_N]
    live = np.sort(_live(ri, wq, run, si, hk, hs, hi))
    nl = live.shape[0]
    n_keep = nl + N - cur
    cap = max(64, n_keep + n_keep // 2)
    qi2 = np.zeros((cap, qi.shape[1]), np.int64)
    qf2 = np.zeros((cap, qf.shape[1]))
    qc2 = np.zeros(cap, np.uint8)
    rej2 = np.zeros(cap, np.bool_)
    wq2 = np.full(cap, -1, np.int64)
    dl2 = np.empty(nl)
    sl2 = np.empty(nl, np.int64)
    for j in range(n_keep):
        k = live[j] if j < nl else cur + j - nl
        qi2[j] = qi[k]
        qf2[j] = qf[k]
        qc2[j] = qc[k]
        rej2[j] = rejected[k]
        if j < nl:
            if k < L:
                dl2[j], sl2[j] = head_deadline[k], head_slots[k]
            else:
                dl2[j], sl2[j] = row_deadline[row0 + k - L], slot_base + row0 + k - L
    for x in range(ri.shape[0]):
        for i in range(ri[x, R_RUN_N]):
            run[x, i] = np.searchsorted(live, run[x, i])  # (live ones are arrived: below the cursor)
        for i in range(ri[x, R_BATCH_N]):
            bq[x, i] = np.searchsorted(live, bq[x, i])
        n = ri[x, R_WLEN]
        r = ri[x, R_WHEAD]
        ri[x, R_WLEN] = 0
        for _ in range(n):
            nxt = wq[r]
            _wpush_back(ri, wq2, x, np.searchsorted(live, r))
            r = nxt
    n = si[I_ULEN]
    r = si[I_UHEAD]
    si[I_ULEN] = 0
    for _ in range(n):
        nxt = wq[r]
        _upush_back(si, wq2, np.searchsorted(live, r))
        r = nxt
    for j in range(si[I_HEAP]):
        if hk[j] == EV_LAND:
            hi[j] = np.searchsorted(live, hi[j])
    si[I_CURSOR] = nl
    si[I_N] = n_keep
    si[I_DONE] = 0
    return qi2, qf2, qc2, rej2, wq2, dl2, sl2
