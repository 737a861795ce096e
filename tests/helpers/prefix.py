"""Workloads with prefix hash blocks for the engine's prefix-cache tests: a table given hash blocks, and prompts
drawn as prefixes of a few trees (ids name whole prefixes, as Mooncake's do)."""

from __future__ import annotations

import dataclasses

import numpy as np

# one replica's scheduler with a small, tight KV cache (preemptions and evictions come quickly)
SMALL_SCHED = dict(token_budget=32, max_seqs=4, context_limit=64, block_size=4, kv_capacity_tokens=64)


def with_hashes(table, hashes):
    """``table`` with the hash blocks ``hashes`` (one list per request) in the table's CSR form."""
    offs = np.concatenate([[0], np.cumsum([len(h) for h in hashes])]).astype(np.int64)
    flat = np.asarray([x for h in hashes for x in h], dtype=np.int64)
    return dataclasses.replace(table, prefix_offsets=offs, prefix_hashes=flat)


def tree_hashes(rng: np.random.Generator, prompts, bt: int, trees: int = 3, depth: int = 10) -> list[list[int]]:
    """Each prompt's hash blocks (one per ``bt`` tokens): the first of them a prefix of one of ``trees`` trees of
    ``depth`` blocks (a uniform length, 0 to ``depth``), the rest its own."""
    roots = [[100 * k + j for j in range(depth)] for k in range(trees)]
    out = []
    for p in prompts:
        root = roots[rng.integers(trees)]
        keep = int(rng.integers(0, depth + 1))
        hs = root[:keep] + [10_000 + int(rng.integers(1 << 30)) + j for j in range(depth - keep)]
        out.append(hs[: -(-int(p) // bt)])
    return out
