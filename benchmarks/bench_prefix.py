"""The prefix cache's cost and effect on the compiled loop: the bench H200 hour's requests given shared prompt prefixes
(a Mooncake-like shape: each request's first hash blocks from one of a few long system prompts or conversation trees,
the rest its own), served to the end from a fresh pool with caching on and off; prints the CPU time of each, the
cache's hit tokens and evictions, the energy either way, with the machine factor of
../shared/tools/machine_factor.py.

    python benchmarks/bench_prefix.py [--seed 100000] [--trees 8] [--block-tokens 512] [--gpus 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time

import numpy as np

from commitenv.envs import CommitServeEnv
from commitenv.sim import Pool
from commitenv.sim.kernel.prefix import P_EVICTIONS, P_HIT
from machine import machine_factor  # benchmarks/machine.py (run as python benchmarks/NAME.py)


def with_prefixes(table, trees: int, bt: int, seed: int):
    """Hash blocks for every request: a shared run of ``k`` blocks from one of ``trees`` trees (``k`` uniform up to
    its prompt's blocks), then private ones (ids name whole prefixes, as Mooncake's do)."""
    rng = np.random.default_rng(seed)
    n = len(table)
    nb = -(-table.prompt_tokens // bt)
    tree = rng.integers(0, trees, n)
    shared = np.floor(rng.uniform(0, 1, n) * (nb + 1)).astype(np.int64)
    offs = np.concatenate([[0], np.cumsum(nb)]).astype(np.int64)
    flat = np.empty(int(offs[-1]), np.int64)
    for i in range(n):
        j = np.arange(nb[i])
        flat[offs[i]: offs[i + 1]] = np.where(j < shared[i], tree[i] * 1_000_000 + j, 10**12 + offs[i] + j)
    return dataclasses.replace(table, prefix_offsets=offs, prefix_hashes=flat)


def run(caching: bool, seed: int, trees: int, bt: int, gpus: int) -> dict:
    env = CommitServeEnv("bench-h200-hour-fixed-a30")
    env.reset(seed=seed)
    src = env.pool
    pool = Pool(src.profiles, src.layout, dataclasses.replace(src.opt, prefix_block_tokens=bt, prefix_caching=caching))
    pool.attach(with_prefixes(src.table, trees, bt, seed))
    if gpus:
        pool.set_active(0.0, gpus)
    c0 = time.process_time()
    pool.run_until(math.inf)
    cpu = time.process_time() - c0
    pr = pool._ks.pfx[0]  # (each replica's cache counters: no rows without a cache)
    return {"cpu_s": round(cpu, 3), "events": pool.events, "energy_mj": round(pool.energy_j() / 1e6, 4),
            "hit_tokens": int(pr[:, P_HIT].sum()), "evictions": int(pr[:, P_EVICTIONS].sum()),
            "requests": len(pool.table)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=100000)
    ap.add_argument("--trees", type=int, default=8)
    ap.add_argument("--block-tokens", type=int, default=512)
    ap.add_argument("--gpus", type=int, default=0, help="active replicas (0: the scenario's all)")
    a = ap.parse_args()
    on = run(True, a.seed, a.trees, a.block_tokens, a.gpus)
    off = run(False, a.seed, a.trees, a.block_tokens, a.gpus)
    print(json.dumps({"requests": on["requests"], "cached": on, "uncached": off,
                      "cpu_ratio": round(on["cpu_s"] / off["cpu_s"], 2), "machine_factor": machine_factor()}))


if __name__ == "__main__":
    main()
