"""Segment mechanics: vLLM V1 scheduling and KV admission, starting a segment (a step or a closed-form decode run),
cutting a run, booking and logging a finished segment."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from commitenv.sim.kernel.cached import (admit_hit, has_blocks_to_register, kv_register, kv_release, kv_room,
                                         kv_take, prefix_hit)

from commitenv.sim.kernel.heap import _cdiv, _wpop_front, _wpush_back, _wpush_front
from commitenv.sim.kernel.layout import (C_A, C_B, C_C1, C_C2, C_KAPPA, C_TAU0, C_TAU1, C_TAU2, C_TAU3, C_TAU4,
                                         GF_FLOOR_W, G_CLOCK, INF, I_CAPLEFT, I_DONE, I_LIVE, I_LOG, I_LOGM,
                                         I_PLAN_BUDGET, I_PLAN_N,
                                         I_PLAN_REP, LF_ENERGY, LF_FLOOR, LF_SHARE, LF_T0, LF_T1, LG_CLOCK, LG_GPU,
                                         LG_N, LG_REP, LG_STEPS, LM_COMPUTED, LM_DECODE, LM_NEW, LM_REQ, Q_BLOCKS,
                                         Q_COMPUTED, Q_FINISH, Q_FIRST, Q_GENERATED, Q_LAST, Q_MAXGAP, Q_OUT,
                                         Q_OVERHEAD, Q_PREEMPT,
                                         Q_PROMPT, Q_REPLICA, Q_STARTED, R_BATCH_N, R_BS, R_BT0, R_BUDGET, R_D, R_E0,
                                         R_ENERGY, R_F, R_FE, R_FLOOR_ACC, R_FLOOR_T, R_FLOOR_W, R_FREE, R_FT, R_GPU,
                                         R_K, R_LOCAL, R_LOGGED, R_MAXSEQ, R_NEND, R_NPOS, R_RESERVE, R_RUN_N, R_SCLK,
                                         R_SEG, R_SHARE, R_SSHARE, R_STATE, R_T0, R_T1, R_UNF, R_WHEAD, R_WLEN, S_CELL0,
                                         S_CLOSED, S_LOG, S_NOISE)
from commitenv.sim.states import ACTIVE, SEG_NONE, SEG_RUN, SEG_STEP


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
    """Give ``r`` its ``need`` new KV blocks (taken from the free ones by `kv_take`) and a place in the batch with ``k``
    tokens; the new batch length."""
    qi[r, Q_BLOCKS] += need
    bq[rep, nb] = r
    bk[rep, nb] = k
    return nb + 1


@njit(cache=True)
def _schedule(ri, qi, wq, run, bq, bk, rep, budget, max_seqs, bs, reserve_full, pfx):
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
            kv_release(rep, victim, ri, qi, pfx)  # (vLLM's recompute preemption)
            qi[victim, Q_COMPUTED] = 0
            qi[victim, Q_PREEMPT] += 1
            _wpush_front(ri, wq, rep, victim)
            preempted = True
            if victim == r:
                scheduled = False
                break
        if not scheduled:
            break
        kv_take(rep, need, ri, pfx)
        nb = _batch_add(ri, qi, bq, bk, rep, nb, r, k, need)
        if has_blocks_to_register(r, qi):
            kv_register(rep, r, qi[r, Q_COMPUTED] + k, qi, pfx)
        budget -= k
        i += 1
    if preempted:
        return nb, True
    draining = ri[rep, R_STATE] != ACTIVE
    while ri[rep, R_WLEN] > 0 and budget > 0 and ri[rep, R_RUN_N] < max_seqs:
        r = ri[rep, R_WHEAD]
        if draining and qi[r, Q_STARTED] == 0:
            break  # a draining replica admits no new work (queued ones were moved away)
        n, cost, k, need = prefix_hit(rep, r, budget, bs, reserve_full, ri, qi, pfx)
        if n == -1:
            break
        if n == -2:
            left = qi[r, Q_PROMPT] + qi[r, Q_GENERATED] - qi[r, Q_COMPUTED]
            k = left if left < budget else budget
            need = _cdiv(qi[r, Q_COMPUTED] + k, bs) - qi[r, Q_BLOCKS]
            if need > ri[rep, R_FREE]:
                break
            if reserve_full and _cdiv(qi[r, Q_PROMPT] + qi[r, Q_GENERATED], bs) - qi[r, Q_BLOCKS] > ri[rep, R_FREE]:
                break
        _wpop_front(ri, wq, rep)
        nb = _admit(rep, r, n, cost, k, need, nb, ri, qi, run, bq, bk, pfx)
        budget -= k
    return nb, False


@njit(cache=True)
def _admit(rep, r, n, cost, k, need, nb, ri, qi, run, bq, bk, pfx):
    """`Replica._admit` of waiting request ``r`` (out of the queue): its prefix hit (``n`` >= 0: the prefix path),
    its place in the running list and the batch with ``k`` tokens and ``need`` new blocks, the blocks those tokens
    complete registered. Returns the new batch length."""
    admit_hit(rep, r, n, cost, ri, qi, pfx)
    run[rep, ri[rep, R_RUN_N]] = r
    ri[rep, R_RUN_N] += 1
    qi[r, Q_STARTED] = 1
    kv_take(rep, need, ri, pfx)
    nb = _batch_add(ri, qi, bq, bk, rep, nb, r, k, need)
    if n >= 0 and has_blocks_to_register(r, qi):
        kv_register(rep, r, qi[r, Q_COMPUTED] + k, qi, pfx)
    return nb


@njit(cache=True)
def _schedule_ordered(ri, qi, wq, run, bq, bk, rep, plan, on_run, cap, pfx):  # noqa: C901
    """`Replica.schedule_ordered`: the next step's batch from a local policy's plan (kernel indices, highest priority
    first; ``on_run[p]``: ``plan[p]`` is running, else waiting; checked by the host): each takes ``min(tokens left,
    budget left)`` tokens if its KV blocks (and, waiting, the sequence cap and draining rule) allow, else it is
    skipped; never preempts; ``cap`` > 0: the plan's own token budget, when below the replica's. Admitted requests
    leave the waiting queue, the rest keep their order. Returns the batch length."""
    budget, bs, reserve_full = ri[rep, R_BUDGET], ri[rep, R_BS], ri[rep, R_RESERVE]
    if 0 < cap < budget:
        budget = cap
    draining = ri[rep, R_STATE] != ACTIVE
    nb = 0
    admitted = 0
    for p in range(plan.shape[0]):
        if budget <= 0:
            break
        r = plan[p]
        if on_run[p]:
            k = qi[r, Q_PROMPT] + qi[r, Q_GENERATED] - qi[r, Q_COMPUTED]
            if k > budget:
                k = budget
            need = _cdiv(qi[r, Q_COMPUTED] + k, bs) - qi[r, Q_BLOCKS]
            if need > ri[rep, R_FREE]:
                continue
            kv_take(rep, need, ri, pfx)
            nb = _batch_add(ri, qi, bq, bk, rep, nb, r, k, need)
            if has_blocks_to_register(r, qi):
                kv_register(rep, r, qi[r, Q_COMPUTED] + k, qi, pfx)
            budget -= k
            continue
        if ri[rep, R_RUN_N] >= ri[rep, R_MAXSEQ] or (draining and qi[r, Q_STARTED] == 0):
            continue
        n, cost, k, need = prefix_hit(rep, r, budget, bs, reserve_full, ri, qi, pfx)
        if n == -1:
            continue
        if n == -2:
            k = qi[r, Q_PROMPT] + qi[r, Q_GENERATED] - qi[r, Q_COMPUTED]
            if k > budget:
                k = budget
            need = _cdiv(qi[r, Q_COMPUTED] + k, bs) - qi[r, Q_BLOCKS]
            if need > ri[rep, R_FREE]:
                continue
            if reserve_full and _cdiv(qi[r, Q_PROMPT] + qi[r, Q_GENERATED], bs) - qi[r, Q_BLOCKS] > ri[rep, R_FREE]:
                continue
        nb = _admit(rep, r, n, cost, k, need, nb, ri, qi, run, bq, bk, pfx)
        qi[r, Q_STARTED] = 2  # (admitted now: leaves the waiting queue below, then 1)
        admitted += 1
        budget -= k
    if admitted:
        n = ri[rep, R_WLEN]
        r = ri[rep, R_WHEAD]
        ri[rep, R_WLEN] = 0
        for _ in range(n):
            nxt = wq[r]
            if qi[r, Q_STARTED] == 2:
                qi[r, Q_STARTED] = 1
                wq[r] = -1
            else:
                _wpush_back(ri, wq, rep, r)
            r = nxt
    return nb


@njit(cache=True)
def _kv_steps(ri, qi, bq, rep, nb, kmax, bs, pfx):
    cap = kv_room(rep, ri, qi, ri[rep, R_WHEAD], ri[rep, R_WLEN], pfx)
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
def _start_segment(t, rep, ri, rf, qi, wq, run, bq, bk, coc, gi, gf, ftab, fetab, cell, sched, si, plan, on_run, pfx):
    """`Replica.start`: schedule (from the local plan the host wrote for ``rep``, when it fills anything; else the vLLM
    scheduler), then a closed-form decode run (unless the pool runs step by step or a local policy plans the
    replica's steps) or a single step."""
    budget, max_seqs, bs, reserve_full = ri[rep, R_BUDGET], ri[rep, R_MAXSEQ], ri[rep, R_BS], ri[rep, R_RESERVE]
    g = ri[rep, R_GPU]
    nb = 0
    preempted = False
    if si[I_PLAN_REP] == rep:
        si[I_PLAN_REP] = -1
        if si[I_PLAN_N] > 0:
            nb = _schedule_ordered(ri, qi, wq, run, bq, bk, rep, plan[: si[I_PLAN_N]], on_run[: si[I_PLAN_N]],
                                   si[I_PLAN_BUDGET], pfx)
    if nb == 0:
        nb, preempted = _schedule(ri, qi, wq, run, bq, bk, rep, budget, max_seqs, bs, reserve_full, pfx)
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
    row = g  # (the truth's factors are its GPU's; the legacy noise draws per replica)
    if sched[S_NOISE]:  # `NoiseSource.draw_for`: the replica's next draw, for the whole segment
        row = rep
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
    ft = ftab[row, j]
    fe = fetab[row, j]
    rf[rep, R_FT] = ft
    rf[rep, R_FE] = fe
    rf[rep, R_T0] = t
    rf[rep, R_FLOOR_W] = gf[g, GF_FLOOR_W]
    rf[rep, R_SSHARE] = rf[rep, R_SHARE]
    cl = gi[g, G_CLOCK]
    co = coc[rep]
    ri[rep, R_SCLK] = cl
    ri[rep, R_LOGGED] = sched[S_LOG]
    rf[rep, R_FLOOR_T] = t
    rf[rep, R_FLOOR_ACC] = 0.0
    if sched[S_CLOSED] and P == 0 and not preempted and not ri[rep, R_LOCAL]:
        kmax = 1 << 62
        for j in range(nb):
            r = bq[rep, j]
            x = qi[r, Q_OUT] - qi[r, Q_GENERATED]
            if x < kmax:
                kmax = x
        if kmax >= 2:
            kmax = _kv_steps(ri, qi, bq, rep, nb, kmax, bs, pfx)
        if kmax >= 2:
            ri[rep, R_SEG] = SEG_RUN
            ri[rep, R_K] = kmax
            T0 = co[cl, C_TAU0] + co[cl, C_TAU2] * n + co[cl, C_TAU3] * L
            D = co[cl, C_TAU3] * n
            E0 = co[cl, C_A] + co[cl, C_B] * n + co[cl, C_KAPPA] * L
            F = co[cl, C_KAPPA] * n
            rf[rep, R_BT0], rf[rep, R_D], rf[rep, R_E0], rf[rep, R_F] = T0, D, E0, F
            rf[rep, R_T1] = t + ft * (kmax * T0 + D * kmax * (kmax - 1) / 2)
            rf[rep, R_ENERGY] = fe * (kmax * E0 + F * kmax * (kmax - 1) / 2)
            if rf[rep, R_T1] > t_next:
                _cut(rf, ri, rep, t_next)
            return True
    dt = ft * (co[cl, C_TAU0] + co[cl, C_TAU1] * P + co[cl, C_TAU2] * n + co[cl, C_TAU3] * L
               + co[cl, C_TAU4] * A)
    ri[rep, R_SEG] = SEG_STEP
    rf[rep, R_T1] = t + dt
    rf[rep, R_ENERGY] = fe * (co[cl, C_A] + co[cl, C_C1] * P + co[cl, C_C2] * A + co[cl, C_B] * n
                              + co[cl, C_KAPPA] * L)
    return True


@njit(cache=True)
def _token_at(qf, r, t):
    """Request ``r`` produced an output token at ``t``: its first, or a gap since its previous one (per-token TBT)."""
    if qf[r, Q_FIRST] < 0:
        qf[r, Q_FIRST] = t
    elif t - qf[r, Q_LAST] > qf[r, Q_MAXGAP]:
        qf[r, Q_MAXGAP] = t - qf[r, Q_LAST]
    qf[r, Q_LAST] = t


@njit(cache=True)
def _decode(ri, rf, qi, qf, bq, rep, m, bs, pfx):
    """Every member of ``rep``'s decode run adds the tokens of the run's first ``m`` steps and KV blocks to hold them;
    returns how many are done. Step i of the run lasts ``ft (T0 + i D)``: a member's gaps are the time from its
    previous token to the first step's end, then the steps' own durations (longest: the first or the last)."""
    t0, ft, T0, D = rf[rep, R_T0], rf[rep, R_FT], rf[rep, R_BT0], rf[rep, R_D]
    first_end = t0 + ft * T0
    inner = ft * max(T0 + D, T0 + (m - 1) * D) if m > 1 else 0.0
    t_end = t0 + _run_time(rf, rep, m)
    ndone = 0
    for j in range(ri[rep, R_BATCH_N]):
        r = bq[rep, j]
        _token_at(qf, r, first_end)
        if inner > qf[r, Q_MAXGAP]:
            qf[r, Q_MAXGAP] = inner
        qf[r, Q_LAST] = t_end
        qi[r, Q_COMPUTED] += m
        qi[r, Q_GENERATED] += m
        nbk = _cdiv(qi[r, Q_COMPUTED], bs)
        kv_take(rep, nbk - qi[r, Q_BLOCKS], ri, pfx)
        qi[r, Q_BLOCKS] = nbk
        if qi[r, Q_GENERATED] >= qi[r, Q_OUT]:
            ndone += 1
    return ndone


@njit(cache=True)
def _log_segment(rep, t0, t1, n_steps, energy, floor_j, ri, rf, qi, bq, bk, si, lgi, lgf, lgm):
    """`ReferencePool._book`'s step log entry of ``rep``'s segment (or its finished part), written before its progress
    is applied: members with their new tokens, computed tokens before and decode flags (`batch_terms`)."""
    e, mo, nb = si[I_LOG], si[I_LOGM], ri[rep, R_BATCH_N]
    if e >= lgi.shape[0] or mo + nb > lgm.shape[0]:
        raise RuntimeError("kernel: step log full (the caller drains it before each event)")
    lgi[e, LG_REP], lgi[e, LG_STEPS], lgi[e, LG_CLOCK], lgi[e, LG_N] = rep, n_steps, ri[rep, R_SCLK], nb
    lgi[e, LG_GPU] = ri[rep, R_GPU]
    lgf[e, LF_T0], lgf[e, LF_T1], lgf[e, LF_ENERGY], lgf[e, LF_FLOOR] = t0, t1, energy, floor_j
    lgf[e, LF_SHARE] = rf[rep, R_SSHARE]
    run = ri[rep, R_SEG] == SEG_RUN
    for j in range(nb):
        r = bq[rep, j]
        k = 1 if run else bk[rep, j]
        lgm[mo + j, LM_REQ], lgm[mo + j, LM_NEW], lgm[mo + j, LM_COMPUTED] = r, k, qi[r, Q_COMPUTED]
        lgm[mo + j, LM_DECODE] = _is_decode(qi, r, k)
    si[I_LOG], si[I_LOGM] = e + 1, mo + nb


@njit(cache=True)
def _finish_segment(t, rep, ri, rf, qi, qf, qc, run, bq, bk, e_dyn, sched, done_out, si, lgi, lgf, lgm, pfx):
    """Book the segment's energy above its floor (and its step log entry), apply its progress, complete finished
    requests."""
    bs = ri[rep, R_BS]
    floor_j = rf[rep, R_FLOOR_ACC] + rf[rep, R_FLOOR_W] * (rf[rep, R_T1] - rf[rep, R_FLOOR_T])
    e_dyn[ri[rep, R_GPU]] += rf[rep, R_ENERGY] - floor_j
    seg = ri[rep, R_SEG]
    if sched[S_LOG] and ri[rep, R_LOGGED]:
        _log_segment(rep, rf[rep, R_T0], rf[rep, R_T1], ri[rep, R_K] if seg == SEG_RUN else 1, rf[rep, R_ENERGY],
                     floor_j, ri, rf, qi, bq, bk, si, lgi, lgf, lgm)
    ndone = 0
    if seg == SEG_STEP:
        for j in range(ri[rep, R_BATCH_N]):
            r = bq[rep, j]
            qi[r, Q_COMPUTED] += bk[rep, j]
            if qi[r, Q_COMPUTED] >= qi[r, Q_PROMPT] + qi[r, Q_GENERATED]:
                qi[r, Q_GENERATED] += 1
                _token_at(qf, r, rf[rep, R_T1])
                if qi[r, Q_GENERATED] >= qi[r, Q_OUT]:
                    ndone += 1
    elif seg == SEG_RUN:
        ndone = _decode(ri, rf, qi, qf, bq, rep, ri[rep, R_K], bs, pfx)
    if ndone:  # (their KV released in the batch's order, as `Replica.finish`)
        for j in range(ri[rep, R_BATCH_N]):
            r = bq[rep, j]
            if qi[r, Q_GENERATED] >= qi[r, Q_OUT]:
                kv_release(rep, r, ri, qi, pfx)
    ri[rep, R_BATCH_N] = 0
    if ndone:
        w = 0
        for i in range(ri[rep, R_RUN_N]):
            r = run[rep, i]
            if qi[r, Q_GENERATED] >= qi[r, Q_OUT]:
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
