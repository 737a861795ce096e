"""The compiled prefix cache (commitenv/sim/kernel/prefix.py) against the Python `PrefixCache`: hand-computed cases
(FIFO eviction of freed entries deepest first, a partly used entry leaving an uncached rest, O(1) removal of a hit
entry from the middle of the queue, shared references, reset), the hash map under insertions and deletions, the
arrays for new caches, and long random operation sequences on several replicas at once, compared after every
operation (return values, queue contents in order, counters, entries with ref counts, head_free, free_entries)."""

from __future__ import annotations

import numpy as np
import pytest

from commitenv.sim.prefix_cache import PrefixCache
from commitenv.sim.kernel import prefix as kp
from commitenv.sim.kernel.prefix import (E_HASH, E_REF, P_EVICT, P_EVICTIONS, P_HIT, P_NENT, P_QBLK, PrefixArrays)


def arr(xs):
    return np.asarray(xs, dtype=np.int64)


class Twin:
    """The Python caches and the arrays side by side, with the live requests of every replica."""

    def __init__(self, specs):
        # specs: (block_tokens, engine block size, cap_blocks) per replica
        self.specs = specs
        self.py = [PrefixCache(bt, bs, cap) for bt, bs, cap in specs]
        self.pa = PrefixArrays([cap for _, _, cap in specs], [bt // bs for bt, bs, _ in specs],
                               [bt for bt, _, _ in specs], free=[cap for _, _, cap in specs])
        self.reqs = [[] for _ in specs]  # per replica: dicts with ids, py (entries), blocks, path, next
        self.out = np.zeros(64, dtype=np.int64)
        self.before_reset = [[0, 0] for _ in specs]  # evictions and hit tokens of the caches reset away

    # ---- one operation on both, returning both results
    def lookup(self, r, path):
        hit, cost = self.py[r].lookup(tuple(path))
        n, kcost = kp.lookup(self.pa.pr, self.pa.ent, self.pa.tab, r, arr(path), self.out)
        ids = self.out[:n].copy()
        assert [int(self.pa.ent[e, E_HASH]) for e in ids] == [e.h for e in hit]
        assert kcost == cost
        assert kp.hit_count(self.pa.ent, self.pa.tab, r, arr(path)) == len(hit)
        return hit, list(ids), cost

    def acquire(self, r, hit, ids):
        self.py[r].acquire(hit)
        kp.acquire(self.pa.pr, self.pa.ps, self.pa.nd, self.pa.ent, r, arr(ids), len(ids))

    def register(self, r, h):
        e = self.py[r].register(h)
        k = kp.register(self.pa.pr, self.pa.ps, self.pa.ent, self.pa.tab, r, h)
        assert (k < 0) == (e is None)
        if e is not None:
            assert self.pa.ent[k, E_HASH] == h and self.pa.ent[k, E_REF] == 1
        return e, k

    def give(self, r, n):
        self.py[r].give(n)
        kp.give(self.pa.pr, self.pa.ps, self.pa.nd, r, n)

    def release(self, r, entries, ids):
        f = self.py[r].release(entries)
        k = kp.release(self.pa.pr, self.pa.ps, self.pa.nd, self.pa.ent, r, arr(ids), len(ids))
        assert k == f
        return f

    def take(self, r, n):
        self.py[r].take(n)
        kp.take(self.pa.pr, self.pa.ps, self.pa.nd, self.pa.ent, self.pa.tab, r, n)

    def reset(self, r, free):
        bt, bs, _ = self.specs[r]
        self.before_reset[r][0] += self.py[r].evictions
        self.before_reset[r][1] += self.py[r].hit_tokens
        self.py[r] = PrefixCache(bt, bs, free)
        kp.reset(self.pa.pr, self.pa.ps, self.pa.nd, self.pa.ent, self.pa.tab, r, free)
        self.reqs[r] = []

    def free(self, r):
        return sum(self.py[r].per_entry if k[0] == "e" else v for k, v in self.py[r].queue.items())

    def compare(self):
        compare(self.pa, self.py)


def py_queue(c):
    return [("e", k[1]) if k[0] == "e" else ("r", v) for k, v in c.queue.items()]


def compare(pa, caches):
    """Every observable of the arrays equal to the Python caches'."""
    out = np.zeros(max(1, pa.ent.shape[0]), dtype=np.int64)
    for r, c in enumerate(caches):
        assert pa.queue(r) == py_queue(c)
        assert pa.entries(r) == {h: e.ref for h, e in c.entries.items()}
        assert int(pa.pr[r, P_EVICT]) == c.evictable
        assert int(pa.pr[r, P_HIT]) == c.hit_tokens
        assert int(pa.pr[r, P_EVICTIONS]) == c.evictions
        assert int(pa.pr[r, P_NENT]) == len(c.entries)
        assert int(pa.pr[r, P_QBLK]) == sum(c.per_entry if k[0] == "e" else v for k, v in c.queue.items())
        assert kp.head_free(pa.pr, pa.nd, r) == c.head_free()
        n = kp.free_entries(pa.pr, pa.nd, pa.ent, r, out)
        assert out[:n].tolist() == c.free_entries()


# ------------------------------------------------------------------------------------------------- by hand
def test_fifo_eviction_of_freed_entries_deepest_first_by_hand():
    # one replica, hash blocks of one engine block (per_entry 1), 8 blocks: queue [r8]
    t = Twin([(4, 4, 8)])
    pa = t.pa
    t.take(0, 3)  # a request takes 3 blocks: [r5]
    e11, k11 = t.register(0, 11)
    e12, k12 = t.register(0, 12)
    assert t.register(0, 11) == (None, -1)  # already cached: the copy stays private
    assert pa.entries(0) == {11: 1, 12: 1}
    # the request leaves: 3 - 2 private blocks, then its entries deepest first -> [r5, r1, e12, e11]
    t.give(0, 1)
    assert t.release(0, [e11, e12], [k11, k12]) == 2
    assert pa.queue(0) == [("r", 5), ("r", 1), ("e", 12), ("e", 11)]
    assert pa.pr[0, P_EVICT] == 2 and pa.pr[0, P_QBLK] == 8
    assert kp.head_free(pa.pr, pa.nd, 0) == 6  # the two runs before the first entry
    t.compare()
    t.take(0, 5)  # pops r5 exactly: [r1, e12, e11], nothing evicted
    assert pa.queue(0) == [("r", 1), ("e", 12), ("e", 11)] and pa.pr[0, P_EVICTIONS] == 0
    t.take(0, 2)  # pops r1 and e12: hash 12 evicted -> [e11], evictable 1
    assert pa.queue(0) == [("e", 11)]
    assert pa.entries(0) == {11: 0} and pa.pr[0, P_EVICTIONS] == 1 and pa.pr[0, P_EVICT] == 1
    t.compare()
    # a prompt with hashes [11, 12] hits 11 only (12 was evicted), taking its 1 block out of the queue
    hit, ids, cost = t.lookup(0, [11, 12])
    assert [e.h for e in hit] == [11] and ids == [k11] and cost == 1
    t.acquire(0, hit, ids)  # queue empty, 4 tokens hit
    assert pa.queue(0) == [] and pa.pr[0, P_HIT] == 4 and pa.entries(0) == {11: 1} and pa.pr[0, P_EVICT] == 0
    t.compare()
    pa.check()


def test_a_partly_used_entry_leaves_an_uncached_rest_by_hand():
    # per_entry 2 (hash blocks of 8 tokens, engine blocks of 4), 6 blocks: [r6]
    t = Twin([(8, 4, 6)])
    pa = t.pa
    t.take(0, 4)  # [r2]
    e21, k21 = t.register(0, 21)
    e22, k22 = t.register(0, 22)
    t.give(0, 0)  # no private blocks: no run
    assert t.release(0, [e21, e22], [k21, k22]) == 4  # [r2, e22, e21], evictable 4
    assert pa.queue(0) == [("r", 2), ("e", 22), ("e", 21)] and pa.pr[0, P_EVICT] == 4
    t.take(0, 3)  # pops r2 (1 left to take), then e22 (2 blocks): 22 evicted, its other block a run at the head
    assert pa.queue(0) == [("r", 1), ("e", 21)]
    assert pa.pr[0, P_EVICTIONS] == 1 and pa.pr[0, P_EVICT] == 2 and pa.pr[0, P_QBLK] == 3
    assert kp.head_free(pa.pr, pa.nd, 0) == 1
    t.compare()
    # a hit on 21 takes it out of the middle of the queue: [r1, e21, r1] -> [r1, r1] (runs are not merged)
    t.give(0, 1)
    hit, ids, cost = t.lookup(0, [21, 22])
    assert ids == [k21] and cost == 2
    t.acquire(0, hit, ids)
    assert pa.queue(0) == [("r", 1), ("r", 1)] and pa.pr[0, P_HIT] == 8 and pa.pr[0, P_QBLK] == 2
    assert kp.head_free(pa.pr, pa.nd, 0) == 2
    t.compare()
    pa.check()


def test_shared_references_free_with_the_last_holder_by_hand():
    # two replicas with the same hash: separate entries; in replica 0 two requests share hash 5
    t = Twin([(4, 4, 4), (4, 4, 4)])
    pa = t.pa
    t.take(0, 1)
    e5, k5 = t.register(0, 5)  # request A of replica 0
    t.take(1, 1)
    f5, j5 = t.register(1, 5)  # replica 1's own entry for hash 5
    assert j5 != k5
    hit, ids, cost = t.lookup(0, [5])
    assert ids == [k5] and cost == 0  # referenced: costs no free block
    t.acquire(0, hit, ids)  # request B of replica 0
    assert pa.entries(0) == {5: 2} and pa.entries(1) == {5: 1}
    assert t.release(0, [e5], [k5]) == 0  # A leaves: B still holds it
    assert pa.queue(0) == [("r", 3)]
    assert t.release(0, [e5], [k5]) == 1  # B leaves: [r3, e5]
    assert pa.queue(0) == [("r", 3), ("e", 5)] and pa.queue(1) == [("r", 3)]
    t.compare()
    pa.check()


def test_reset_empties_one_replica():
    t = Twin([(4, 4, 6), (8, 4, 8)])
    pa = t.pa
    t.take(0, 2)
    a, ka = t.register(0, 1)
    b, kb = t.register(0, 2)
    t.release(0, [a], [ka])  # [r4, e1]; entry 2 still referenced
    t.take(1, 2)
    c, kc = t.register(1, 1)
    t.release(1, [c], [kc])  # replica 1: [r6, e1]
    hit, ids, _ = t.lookup(1, [1])
    t.acquire(1, hit, ids)
    t.take(1, 1)
    n_free_ent = pa.ps[kp.S_EFREE]
    t.reset(0, 5)  # both of replica 0's entries go (referenced or not), counters zero, one run of 5
    assert pa.queue(0) == [("r", 5)] and pa.entries(0) == {}
    assert pa.pr[0, P_EVICT] == pa.pr[0, P_HIT] == pa.pr[0, P_EVICTIONS] == pa.pr[0, P_NENT] == 0
    assert pa.queue(1) == [("r", 5)] and pa.entries(1) == {1: 1} and pa.pr[1, P_HIT] == 8
    assert pa.ps[kp.S_EFREE] != n_free_ent
    t.compare()
    pa.check()
    e, k = t.register(0, 2)  # an id off the free stack
    assert pa.entries(0) == {2: 1}
    t.compare()
    pa.check()


def test_hash_map_insertions_and_deletions():
    # a few replicas, hashes colliding across replicas; delete at random and find every survivor
    rng = np.random.default_rng(3)
    R, cap = 3, 200
    pa = PrefixArrays([cap] * R, [1] * R, [4] * R)
    live = {}
    for step in range(3000):
        r = int(rng.integers(R))
        h = int(rng.integers(400))
        if (r, h) in live and rng.random() < 0.6:
            e = live.pop((r, h))
            kp._tab_delete(pa.ent, pa.tab, e)
            kp._ent_free(pa.ps, pa.ent, e)
            pa.pr[r, P_NENT] -= 1
        elif (r, h) not in live and len(live) < R * cap:
            live[(r, h)] = kp.register(pa.pr, pa.ps, pa.ent, pa.tab, r, h)
        if step % 100 == 0:
            for (rr, hh), e in live.items():
                assert kp.find(pa.ent, pa.tab, rr, hh) == e
            for _ in range(20):
                rr, hh = int(rng.integers(R)), int(rng.integers(400))
                assert kp.find(pa.ent, pa.tab, rr, hh) == live.get((rr, hh), -1)
    assert int((pa.tab >= 0).sum()) == len(live)


def test_entry_pool_full_raises():
    pa = PrefixArrays([2], [1], [4], free=[2])
    kp.register(pa.pr, pa.ps, pa.ent, pa.tab, 0, 1)
    kp.register(pa.pr, pa.ps, pa.ent, pa.tab, 0, 2)
    kp.register(pa.pr, pa.ps, pa.ent, pa.tab, 0, 3)  # the pool keeps one spare entry
    with pytest.raises(RuntimeError, match="entry pool full"):
        kp.register(pa.pr, pa.ps, pa.ent, pa.tab, 0, 4)


def test_shareable():
    for n, p, bt in [(3, 9, 4), (3, 8, 4), (5, 100, 16), (0, 10, 4), (2, 1, 4)]:
        assert kp.shareable(n, p, bt) == PrefixCache.shareable(n, p, bt)


# ------------------------------------------------------------------------------------------------- random
def random_path(rng):
    """Hashes of a prompt from one of three prefix trees (ids name whole prefixes, so a child implies its path)."""
    tree = int(rng.integers(3))
    depth = int(rng.integers(1, 9))
    h, path = tree + 1, []
    for _ in range(depth):
        h = h * 4 + int(rng.integers(3 if rng.random() < 0.8 else 4))
        path.append(h)
    return path


def step(t, rng):
    """One random operation on a random replica (admission, growth, finish, a bare lookup, rarely a reset)."""
    r = int(rng.integers(len(t.py)))
    pe = t.py[r].per_entry
    reqs = t.reqs[r]
    u = rng.random()
    if u < 0.004:
        t.reset(r, t.specs[r][2])
    elif u < 0.4 or not reqs:  # admission: hit, allocate, register what the new blocks complete
        path = random_path(rng)
        hit, ids, cost = t.lookup(r, path)
        if rng.random() < 0.2 and hit:
            return  # admission refused
        t.acquire(r, hit, ids)
        need = int(rng.integers(0, t.free(r) + 1)) if rng.random() < 0.8 else min(t.free(r), 2 * pe)
        t.take(r, need)
        req = dict(py=list(hit), ids=list(ids), blocks=pe * len(hit) + need, path=path, next=len(hit))
        reqs.append(req)
        grow_register(t, r, req, need // pe)
    elif u < 0.65:  # a running request allocates more and registers more blocks
        req = reqs[int(rng.integers(len(reqs)))]
        n = int(rng.integers(0, min(t.free(r), 3 * pe) + 1))
        t.take(r, n)
        req["blocks"] += n
        private = req["blocks"] - pe * len(req["py"])
        grow_register(t, r, req, int(rng.integers(0, private // pe + 1)))
    elif u < 0.95:  # a request finishes or is preempted: private blocks, then its entries deepest first
        req = reqs.pop(int(rng.integers(len(reqs))))
        t.give(r, req["blocks"] - pe * len(req["py"]))
        t.release(r, req["py"], req["ids"])
    else:
        t.lookup(r, random_path(rng))


def grow_register(t, r, req, k):
    """Register up to ``k`` more hashes of the request's path (an already cached one stays private)."""
    path = req["path"]
    while k > 0 and req["next"] < len(path):
        e, kid = t.register(r, path[req["next"]])
        req["next"] += 1
        k -= 1
        if e is not None:
            req["py"].append(e)
            req["ids"].append(kid)


SPECS = [(4, 4, 24), (8, 4, 40), (16, 4, 64), (8, 8, 16)]


@pytest.mark.parametrize("seed", range(4))
def test_random_operations_match_the_python_cache(seed):
    rng = np.random.default_rng(seed)
    t = Twin(SPECS)
    for i in range(10000):
        step(t, rng)
        t.compare()
        if i % 50 == 0:
            t.pa.check()
        for r, c in enumerate(t.py):  # KV blocks add up: free + private + referenced entries == capacity
            pe = c.per_entry
            private = sum(q["blocks"] - pe * len(q["py"]) for q in t.reqs[r])
            referenced = pe * sum(1 for e in c.entries.values() if e.ref > 0)
            assert t.free(r) + private + referenced == SPECS[r][2]
    for c, (ev, hit) in zip(t.py, t.before_reset):  # every path was exercised
        assert c.evictions + ev > 0 and c.hit_tokens + hit > 0
    assert sum(ev for ev, _ in t.before_reset) > 0  # resets of caches in use
    t.pa.check()


def test_a_copy_is_independent():
    rng = np.random.default_rng(11)
    t = Twin(SPECS)
    for i in range(300):
        step(t, rng)
    cp = t.pa.copy()
    kp.give(cp.pr, cp.ps, cp.nd, 0, 3)
    assert cp.queue(0) != t.pa.queue(0)
    t.compare()


def test_new_arrays_hold_what_a_new_cache_holds():
    # a replica with no free block stays empty; the free blocks of a new cache are one run, as the Python cache's
    c = PrefixCache(8, 4, 10)
    pa = PrefixArrays([0, 10], [1, c.per_entry], [1, c.block_tokens], free=[0, 10])
    assert pa.queue(0) == [] and pa.queue(1) == py_queue(c) == [("r", 10)] and pa.entries(1) == {}
    compare(pa, [PrefixCache(4, 4, 0), c])
    pa.check()


def test_node_and_entry_pools_hold_the_worst_case():
    # cap 8, per_entry 2: 8 one-block runs fill the queue; then 4 entries (all the capacity) queued at once
    pa = PrefixArrays([8], [2], [8])
    for _ in range(8):
        kp.give(pa.pr, pa.ps, pa.nd, 0, 1)
    assert pa.queue(0) == [("r", 1)] * 8
    kp.take(pa.pr, pa.ps, pa.nd, pa.ent, pa.tab, 0, 8)
    ids = arr([kp.register(pa.pr, pa.ps, pa.ent, pa.tab, 0, h) for h in (1, 2, 3, 4)])
    assert kp.release(pa.pr, pa.ps, pa.nd, pa.ent, 0, ids, 4) == 8
    assert pa.queue(0) == [("e", 4), ("e", 3), ("e", 2), ("e", 1)]
    kp.take(pa.pr, pa.ps, pa.nd, pa.ent, pa.tab, 0, 7)  # evicts all four, a one-block rest at the head
    assert pa.queue(0) == [("r", 1)] and pa.entries(0) == {} and pa.pr[0, P_EVICTIONS] == 4
    pa.check()


# ------------------------------------------------------------------------------------------------- a real engine
def _mirrored(pa, r):
    """A `PrefixCache` subclass that repeats every call on replica ``r`` of ``pa`` and compares the results and
    the whole state after it (entries found by hash: a request's entries are live)."""
    out = np.zeros(256, dtype=np.int64)

    def ids_of(entries):
        return arr([kp.find(pa.ent, pa.tab, r, e.h) for e in entries])

    class Mirror(PrefixCache):
        __slots__ = ()
        calls = {"lookup": 0, "acquire": 0, "register": 0, "give": 0, "release": 0, "take": 0}

        def _check(self, name):
            Mirror.calls[name] += 1
            compare(_One(pa, r), [self])

        def lookup(self, hashes):
            hit, cost = super().lookup(hashes)
            n, kc = kp.lookup(pa.pr, pa.ent, pa.tab, r, arr(hashes), out)
            assert [int(pa.ent[e, E_HASH]) for e in out[:n]] == [e.h for e in hit] and kc == cost
            self._check("lookup")
            return hit, cost

        def acquire(self, hit):
            kp.acquire(pa.pr, pa.ps, pa.nd, pa.ent, r, ids_of(hit), len(hit))
            super().acquire(hit)
            self._check("acquire")

        def register(self, h):
            e = super().register(h)
            k = kp.register(pa.pr, pa.ps, pa.ent, pa.tab, r, h)
            assert (k < 0) == (e is None)
            self._check("register")
            return e

        def give(self, n):
            super().give(n)
            kp.give(pa.pr, pa.ps, pa.nd, r, n)
            self._check("give")

        def release(self, prefix):
            k = kp.release(pa.pr, pa.ps, pa.nd, pa.ent, r, ids_of(prefix), len(prefix))
            f = super().release(prefix)
            assert k == f
            self._check("release")
            return f

        def take(self, n):
            super().take(n)
            kp.take(pa.pr, pa.ps, pa.nd, pa.ent, pa.tab, r, n)
            self._check("take")

    return Mirror


class _One:
    """Replica ``r`` of a `PrefixArrays` seen as replica 0 (for `compare`)."""

    def __init__(self, pa, r):
        self.pa, self.r = pa, r
        self.ent, self.nd = pa.ent, pa.nd
        self.pr = pa.pr[r:r + 1]

    def queue(self, _):
        return self.pa.queue(self.r)

    def entries(self, _):
        return self.pa.entries(self.r)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("bt,budget", [(4, 16), (8, 12), (16, 12)])
def test_a_served_workload_replayed_on_the_arrays(bt, budget, seed):
    # the random prefix-tree workload of test_engine_prefix_cache (tight KV: preemptions, evictions): every cache
    # call the reference engine makes is repeated on the arrays, results and state compared after each
    from helpers.profiles import toy_profile
    from helpers.reference import ReferencePool
    from commitenv.sim import EngineOptions, NoiseSpec, PoolLayout
    from commitenv.workload.table import make_table
    from helpers.prefix import SMALL_SCHED as BIG
    from helpers.prefix import tree_hashes, with_hashes

    rng = np.random.default_rng(100 * seed + bt)
    n = 120
    arrivals = np.sort(rng.uniform(0, 1.0, n))
    prompts = rng.integers(1, 40, n)
    outputs = rng.integers(1, 12, n)
    hashes = tree_hashes(rng, prompts, bt)
    sched = dict(BIG, token_budget=budget, kv_capacity_tokens=80)
    opts = EngineOptions(noise=NoiseSpec(0, 0), log_steps=False, prefix_block_tokens=bt, closed_form=False)
    pool = ReferencePool(toy_profile(scheduler=sched), PoolLayout.single(1), opts)
    pool.attach(with_hashes(make_table(arrivals, prompts, outputs), hashes))
    rep = pool.replicas[0]
    pc = rep.pcache  # (new: every block free, in one run); the arrays hold it as replica 1 of two
    pa = PrefixArrays([0, rep.cap_blocks], [1, pc.per_entry], [1, pc.block_tokens], free=[0, rep.free_blocks])
    mirror = _mirrored(pa, 1)
    rep.pcache.__class__ = mirror
    pool.run_until(1e6)
    assert pool.completed == n
    assert all(v > 0 for v in mirror.calls.values())
    assert pa.pr[1, P_EVICTIONS] > 0 and pa.pr[1, P_HIT] > 0 and int(pa.pr[1, P_QBLK]) == rep.cap_blocks
    pa.check()


def test_lookup_refuses_a_short_out_array():
    pa = PrefixArrays([4], [1], [4], free=[4])
    for h in (1, 2):
        kp.register(pa.pr, pa.ps, pa.ent, pa.tab, 0, h)
    with pytest.raises(RuntimeError, match="too short"):
        kp.lookup(pa.pr, pa.ent, pa.tab, 0, arr([1, 2]), np.zeros(1, dtype=np.int64))
