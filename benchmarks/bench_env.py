"""Environment speed: reset time with a new trace every episode and steps per second on the single-hour H200
benchmark scenario (realism 'paper') with the vLLM controller, the same on the ideal reproduction hour, a full H20
day, and the time of gym.make. ``--envs 2`` also steps two envs in a Gymnasium AsyncVectorEnv; ``--attribution`` also
runs the bench hour and the bench H200 day with per-request attribution on (`CommitServeEnv(attribution=True)`, what
``commitenv attribute`` re-runs). The machine factor of ../shared/tools/machine_factor.py is printed beside the figures
(1.0 = the reference machine). Prints one JSON object as its last line.

    python benchmarks/bench_env.py [--episodes 5] [--envs 2] [--no-day] [--attribution]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import gymnasium as gym
import numpy as np

import commitenv  # noqa: F401  (registers the scenarios)
from commitenv_controllers import ControllerContext, make
from machine import machine_factor  # benchmarks/machine.py (run as python benchmarks/NAME.py)

HOUR = "commitenv/bench-h200-hour-fixed-a30-v0"
IDEAL_HOUR = "commitenv/epact-h200-hour-fixed-a30-v0"
DAY = "commitenv/epact-h20-day-v0"
BENCH_DAY = "commitenv/bench-h200-day-v0"



def episodes(env_id: str, controller: str, seeds: list[int], **env_kwargs) -> dict[str, float]:
    """Run one env over ``seeds`` (a new trace each time where the scenario draws one); reset and step times."""
    env = gym.make(env_id, **env_kwargs)
    env.reset(seed=seeds[0] + 1_000_000)  # warm: reference cache, length tables
    resets, steps, wall = [], 0, 0.0
    for seed in seeds:
        t0 = time.perf_counter()
        obs, info = env.reset(seed=seed)
        resets.append(time.perf_counter() - t0)
        ctrl = make(controller)
        ctrl.reset(ControllerContext.from_env(env), seed)
        done = False
        t1 = time.perf_counter()
        while not done:
            obs, r, done, trunc, info = env.step(ctrl.act(obs, info))
            steps += 1
        wall += time.perf_counter() - t1
    env.close()
    total = wall + sum(resets)
    return {"reset_ms": round(1000 * statistics.median(resets), 2), "steps_per_s": round(steps / wall, 1),
            "steps_per_s_with_reset": round(steps / total, 1), "episodes": len(seeds)}


def vector_steps(env_id: str, n_envs: int, n_steps: int) -> float:
    """Steps per second (summed over envs) of an AsyncVectorEnv of ``n_envs`` subprocess envs taking the vLLM action
    (all replicas, reference clock); episodes restart with new traces automatically."""
    envs = gym.vector.AsyncVectorEnv([lambda: gym.make(env_id) for _ in range(n_envs)])
    envs.reset(seed=list(range(n_envs)))
    e = gym.make(env_id).unwrapped
    act = {"active": np.full(n_envs, e.n_replicas), "clock": np.full(n_envs, e.profile.reference_clock_index)}
    t0 = time.perf_counter()
    for _ in range(n_steps):
        envs.step(act)
    wall = time.perf_counter() - t0
    envs.close()
    return round(n_envs * n_steps / wall, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=5)
    ap.add_argument("--envs", type=int, default=0, help="also measure an AsyncVectorEnv of this many envs")
    ap.add_argument("--no-day", action="store_true", help="skip the full-day episode")
    ap.add_argument("--attribution", action="store_true", help="also the bench hour and H200 day with attribution on")
    args = ap.parse_args()
    factor = machine_factor()
    gym.make(HOUR).close()  # warm the reference cache so make_s measures make itself
    t0 = time.perf_counter()
    gym.make(HOUR).close()
    make_s = time.perf_counter() - t0
    seeds = list(range(100, 100 + args.episodes))
    out: dict[str, object] = {"machine_factor": factor, "make_s": round(make_s, 4)}
    out["bench_hour"] = episodes(HOUR, "vllm", seeds)
    out["ideal_hour"] = episodes(IDEAL_HOUR, "vllm", seeds)
    if args.envs:
        out[f"bench_hour_vector_{args.envs}_steps_per_s"] = vector_steps(HOUR, args.envs, 240)
    if args.attribution:
        out["bench_hour_attribution"] = episodes(HOUR, "vllm", seeds, attribution=True)
        day = episodes(BENCH_DAY, "vllm", [100000], attribution=True)
        out["bench_day_attribution_wall_s"] = round(1440 / day["steps_per_s"], 2)
    if not args.no_day:
        gym.make(DAY).close()
        day = episodes(DAY, "vllm", [0])
        out["day_wall_s"] = round(1440 / day["steps_per_s"], 2)
    print(f"machine factor {factor} (1.0 = reference); bench hour: reset {out['bench_hour']['reset_ms']} ms, "
          f"{out['bench_hour']['steps_per_s']} steps/s; ideal hour: {out['ideal_hour']['steps_per_s']} steps/s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
