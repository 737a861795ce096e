"""The environment on the compiled event loop against the Python loop: the single-hour H200 benchmark with a
controller, first with the kernel off (COMMITENV_KERNEL=0's switch), then on; checks that observations, rewards and
the settled costs agree exactly and prints steps/s of both with the machine factor.

    python benchmarks/bench_env_kernel.py [--controller vllm] [--episodes 3]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from commitenv.control import ControllerContext
from commitenv.envs import CommitServeEnv
from commitenv.registry import resolve
from commitenv.sim import kernel
from machine import machine_factor  # benchmarks/machine.py (run as python benchmarks/NAME.py)


def run(scenario: str, controller: str, seeds: list[int]) -> tuple[list, float, int]:
    env = CommitServeEnv(scenario)
    env.reset(seed=seeds[0] + 1_000_000)  # warm: reference cache, length tables, compilation
    trace, wall, steps = [], 0.0, 0
    for seed in seeds:
        obs, info = env.reset(seed=seed)
        ctrl = resolve(controller).make()
        ctrl.reset(ControllerContext.from_env(env), seed)
        done = False
        t0 = time.perf_counter()
        while not done:
            obs, r, done, trunc, info = env.step(ctrl.act(obs, info))
            trace.append((obs.copy(), r))
            steps += 1
        wall += time.perf_counter() - t0
        trace.append(info["settlement"]["cost_kwh_eq"] if "settlement" in info else None)
    return trace, wall, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="bench-h200-hour-fixed-a30")
    ap.add_argument("--controller", default="vllm")
    ap.add_argument("--episodes", type=int, default=3)
    a = ap.parse_args()
    seeds = list(range(100000, 100000 + a.episodes))
    kernel.ENABLED = False
    ref, wall_pool, steps = run(a.scenario, a.controller, seeds)
    kernel.ENABLED = True
    got, wall_kernel, steps_k = run(a.scenario, a.controller, seeds)
    same = steps == steps_k and all(
        (x == y) if not isinstance(x, tuple) else (np.array_equal(x[0], y[0]) and x[1] == y[1]) for x, y in zip(ref, got))
    print(json.dumps({"scenario": a.scenario, "controller": a.controller, "episodes": a.episodes, "steps": steps,
                      "identical": bool(same), "pool_steps_per_s": round(steps / wall_pool, 1),
                      "kernel_steps_per_s": round(steps_k / wall_kernel, 1), "machine_factor": machine_factor()}))


if __name__ == "__main__":
    main()
