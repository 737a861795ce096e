"""Environment speed: steps per second on a single-hour H200 scenario with the vLLM controller, a full H20
day with vLLM, and the time of gym.make. Prints one JSON object as its last line."""

from __future__ import annotations

import json
import time

import gymnasium as gym

import commitenv  # noqa: F401  (registers the scenarios)
from controllers import ControllerContext, make


def episode(env_id: str, controller: str, seed: int = 0) -> tuple[int, float]:
    env = gym.make(env_id)
    t0 = time.perf_counter()
    obs, info = env.reset(seed=seed)
    ctrl = make(controller)
    ctrl.reset(ControllerContext.from_env(env), seed)
    steps = 0
    done = False
    while not done:
        obs, r, done, trunc, info = env.step(ctrl.act(obs, info))
        steps += 1
    wall = time.perf_counter() - t0
    env.close()
    return steps, wall


def main() -> None:
    hour_id = "commitenv/epact-h200-hour-fixed-a30-v0"
    day_id = "commitenv/epact-h20-day-v0"
    gym.make(hour_id).close()  # warm the reference cache so make_s measures make itself
    t0 = time.perf_counter()
    gym.make(hour_id).close()
    make_s = time.perf_counter() - t0
    first_steps, first_wall = episode(hour_id, "vllm")  # includes building the workload
    runs = [episode(hour_id, "vllm", seed) for seed in range(1, 6)]
    steps = sum(r[0] for r in runs)
    wall = sum(r[1] for r in runs)
    gym.make(day_id).close()
    day_steps, day_wall = episode(day_id, "vllm")
    print(f"hour: first episode {first_steps} steps in {first_wall:.2f} s; next 5 episodes {steps} steps in "
          f"{wall:.2f} s; day: {day_steps} steps in {day_wall:.1f} s; make {make_s:.3f} s")
    print(json.dumps({
        "hour_steps_per_s": round(steps / wall, 1),
        "hour_first_episode_steps_per_s": round(first_steps / first_wall, 1),
        "day_wall_s": round(day_wall, 2),
        "make_s": round(make_s, 4),
    }))


if __name__ == "__main__":
    main()
