"""Per-replica prefix block cache (vLLM automatic prefix caching at the granularity of the trace's hash blocks).

Requests carry the hash ids of their prompt's full blocks (Mooncake ``hash_ids``: one id per
``block_tokens`` tokens, an id naming the whole prefix up to its block). Semantics follow vLLM V1:

* a block is *registered* (becomes hittable) when the step that computes it is scheduled, so a request admitted
  later in the same scheduling pass already hits it;
* at admission a request skips its longest run of leading cached blocks; at least one prompt token is always
  computed, so only blocks ending at or before ``prompt - 1`` can hit (``shareable`` below);
* freed blocks join the tail of one FIFO queue of free blocks (a request's blocks tail first, so its deepest
  block leaves the queue first); a freed block keeps its cached content (it can still be hit, which takes it
  out of the queue) until an allocation pops it from the head, which evicts it. vLLM's free-block queue works
  the same way; here it holds runs of uncached blocks and whole hash blocks (``per_entry`` KV blocks each).

A request only registers and hits its ``shareable`` blocks; a block that ends exactly at the prompt's last token
is computed privately (vLLM recomputes it on a full hit anyway). This keeps the cost of every block a function
of which requests hold it, the structure StepSplit's prefix split relies on (section 6.7).

Memory accounting (engine KV blocks of ``block_size`` tokens): a request's ``blocks`` counts every block its
KV spans; the ``prefix`` entries it references (hit or registered) are shared, so the request's private blocks
are ``blocks - per_entry * len(prefix)``. The replica's ``free_blocks`` is the length of the free queue, cached
free blocks included; ``evictable`` is how many of them the cache still holds.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import count


class PrefixEntry:
    """One cached prefix block: its hash id and how many live requests reference it."""

    __slots__ = ("h", "ref")

    def __init__(self, h: int) -> None:
        self.h = h
        self.ref = 0


class PrefixCache:
    """Hash -> entry map of one replica, and its FIFO queue of free KV blocks (runs of uncached blocks and
    unreferenced cached entries, oldest first)."""

    __slots__ = ("block_tokens", "per_entry", "entries", "queue", "evictable", "hit_tokens", "evictions", "_ids")

    def __init__(self, block_tokens: int, engine_block_size: int, free_blocks: int = 0) -> None:
        self.block_tokens = block_tokens
        self.per_entry = self.blocks_per_entry(block_tokens, engine_block_size)
        self.entries: dict[int, PrefixEntry] = {}
        # free queue: ("r", n) -> block count of an uncached run, ("e", hash) -> an unreferenced cached entry
        self.queue: OrderedDict[tuple, int | PrefixEntry] = OrderedDict()
        self._ids = count()
        self.give(free_blocks)
        self.evictable = 0  # engine blocks held by unreferenced entries (a part of the replica's free blocks)
        self.hit_tokens = 0  # prompt tokens skipped by cache hits so far (statistics)
        self.evictions = 0

    @staticmethod
    def blocks_per_entry(block_tokens: int, engine_block_size: int) -> int:
        """Engine KV blocks per prefix hash block (ValueError unless a positive multiple of the engine's block)."""
        if block_tokens < 1 or block_tokens % engine_block_size:
            raise ValueError(
                f"prefix_block_tokens: expected a positive multiple of the profile's block_size "
                f"({engine_block_size}), got {block_tokens}"
            )
        return block_tokens // engine_block_size

    @staticmethod
    def shareable(n_hashes: int, prompt: int, block_tokens: int) -> int:
        """How many leading hash blocks of a prompt can be shared: full blocks ending before its last token."""
        return min(n_hashes, (prompt - 1) // block_tokens)

    def lookup(self, hashes: tuple[int, ...]) -> tuple[list[PrefixEntry], int]:
        """Longest cached run of leading ``hashes``: (entries, engine blocks it takes out of the free queue)."""
        hit: list[PrefixEntry] = []
        cost = 0
        entries = self.entries
        for h in hashes:
            e = entries.get(h)
            if e is None:
                break
            hit.append(e)
            if e.ref == 0:
                cost += self.per_entry
        return hit, cost

    def acquire(self, hit: list[PrefixEntry]) -> None:
        """Reference the entries a request hit (unreferenced ones leave the free queue)."""
        for e in hit:
            if e.ref == 0:
                del self.queue[("e", e.h)]
                self.evictable -= self.per_entry
            e.ref += 1
        self.hit_tokens += len(hit) * self.block_tokens

    def register(self, h: int) -> PrefixEntry | None:
        """A request computes block ``h``: cache it, referenced by that request (None if already cached, in
        which case the request's copy stays private, as vLLM keeps the first cached copy)."""
        if h in self.entries:
            return None
        e = PrefixEntry(h)
        e.ref = 1
        self.entries[h] = e
        return e

    def give(self, n: int) -> None:
        """``n`` uncached blocks join the tail of the free queue."""
        if n > 0:
            self.queue[("r", next(self._ids))] = n

    def release(self, prefix: list[PrefixEntry]) -> int:
        """A request drops its references, deepest block first; returns the engine blocks that became free."""
        freed = 0
        for e in reversed(prefix):
            e.ref -= 1
            if e.ref == 0:
                self.queue[("e", e.h)] = e
                self.evictable += self.per_entry
                freed += self.per_entry
        return freed

    def take(self, n: int) -> None:
        """Allocate ``n`` blocks from the head of the free queue (the caller checked they are free), evicting
        every cached entry popped; a partly used run or entry leaves its rest, uncached, at the head."""
        q = self.queue
        while n > 0:
            key, item = q.popitem(last=False)
            if key[0] == "e":
                del self.entries[key[1]]
                self.evictable -= self.per_entry
                self.evictions += 1
                size = self.per_entry
            else:
                size = item
            if size > n:
                rest = ("r", next(self._ids))
                q[rest] = size - n
                q.move_to_end(rest, last=False)
            n -= size

    def head_free(self) -> int:
        """Blocks that can be allocated before the first cached entry in the queue would be evicted."""
        total = 0
        for key, item in self.queue.items():
            if key[0] == "e":
                break
            total += item
        return total

    def free_entries(self) -> list[int]:
        """Hashes of the unreferenced cached entries, in queue order (next evicted first)."""
        return [k[1] for k in self.queue if k[0] == "e"]

    def clone(self) -> tuple["PrefixCache", dict[int, PrefixEntry]]:
        """A copy with fresh entries and the same queue; returns it and the hash -> new entry map."""
        c = PrefixCache.__new__(PrefixCache)
        c.block_tokens, c.per_entry = self.block_tokens, self.per_entry
        c.entries = {}
        for h, e in self.entries.items():
            ne = PrefixEntry(h)
            ne.ref = e.ref
            c.entries[h] = ne
        c.queue = OrderedDict((k, c.entries[k[1]] if k[0] == "e" else v) for k, v in self.queue.items())
        c._ids = count(next(self._ids))
        c.evictable, c.hit_tokens, c.evictions = self.evictable, self.hit_tokens, self.evictions
        return c, c.entries
