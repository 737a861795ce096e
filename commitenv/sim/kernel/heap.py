"""The event heap (time, kind, sequence; ``ht``, ``hk``, ``hs``, ``hi``, ``hv``) and the replicas' waiting queues
(linked lists through ``wq``), with the live-request helpers that walk them."""

from __future__ import annotations

import numpy as np
from numba import njit

from commitenv.sim.kernel.layout import (I_HEAP, I_SEQ, I_UHEAD, I_ULEN, I_UTAIL, Q_ARRIVAL, Q_BLOCKS, Q_COMPUTED,
                                         Q_GENERATED, Q_LAST, Q_OUT, Q_PROMPT, R_RUN_N, R_WHEAD, R_WLEN, R_WTAIL)
from commitenv.sim.states import EV_LAND


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
def _upush_back(si, wq, r):
    """Request ``r`` joins the unrouted list (`Pool.unrouted`, a linked list through ``wq`` headed in ``si``)."""
    wq[r] = -1
    if si[I_ULEN] == 0:
        si[I_UHEAD] = r
    else:
        wq[si[I_UTAIL]] = r
    si[I_UTAIL] = r
    si[I_ULEN] += 1


@njit(cache=True)
def _unrouted(si, wq):
    """The unrouted requests, in the order they joined."""
    out = np.empty(si[I_ULEN], np.int64)
    r = si[I_UHEAD]
    for j in range(out.shape[0]):
        out[j] = r
        r = wq[r]
    return out


@njit(cache=True)
def _waiting(ri, wq, x):
    out = np.empty(ri[x, R_WLEN], np.int64)
    r = ri[x, R_WHEAD]
    for j in range(out.shape[0]):
        out[j] = r
        r = wq[r]
    return out


@njit(cache=True)
def _transit(si, hk, hs, hi):
    """The requests migrating (an `EV_LAND` event each), in the order they left (`Pool.transit`'s)."""
    n = si[I_HEAP]
    k = 0
    for j in range(n):
        if hk[j] == EV_LAND:
            k += 1
    seq = np.empty(k, np.int64)
    idx = np.empty(k, np.int64)
    k = 0
    for j in range(n):
        if hk[j] == EV_LAND:
            seq[k], idx[k] = hs[j], hi[j]
            k += 1
    return idx[np.argsort(seq)]


@njit(cache=True)
def _live(ri, wq, run, si, hk, hs, hi):
    """Every live request (`Pool.live_requests`): each replica's running, then its waiting queue; the unrouted ones;
    the migrating ones."""
    unr = _unrouted(si, wq)
    tr = _transit(si, hk, hs, hi)
    n = unr.shape[0] + tr.shape[0]
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
    for r in unr:
        out[j] = r
        j += 1
    for r in tr:
        out[j] = r
        j += 1
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
def _task_rows(x, ri, qi, qf, wq, run, tvi, live_slots, head_deadline, row_deadline, pred_out, vis_dl):
    """Replica ``x``'s requests in the engine's order (running, then waiting) as a local policy sees them
    (`ReferenceHooks._task_view`): int rows (kernel index, slot, running, decode, tokens left, computed, prompt,
    generated, predicted output, blocks) and float rows (arrival, visible deadline, latest token). ``tvi``: the head's
    length, the first row's slot, the first row, and whether predictions and visible deadlines come from the pool's
    arrays by slot (``pred_out``, ``vis_dl``; else the lengths and deadlines the requests run to)."""
    n_live, slot0, row0, seen_pool = tvi[0], tvi[1], tvi[2], tvi[3] != 0
    nr = ri[x, R_RUN_N]
    n = nr + ri[x, R_WLEN]
    ints = np.empty((n, 10), np.int64)
    flts = np.empty((n, 3))
    r = ri[x, R_WHEAD]
    for j in range(n):
        if j < nr:
            k = run[x, j]
        else:
            k = r
            r = wq[r]
        slot = live_slots[k] if k < n_live else slot0 + k - n_live
        left = qi[k, Q_PROMPT] + qi[k, Q_GENERATED] - qi[k, Q_COMPUTED]
        dl = head_deadline[k] if k < n_live else row_deadline[row0 + k - n_live]
        ints[j, 0], ints[j, 1], ints[j, 2] = k, slot, j < nr
        ints[j, 3] = left == 1 and qi[k, Q_GENERATED] >= 1
        ints[j, 4], ints[j, 5], ints[j, 6], ints[j, 7] = left, qi[k, Q_COMPUTED], qi[k, Q_PROMPT], qi[k, Q_GENERATED]
        ints[j, 8] = pred_out[slot] if seen_pool else qi[k, Q_OUT]
        ints[j, 9] = qi[k, Q_BLOCKS]
        flts[j, 0] = qf[k, Q_ARRIVAL]
        flts[j, 1] = vis_dl[slot] if seen_pool else dl
        flts[j, 2] = qf[k, Q_LAST]
    return ints, flts
