"""Festina's consolidation solve (Phase Two: the SM, memory and joint bin packings on CP-SAT; Phase Three: the
EWR placement) against the number of GPUs: wall and CPU time of each phase, CP-SAT's status under its time limit
(OPTIMAL, FEASIBLE, UNKNOWN: then first-fit decreasing stands), the GPUs it plans against the trivial lower bound and
first-fit decreasing, and the peak memory, each size in a fresh process (a size that runs out of time or memory is
reported, not fatal); with the machine factor of ../shared/tools/machine_factor.py.

Instances: two LLM instances per GPU on average, a serverless mix (sec. 5 of the paper: many rarely used models, a
few busy ones): memory from a 7-70B fp16 family plus a KV budget, SM demand log-uniform 0.02-0.6, preferred clocks
on the H100's levels, busy time proportional to the SM demand. The sizes are synthetic; only the solver's scaling is
measured here.

    python benchmarks/bench_consolidation.py [--gpus 8,16,32,64,128,256,512,1024] [--seeds 0,1,2] [--time-limit 10]
        [--timeout 600]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

WEIGHTS_GB = (14.0, 16.0, 26.0, 64.0)  # 7B, 8B, 13B, 32B at fp16 (2 bytes per parameter)
WEIGHT_P = (0.4, 0.3, 0.2, 0.1)
CLOCKS_MHZ = (1200.0, 1500.0, 1755.0, 1980.0)
GPU_MEM_GB = 80.0


def instances(n_gpus: int, seed: int = 0) -> list:
    """Two instances per GPU on average: memory = weights + a KV budget of 10-40 % of the weights (at most 90 % of a
    GPU's memory after Festina's 5 % margin), SM demand
    log-uniform in [0.02, 0.6], a preferred clock, busy seconds per hour proportional to the SM demand."""
    import numpy as np
    from commitenv_controllers.festina.consolidation import LlmDemand

    rng = np.random.default_rng(seed)
    n = 2 * n_gpus
    w = rng.choice(WEIGHTS_GB, size=n, p=WEIGHT_P)
    mem = np.minimum(w * (1.0 + rng.uniform(0.1, 0.4, n)), 0.9 * 0.95 * GPU_MEM_GB)  # (within one GPU's margin)
    sm = np.exp(rng.uniform(np.log(0.02), np.log(0.6), n))
    freq = rng.choice(CLOCKS_MHZ, size=n)
    return [LlmDemand(f"llm{i}", float(freq[i]), float(sm[i]), float(mem[i]), float(3600.0 * sm[i])) for i in range(n)]


def one(n_gpus: int, time_limit_s: float, seed: int) -> dict:
    """Time the two phases on one size (run in its own process by `main`)."""
    from commitenv_controllers.festina.consolidation import min_gpus, place

    demands = instances(n_gpus, seed)
    c0, t0 = time.process_time(), time.perf_counter()
    plan = min_gpus(demands, gpu_mem_cap_gb=GPU_MEM_GB, time_limit_s=time_limit_s)
    c1, t1 = time.process_time(), time.perf_counter()
    placed, n_try = None, plan.n_gpu
    while placed is None and n_try <= len(demands):
        try:
            placed = place(demands, n_try, gpu_mem_cap_gb=GPU_MEM_GB)
        except ValueError:
            n_try += 1
    c2, t2 = time.process_time(), time.perf_counter()
    return {"gpus": n_gpus, "seed": seed, "llms": len(demands),
            "plan_wall_s": round(t1 - t0, 2), "plan_cpu_s": round(c1 - c0, 2),
            "place_wall_s": round(t2 - t1, 2), "place_cpu_s": round(c2 - c1, 2),
            "status": {"sm": plan.sm_packing.status, "mem": plan.mem_packing.status,
                       "joint": plan.vector_packing.status},
            "lower_bound": max(plan.sm_lower_bound, plan.mem_lower_bound), "paper_n_gpu": plan.paper_n_gpu,
            "joint_n_gpu": plan.n_gpu, "placed_on": n_try,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="8,16,32,64,128,256,512,1024")
    ap.add_argument("--time-limit", type=float, default=10.0, help="CP-SAT's limit per solve (the controller's default)")
    ap.add_argument("--timeout", type=float, default=600.0, help="wall limit for one size, in its own process")
    ap.add_argument("--seeds", default="0,1,2", help="instances per size")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    seeds = [int(x) for x in a.seeds.split(",")]
    if a.one is not None:
        print(json.dumps(one(a.one, a.time_limit, seeds[0])))
        return
    from machine import machine_factor  # benchmarks/machine.py (run as python benchmarks/NAME.py)

    rows = []
    for n in [int(x) for x in a.gpus.split(",")]:
        for seed in seeds:
            try:
                out = subprocess.run([sys.executable, __file__, "--one", str(n), "--time-limit", str(a.time_limit),
                                      "--seeds", str(seed)], capture_output=True, text=True, timeout=a.timeout)
                row = json.loads(out.stdout.splitlines()[-1]) if out.returncode == 0 else \
                    {"gpus": n, "seed": seed, "failed": f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}"}
            except subprocess.TimeoutExpired:
                row = {"gpus": n, "seed": seed, "failed": f"over {a.timeout:.0f} s"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(json.dumps({"time_limit_s": a.time_limit, "machine_factor": machine_factor()}))


if __name__ == "__main__":
    main()
