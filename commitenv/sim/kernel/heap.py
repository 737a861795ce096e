"""The event heap (time, kind, sequence; ``ht``, ``hk``, ``hs``, ``hi``, ``hv``) and the replicas' waiting queues
(linked lists through ``wq``), with the live-request helpers that walk them."""

from __future__ import annotations

import numpy as np
from numba import njit

from commitenv.sim.kernel.layout import (I_HEAP, I_SEQ, Q_COMPUTED, Q_GENERATED, Q_PROMPT, R_RUN_N, R_WHEAD, R_WLEN,
                                         R_WTAIL)


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
