"""Festina (or another controller) on one episode: the wall and CPU time, the engine's local-policy plans and dispatch
calls and the time spent in them (views built and policies run, each plan called back from the compiled loop to the
host), with the run's score (the same on every repeat) and the machine factor of ../shared/tools/machine_factor.py.

    python benchmarks/bench_festina.py [--scenario festina-h100-shared] [--controller festina] [--seed 100000]
        [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import time

from commitenv.evaluation import run_episode
from machine import machine_factor  # benchmarks/machine.py (run as python benchmarks/NAME.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="festina-h100-shared")
    ap.add_argument("--controller", default="festina")
    ap.add_argument("--seed", type=int, default=100000)
    ap.add_argument("--repeat", type=int, default=1, help="episodes to time (the score of each is the same)")
    a = ap.parse_args()
    walls, cpus, scores = [], [], set()
    for _ in range(a.repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        env, res = run_episode(a.controller, a.scenario, a.seed)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        s = res.summary
        scores.add(json.dumps({k: s[k] for k in ("cost_kwh_eq", "attainment_pct", "misses", "energy_mj")}))
    if len(scores) > 1:
        raise SystemExit(f"repeats disagree: {scores}")
    pool = env.pool
    print(json.dumps({"scenario": a.scenario, "controller": a.controller, "seed": a.seed,
                      "wall_s": [round(w, 2) for w in walls], "cpu_s": [round(c, 2) for c in cpus],
                      "local_plans": pool.local_calls, "local_s": round(pool.local_s, 2),
                      "dispatch_calls": pool.dispatch_calls, "dispatch_s": round(pool.dispatch_s, 2),
                      "events": pool.events, "score": json.loads(scores.pop()), "machine_factor": machine_factor()},
                     indent=1))


if __name__ == "__main__":
    main()
