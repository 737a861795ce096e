"""Site speed and scale: interval steps per second of the 4-pool site through `SiteEnv` (vLLM's action on every
pool, a whole day), the same site run in this process and sharded over 2 local Ray actors (wall, CPU and peak RSS per
shard), a 1,024-GPU site-day (32 pools of 32 GPUs, 16 H200 and 16 H20, vLLM) on 2 Ray actors, and the projection of a
10,000-GPU site-day (312 such pools) onto an 8-machine Ray cluster from the measured per-pool-day cost. The machine
factor of ../shared/tools/machine_factor.py is printed beside the figures (1.0 = the reference machine). Prints one
JSON object as its last line.

    python benchmarks/bench_site.py [--seed 0] [--no-1024] [--epact-pool-day]
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import yaml

from commitenv.site import SiteEnv, load_site
from commitenv.site.runner import run_site_episode
from machine import machine_factor  # benchmarks/machine.py (run as python benchmarks/NAME.py)

SITE = "site-4pool-day"


def env_steps(seed: int) -> dict[str, float]:
    """The 4-pool site-day through the Gymnasium env, every pool at vLLM's action."""
    env = SiteEnv(SITE)
    t0 = time.perf_counter()
    env.reset(seed=seed)
    reset_s = time.perf_counter() - t0
    action = {n: {"active": e.n_replicas, "clock": e.profile.reference_clock_index} for n, e in env.envs.items()}
    steps, done = 0, False
    t1, c1 = time.perf_counter(), time.process_time()
    while not done:
        _, _, done, _, _ = env.step(action)
        steps += 1
    wall = time.perf_counter() - t1
    return {"reset_s": round(reset_s, 2), "steps": steps, "steps_per_s": round(steps / wall, 1),
            "day_wall_s": round(wall, 1), "day_cpu_s": round(time.process_time() - c1, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def site_run(site, controller: str, seed: int, ray: bool, shards: int) -> dict:
    c0 = time.process_time()
    run = run_site_episode(site, controller, seed, ray_address="local" if ray else None, shards=shards)
    s = run.summary
    return {"controller": controller, "shards": s["shards"], "ray": ray, "wall_s": round(s["wall_s"], 1),
            "driver_cpu_s": round(time.process_time() - c0, 1), "cost_kwh_eq": round(s["cost_kwh_eq"], 4),
            "requests": s["requests"],
            "shards_cpu_s": [round(u["cpu_s"], 1) for u in s["shard_usage"]] if ray else None,
            "shards_peak_rss_mb": [round(u["peak_rss_mb"]) for u in s["shard_usage"]]}


def site_1024(folder: Path) -> Path:
    path = folder / "site-1024.yaml"
    path.write_text(yaml.safe_dump({
        "name": "site-1024", "description": "32 pools of 32 GPUs (16 H200, 16 H20): 1,024 GPUs",
        "pools": [{"name": "h200", "scenario": "bench-h200-day", "count": 16},
                  {"name": "h20", "scenario": "bench-h20-day", "count": 16}]}))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-1024", action="store_true", help="skip the 1,024-GPU site-day")
    ap.add_argument("--epact-pool-day", action="store_true",
                    help="also time one pool-day of ePACT+ with its miss margin (for the projection)")
    args = ap.parse_args()
    factor = machine_factor()
    out: dict = {"machine_factor": factor}
    load_site(SITE)  # the commitments' reference runs, cached before any timing
    out["env_4pool_day"] = env_steps(args.seed)
    print(json.dumps({"env_4pool_day": out["env_4pool_day"]}), flush=True)
    out["run_4pool_day"] = [site_run(SITE, "vllm", args.seed, False, 1), site_run(SITE, "vllm", args.seed, True, 2)]
    print(json.dumps({"run_4pool_day": out["run_4pool_day"]}), flush=True)
    assert out["run_4pool_day"][0]["cost_kwh_eq"] == out["run_4pool_day"][1]["cost_kwh_eq"]
    per_pool_day_cpu = {"vllm": sum(out["run_4pool_day"][1]["shards_cpu_s"]) / 4}
    if not args.no_1024:
        with tempfile.TemporaryDirectory() as d:
            site = load_site(site_1024(Path(d)))
            out["run_1024_gpu_day"] = site_run(site, "vllm", args.seed, True, 2)
        print(json.dumps({"run_1024_gpu_day": out["run_1024_gpu_day"]}), flush=True)
        per_pool_day_cpu["vllm"] = sum(out["run_1024_gpu_day"]["shards_cpu_s"]) / 32
    if args.epact_pool_day:
        from commitenv.evaluation import run_episode

        c0 = time.process_time()
        run_episode("epact_plus", "bench-h200-day", 1, controller_kwargs={"miss_margin": True, "workers": 0})
        per_pool_day_cpu["epact_plus_margin"] = time.process_time() - c0
    # the 10,000-GPU site-day: 312 pools on 8 machines of this kind (2 cores each: 16 actors), the driver's share
    # of the wall time measured on the 1,024-GPU run (its wall beyond the busiest shard's CPU)
    # the sharded run's wall over its busiest shard's CPU: waiting for the slowest shard, the driver, Ray's calls
    big = out.get("run_1024_gpu_day") or out["run_4pool_day"][1]
    lockstep = big["wall_s"] / max(big["shards_cpu_s"])
    proj = {}
    for ctrl, cpu in per_pool_day_cpu.items():
        proj[ctrl] = {"pool_day_cpu_s": round(cpu, 1), "pools": 312, "machines": 8, "cores": 16,
                      "lockstep_factor": round(lockstep, 2),
                      "site_day_wall_min": round(312 * cpu / 16 * lockstep / 60, 1)}
    out["projection_10k_gpu_day"] = proj
    print(json.dumps(out))


if __name__ == "__main__":
    main()
