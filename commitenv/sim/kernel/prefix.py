"""The prefix block cache (`commitenv.sim.prefix_cache.PrefixCache`) of every replica compiled, on int64 arrays.

Five arrays hold the caches of ``R`` replicas, sized from known bounds (nothing grows inside numba):

* ``pr`` (R x N_PR): per replica the free queue's head and tail node, ``evictable``, ``hit_tokens``, ``evictions``,
  its ``per_entry`` and ``block_tokens``, the blocks in its free queue and its live entries;
* ``ps`` (N_PS): the heads of the free-node and free-entry stacks;
* ``nd`` (nodes x N_ND): the free queues, one doubly linked list per replica of nodes (kind run or entry, value: the
  run's block count or the entry's id, prev, next); a free node is on the free-node stack (linked through N_NEXT).
  A replica's queue holds at most ``cap_blocks`` nodes (every node is at least one free block); the pool holds
  ``cap_blocks + cap_blocks // per_entry`` per replica;
* ``ent`` (entries x N_ENT): the cached entries (hash, ref count, owner replica, its queue node or -1 while
  referenced); a free entry has owner -1 and is on the free-entry stack (linked through E_NODE). A replica holds at
  most ``cap_blocks // per_entry`` entries (each one is ``per_entry`` of its blocks, free or in use);
* ``tab``: the (replica, hash) -> entry map, an open-addressing table (linear probing, deletion by backward shift)
  of entry ids (-1: empty slot), at most half full.

The functions follow the Python class method by method, with the same order of the queue and the same counters
(tests/sim/test_kernel_prefix_cache.py holds them equal under random operations): `lookup` (the hit's entry ids
written into ``out``), `acquire`, `register` (the new entry's id, or -1), `give`, `release` (walks the entry ids
given deepest first, i.e. reversed), `take`, `head_free`, `free_entries`, and `reset` (an empty cache with one run
of free blocks: an instance moving GPUs). Entry ids are stable while an entry lives: requests hold them.
`PrefixArrays` builds the arrays on the host from `PrefixCache` objects and writes them back.
"""

from __future__ import annotations


import numpy as np
from numba import njit



# per-replica columns (``pr``)
P_HEAD, P_TAIL, P_EVICT, P_HIT, P_EVICTIONS, P_PE, P_BT, P_QBLK, P_NENT = range(9)
N_PR = 9
# scalars (``ps``): heads of the free-node and free-entry stacks (-1: empty)
S_NFREE, S_EFREE = range(2)
N_PS = 2
# node columns (``nd``) and kinds
N_KIND, N_VAL, N_PREV, N_NEXT = range(4)
N_ND = 4
K_FREE, K_RUN, K_ENT = -1, 0, 1
# entry columns (``ent``)
E_HASH, E_REF, E_REP, E_NODE = range(4)
N_ENT = 4


# ------------------------------------------------------------------------------------------------- the hash map
@njit(cache=True)
def _slot(mask, r, h):
    """Home slot of key (replica ``r``, hash ``h``) in a table of ``mask + 1`` slots."""
    x = h * -7046029254386353131 + r * 7146996355962920985
    x ^= x >> 31
    x *= 2685821657736338717
    x ^= x >> 29
    return x & mask


@njit(cache=True)
def find(ent, tab, r, h):
    """Entry id of hash ``h`` in replica ``r``'s cache, or -1."""
    mask = tab.shape[0] - 1
    i = _slot(mask, r, h)
    while True:
        e = tab[i]
        if e < 0:
            return -1
        if ent[e, E_HASH] == h and ent[e, E_REP] == r:
            return e
        i = (i + 1) & mask


@njit(cache=True)
def _tab_insert(ent, tab, e):
    """Put entry ``e`` (not in the table) into the table."""
    mask = tab.shape[0] - 1
    i = _slot(mask, ent[e, E_REP], ent[e, E_HASH])
    while tab[i] >= 0:
        i = (i + 1) & mask
    tab[i] = e


@njit(cache=True)
def _tab_delete(ent, tab, e):
    """Take entry ``e`` out of the table, shifting the probe run after it back (no tombstones)."""
    mask = tab.shape[0] - 1
    i = _slot(mask, ent[e, E_REP], ent[e, E_HASH])
    while tab[i] != e:
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        f = tab[j]
        if f < 0:
            break
        k = _slot(mask, ent[f, E_REP], ent[f, E_HASH])
        if i <= j:
            stays = i < k <= j
        else:
            stays = k > i or k <= j
        if not stays:
            tab[i] = f
            i = j
    tab[i] = -1


# ------------------------------------------------------------------------------------------------- nodes, entries
@njit(cache=True)
def _node_new(ps, nd, kind, val):
    """A node off the free-node stack, unlinked, holding (kind, val)."""
    n = ps[S_NFREE]
    if n < 0:
        raise RuntimeError("prefix cache: node pool full")
    ps[S_NFREE] = nd[n, N_NEXT]
    nd[n, N_KIND] = kind
    nd[n, N_VAL] = val
    nd[n, N_PREV] = -1
    nd[n, N_NEXT] = -1
    return n


@njit(cache=True)
def _node_free(ps, nd, n):
    """Push unlinked node ``n`` onto the free-node stack."""
    nd[n, N_KIND] = K_FREE
    nd[n, N_VAL] = 0
    nd[n, N_PREV] = -1
    nd[n, N_NEXT] = ps[S_NFREE]
    ps[S_NFREE] = n


@njit(cache=True)
def _link_tail(pr, nd, r, n):
    """Append node ``n`` to replica ``r``'s free queue."""
    t = pr[r, P_TAIL]
    nd[n, N_PREV] = t
    nd[n, N_NEXT] = -1
    if t < 0:
        pr[r, P_HEAD] = n
    else:
        nd[t, N_NEXT] = n
    pr[r, P_TAIL] = n


@njit(cache=True)
def _link_head(pr, nd, r, n):
    """Put node ``n`` first in replica ``r``'s free queue."""
    h = pr[r, P_HEAD]
    nd[n, N_PREV] = -1
    nd[n, N_NEXT] = h
    if h < 0:
        pr[r, P_TAIL] = n
    else:
        nd[h, N_PREV] = n
    pr[r, P_HEAD] = n


@njit(cache=True)
def _unlink(pr, nd, r, n):
    """Take node ``n`` out of replica ``r``'s free queue (O(1), anywhere in it)."""
    p = nd[n, N_PREV]
    q = nd[n, N_NEXT]
    if p < 0:
        pr[r, P_HEAD] = q
    else:
        nd[p, N_NEXT] = q
    if q < 0:
        pr[r, P_TAIL] = p
    else:
        nd[q, N_PREV] = p
    nd[n, N_PREV] = -1
    nd[n, N_NEXT] = -1


@njit(cache=True)
def _ent_new(ps, ent, r, h):
    """An entry off the free-entry stack: hash ``h`` of replica ``r``, unreferenced, in no queue node."""
    e = ps[S_EFREE]
    if e < 0:
        raise RuntimeError("prefix cache: entry pool full")
    ps[S_EFREE] = ent[e, E_NODE]
    ent[e, E_HASH] = h
    ent[e, E_REF] = 0
    ent[e, E_REP] = r
    ent[e, E_NODE] = -1
    return e


@njit(cache=True)
def _ent_free(ps, ent, e):
    """Push entry ``e`` (out of the table and queue) onto the free-entry stack."""
    ent[e, E_HASH] = 0
    ent[e, E_REF] = 0
    ent[e, E_REP] = -1
    ent[e, E_NODE] = ps[S_EFREE]
    ps[S_EFREE] = e


# ------------------------------------------------------------------------------------------------- PrefixCache's methods
@njit(cache=True)
def shareable(n_hashes, prompt, block_tokens):
    """How many leading hash blocks of a prompt can be shared: full blocks ending before its last token."""
    return min(n_hashes, (prompt - 1) // block_tokens)


@njit(cache=True)
def lookup(pr, ent, tab, r, hashes, out):
    """Longest cached run of leading ``hashes`` in replica ``r``: its entry ids into ``out``; (length, engine blocks
    it takes out of the free queue)."""
    pe = pr[r, P_PE]
    n = 0
    cost = 0
    for h in hashes:
        e = find(ent, tab, r, h)
        if e < 0:
            break
        if n >= out.shape[0]:
            raise RuntimeError("prefix cache: lookup's out array too short")
        out[n] = e
        n += 1
        if ent[e, E_REF] == 0:
            cost += pe
    return n, cost


@njit(cache=True)
def hit_count(ent, tab, r, hashes):
    """Length of the longest cached run of leading ``hashes`` in replica ``r`` (the dispatch view's hit)."""
    n = 0
    for h in hashes:
        if find(ent, tab, r, h) < 0:
            break
        n += 1
    return n


@njit(cache=True)
def acquire(pr, ps, nd, ent, r, ids, n):
    """Reference the entries ``ids[:n]`` a request of replica ``r`` hit (unreferenced ones leave the free queue)."""
    pe = pr[r, P_PE]
    for i in range(n):
        e = ids[i]
        if ent[e, E_REF] == 0:
            node = ent[e, E_NODE]
            _unlink(pr, nd, r, node)
            _node_free(ps, nd, node)
            ent[e, E_NODE] = -1
            pr[r, P_EVICT] -= pe
            pr[r, P_QBLK] -= pe
        ent[e, E_REF] += 1
    pr[r, P_HIT] += n * pr[r, P_BT]


@njit(cache=True)
def register(pr, ps, ent, tab, r, h):
    """A request of replica ``r`` computes block ``h``: cache it, referenced once; its entry id, or -1 when already
    cached (the request's copy stays private)."""
    if find(ent, tab, r, h) >= 0:
        return -1
    e = _ent_new(ps, ent, r, h)
    ent[e, E_REF] = 1
    _tab_insert(ent, tab, e)
    pr[r, P_NENT] += 1
    return e


@njit(cache=True)
def give(pr, ps, nd, r, n):
    """``n`` uncached blocks join the tail of replica ``r``'s free queue (as one run)."""
    if n > 0:
        node = _node_new(ps, nd, K_RUN, n)
        _link_tail(pr, nd, r, node)
        pr[r, P_QBLK] += n


@njit(cache=True)
def release(pr, ps, nd, ent, r, ids, n):
    """A request of replica ``r`` drops its references ``ids[:n]``, deepest (last) first; the engine blocks that
    became free."""
    pe = pr[r, P_PE]
    freed = 0
    for i in range(n - 1, -1, -1):
        e = ids[i]
        ent[e, E_REF] -= 1
        if ent[e, E_REF] == 0:
            node = _node_new(ps, nd, K_ENT, e)
            _link_tail(pr, nd, r, node)
            ent[e, E_NODE] = node
            pr[r, P_EVICT] += pe
            pr[r, P_QBLK] += pe
            freed += pe
    return freed


@njit(cache=True)
def _evict(pr, ps, ent, tab, r, e):
    """Drop entry ``e`` (popped from replica ``r``'s free queue) from the cache."""
    _tab_delete(ent, tab, e)
    _ent_free(ps, ent, e)
    pr[r, P_EVICT] -= pr[r, P_PE]
    pr[r, P_EVICTIONS] += 1
    pr[r, P_NENT] -= 1


@njit(cache=True)
def take(pr, ps, nd, ent, tab, r, n):
    """Allocate ``n`` blocks from the head of replica ``r``'s free queue (the caller checked they are free),
    evicting every entry popped; a partly used run or entry leaves its rest, uncached, at the head."""
    while n > 0:
        node = pr[r, P_HEAD]
        if node < 0:
            raise RuntimeError("prefix cache: take from an empty free queue")
        _unlink(pr, nd, r, node)
        if nd[node, N_KIND] == K_ENT:
            _evict(pr, ps, ent, tab, r, nd[node, N_VAL])
            size = pr[r, P_PE]
        else:
            size = nd[node, N_VAL]
        _node_free(ps, nd, node)
        pr[r, P_QBLK] -= size
        if size > n:
            rest = _node_new(ps, nd, K_RUN, size - n)
            _link_head(pr, nd, r, rest)
            pr[r, P_QBLK] += size - n
        n -= size


@njit(cache=True)
def head_free(pr, nd, r):
    """Blocks of replica ``r`` that can be allocated before the first cached entry in its queue would be evicted."""
    total = 0
    node = pr[r, P_HEAD]
    while node >= 0 and nd[node, N_KIND] == K_RUN:
        total += nd[node, N_VAL]
        node = nd[node, N_NEXT]
    return total


@njit(cache=True)
def free_entries(pr, nd, ent, r, out):
    """Hashes of replica ``r``'s unreferenced entries, in queue order (next evicted first), into ``out``; how many."""
    n = 0
    node = pr[r, P_HEAD]
    while node >= 0:
        if nd[node, N_KIND] == K_ENT:
            out[n] = ent[nd[node, N_VAL], E_HASH]
            n += 1
        node = nd[node, N_NEXT]
    return n


@njit(cache=True)
def reset(pr, ps, nd, ent, tab, r, free_blocks):
    """Empty replica ``r``'s cache (its entries, referenced or not, and queue nodes; counters zero) and give it
    ``free_blocks`` as one run. Walks every entry slot: for rare events (an instance moving GPUs)."""
    node = pr[r, P_HEAD]
    while node >= 0:
        nxt = nd[node, N_NEXT]
        nd[node, N_PREV] = -1
        _node_free(ps, nd, node)
        node = nxt
    for e in range(ent.shape[0]):
        if ent[e, E_REP] == r:
            _tab_delete(ent, tab, e)
            _ent_free(ps, ent, e)
    pr[r, P_HEAD] = -1
    pr[r, P_TAIL] = -1
    pr[r, P_EVICT] = 0
    pr[r, P_HIT] = 0
    pr[r, P_EVICTIONS] = 0
    pr[r, P_QBLK] = 0
    pr[r, P_NENT] = 0
    give(pr, ps, nd, r, free_blocks)


# ------------------------------------------------------------------------------------------------- host side
def _pow2(n: int) -> int:
    p = 8
    while p < n:
        p <<= 1
    return p


class PrefixArrays:
    """The prefix caches of ``R`` replicas on arrays (``pr``, ``ps``, ``nd``, ``ent``, ``tab``), sized from each
    replica's KV capacity ``caps[r]`` (blocks) and ``per_entry[r]``; built empty (one run of ``free[r]`` blocks, as a new
    `PrefixCache` holds them)."""

    __slots__ = ("pr", "ps", "nd", "ent", "tab")

    def __init__(self, caps, per_entry, block_tokens, free=None) -> None:
        R = len(caps)
        caps = [int(c) for c in caps]
        pe = [int(x) for x in per_entry]
        bt = [int(x) for x in block_tokens]
        if len(pe) != R or len(bt) != R:
            raise ValueError("PrefixArrays: caps, per_entry and block_tokens need one value per replica")
        n_nodes = sum(c + c // p for c, p in zip(caps, pe)) + 1
        n_ent = sum(c // p for c, p in zip(caps, pe)) + 1
        self.pr = np.zeros((R, N_PR), dtype=np.int64)
        self.pr[:, P_HEAD] = -1
        self.pr[:, P_TAIL] = -1
        self.pr[:, P_PE] = pe
        self.pr[:, P_BT] = bt
        self.nd = np.zeros((n_nodes, N_ND), dtype=np.int64)
        self.nd[:, N_KIND] = K_FREE
        self.nd[:, N_PREV] = -1
        self.nd[:, N_NEXT] = np.arange(1, n_nodes + 1)
        self.nd[-1, N_NEXT] = -1
        self.ent = np.zeros((n_ent, N_ENT), dtype=np.int64)
        self.ent[:, E_REP] = -1
        self.ent[:, E_NODE] = np.arange(1, n_ent + 1)
        self.ent[-1, E_NODE] = -1
        self.ps = np.zeros(N_PS, dtype=np.int64)
        self.ps[S_NFREE] = 0
        self.ps[S_EFREE] = 0
        self.tab = np.full(_pow2(2 * n_ent), -1, dtype=np.int64)
        if free is not None:
            for r, n in enumerate(free):
                give(self.pr, self.ps, self.nd, r, int(n))

    @property
    def R(self) -> int:
        return self.pr.shape[0]

    def queue(self, r: int) -> list[tuple[str, int]]:
        """Replica ``r``'s free queue, head first: ("r", blocks) per run, ("e", hash) per entry."""
        out = []
        nd, ent = self.nd, self.ent
        node = int(self.pr[r, P_HEAD])
        while node >= 0:
            if nd[node, N_KIND] == K_ENT:
                out.append(("e", int(ent[nd[node, N_VAL], E_HASH])))
            else:
                out.append(("r", int(nd[node, N_VAL])))
            node = int(nd[node, N_NEXT])
        return out

    def entries(self, r: int) -> dict[int, int]:
        """Replica ``r``'s cached hashes -> ref counts."""
        rows = np.nonzero(self.ent[:, E_REP] == r)[0]
        return {int(self.ent[e, E_HASH]): int(self.ent[e, E_REF]) for e in rows}

    def copy(self) -> "PrefixArrays":
        """An independent copy of every array."""
        c = PrefixArrays.__new__(PrefixArrays)
        c.pr, c.ps, c.nd, c.ent, c.tab = (self.pr.copy(), self.ps.copy(), self.nd.copy(), self.ent.copy(),
                                          self.tab.copy())
        return c

    def check(self) -> None:
        """Assert the arrays' invariants (links, counters, table) on the host (tests)."""
        nd, ent, pr = self.nd, self.ent, self.pr
        used_nodes = set()
        for r in range(self.R):
            node, prev, qblk, ents = int(pr[r, P_HEAD]), -1, 0, 0
            while node >= 0:
                assert int(nd[node, N_PREV]) == prev and node not in used_nodes
                used_nodes.add(node)
                if nd[node, N_KIND] == K_ENT:
                    e = int(nd[node, N_VAL])
                    assert ent[e, E_REP] == r and ent[e, E_REF] == 0 and ent[e, E_NODE] == node
                    qblk += int(pr[r, P_PE])
                    ents += 1
                else:
                    assert nd[node, N_KIND] == K_RUN and nd[node, N_VAL] > 0
                    qblk += int(nd[node, N_VAL])
                prev, node = node, int(nd[node, N_NEXT])
            assert int(pr[r, P_TAIL]) == prev
            assert qblk == pr[r, P_QBLK] and pr[r, P_EVICT] == ents * pr[r, P_PE]
            live = ent[:, E_REP] == r
            assert int(live.sum()) == pr[r, P_NENT]
            assert np.all((ent[live, E_REF] > 0) == (ent[live, E_NODE] < 0))
        free_nodes = 0
        node = int(self.ps[S_NFREE])
        while node >= 0:
            assert nd[node, N_KIND] == K_FREE
            free_nodes += 1
            node = int(nd[node, N_NEXT])
        assert free_nodes + len(used_nodes) == nd.shape[0]
        free_ents = 0
        e = int(self.ps[S_EFREE])
        while e >= 0:
            assert ent[e, E_REP] == -1
            free_ents += 1
            e = int(ent[e, E_NODE])
        live = np.nonzero(ent[:, E_REP] >= 0)[0]
        assert free_ents + len(live) == ent.shape[0]
        in_tab = self.tab[self.tab >= 0]
        assert sorted(in_tab.tolist()) == sorted(live.tolist())
        for e in live:
            assert find(ent, self.tab, int(ent[e, E_REP]), int(ent[e, E_HASH])) == e
