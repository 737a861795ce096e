"""The prefix cache on the compiled loop against the Python loop: the bench H200 hour's requests given shared prompt
prefixes (a Mooncake-like shape: each request's first hash blocks from one of a few long system prompts or
conversation trees, the rest its own), served to the end by each engine from a fresh pool; prints whether completion
times and meters agree bit for bit, the CPU time of each, the cache's hit tokens and evictions, with the machine
factor of ../shared/tools/machine_factor.py.

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
from commitenv.sim import kernel
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


def run(on_kernel: bool, seed: int, trees: int, bt: int, gpus: int) -> dict:
    kernel.ENABLED = on_kernel
    env = CommitServeEnv("bench-h200-hour-fixed-a30")
    env.reset(seed=seed)
    pool = env.pool
    pool.opt = dataclasses.replace(pool.opt, prefix_block_tokens=bt)
    pool.attach(with_prefixes(pool.table, trees, bt, seed))
    if gpus:
        pool.set_active(0.0, gpus)
    c0 = time.process_time()
    pool.run_until(math.inf)
    cpu = time.process_time() - c0
    out = {"on_kernel": pool._ks is not None, "cpu_s": round(cpu, 3), "events": pool.events,
           "finish": np.nan_to_num(pool.finish_t, nan=-1.0), "meters": pool.gpu_energy_j(pool.now)}
    if pool._ks is not None:
        pool._leave_kernel()
    out["hit_tokens"] = sum(r.pcache.hit_tokens for r in pool.replicas)
    out["evictions"] = sum(r.pcache.evictions for r in pool.replicas)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=100000)
    ap.add_argument("--trees", type=int, default=8)
    ap.add_argument("--block-tokens", type=int, default=512)
    ap.add_argument("--gpus", type=int, default=0, help="active replicas (0: the scenario's all)")
    a = ap.parse_args()
    py = run(False, a.seed, a.trees, a.block_tokens, a.gpus)
    kn = run(True, a.seed, a.trees, a.block_tokens, a.gpus)
    same = (np.array_equal(py["finish"], kn["finish"]) and np.array_equal(py["meters"], kn["meters"])
            and py["events"] == kn["events"] and py["hit_tokens"] == kn["hit_tokens"])
    if not same:
        raise SystemExit("bench_prefix: the engines disagree")
    print(json.dumps({"requests": int(len(py["finish"])), "events": py["events"], "identical": same,
                      "hit_tokens": int(py["hit_tokens"]), "evictions": int(py["evictions"]),
                      "python_cpu_s": py["cpu_s"], "kernel_cpu_s": kn["cpu_s"],
                      "ratio": round(py["cpu_s"] / kn["cpu_s"], 1), "machine_factor": machine_factor()}))


if __name__ == "__main__":
    main()
