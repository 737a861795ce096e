"""The compiled loop's KV blocks with the prefix cache (`commitenv.sim.kernel.prefix` on ``pfx``): a request's release,
an allocation, the blocks a step's tokens complete registered, and the prefix hit of an admission, as `Replica`'s
`_release`, `_alloc`, `_register` and `_admission` / `_admit` do them.

``pfx`` is the tuple (``pr``, ``ps``, ``nd``, ``ent``, ``tab``, ``hh``, ``pe``, ``hout``): the caches of every
replica, the hash ids of every request's shareable prefix blocks (a request's run of ``Q_NH`` of them starts at
``Q_HOFF``), the entry each of those blocks references (-1: none; a request's prefix list is its blocks with an entry,
in order) and a scratch array for a lookup's hit. A pool without a cache passes arrays with no replica rows
(``pr.shape[0] == 0``): the blocks are then plain counts."""

from __future__ import annotations

from numba import njit

from commitenv.sim.kernel.heap import _cdiv
from commitenv.sim.kernel.layout import Q_BLOCKS, Q_COMPUTED, Q_GENERATED, Q_HOFF, Q_NH, Q_PFXN, Q_PROMPT, R_FREE
from commitenv.sim.kernel.prefix import (P_BT, P_EVICT, P_PE, acquire, give, head_free, lookup, register, release,
                                         reset, take)


@njit(cache=True)
def kv_release(rep, r, ri, qi, pfx):
    """`Replica._release`: request ``r``'s private blocks go back at once (to the free queue's tail), then its prefix
    entries, deepest first, those it held last."""
    pr, ps, nd, ent, tab, hh, pe, hout = pfx
    if pr.shape[0] == 0:
        ri[rep, R_FREE] += qi[r, Q_BLOCKS]
    else:
        base = qi[r, Q_HOFF]
        n = 0
        for j in range(qi[r, Q_PFXN]):
            if pe[base + j] >= 0:
                hout[n] = pe[base + j]
                pe[base + j] = -1
                n += 1
        private = qi[r, Q_BLOCKS] - pr[rep, P_PE] * n
        give(pr, ps, nd, rep, private)
        ri[rep, R_FREE] += private
        if n:
            ri[rep, R_FREE] += release(pr, ps, nd, ent, rep, hout, n)
    qi[r, Q_BLOCKS] = 0
    qi[r, Q_PFXN] = 0


@njit(cache=True)
def kv_take(rep, n, ri, pfx):
    """`Replica._alloc`: ``n`` free blocks (checked by the caller) from the free queue's head, evicting the cached
    entries it pops."""
    pr, ps, nd, ent, tab, hh, pe, hout = pfx
    if pr.shape[0] != 0 and n > 0:
        take(pr, ps, nd, ent, tab, rep, n)
    ri[rep, R_FREE] -= n


@njit(cache=True)
def kv_register(rep, r, upto, qi, pfx):
    """`Replica._register`: cache request ``r``'s shareable blocks that its computed tokens up to ``upto`` complete
    (a block another request cached first stays private to ``r``)."""
    pr, ps, nd, ent, tab, hh, pe, hout = pfx
    if pr.shape[0] == 0:
        return
    base, nh, bt = qi[r, Q_HOFF], qi[r, Q_NH], pr[rep, P_BT]
    j = qi[r, Q_PFXN]
    while j < nh and (j + 1) * bt <= upto:
        e = register(pr, ps, ent, tab, rep, hh[base + j])
        if e >= 0:
            pe[base + j] = e
        j += 1
    qi[r, Q_PFXN] = j


@njit(cache=True)
def has_blocks_to_register(r, qi):
    """Whether request ``r`` has shareable blocks its steps have not considered yet."""
    return qi[r, Q_PFXN] < qi[r, Q_NH]


@njit(cache=True)
def prefix_hit(rep, r, budget, bs, reserve_full, ri, qi, pfx):
    """`Replica._admission` of waiting request ``r`` on its prefix path (a cache, shareable blocks, nothing computed):
    (hit entries in ``hout[:n]``, n, their cost in free blocks, tokens ``k``, new blocks), n = -1 when it does not
    fit; n = -2 when the path does not apply (the caller takes the plain one)."""
    pr, ps, nd, ent, tab, hh, pe, hout = pfx
    if pr.shape[0] == 0 or qi[r, Q_NH] == 0 or qi[r, Q_COMPUTED] != 0:
        return -2, 0, 0, 0
    base = qi[r, Q_HOFF]
    n, cost = lookup(pr, ent, tab, rep, hh[base: base + qi[r, Q_NH]], hout)
    per = pr[rep, P_PE]
    h = n * pr[rep, P_BT]
    left = qi[r, Q_PROMPT] + qi[r, Q_GENERATED] - h
    k = left if left < budget else budget
    need = _cdiv(h + k, bs) - n * per
    if need + cost > ri[rep, R_FREE]:
        return -1, 0, 0, 0
    if reserve_full and _cdiv(qi[r, Q_PROMPT] + qi[r, Q_GENERATED], bs) - n * per + cost > ri[rep, R_FREE]:
        return -1, 0, 0, 0
    return n, cost, k, need


@njit(cache=True)
def admit_hit(rep, r, n, cost, ri, qi, pfx):
    """The first part of `Replica._admit` on the prefix path: reference the ``n`` hit entries (``hout[:n]``), take
    them out of the free queue and skip their tokens."""
    pr, ps, nd, ent, tab, hh, pe, hout = pfx
    if n > 0:
        acquire(pr, ps, nd, ent, rep, hout, n)
        ri[rep, R_FREE] -= cost
        base = qi[r, Q_HOFF]
        for j in range(n):
            pe[base + j] = hout[j]
        qi[r, Q_COMPUTED] = n * pr[rep, P_BT]
        qi[r, Q_BLOCKS] = n * pr[rep, P_PE]
        qi[r, Q_PFXN] = n


@njit(cache=True)
def kv_room(rep, ri, qi, wq_head, wlen, pfx):
    """`Replica._kv_steps`' free blocks for a decode run: with cached entries evictable and a waiting head that could
    hit them, only the blocks before the first cached entry in the free queue (an eviction inside the run could change
    that head's admission)."""
    pr, ps, nd, ent, tab, hh, pe, hout = pfx
    if pr.shape[0] != 0 and pr[rep, P_EVICT] and wlen > 0 and qi[wq_head, Q_NH] > 0:
        return head_free(pr, nd, rep)
    return ri[rep, R_FREE]


@njit(cache=True)
def kv_reset(rep, free_blocks, pfx):
    """A fresh KV cache for replica ``rep`` (an instance loading on another GPU): its prefix cache emptied, with
    ``free_blocks`` free."""
    pr, ps, nd, ent, tab, hh, pe, hout = pfx
    if pr.shape[0] != 0:
        reset(pr, ps, nd, ent, tab, rep, free_blocks)
