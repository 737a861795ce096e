"""The engine's event loop compiled: a pool serving one model with the vLLM scheduler, on arrays.

Requests, replica queues, the segment in flight, the event heap, the truth factors (or legacy noise draws), the GPU
meters and the step log live in numpy arrays; `KernelState.advance` runs every arrival and segment end up to a time
in one numba call, and `set_active`, `set_clock` and `settle` act as the pool's. It follows
`commitenv.sim.pool.Pool` and `commitenv.sim.replica.Replica` line for line for the pools it covers
(`KernelState.covers`); `Pool` runs here while it can and `export_to` hands the state back to the Python loop for
everything else (tests/test_engine_kernel.py holds both to bit-identical results).
"""

from __future__ import annotations

import copy
import math
import os
import weakref
from dataclasses import dataclass

import numpy as np
from numba import njit

from commitenv.sim.coeffs import coeffs_for
from commitenv.sim.noise import NoiseSource
from commitenv.sim.records import InFlightPart, SegmentLog, StepLogBatch
from commitenv.sim.states import ACTIVE, DRAINING, EV_CLOCK, EV_SEG, EV_WAKE, SEG_NONE, SEG_RUN, SEG_STEP, STANDBY, WAKING

INF = math.inf
# pools run here whenever covered; COMMITENV_KERNEL=0 (or ENABLED = False) keeps every pool on the Python loop
ENABLED = os.environ.get("COMMITENV_KERNEL", "1") != "0"

# int64 scalars of the state (``si``)
I_CURSOR, I_SEQ, I_HEAP, I_PEND, I_LIVE, I_DONE, I_EVENTS, I_N, I_CAPLEFT, I_CAPARR, I_LOG, I_LOGM = range(12)
# I_N: requests that arrive at all; I_CAPLEFT: captured requests not finished; I_CAPARR: arrivals are captured;
# I_LOG, I_LOGM: step log entries and their members written since the last `KernelState._drain_log`
# float64 scalars (``sf``)
F_NOW, F_LAST = 0, 1  # the engine clock; the time of the last event processed (heap or arrival)
# per-replica float64 columns (``rf``)
R_T0, R_T1, R_BT0, R_D, R_E0, R_F, R_FT, R_FE, R_ENERGY, R_FLOOR_W, R_FLOOR_T, R_FLOOR_ACC = range(12)
# per-replica int64 columns (``ri``)
(R_UNF, R_FREE, R_SEG, R_K, R_VER, R_PENDING, R_RUN_N, R_BATCH_N, R_WHEAD, R_WLEN, R_STATE, R_WTAIL, R_NPOS, R_NEND,
 R_SCLK, R_LOGGED) = range(16)
# R_NPOS, R_NEND: under the legacy per-segment noise, the replica's next draw and the end of its draws in the tables;
# R_SCLK: the clock level its segment started at (the step log's clock); R_LOGGED: the segment was started while the
# step log was written (`Replica.seg_log` set), so its booking is logged
# per-request int64 columns (``qi``)
Q_PROMPT, Q_OUT, Q_COMPUTED, Q_GENERATED, Q_BLOCKS, Q_STARTED, Q_PREEMPT, Q_REPLICA = range(8)
# per-request float64 columns (``qf``)
Q_ARRIVAL, Q_FIRST, Q_FINISH, Q_OVERHEAD = range(4)
# per-GPU int64 columns (``gi``) and float64 columns (``gf``)
G_CLOCK, G_PENDING, G_VER = range(3)
GF_PENDING_T, GF_FLOOR_W, GF_T_FLOOR, GF_E_FLOOR = range(4)
# scheduler limits, the truth table's first cell, whether the tables hold legacy noise draws, whether the step log
# is written and whether decode runs advance in closed form (``sched``: int64)
S_BUDGET, S_MAX_SEQS, S_BLOCK, S_RESERVE, S_CELL0, S_NOISE, S_LOG, S_CLOSED = range(8)
# the step log: per entry int64 (``lgi``) and float64 (``lgf``) columns, per member int64 columns (``lgm``)
LG_REP, LG_STEPS, LG_CLOCK, LG_N = range(4)
LF_T0, LF_T1, LF_ENERGY, LF_FLOOR = range(4)
LM_REQ, LM_NEW, LM_COMPUTED, LM_DECODE = range(4)
# coefficients per clock level (``coc``): tau0..tau4, a, c1, c2, b, kappa
C_TAU0, C_TAU1, C_TAU2, C_TAU3, C_TAU4, C_A, C_C1, C_C2, C_B, C_KAPPA = range(10)
# the state arrays a `KernelState` writes (a copy duplicates them; tables, rows and the step log are handled apart):
# per request (indexed like ``qi``; a compaction makes them anew) and the rest (scalars, replicas, GPUs, event heap)
REQUEST_ARRAYS = ("qi", "qf", "qc", "rejected", "wq", "done_out")
ENGINE_ARRAYS = ("ri", "rf", "gi", "gf", "si", "sf", "run", "bq", "bk", "pend", "ht", "hk", "hs", "hi", "hv", "e_dyn")


@njit(cache=True)
def _less(ht, hk, hs, a, b):
    if ht[a] != ht[b]:
        return ht[a] < ht[b]
    if hk[a] != hk[b]:
        return hk[a] < hk[b]
    return hs[a] < hs[b]


@njit(cache=True)
def _swap(ht, hk, hs, hi, hv, a, b):
    ht[a], ht[b] = ht[b], ht[a]
    hk[a], hk[b] = hk[b], hk[a]
    hs[a], hs[b] = hs[b], hs[a]
    hi[a], hi[b] = hi[b], hi[a]
    hv[a], hv[b] = hv[b], hv[a]


@njit(cache=True)
def _push(si, ht, hk, hs, hi, hv, t, kind, idx, ver):
    si[I_SEQ] += 1
    j = si[I_HEAP]
    if j >= ht.shape[0]:
        raise RuntimeError("kernel: event heap full")
    si[I_HEAP] = j + 1
    ht[j], hk[j], hs[j], hi[j], hv[j] = t, kind, si[I_SEQ], idx, ver
    while j > 0:
        p = (j - 1) >> 1
        if _less(ht, hk, hs, j, p):
            _swap(ht, hk, hs, hi, hv, j, p)
            j = p
        else:
            break


@njit(cache=True)
def _pop(si, ht, hk, hs, hi, hv):
    n = si[I_HEAP] - 1
    si[I_HEAP] = n
    _swap(ht, hk, hs, hi, hv, 0, n)
    j = 0
    while True:
        c = 2 * j + 1
        if c >= n:
            break
        if c + 1 < n and _less(ht, hk, hs, c + 1, c):
            c += 1
        if _less(ht, hk, hs, c, j):
            _swap(ht, hk, hs, hi, hv, c, j)
            j = c
        else:
            break
    return n  # the popped entry sits at index n


@njit(cache=True)
def _cdiv(a, b):
    return -((-a) // b)


@njit(cache=True)
def _wpush_front(ri, wq, rep, r):
    """Waiting queues are linked lists through ``wq`` (next request, per request): vLLM's appendleft."""
    wq[r] = ri[rep, R_WHEAD] if ri[rep, R_WLEN] else -1
    ri[rep, R_WHEAD] = r
    if ri[rep, R_WLEN] == 0:
        ri[rep, R_WTAIL] = r
    ri[rep, R_WLEN] += 1


@njit(cache=True)
def _wpush_back(ri, wq, rep, r):
    wq[r] = -1
    if ri[rep, R_WLEN] == 0:
        ri[rep, R_WHEAD] = r
    else:
        wq[ri[rep, R_WTAIL]] = r
    ri[rep, R_WTAIL] = r
    ri[rep, R_WLEN] += 1


@njit(cache=True)
def _wpop_front(ri, wq, rep):
    r = ri[rep, R_WHEAD]
    ri[rep, R_WHEAD] = wq[r]
    ri[rep, R_WLEN] -= 1
    return r


@njit(cache=True)
def _waiting(ri, wq, x):
    out = np.empty(ri[x, R_WLEN], np.int64)
    r = ri[x, R_WHEAD]
    for j in range(out.shape[0]):
        out[j] = r
        r = wq[r]
    return out


@njit(cache=True)
def _live(ri, wq, run):
    """Every live request: each replica's running, then its waiting queue."""
    n = 0
    for x in range(ri.shape[0]):
        n += ri[x, R_RUN_N] + ri[x, R_WLEN]
    out = np.empty(n, np.int64)
    j = 0
    for x in range(ri.shape[0]):
        for i in range(ri[x, R_RUN_N]):
            out[j] = run[x, i]
            j += 1
        r = ri[x, R_WHEAD]
        for _ in range(ri[x, R_WLEN]):
            out[j] = r
            j += 1
            r = wq[r]
    return out


@njit(cache=True)
def _left(idx, qi):
    """Tokens left to compute before each request's next output token (`commitenv.sim.request.live_state`)."""
    out = np.empty(idx.shape[0], np.int64)
    for j in range(idx.shape[0]):
        r = idx[j]
        g = qi[r, Q_GENERATED]
        out[j] = qi[r, Q_PROMPT] + g - qi[r, Q_COMPUTED] - (1 if g > 0 else 0)
    return out


@njit(cache=True)
def _run_steps_done_by(rf, ri, x_t, rep):
    x = (x_t - rf[rep, R_T0]) / rf[rep, R_FT]
    if x <= 0:
        return 0
    T0, D, k = rf[rep, R_BT0], rf[rep, R_D], ri[rep, R_K]
    if D <= 0:
        m = int(math.floor(x / T0 + 1e-12))
    else:
        b = T0 - D / 2
        m = int(math.floor((-b + math.sqrt(b * b + 2 * D * x)) / D + 1e-9))
    m = max(0, min(m, k))
    while m < k and (m + 1) * T0 + D * (m + 1) * m / 2 <= x:
        m += 1
    while m > 0 and m * T0 + D * m * (m - 1) / 2 > x:
        m -= 1
    return m


@njit(cache=True)
def _run_time(rf, rep, m):
    return rf[rep, R_FT] * (m * rf[rep, R_BT0] + rf[rep, R_D] * m * (m - 1) / 2)


@njit(cache=True)
def _run_energy(rf, rep, m):
    return rf[rep, R_FE] * (m * rf[rep, R_E0] + rf[rep, R_F] * m * (m - 1) / 2)


@njit(cache=True)
def _cut(rf, ri, rep, t):
    if ri[rep, R_SEG] != SEG_RUN or t >= rf[rep, R_T1]:
        return False
    m = _run_steps_done_by(rf, ri, t, rep)
    if rf[rep, R_T0] + _run_time(rf, rep, m) < t or m == 0:
        m += 1
    if m >= ri[rep, R_K]:
        return False
    ri[rep, R_K] = m
    rf[rep, R_T1] = rf[rep, R_T0] + _run_time(rf, rep, m)
    rf[rep, R_ENERGY] = _run_energy(rf, rep, m)
    return True


@njit(cache=True)
def _batch_add(ri, qi, bq, bk, rep, nb, r, k, need):
    """Give ``r`` its ``need`` new KV blocks and a place in the batch with ``k`` tokens; the new batch length."""
    ri[rep, R_FREE] -= need
    qi[r, Q_BLOCKS] += need
    bq[rep, nb] = r
    bk[rep, nb] = k
    return nb + 1


@njit(cache=True)
def _schedule(ri, qi, wq, run, bq, bk, rep, budget, max_seqs, bs, reserve_full):
    """vLLM V1: running first (preempting the newest on a KV shortage), then waiting in order when nothing was
    preempted. Fills bq/bk; returns (batch length, preempted)."""
    nb = 0
    preempted = False
    i = 0
    while i < ri[rep, R_RUN_N]:
        if budget <= 0:
            break
        r = run[rep, i]
        k = qi[r, Q_PROMPT] + qi[r, Q_GENERATED] - qi[r, Q_COMPUTED]
        if k > budget:
            k = budget
        need = _cdiv(qi[r, Q_COMPUTED] + k, bs) - qi[r, Q_BLOCKS]
        scheduled = True
        while need > ri[rep, R_FREE]:
            ri[rep, R_RUN_N] -= 1
            victim = run[rep, ri[rep, R_RUN_N]]
            ri[rep, R_FREE] += qi[victim, Q_BLOCKS]
            qi[victim, Q_BLOCKS] = 0
            qi[victim, Q_COMPUTED] = 0
            qi[victim, Q_PREEMPT] += 1
            _wpush_front(ri, wq, rep, victim)
            preempted = True
            if victim == r:
                scheduled = False
                break
        if not scheduled:
            break
        nb = _batch_add(ri, qi, bq, bk, rep, nb, r, k, need)
        budget -= k
        i += 1
    if preempted:
        return nb, True
    draining = ri[rep, R_STATE] != ACTIVE
    while ri[rep, R_WLEN] > 0 and budget > 0 and ri[rep, R_RUN_N] < max_seqs:
        r = ri[rep, R_WHEAD]
        if draining and qi[r, Q_STARTED] == 0:
            break  # a draining replica admits no new work (queued ones were moved away)
        left = qi[r, Q_PROMPT] + qi[r, Q_GENERATED] - qi[r, Q_COMPUTED]
        k = left if left < budget else budget
        need = _cdiv(qi[r, Q_COMPUTED] + k, bs) - qi[r, Q_BLOCKS]
        if need > ri[rep, R_FREE]:
            break
        if reserve_full and _cdiv(qi[r, Q_PROMPT] + qi[r, Q_GENERATED], bs) - qi[r, Q_BLOCKS] > ri[rep, R_FREE]:
            break
        _wpop_front(ri, wq, rep)
        run[rep, ri[rep, R_RUN_N]] = r
        ri[rep, R_RUN_N] += 1
        qi[r, Q_STARTED] = 1
        nb = _batch_add(ri, qi, bq, bk, rep, nb, r, k, need)
        budget -= k
    return nb, False


@njit(cache=True)
def _kv_steps(ri, qi, bq, rep, nb, kmax, bs):
    cap = ri[rep, R_FREE]
    for j in range(nb):
        cap += qi[bq[rep, j], Q_BLOCKS]

    def fits(j):
        s = 0
        for x in range(nb):
            s += _cdiv(qi[bq[rep, x], Q_COMPUTED] + j, bs)
        return s <= cap

    if fits(kmax):
        return kmax
    if not fits(2):
        return 1
    lo, hi = 2, kmax
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


@njit(cache=True)
def _is_decode(qi, r, k):
    """`batch_terms`' rule: ``k`` new tokens of request ``r`` are a decode token (its prompt and earlier tokens all
    computed) rather than a prefill chunk."""
    return k == 1 and qi[r, Q_GENERATED] >= 1 and qi[r, Q_COMPUTED] + 1 == qi[r, Q_PROMPT] + qi[r, Q_GENERATED]


@njit(cache=True)
def _decode_flags(qi, members, new):
    """`_is_decode` of every (request, new tokens) pair."""
    out = np.empty(len(members), np.bool_)
    for j in range(len(members)):
        out[j] = _is_decode(qi, members[j], new[j])
    return out


@njit(cache=True)
def _start_segment(t, rep, ri, rf, qi, wq, run, bq, bk, coc, gi, gf, ftab, fetab, cell, sched):
    """`Replica.start` without a local policy: schedule, then a closed-form decode run (unless the pool runs step by
    step) or a single step."""
    budget, max_seqs, bs, reserve_full = sched[S_BUDGET], sched[S_MAX_SEQS], sched[S_BLOCK], sched[S_RESERVE]
    nb, preempted = _schedule(ri, qi, wq, run, bq, bk, rep, budget, max_seqs, bs, reserve_full)
    ri[rep, R_BATCH_N] = nb
    if nb == 0:
        ri[rep, R_SEG] = SEG_NONE
        return False
    P = A = n = L = 0
    for j in range(nb):
        r = bq[rep, j]
        k = bk[rep, j]
        if _is_decode(qi, r, k):
            n += 1
            L += qi[r, Q_COMPUTED] + 1
        else:
            P += k
            A += k * qi[r, Q_COMPUTED] + k * (k + 1) // 2
    if sched[S_NOISE]:  # `NoiseSource.draw_for`: the replica's next draw, for the whole segment
        j = ri[rep, R_NPOS]
        if j >= ri[rep, R_NEND]:
            raise RuntimeError("kernel: legacy noise draws exhausted (the caller refills before each event)")
        ri[rep, R_NPOS] = j + 1
        t_next = INF
    else:
        c = int(t // cell)
        j = c - sched[S_CELL0]  # (the tables start at cell S_CELL0)
        if j < 0 or j >= ftab.shape[1]:
            raise RuntimeError("kernel: truth factor table does not cover the segment's start")
        t_next = (c + 1) * cell
    ft = ftab[rep, j]
    fe = fetab[rep, j]
    rf[rep, R_FT] = ft
    rf[rep, R_FE] = fe
    rf[rep, R_T0] = t
    rf[rep, R_FLOOR_W] = gf[rep, GF_FLOOR_W]
    cl = gi[rep, G_CLOCK]
    ri[rep, R_SCLK] = cl
    ri[rep, R_LOGGED] = sched[S_LOG]
    rf[rep, R_FLOOR_T] = t
    rf[rep, R_FLOOR_ACC] = 0.0
    if sched[S_CLOSED] and P == 0 and not preempted:
        kmax = 1 << 62
        for j in range(nb):
            r = bq[rep, j]
            x = qi[r, Q_OUT] - qi[r, Q_GENERATED]
            if x < kmax:
                kmax = x
        if kmax >= 2:
            kmax = _kv_steps(ri, qi, bq, rep, nb, kmax, bs)
        if kmax >= 2:
            ri[rep, R_SEG] = SEG_RUN
            ri[rep, R_K] = kmax
            T0 = coc[cl, C_TAU0] + coc[cl, C_TAU2] * n + coc[cl, C_TAU3] * L
            D = coc[cl, C_TAU3] * n
            E0 = coc[cl, C_A] + coc[cl, C_B] * n + coc[cl, C_KAPPA] * L
            F = coc[cl, C_KAPPA] * n
            rf[rep, R_BT0], rf[rep, R_D], rf[rep, R_E0], rf[rep, R_F] = T0, D, E0, F
            rf[rep, R_T1] = t + ft * (kmax * T0 + D * kmax * (kmax - 1) / 2)
            rf[rep, R_ENERGY] = fe * (kmax * E0 + F * kmax * (kmax - 1) / 2)
            if rf[rep, R_T1] > t_next:
                _cut(rf, ri, rep, t_next)
            return True
    dt = ft * (coc[cl, C_TAU0] + coc[cl, C_TAU1] * P + coc[cl, C_TAU2] * n + coc[cl, C_TAU3] * L
               + coc[cl, C_TAU4] * A)
    ri[rep, R_SEG] = SEG_STEP
    rf[rep, R_T1] = t + dt
    rf[rep, R_ENERGY] = fe * (coc[cl, C_A] + coc[cl, C_C1] * P + coc[cl, C_C2] * A + coc[cl, C_B] * n
                              + coc[cl, C_KAPPA] * L)
    return True


@njit(cache=True)
def _decode(ri, qi, bq, rep, m, bs):
    """Every member of ``rep``'s decode run adds ``m`` tokens and KV blocks to hold them; returns how many are done."""
    ndone = 0
    for j in range(ri[rep, R_BATCH_N]):
        r = bq[rep, j]
        qi[r, Q_COMPUTED] += m
        qi[r, Q_GENERATED] += m
        nbk = _cdiv(qi[r, Q_COMPUTED], bs)
        ri[rep, R_FREE] -= nbk - qi[r, Q_BLOCKS]
        qi[r, Q_BLOCKS] = nbk
        if qi[r, Q_GENERATED] >= qi[r, Q_OUT]:
            ndone += 1
    return ndone


@njit(cache=True)
def _log_segment(rep, t0, t1, n_steps, energy, floor_j, ri, qi, bq, bk, si, lgi, lgf, lgm):
    """`Pool._book`'s step log entry of ``rep``'s segment (or its finished part), written before its progress is
    applied: members with their new tokens, computed tokens before and decode flags (`batch_terms`)."""
    e, mo, nb = si[I_LOG], si[I_LOGM], ri[rep, R_BATCH_N]
    if e >= lgi.shape[0] or mo + nb > lgm.shape[0]:
        raise RuntimeError("kernel: step log full (the caller drains it before each event)")
    lgi[e, LG_REP], lgi[e, LG_STEPS], lgi[e, LG_CLOCK], lgi[e, LG_N] = rep, n_steps, ri[rep, R_SCLK], nb
    lgf[e, LF_T0], lgf[e, LF_T1], lgf[e, LF_ENERGY], lgf[e, LF_FLOOR] = t0, t1, energy, floor_j
    run = ri[rep, R_SEG] == SEG_RUN
    for j in range(nb):
        r = bq[rep, j]
        k = 1 if run else bk[rep, j]
        lgm[mo + j, LM_REQ], lgm[mo + j, LM_NEW], lgm[mo + j, LM_COMPUTED] = r, k, qi[r, Q_COMPUTED]
        lgm[mo + j, LM_DECODE] = _is_decode(qi, r, k)
    si[I_LOG], si[I_LOGM] = e + 1, mo + nb


@njit(cache=True)
def _finish_segment(t, rep, ri, rf, qi, qf, qc, run, bq, bk, e_dyn, sched, done_out, si, lgi, lgf, lgm):
    """Book the segment's energy above its floor (and its step log entry), apply its progress, complete finished
    requests."""
    bs = sched[S_BLOCK]
    floor_j = rf[rep, R_FLOOR_ACC] + rf[rep, R_FLOOR_W] * (rf[rep, R_T1] - rf[rep, R_FLOOR_T])
    e_dyn[rep] += rf[rep, R_ENERGY] - floor_j
    seg = ri[rep, R_SEG]
    if sched[S_LOG] and ri[rep, R_LOGGED]:
        _log_segment(rep, rf[rep, R_T0], rf[rep, R_T1], ri[rep, R_K] if seg == SEG_RUN else 1, rf[rep, R_ENERGY],
                     floor_j, ri, qi, bq, bk, si, lgi, lgf, lgm)
    ndone = 0
    if seg == SEG_STEP:
        for j in range(ri[rep, R_BATCH_N]):
            r = bq[rep, j]
            qi[r, Q_COMPUTED] += bk[rep, j]
            if qi[r, Q_COMPUTED] >= qi[r, Q_PROMPT] + qi[r, Q_GENERATED]:
                qi[r, Q_GENERATED] += 1
                if qf[r, Q_FIRST] < 0:
                    qf[r, Q_FIRST] = rf[rep, R_T1]
                if qi[r, Q_GENERATED] >= qi[r, Q_OUT]:
                    ndone += 1
    elif seg == SEG_RUN:
        ndone = _decode(ri, qi, bq, rep, ri[rep, R_K], bs)
    ri[rep, R_BATCH_N] = 0
    if ndone:
        w = 0
        for i in range(ri[rep, R_RUN_N]):
            r = run[rep, i]
            if qi[r, Q_GENERATED] >= qi[r, Q_OUT]:
                ri[rep, R_FREE] += qi[r, Q_BLOCKS]
                qi[r, Q_BLOCKS] = 0
                si[I_LIVE] -= 1
                si[I_DONE] += 1
                qf[r, Q_FINISH] = t + qf[r, Q_OVERHEAD]
                qf[r, Q_FIRST] = qf[r, Q_FIRST] + qf[r, Q_OVERHEAD]
                qi[r, Q_REPLICA] = rep
                done_out[si[I_DONE] - 1] = r
                if qc[r]:
                    si[I_CAPLEFT] -= 1
            else:
                run[rep, w] = r
                w += 1
        ri[rep, R_RUN_N] = w
        ri[rep, R_UNF] -= ndone
    ri[rep, R_SEG] = SEG_NONE


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
def _floor_power(g, ri, gi, floor_tab):
    """`GPU.floor_power` of a GPU hosting one instance: by its lifecycle state, at the GPU's clock."""
    st = ri[g, R_STATE]
    col = 0 if st == ACTIVE or st == WAKING else (1 if st == DRAINING else 2)
    return floor_tab[g, gi[g, G_CLOCK], col]


@njit(cache=True)
def _floor_changed(t, g, ri, rf, gi, gf, floor_tab):
    p = _floor_power(g, ri, gi, floor_tab)
    if p != gf[g, GF_FLOOR_W]:
        _set_floor(t, g, p, ri, rf, gf)


@njit(cache=True)
def _start(t, rep, ri, rf, qi, wq, run, bq, bk, coc, gi, gf, floor_tab, ftab, fetab, cell, sched, si, ht, hk, hs,
           hi, hv):
    if ri[rep, R_STATE] == ACTIVE and ri[rep, R_RUN_N] == 0 and ri[rep, R_WLEN] == 0:
        return
    if _start_segment(t, rep, ri, rf, qi, wq, run, bq, bk, coc, gi, gf, ftab, fetab, cell, sched):
        ri[rep, R_VER] += 1
        _push(si, ht, hk, hs, hi, hv, rf[rep, R_T1], EV_SEG, rep, ri[rep, R_VER])
    elif ri[rep, R_STATE] == DRAINING and ri[rep, R_RUN_N] == 0 and ri[rep, R_WLEN] == 0:
        ri[rep, R_STATE] = STANDBY
        _floor_changed(t, rep, ri, rf, gi, gf, floor_tab)


@njit(cache=True)
def _route(t, r, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv):
    """Least unfinished requests among the active replicas, ties to the lowest index (`Pool._route`)."""
    R = ri.shape[0]
    best = -1
    for x in range(R):
        if ri[x, R_STATE] == ACTIVE and (best < 0 or ri[x, R_UNF] < ri[best, R_UNF]):
            best = x
    if best < 0:
        raise RuntimeError("kernel: no active replica to route to")
    qi[r, Q_REPLICA] = best
    _wpush_back(ri, wq, best, r)
    ri[best, R_UNF] += 1
    _poke(t, best, ri, rf, si, pend, ht, hk, hs, hi, hv)


@njit(cache=True)
def _route_in_order(t, moved, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv):
    """`_route` of every request in ``moved``, in index (arrival) order: the order by marking (linear in the index
    range), the least-loaded replica from a heap of (unfinished, index) over the active ones (log R per request)."""
    lo, hi_ = moved.min(), moved.max()
    mark = np.zeros(hi_ - lo + 1, np.bool_)
    for r in moved:
        mark[r - lo] = True
    R = ri.shape[0]
    heap = np.empty(R, np.int64)  # active replicas, a binary heap on (unfinished, index)
    n = 0
    for x in range(R):
        if ri[x, R_STATE] == ACTIVE:
            heap[n] = x
            n += 1
    if n == 0:
        raise RuntimeError("kernel: no active replica to route to")
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
def _redistribute(t, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv, gi, gf, floor_tab):
    """`Pool._redistribute`: every queued request that has not started is routed again, in arrival order, to the
    active replicas; draining replicas left without work go to standby."""
    R = ri.shape[0]
    total = 0
    for x in range(R):
        total += ri[x, R_WLEN]
    moved = np.empty(total, np.int64)
    nm = 0
    for x in range(R):
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
    if nm:
        _route_in_order(t, moved[:nm], ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv)
    for x in range(R):
        if ri[x, R_SEG] == SEG_NONE and ri[x, R_RUN_N] == 0 and ri[x, R_WLEN] == 0 and ri[x, R_STATE] == DRAINING:
            ri[x, R_STATE] = STANDBY
            _floor_changed(t, x, ri, rf, gi, gf, floor_tab)


@njit(cache=True)
def _flush(t, ri, rf, qi, wq, run, bq, bk, coc, gi, gf, floor_tab, ftab, fetab, cell, sched, si, pend, ht, hk, hs,
           hi, hv):
    """Start the replicas that received work at ``t`` (`Pool._flush`)."""
    npend = si[I_PEND]
    si[I_PEND] = 0
    for x in range(npend):
        rep = pend[x]
        ri[rep, R_PENDING] = 0
        if ri[rep, R_SEG] == SEG_NONE:
            _start(t, rep, ri, rf, qi, wq, run, bq, bk, coc, gi, gf, floor_tab, ftab, fetab, cell, sched, si,
                   ht, hk, hs, hi, hv)


@njit(cache=True)
def set_active(t, count, latency_s, ri, rf, qi, wq, run, bq, bk, coc, gi, gf, floor_tab, ftab, fetab, cell, sched,
               si, pend, ht, hk, hs, hi, hv):
    """`Pool.set_active` for one model: the first ``count`` replicas active (a standby one wakes after
    ``latency_s``, a draining one resumes at once), the rest draining; re-routes the queues when the set changed."""
    R = ri.shape[0]
    changed = False
    for i in range(R):
        st = ri[i, R_STATE]
        if i < count:
            if st == DRAINING:
                ri[i, R_STATE] = ACTIVE
                _floor_changed(t, i, ri, rf, gi, gf, floor_tab)
            elif st == STANDBY:
                ri[i, R_STATE] = WAKING
                ri[i, R_VER] += 1
                _floor_changed(t, i, ri, rf, gi, gf, floor_tab)
                _push(si, ht, hk, hs, hi, hv, t + latency_s, EV_WAKE, i, ri[i, R_VER])
        else:
            if st == ACTIVE:
                ri[i, R_STATE] = DRAINING
                _floor_changed(t, i, ri, rf, gi, gf, floor_tab)
            elif st == WAKING:
                ri[i, R_VER] += 1
                ri[i, R_STATE] = STANDBY
                _floor_changed(t, i, ri, rf, gi, gf, floor_tab)
        changed |= ri[i, R_STATE] != st
    if not changed:
        return
    _redistribute(t, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv, gi, gf, floor_tab)
    _flush(t, ri, rf, qi, wq, run, bq, bk, coc, gi, gf, floor_tab, ftab, fetab, cell, sched, si, pend, ht, hk, hs,
           hi, hv)


@njit(cache=True)
def _set_clock(t, idx, latency_s, gi, gf, si, ht, hk, hs, hi, hv):
    """`Pool.set_clock` on every GPU: clock level ``idx`` from ``t + latency_s`` (a pending change superseded, one
    back to the current clock cancelled)."""
    for g in range(gi.shape[0]):
        target = gi[g, G_PENDING] if gi[g, G_PENDING] >= 0 else gi[g, G_CLOCK]
        if idx == target:
            continue
        gi[g, G_VER] += 1
        if idx == gi[g, G_CLOCK]:
            gi[g, G_PENDING] = -1
            continue
        gi[g, G_PENDING] = idx
        gf[g, GF_PENDING_T] = t + latency_s
        _push(si, ht, hk, hs, hi, hv, gf[g, GF_PENDING_T], EV_CLOCK, g, gi[g, G_VER])


@njit(cache=True)
def _set_floor(t, g, power_w, ri, rf, gf):
    """`GPU.set_floor` (one instance per GPU): close the floor meter at ``t``; a segment in flight is charged the
    new floor from ``t`` on."""
    gf[g, GF_E_FLOOR] += gf[g, GF_FLOOR_W] * (t - gf[g, GF_T_FLOOR])
    gf[g, GF_T_FLOOR] = t
    if power_w != gf[g, GF_FLOOR_W]:
        if ri[g, R_SEG] != SEG_NONE and rf[g, R_T0] <= t < rf[g, R_T1]:
            rf[g, R_FLOOR_ACC] += rf[g, R_FLOOR_W] * (t - rf[g, R_FLOOR_T])
            rf[g, R_FLOOR_T] = t
            rf[g, R_FLOOR_W] = power_w
    gf[g, GF_FLOOR_W] = power_w


@njit(cache=True)
def _noise_low(ri):
    for x in range(ri.shape[0]):
        if ri[x, R_NPOS] >= ri[x, R_NEND]:
            return True
    return False


@njit(cache=True)
def advance(t_end, stop_captured, si, sf, ri, rf, qi, qf, qc, rejected, wq, run, bq, bk, pend, ht, hk, hs, hi, hv,
            coc, gi, gf, floor_tab, ftab, fetab, cell, sched, e_dyn, done_out, lgi, lgf, lgm):
    """Run every arrival and segment end at or before ``t_end`` (`Pool.run_until` for the covered subset); with
    ``stop_captured``, stop at the segment end that finishes the last captured request."""
    n = si[I_N]
    room = 2 * ri.shape[0] + 4  # the most entries one event pushes (a wake re-routes to every replica, then starts)
    last = sf[F_NOW]
    while True:
        if si[I_HEAP] + room > ht.shape[0]:
            sf[F_NOW] = max(sf[F_NOW], last)
            return 1  # the caller grows the heap and calls again (nothing of the next event is done yet)
        if sched[S_NOISE] and _noise_low(ri):
            sf[F_NOW] = max(sf[F_NOW], last)
            return 2  # the caller refills the noise draws and calls again (one event starts one segment per replica)
        if sched[S_LOG] and (si[I_LOG] >= lgi.shape[0] or si[I_LOGM] + sched[S_MAX_SEQS] + 1 > lgm.shape[0]):
            sf[F_NOW] = max(sf[F_NOW], last)
            return 3  # the caller drains the step log and calls again (one event books at most one segment)
        cur = si[I_CURSOR]
        ta = qf[cur, Q_ARRIVAL] if cur < n else INF
        th = ht[0] if si[I_HEAP] > 0 else INF
        if si[I_PEND] > 0 and (th if th < ta else ta) > last:
            _flush(last, ri, rf, qi, wq, run, bq, bk, coc, gi, gf, floor_tab, ftab, fetab, cell, sched, si, pend, ht,
                   hk, hs, hi, hv)
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
            if kind == EV_CLOCK:  # `Pool._apply_clock`: a step in flight keeps its law, a run is cut
                g = rep
                if gi[g, G_VER] != ver:
                    continue
                if ri[g, R_SEG] == SEG_RUN and _cut(rf, ri, g, t):
                    ri[g, R_VER] += 1
                    _push(si, ht, hk, hs, hi, hv, rf[g, R_T1], EV_SEG, g, ri[g, R_VER])
                gi[g, G_CLOCK] = gi[g, G_PENDING]
                gi[g, G_PENDING] = -1
                _set_floor(t, g, _floor_power(g, ri, gi, floor_tab), ri, rf, gf)
                continue
            if kind == EV_WAKE:
                if ri[rep, R_VER] != ver or ri[rep, R_STATE] != WAKING:
                    continue
                ri[rep, R_STATE] = ACTIVE
                _floor_changed(t, rep, ri, rf, gi, gf, floor_tab)
                _redistribute(t, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv, gi, gf, floor_tab)
                continue
            if ri[rep, R_VER] != ver:
                continue
            _finish_segment(t, rep, ri, rf, qi, qf, qc, run, bq, bk, e_dyn, sched, done_out, si, lgi, lgf, lgm)
            if stop_captured and si[I_CAPLEFT] == 0:
                sf[F_NOW] = t
                return 0
            cur = si[I_CURSOR]
            if (cur < n and qf[cur, Q_ARRIVAL] == t) or (si[I_HEAP] > 0 and ht[0] == t) or si[I_PEND] > 0:
                if ri[rep, R_PENDING] == 0:
                    ri[rep, R_PENDING] = 1
                    pend[si[I_PEND]] = rep
                    si[I_PEND] += 1
            else:
                _start(t, rep, ri, rf, qi, wq, run, bq, bk, coc, gi, gf, floor_tab, ftab, fetab, cell, sched, si,
                       ht, hk, hs, hi, hv)
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
            _route(ta, i, ri, rf, qi, wq, si, pend, ht, hk, hs, hi, hv)
    sf[F_NOW] = max(sf[F_NOW], t_end if t_end < INF else last)
    return 0


@njit(cache=True)
def settle(t, ri, rf, qi, bk, bq, e_dyn, sched, si, ht, hk, hs, hi, hv, lgi, lgf, lgm):
    """`Pool.settle`: cut every decode run at the first step end >= ``t`` and apply (and meter, and log) the steps
    that ended before, leaving one step in flight."""
    bs = sched[S_BLOCK]
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
            _log_segment(g, rf[g, R_T0], t_mid, m, de, floor_j, ri, qi, bq, bk, si, lgi, lgf, lgm)
        _decode(ri, qi, bq, g, m, bs)
        rf[g, R_BT0] += rf[g, R_D] * m
        rf[g, R_E0] += rf[g, R_F] * m
        ri[g, R_K] -= m
        rf[g, R_T0] = t_mid
        rf[g, R_FLOOR_ACC] = 0.0
        rf[g, R_FLOOR_T] = t_mid
        rf[g, R_ENERGY] -= de
        e_dyn[g] += de - floor_j


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
def meter(t, ri, rf, gf, e_dyn):
    """Energy (J) of every GPU from the start to ``t`` (`GPU.meter`, one instance per GPU)."""
    R = ri.shape[0]
    out = np.empty(R)
    for g in range(R):
        e = gf[g, GF_E_FLOOR] + gf[g, GF_FLOOR_W] * (t - gf[g, GF_T_FLOOR]) + e_dyn[g]
        if ri[g, R_SEG] != SEG_NONE:
            end = rf[g, R_T1] if rf[g, R_T1] < t else t
            if end > rf[g, R_T0]:
                e += _energy_until(t, ri, rf, g) - _floor_until(rf, g, end)
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
def _compact_core(ri, wq, run, bq, qi, qf, qc, rejected, si, head_deadline, head_slots, row_deadline, row0, L,
                  slot_base):
    """`KernelState._compact`'s work: new request arrays holding the live requests (in index order) then the rows
    loaded but not arrived; queues, batches and running lists re-indexed in place. Returns the new arrays and the
    new head's deadlines and slots."""
    cur, N = si[I_CURSOR], si[I_N]
    live = np.sort(_live(ri, wq, run))
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
    si[I_CURSOR] = nl
    si[I_N] = n_keep
    si[I_DONE] = 0
    return qi2, qf2, qc2, rej2, wq2, dl2, sl2


_COEFFS: dict[int, np.ndarray] = {}  # id(profile) -> coefficients, dropped with the profile (as `coeffs_for`'s)


def _clock_coefficients(prof) -> np.ndarray:
    """The step laws' coefficients at each clock level of ``prof`` (``coc``; read only, cached per profile object as
    `coeffs_for` caches them: a profile is not changed once an engine used it)."""
    coc = _COEFFS.get(id(prof))
    if coc is None:
        coc = np.zeros((len(prof.clocks), 10))
        for ci in range(len(prof.clocks)):
            c = coeffs_for(prof, ci, 1.0)
            coc[ci] = (c.tau0, c.tau1, c.tau2, c.tau3, c.tau4, c.a, c.c1, c.c2, c.b, c.kappa)
        _COEFFS[id(prof)] = coc
        weakref.finalize(prof, _COEFFS.pop, id(prof), None)
    return coc


@dataclass(frozen=True)
class _Rows:
    """A pool's workload rows as arrays (read only; shared by every copy of a kernel state)."""

    arrival: np.ndarray
    prompt: np.ndarray
    out: np.ndarray  # the output length the engine runs to
    rejected: np.ndarray
    deadline: np.ndarray  # what `Req.deadline` carries
    overhead: np.ndarray | None  # serving overhead added to the finish time (None: none)

    @classmethod
    def of(cls, pool) -> "_Rows":
        n = pool._n
        if n and pool.table is not None and pool._slot_base == 0 and len(pool.table) == n:
            return cls(pool.table.arrival_s, pool.table.prompt_tokens, np.asarray(pool.out_tokens),
                       np.asarray(pool.rejected, np.bool_), np.asarray(pool.deadline, np.float64), pool.overhead_s)
        if not n:
            e = np.zeros(0)
            return cls(e, e.astype(np.int64), e.astype(np.int64), e.astype(np.bool_), e, None)
        oh = pool.overhead_s if pool._slot_base == 0 else None
        return cls(np.asarray(pool._arr[:n], np.float64), np.asarray(pool._prompt[:n], np.int64),
                   np.asarray(pool._out[:n], np.int64), np.asarray(pool.rejected[:n], np.bool_),
                   np.asarray(pool._deadline[:n], np.float64), oh)


class KernelState:
    """The arrays `advance` works on, imported from a `Pool`'s state: its live requests, segments in flight and pending
    events when it has served already (a what-if copy, say), and its workload's rows as the clock nears them.

    Requests are indexed the head first (the requests live at the import or the last compaction, by slot, so index
    order is arrival order), then the workload's rows loaded: index ``n_live + row - row0``; `slots` maps indices
    back to the pool's request slots. Rows are loaded ``LOOKAHEAD_S`` ahead; with ``compact`` the finished requests
    are dropped when room is needed and on `copy`, so a state holds about the live requests and an hour of rows."""

    LOOKAHEAD_S = 3600.0  # workload rows are loaded this far ahead of the engine clock
    COPY_LOOKAHEAD_S = 300.0  # ... and in a copy (a fork runs short stretches; it keeps only these rows, and loads on)

    @staticmethod
    def covers(pool) -> bool:
        """Whether the kernel can run ``pool`` from its current state: one model, one full-share instance per GPU
        without a prefix cache or local policy, the truth model, the legacy per-segment noise, a what-if copy's
        nominal model or no noise, the default router, no request unrouted or migrating, no
        replica loading or moving."""
        from commitenv.sim.truth import NominalModel

        reps, gpus = pool._replicas, pool._gpus
        noise_ok = pool.noise is pool.truth or (pool.truth is None
                                                and isinstance(pool.noise, (NominalModel, NoiseSource)))
        return (noise_ok and pool.dispatch is None and pool._hashes is None and pool.n_models == 1
                and len(reps) == len(gpus)
                and not pool.unrouted and not pool.transit and not pool._pending
                and (pool.overhead_s is None or (pool.captured_left == 0 and not pool._capture_arrivals))
                and all(e[1] in (EV_SEG, EV_WAKE, EV_CLOCK) for e in pool._heap)
                and all(g.replicas == [r] and g.index == r.index == x for x, (g, r) in enumerate(zip(gpus, reps)))
                and all(r.local is None and r.pcache is None and r.share == 1.0 and not r.pending_start
                        and r.state in (ACTIVE, DRAINING, STANDBY, WAKING) for r in reps))

    @classmethod
    def covering(cls, pool) -> "KernelState | None":
        """The kernel state of ``pool`` if the kernel is on and covers it (with compaction: the pool takes results)."""
        return cls(pool, compact=True) if ENABLED and cls.covers(pool) else None

    def __init__(self, pool, heap_size: int = 0, *, compact: bool = False) -> None:
        """``compact``: finished requests may be dropped once `take_finished` handed them out (a pool records their
        results); without it every request stays, at its index, for the caller to read."""
        if not self.covers(pool):
            raise ValueError("kernel: pool outside the covered subset (truth factors, legacy, nominal or no noise, "
                             "one model, one full-share instance per GPU, default router, no prefix cache, no local "
                             "policy, nothing unrouted, migrating, loading or moving)")
        from commitenv.sim.truth import NominalModel

        reps, gpus = pool._replicas, pool._gpus
        live = sorted((r for rep in reps for q in (rep.running, rep.waiting) for r in q), key=lambda r: r.slot)
        L = len(live)
        sch = pool.profiles[0].scheduler
        self.R = R = len(reps)
        self.src = _Rows.of(pool)
        self.slot_base = pool._slot_base
        self.n_live = L  # the head: requests live at the import (or the last compaction), by slot
        self.live_slots = np.array([r.slot for r in live], np.int64)
        self.head_deadline = np.array([r.deadline for r in live], np.float64)
        # workload rows [row0, row_end) follow the head, at index n_live + row - row0
        self.row0 = self.row_end = pool._cursor
        self._stopped = False  # `stop_arrivals`: no row loaded or arriving any more
        self.lookahead_s = self.LOOKAHEAD_S
        self.compact = compact
        self.taken = 0  # completions handed out by `take_finished`
        self.done0 = pool.completed  # completions before the import or the last compaction (``I_DONE``: the rest)
        cap = L + 64
        self.qi = np.zeros((cap, 8), np.int64)
        self.qf = np.zeros((cap, 4))
        self.qc = np.zeros(cap, np.uint8)  # captured (a what-if run reports its finish)
        self.rejected = np.zeros(cap, np.bool_)
        self.wq = np.full(cap, -1, np.int64)  # next request in its waiting queue
        self.done_out = np.zeros(cap, np.int64)
        oh = pool.overhead_s
        index = {}
        for k, r in enumerate(live):
            index[id(r)] = k
            self.qi[k] = (r.prompt, r.out, r.computed, r.generated, r.blocks, r.started, r.preemptions, r.replica)
            self.qf[k] = (r.arrival, r.first_t, np.nan,
                          oh[r.slot] if oh is not None and r.slot < pool._n_results else 0.0)
            self.qc[k] = r.captured
        prof = pool.profiles[0]
        self.profile = prof
        self.coc = _clock_coefficients(prof)
        self.sched = np.array([sch.token_budget, sch.max_seqs, sch.block_size, int(sch.reserve_full_sequence), 0, 0,
                               int(pool.log is not None or pool.on_step is not None), int(pool.opt.closed_form)],
                              np.int64)
        self.run = np.zeros((R, sch.max_seqs + 1), np.int64)
        self.bq = np.zeros((R, sch.max_seqs + 1), np.int64)
        self.bk = np.zeros((R, sch.max_seqs + 1), np.int64)
        self.ri = np.zeros((R, 16), np.int64)
        self.rf = np.zeros((R, 12))
        ri, rf = self.ri, self.rf  # (column by column: a what-if copy is imported for every candidate)
        ri[:, R_UNF] = [rep.unf for rep in reps]
        ri[:, R_FREE] = [rep.free_blocks for rep in reps]
        ri[:, R_STATE] = [rep.state for rep in reps]
        ri[:, R_VER] = [rep.version for rep in reps]
        ri[:, R_SEG] = [rep.seg for rep in reps]
        ri[:, R_K] = [rep.run_k for rep in reps]
        ri[:, R_SCLK] = [rep.gpu.clock_idx if rep.seg_log is None else prof.clock_index(rep.seg_log.clock_mhz) for rep in reps]
        ri[:, R_LOGGED] = [rep.seg != SEG_NONE and rep.seg_log is not None for rep in reps]
        for col, name in ((R_T0, "t0"), (R_T1, "t1"), (R_BT0, "T0"), (R_D, "D"), (R_E0, "E0"), (R_F, "F"),
                          (R_FT, "ft"), (R_FE, "fe"), (R_ENERGY, "seg_energy"), (R_FLOOR_W, "seg_floor_w"),
                          (R_FLOOR_T, "seg_floor_t"), (R_FLOOR_ACC, "seg_floor_acc")):
            rf[:, col] = [getattr(rep, name) for rep in reps]
        for x, rep in enumerate(reps):
            if rep.running:
                if len(rep.running) > sch.max_seqs:
                    raise ValueError(f"kernel: replica {x} runs {len(rep.running)} requests, above max_seqs "
                                     f"{sch.max_seqs}")
                ri[x, R_RUN_N] = len(rep.running)
                self.run[x, : len(rep.running)] = [index[id(r)] for r in rep.running]
            if rep.waiting:  # (the linked list of `_wpush_back`, written at once)
                w = [index[id(r)] for r in rep.waiting]
                self.wq[w[:-1]] = w[1:]
                ri[x, R_WHEAD], ri[x, R_WTAIL], ri[x, R_WLEN] = w[0], w[-1], len(w)
            if rep.seg == SEG_STEP:
                ri[x, R_BATCH_N] = len(rep.batch)
                self.bq[x, : len(rep.batch)] = [index[id(r)] for r, _ in rep.batch]
                self.bk[x, : len(rep.batch)] = [k for _, k in rep.batch]
            elif rep.seg == SEG_RUN:
                ri[x, R_BATCH_N] = len(rep.run_reqs)
                self.bq[x, : len(rep.run_reqs)] = [index[id(r)] for r in rep.run_reqs]
        self.gi = np.zeros((R, 3), np.int64)
        self.gf = np.zeros((R, 4))
        # the idle floor of an active GPU at each clock, multiplied as `GPU.floor_power` does
        levels = np.array([[lvl.active_idle_w, lvl.draining_idle_w, prof.standby_w] for lvl in prof.clocks])
        self.floor_tab = np.array([g.power_factor for g in gpus])[:, None, None] * levels[None]
        self.gi[:, G_CLOCK] = [gpu.clock_idx for gpu in gpus]
        self.gi[:, G_PENDING] = [-1 if gpu.pending_clock is None else gpu.pending_clock for gpu in gpus]
        self.gi[:, G_VER] = [gpu.version for gpu in gpus]
        self.gf[:, GF_PENDING_T] = [gpu.pending_t for gpu in gpus]
        self.gf[:, GF_FLOOR_W] = [gpu.floor_w for gpu in gpus]
        self.gf[:, GF_T_FLOOR] = [gpu.t_floor for gpu in gpus]
        self.gf[:, GF_E_FLOOR] = [gpu.e_floor for gpu in gpus]
        self.e_dyn = np.array([gpu.e_dyn for gpu in gpus], dtype=np.float64)
        self._truth = pool.truth
        self.noise = pool.noise if isinstance(pool.noise, NoiseSource) else None
        if self.noise is not None:  # the legacy noise: each replica's stream of draws, taken over from the source
            self.cell = INF
            self.sched[S_NOISE] = 1
            self._set_draws([self.noise.take(x) for x in range(R)])
        elif pool.truth is None:  # no noise or the nominal model: constant factors in one endless cell
            self.cell = INF
            fe = pool.noise.energy_factor if isinstance(pool.noise, NominalModel) else 1.0
            self.ftab, self.fetab = np.ones((R, 1)), np.full((R, 1), fe)
        else:
            self.cell = float(pool.truth._cell)
            self.ftab = self.fetab = np.zeros((R, 0))
        self.si = np.zeros(12, np.int64)
        self.si[I_N] = self.si[I_CURSOR] = L
        self.si[I_SEQ] = pool._seq
        self.si[I_LIVE], self.si[I_EVENTS] = pool.live, pool.events
        self.si[I_CAPLEFT], self.si[I_CAPARR] = pool.captured_left, pool._capture_arrivals
        self.sf = np.array([pool.now, pool.now])
        self._ensure(pool.now)
        self.pend = np.zeros(R, np.int64)
        heap = pool._heap
        size = max(heap_size, 2 * R + 8, 2 * len(heap)) if heap_size else 8 * R + 64 + 2 * len(heap)
        self.ht = np.zeros(size)
        self.hk, self.hs, self.hi, self.hv = (np.zeros(size, np.int64) for _ in range(4))
        self.si[I_HEAP] = len(heap)
        if heap:  # (heapq's list is a binary heap under the same order: copied as it stands)
            cols = list(zip(*heap))
            self.ht[: len(heap)] = cols[0]
            for a, col in zip((self.hk, self.hs, self.hi, self.hv), cols[1:]):
                a[: len(heap)] = col
        self._load(pool.now)
        # the step log (`Pool.log`, `Pool.on_step`): written by the compiled loop, drained into `StepLogEntry`s after
        # every call (`take_log`)
        self._mhz = np.array([lvl.mhz for lvl in prof.clocks], np.int64)
        self._log_out: list = []
        n_ent, n_mem = (max(self.LOG_ENTRIES, R + 1), max(self.LOG_MEMBERS, (R + 1) * (sch.max_seqs + 1))) \
            if self.sched[S_LOG] else (0, 0)
        self.lgi, self.lgf = np.zeros((n_ent, 4), np.int64), np.zeros((n_ent, 4))
        self.lgm = np.zeros((n_mem, 4), np.int64)

    # ------------------------------------------------------------------------------------------ step log
    LOG_ENTRIES = 4096  # step log entries, and their members, the compiled loop writes between two drains
    LOG_MEMBERS = 1 << 16

    @property
    def closed_form(self) -> bool:
        """Whether the segments that start from now on advance decode runs in closed form (`EngineOptions.closed_form`;
        segments in flight keep the form they started with, as on the Python loop)."""
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
            rep, rep, lgf[:, LF_T0].copy(), lgf[:, LF_T1].copy(), lgi[:, LG_STEPS].copy(), lgf[:, LF_ENERGY].copy(),
            self._mhz[lgi[:, LG_CLOCK]], np.ones(n), lgf[:, LF_FLOOR].copy(), lgi[:, LG_N].copy(),
            self.slots(lgm[:, LM_REQ]), lgm[:, LM_NEW].copy(), lgm[:, LM_COMPUTED].copy(), lgm[:, LM_DECODE] != 0))
        self.si[I_LOG] = self.si[I_LOGM] = 0

    def take_log(self):
        """The step log entries booked since the last call, in booking order, as one `StepLogBatch` (None: none)."""
        out, self._log_out = self._log_out, []
        return StepLogBatch.join(out) if out else None

    def stop_logging(self) -> None:
        """Write no step log from here on (a fork keeps none); entries not taken are dropped."""
        self.sched = self.sched.copy()  # (copies share it)
        self.sched[S_LOG] = 0
        self.si[I_LOG] = self.si[I_LOGM] = 0
        self._log_out = []

    def _seg_log(self, x: int) -> SegmentLog:
        """`Replica.seg_log` of replica ``x``'s segment in flight, as the Python loop records it at its start (a run's
        computed tokens advanced by the steps already booked, as `Pool.settle` advances them)."""
        nb, ri = int(self.ri[x, R_BATCH_N]), self.ri
        members = self.bq[x, :nb]
        new = np.ones(nb, np.int64) if ri[x, R_SEG] == SEG_RUN else self.bk[x, :nb]
        return SegmentLog(tuple(self.slots(members).tolist()), tuple(new.tolist()),
                          tuple(self.qi[members, Q_COMPUTED].tolist()), tuple(_decode_flags(self.qi, members, new).tolist()),
                          int(self._mhz[ri[x, R_SCLK]]), 1.0)

    # ------------------------------------------------------------------------------------------ requests
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

    def _load(self, t: float) -> None:
        """Load the workload rows arriving at or before ``t`` (and those of ``lookahead_s`` after, so that loads are
        rare)."""
        src = self.src
        n = len(src.arrival)
        if self._stopped or self.row_end >= n:
            return
        hi = n if t == INF else int(np.searchsorted(src.arrival, t, side="right"))
        if hi <= self.row_end:
            return
        if t < INF:
            hi = max(hi, int(np.searchsorted(src.arrival, t + self.lookahead_s, side="right")))
        if self.n_live + hi - self.row0 > self.qi.shape[0]:
            self._make_room(hi)
        lo, L = self.row_end, self.n_live
        a, b = L + lo - self.row0, L + hi - self.row0
        self.qi[a:b] = 0
        self.qi[a:b, Q_PROMPT] = src.prompt[lo:hi]
        self.qi[a:b, Q_OUT] = src.out[lo:hi]
        self.qi[a:b, Q_REPLICA] = -1
        self.qf[a:b, Q_ARRIVAL] = src.arrival[lo:hi]
        self.qf[a:b, Q_FIRST] = -1.0
        self.qf[a:b, Q_FINISH] = np.nan
        self.qf[a:b, Q_OVERHEAD] = 0.0 if src.overhead is None else src.overhead[lo:hi]
        self.qc[a:b] = 0
        self.rejected[a:b] = src.rejected[lo:hi]
        self.wq[a:b] = -1
        self.row_end = hi
        self.si[I_N] = b

    def _make_room(self, hi: int) -> None:
        """Room for the rows up to ``hi``: drop the finished requests when they are many (`_compact`), else grow
        (doubling)."""
        droppable = int(self.si[I_CURSOR]) - int(self.si[I_LIVE])  # arrived and gone (finished or rejected)
        if self.compact and self.taken == self.si[I_DONE] and droppable >= (self.n_live + hi - self.row0) // 2:
            self._compact()
        need = self.n_live + hi - self.row0
        cap = self.qi.shape[0]
        if need <= cap:
            return
        new = max(2 * cap, need)
        self.qi = np.concatenate([self.qi, np.zeros((new - cap, 8), np.int64)])
        self.qf = np.concatenate([self.qf, np.zeros((new - cap, 4))])
        self.qc = np.concatenate([self.qc, np.zeros(new - cap, np.uint8)])
        self.rejected = np.concatenate([self.rejected, np.zeros(new - cap, np.bool_)])
        self.wq = np.concatenate([self.wq, np.full(new - cap, -1, np.int64)])
        self.done_out = np.concatenate([self.done_out, np.zeros(new - cap, np.int64)])

    def _compact(self, copy_all: bool = False, ahead_s: float | None = None) -> None:
        """Keep only the live requests (the new head) and the rows loaded but not arrived (with ``ahead_s``, those
        arriving within that many seconds; the rest are loaded again when needed): the finished and rejected ones
        leave (their results were taken). With ``copy_all`` every state array is new afterwards (a copy shares
        nothing it writes with the original)."""
        if self.taken != self.si[I_DONE] or self.si[I_LOG]:
            raise RuntimeError("kernel: compaction before the finished requests' results (or step log) were taken")
        if copy_all:  # (first: the compaction writes into these)
            for name in ENGINE_ARRAYS:
                setattr(self, name, getattr(self, name).copy())
        cur, L = int(self.si[I_CURSOR]), self.n_live
        if ahead_s is not None and not self._stopped:
            row_cur = self.row0 + cur - L
            hi = row_cur + int(np.searchsorted(self.src.arrival[row_cur:self.row_end], self.sf[F_NOW] + ahead_s,
                                               side="right"))
            if hi < self.row_end:
                self.row_end = hi
                self.si[I_N] = cur + hi - row_cur
        self.done0 += int(self.si[I_DONE])
        (self.qi, self.qf, self.qc, self.rejected, self.wq, self.head_deadline,
         self.live_slots) = _compact_core(self.ri, self.wq, self.run, self.bq, self.qi, self.qf, self.qc, self.rejected, self.si,
                               self.head_deadline, self.live_slots, self.src.deadline, self.row0, L, self.slot_base)
        self.done_out = np.zeros(self.qi.shape[0], np.int64)
        self.row0 += cur - L
        self.n_live = len(self.live_slots)
        self.taken = 0

    def take_finished(self) -> np.ndarray:
        """Kernel indices of the requests finished since the last call (the caller records their results now: a
        compaction may drop them later)."""
        end = int(self.si[I_DONE])
        out = self.done_out[self.taken : end].copy()
        self.taken = end
        return out

    def _ensure(self, t: float) -> None:
        """Truth factor tables covering every segment that starts from the engine clock to ``t`` (generated as the
        pool would, in `TruthSource`'s blocks; grown by at least an hour at a time, the cells before the clock left
        out)."""
        if self._truth is None:
            return
        cell = self.cell
        need = int(t // cell) + 2
        c0, have = int(self.sched[S_CELL0]), self.ftab.shape[1]
        if need <= c0 + have:
            return
        need = max(need, c0 + have + int(3600 // cell))
        c0 = max(0, int((self.sf[F_NOW] - 1.0) // cell))  # (1 s back: a change may be applied just before the clock)
        ft, fe = self._truth.factor_tables(need)
        # (contiguous copies: a view of the truth's growing tables is C-contiguous or not depending on its capacity,
        # and numba compiles `advance` again for each memory layout it meets)
        self.ftab, self.fetab = np.ascontiguousarray(ft[:, c0:need]), np.ascontiguousarray(fe[:, c0:need])
        self.sched = self.sched.copy()  # (copies share it until one of them moves its tables)
        self.sched[S_CELL0] = c0

    def _set_draws(self, draws: list[np.ndarray]) -> None:
        """Tables of each replica's unconsumed legacy noise draws (``draws[x]``: rows of (time, energy) factors in
        order), padded to one width; new arrays, so that copies sharing the old tables keep them."""
        w = max([1] + [len(d) for d in draws])
        self.ftab, self.fetab = np.full((self.R, w), np.nan), np.full((self.R, w), np.nan)
        for x, d in enumerate(draws):
            self.ftab[x, : len(d)], self.fetab[x, : len(d)] = d[:, 0], d[:, 1]
        self.ri[:, R_NPOS] = 0
        self.ri[:, R_NEND] = [len(d) for d in draws]

    def _draws(self, x: int) -> np.ndarray:
        """Replica ``x``'s unconsumed legacy noise draws, in order (rows of (time, energy) factors)."""
        a, b = self.ri[x, R_NPOS], self.ri[x, R_NEND]
        return np.column_stack((self.ftab[x, a:b], self.fetab[x, a:b]))

    def _refill(self) -> None:
        """Under the legacy noise, a draw left for every replica: an exhausted stream gets its source's next block
        (the sequence the Python loop would draw)."""
        if self.noise is not None and _noise_low(self.ri):
            draws = [self._draws(x) for x in range(self.R)]
            self._set_draws([d if len(d) else self.noise.block(x) for x, d in enumerate(draws)])

    def _room(self, k: int) -> None:
        """Grow the event heap (doubling) until ``k`` more entries fit."""
        size = self.ht.shape[0]
        if self.si[I_HEAP] + k <= size:
            return
        new = max(2 * size, int(self.si[I_HEAP]) + k)
        self.ht = np.concatenate([self.ht, np.zeros(new - size)])
        self.hk, self.hs, self.hi, self.hv = (np.concatenate([a, np.zeros(new - size, np.int64)])
                                              for a in (self.hk, self.hs, self.hi, self.hv))

    def _advance(self, t_end: float, stop_captured: bool = False) -> None:
        while code := self._advance_once(t_end, stop_captured):
            if code == 1:
                self._room(self.ht.shape[0])
            elif code == 2:
                self._refill()
            else:
                self._drain_log()
        self._drain_log()

    def _advance_once(self, t_end: float, stop_captured: bool) -> int:
        return advance(t_end, stop_captured, self.si, self.sf, self.ri, self.rf, self.qi, self.qf, self.qc,
                       self.rejected, self.wq, self.run, self.bq, self.bk, self.pend, self.ht, self.hk, self.hs,
                       self.hi, self.hv, self.coc, self.gi, self.gf, self.floor_tab, self.ftab, self.fetab, self.cell,
                       self.sched, self.e_dyn, self.done_out, self.lgi, self.lgf, self.lgm)

    def advance(self, t_end: float, stop_captured: bool = False) -> None:
        """`Pool.run_until(t_end, stop_when_captured_done=stop_captured)`; to the end of all work when ``t_end`` is
        infinite (then, as the pool, the clock stops at the last event)."""
        if t_end < INF or self._truth is None:
            self._ensure(t_end)
            self._load(t_end)
            self._advance(t_end, stop_captured)
            return
        if stop_captured:
            raise ValueError("kernel: stop_captured needs a finite end under a truth model")
        now0 = self.sf[F_NOW]
        self.sf[F_LAST] = now0
        while self.si[I_HEAP] or self.si[I_CURSOR] < self.si[I_N] or not (self._stopped
                                                                         or self.row_end >= len(self.src.arrival)):
            self._ensure(self.sf[F_NOW] + 3600.0)
            t = (self.sched[S_CELL0] + self.ftab.shape[1] - 2) * self.cell
            self._load(t)
            self._advance(t)
        self.sf[F_NOW] = max(now0, self.sf[F_LAST])

    def set_active(self, t: float, count: int) -> None:
        """`Pool.set_active` for the pool's one model."""
        if not 1 <= count <= self.R:
            raise ValueError(f"active replicas: expected 1..{self.R}, got {count}")
        if t < self.sf[F_NOW] - 1e-9:
            raise ValueError(f"set_active at t={t} precedes the engine clock {self.sf[F_NOW]}")
        self._room(3 * self.R + 8)
        self._refill()
        set_active(t, count, self.profile.latencies.activation_s, self.ri, self.rf, self.qi, self.wq, self.run,
                   self.bq, self.bk, self.coc, self.gi, self.gf, self.floor_tab, self.ftab, self.fetab, self.cell,
                   self.sched, self.si, self.pend, self.ht, self.hk, self.hs, self.hi, self.hv)

    def set_clock(self, t: float, mhz: int) -> None:
        """`Pool.set_clock` on every GPU: clock ``mhz`` applies after the profile's clock-change latency."""
        if t < self.sf[F_NOW] - 1e-9:
            raise ValueError(f"set_clock at t={t} precedes the engine clock {self.sf[F_NOW]}")
        idx = self.profile.clock_index(mhz)
        self._room(self.R)
        _set_clock(t, idx, self.profile.latencies.clock_change_s, self.gi, self.gf, self.si, self.ht, self.hk, self.hs,
                   self.hi, self.hv)

    def copy(self, *, log: bool = True) -> "KernelState":
        """An independent copy (the state arrays copied; without the finished requests when their results were taken,
        and then with only ``COPY_LOOKAHEAD_S`` of rows ahead; tables, workload rows, profile and truth source shared,
        as they only grow or are read). Without ``log`` the copy writes no step log (a fork keeps none)."""
        c = copy.copy(self)
        if self.noise is not None:
            c.noise = self.noise.copy()
        if self.compact and self.taken == self.si[I_DONE]:
            c.lookahead_s = min(self.lookahead_s, self.COPY_LOOKAHEAD_S)
            c._compact(copy_all=True, ahead_s=c.lookahead_s)
        else:
            for name in REQUEST_ARRAYS + ENGINE_ARRAYS:
                setattr(c, name, getattr(self, name).copy())
        if log:
            c.lgi, c.lgf, c.lgm, c._log_out = self.lgi.copy(), self.lgf.copy(), self.lgm.copy(), list(self._log_out)
        else:  # (empty arrays, the recording off)
            c.lgi, c.lgf, c.lgm = np.zeros((0, 4), np.int64), np.zeros((0, 4)), np.zeros((0, 4), np.int64)
            c.stop_logging()
        return c

    @property
    def nbytes(self) -> int:
        """Bytes of the state arrays (what `copy` duplicates at most)."""
        return sum(getattr(self, name).nbytes for name in REQUEST_ARRAYS + ENGINE_ARRAYS)

    def stop_arrivals(self) -> None:
        """No request arrives after the ones already in (`Pool.stop_arrivals`)."""
        self.si[I_N] = self.si[I_CURSOR]
        self._stopped = True

    def waiting_ids(self, x: int) -> list[int]:
        """The requests in replica ``x``'s waiting queue, front first."""
        return _waiting(self.ri, self.wq, x).tolist()

    def export_to(self, pool) -> None:
        """Write the kernel's state back into ``pool`` (the pool it was taken from), so the Python engine continues
        exactly where the kernel stopped: live requests as `Req` objects in the replicas' queues and segments,
        replica, GPU and heap state, counters, captured completions and the per-request results of the finished
        requests."""
        import heapq
        from collections import deque

        from commitenv.sim.request import Req

        qi, qf, ri, rf, gi, gf = self.qi, self.qf, self.ri, self.rf, self.gi, self.gf
        if self.si[I_PEND]:
            raise RuntimeError("kernel: export with replicas pending a start")
        live = _live(ri, self.wq, self.run)  # (every request a queue or segment holds)
        reqs: dict[int, Req] = {}
        for k, slot, dl, q, f, cap in zip(live.tolist(), self.slots(live).tolist(), self.deadlines(live).tolist(),
                                          qi[live].tolist(), qf[live].tolist(), self.qc[live].tolist()):
            r = Req(slot, f[Q_ARRIVAL], q[Q_PROMPT], q[Q_OUT], dl)
            r.computed, r.generated, r.blocks = q[Q_COMPUTED], q[Q_GENERATED], q[Q_BLOCKS]
            r.replica, r.started = q[Q_REPLICA], bool(q[Q_STARTED])
            r.first_t, r.preemptions, r.captured = f[Q_FIRST], q[Q_PREEMPT], bool(cap)
            reqs[k] = r
        req = reqs.__getitem__

        heap = [(float(self.ht[j]), int(self.hk[j]), int(self.hs[j]), int(self.hi[j]), int(self.hv[j]))
                for j in range(int(self.si[I_HEAP]))]
        for x, rep in enumerate(pool._replicas):
            rep.running = [req(int(i)) for i in self.run[x, : ri[x, R_RUN_N]]]
            rep.waiting = deque(req(i) for i in self.waiting_ids(x))
            rep.unf, rep.free_blocks = int(ri[x, R_UNF]), int(ri[x, R_FREE])
            rep.state, rep.version, rep.pending_start = int(ri[x, R_STATE]), int(ri[x, R_VER]), False
            for t, kind, _, idx, ver in heap:
                if kind == EV_WAKE and idx == x and ver == rep.version:
                    rep.wake_t = t
            seg = int(ri[x, R_SEG])
            rep.seg = seg
            members = [req(int(i)) for i in self.bq[x, : ri[x, R_BATCH_N]]]
            rep.batch = list(zip(members, (int(k) for k in self.bk[x, : ri[x, R_BATCH_N]]))) if seg == SEG_STEP else []
            rep.run_reqs = members if seg == SEG_RUN else []
            rep.run_k = int(ri[x, R_K])
            rep.t0, rep.t1 = float(rf[x, R_T0]), float(rf[x, R_T1])
            rep.T0, rep.D, rep.E0, rep.F = (float(rf[x, c]) for c in (R_BT0, R_D, R_E0, R_F))
            rep.ft, rep.fe, rep.seg_energy = float(rf[x, R_FT]), float(rf[x, R_FE]), float(rf[x, R_ENERGY])
            rep.seg_floor_w, rep.seg_floor_t = float(rf[x, R_FLOOR_W]), float(rf[x, R_FLOOR_T])
            rep.seg_floor_acc = float(rf[x, R_FLOOR_ACC])
            rep.seg_log = self._seg_log(x) if seg != SEG_NONE and ri[x, R_LOGGED] else None
            rep.invalidate_coeffs()
        for g, gpu in enumerate(pool._gpus):
            gpu.clock_idx = int(gi[g, G_CLOCK])
            gpu.pending_clock = None if gi[g, G_PENDING] < 0 else int(gi[g, G_PENDING])
            gpu.pending_t, gpu.version = float(gf[g, GF_PENDING_T]), int(gi[g, G_VER])
            gpu.floor_w, gpu.t_floor, gpu.e_floor = (float(gf[g, c]) for c in (GF_FLOOR_W, GF_T_FLOOR, GF_E_FLOOR))
            gpu.e_dyn = float(self.e_dyn[g])
        heapq.heapify(heap)
        pool._heap = heap
        pool._seq = int(self.si[I_SEQ])
        pool._pending = []
        pool._refresh_routable(0)
        if self.noise is not None:  # (the source continues with the draws the kernel took and did not use)
            for x in range(self.R):
                self.noise.put_back(x, self._draws(x))
            pool.noise = self.noise
        pool.sync_from_kernel(self)

    def results_into(self, done: np.ndarray, rows: np.ndarray, finish_t, first_t, replica_of, preemptions) -> None:
        """Per-request results of the finished requests ``done`` (kernel indices) into the pool's result arrays at
        ``rows``, as `Pool._complete` records them."""
        finish_t[rows] = self.qf[done, Q_FINISH]
        first_t[rows] = self.qf[done, Q_FIRST]
        replica_of[rows] = self.qi[done, Q_REPLICA]
        preemptions[rows] = self.qi[done, Q_PREEMPT]

    def queue_counts(self) -> tuple[int, int]:
        """(waiting, running) requests over the pool."""
        return int(self.ri[:, R_WLEN].sum()), int(self.ri[:, R_RUN_N].sum())

    def live_state(self) -> tuple[np.ndarray, np.ndarray]:
        """`Pool.live_state`: slots and tokens left of the live requests, each replica's running then waiting."""
        idx = _live(self.ri, self.wq, self.run)
        return self.slots(idx), _left(idx, self.qi)

    def live_deadlines(self) -> tuple[np.ndarray, np.ndarray]:
        """The live requests' pool slots and deadlines (`Pool.live_deadlines`)."""
        idx = _live(self.ri, self.wq, self.run)
        return self.slots(idx), self.deadlines(idx)

    def counters(self) -> tuple[int, float, int, int, int]:
        """(arrived, now, live, completed, events), as `Pool` keeps them (arrived counts the workload's rows)."""
        si = self.si
        return (self.row0 + int(si[I_CURSOR]) - self.n_live, float(self.sf[F_NOW]), int(si[I_LIVE]),
                self.done0 + int(si[I_DONE]), int(si[I_EVENTS]))

    def settle(self, t: float) -> None:
        self._room(self.R)
        settle(t, self.ri, self.rf, self.qi, self.bk, self.bq, self.e_dyn, self.sched, self.si, self.ht, self.hk,
               self.hs, self.hi, self.hv, self.lgi, self.lgf, self.lgm)  # (room for R entries: drained after each call)
        self._drain_log()

    def meter(self, t: float) -> np.ndarray:
        return meter(t, self.ri, self.rf, self.gf, self.e_dyn)

    def in_flight(self, t: float) -> list:
        """`Pool.in_flight`: the logged segments in flight that started before ``t``."""
        if not self.logging:
            return []
        ri, rf = self.ri, self.rf
        return [InFlightPart(x, x, float(rf[x, R_T0]), int(ri[x, R_K]) if ri[x, R_SEG] == SEG_RUN else 1, e, f,
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

