"""The compiled event loop (`commitenv.sim.kernel`) against `Pool.run_until` on one benchmark hour: both run the
same fresh pool interval by interval; prints whether completion times and GPU meters agree bit for bit and the
wall time of each engine's calls (nothing else), with the machine factor of ../shared/tools/machine_factor.py.

    python benchmarks/bench_kernel.py [--seed 100000] [--scenario bench-h200-hour-fixed-a30]
        [--gpus N --clock I [--kv-extra B]]   # a stressed pool: N GPUs at clock index I, B spare KV blocks
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from commitenv.envs import CommitServeEnv
from commitenv.scenarios.build import engine_options
from commitenv.sim import kernel
from commitenv.sim.kernel import KernelState
from commitenv.sim.pool import Pool, PoolLayout
from machine import machine_factor  # benchmarks/machine.py (run as python benchmarks/NAME.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=100000)
    ap.add_argument("--scenario", default="bench-h200-hour-fixed-a30")
    ap.add_argument("--gpus", type=int)
    ap.add_argument("--clock", type=int, default=0)
    ap.add_argument("--kv-extra", type=int)
    a = ap.parse_args()
    kernel.ENABLED = False  # the pool runs the Python loop; the kernel runs beside it on its own state
    env = CommitServeEnv(a.scenario)
    env.reset(seed=a.seed)
    pool = env.pool
    if a.gpus is not None:
        pool = Pool(env.profiles, PoolLayout.single(a.gpus), engine_options(env.scenario, a.seed),
                    clock_mhz=env.clocks_mhz[a.clock])
        pool.attach(env.table)
        if a.kv_extra is not None:
            sch = pool.profiles[0].scheduler
            for rep in pool.replicas:
                rep.cap_blocks = rep.free_blocks = -(-sch.context_limit // sch.block_size) + a.kv_extra
    KernelState(pool).advance(0.0)  # compile (numba caches it on disk)
    ks = KernelState(pool)
    t_pool = t_kernel = 0.0
    meters_equal = True
    for k in [*range(1, 61), None]:
        t = math.inf if k is None else 60.0 * k
        t0 = time.perf_counter()
        pool.run_until(t)
        t_pool += time.perf_counter() - t0
        t0 = time.perf_counter()
        ks.advance(t)
        t_kernel += time.perf_counter() - t0
        if k is not None:
            meters_equal &= bool(np.array_equal(np.array([g.meter(t) for g in pool.gpus]), ks.meter(t)))
    out = {"scenario": a.scenario, "seed": a.seed, "gpus": len(pool.gpus), "requests": pool._n,
           "events_pool": pool.events, "events_kernel": ks.events, "preemptions": int(pool.preemptions.sum()),
           "finish_identical": bool(np.array_equal(np.nan_to_num(pool.finish_t, nan=-1.0),
                                                   np.nan_to_num(ks.finish_t, nan=-1.0))),
           "meters_identical": meters_equal, "pool_s": round(t_pool, 3), "kernel_s": round(t_kernel, 4),
           "ratio": round(t_pool / t_kernel, 1), "machine_factor": machine_factor()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
