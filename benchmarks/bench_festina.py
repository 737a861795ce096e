"""Festina on one episode: the wall time, the engine's local-policy plans and dispatch calls and the time spent in
them (views built and policies run), with the run's score (to check that a speed change leaves it unchanged) and the
machine factor of ../shared/tools/machine_factor.py.

    python benchmarks/bench_festina.py [--scenario bench-h200-hour-fixed-a30] [--seed 0] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import time

from commitenv.evaluation import run_episode
from machine import machine_factor  # benchmarks/machine.py (run as python benchmarks/NAME.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="bench-h200-hour-fixed-a30")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="episodes to time (the score of each is the same)")
    a = ap.parse_args()
    walls = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        env, res = run_episode("festina", a.scenario, a.seed)
        walls.append(time.perf_counter() - t0)
    pool, s = env.pool, res.summary
    print(json.dumps({
        "scenario": a.scenario, "seed": a.seed, "wall_s": [round(w, 2) for w in walls],
        "local_plans": pool.local_calls, "local_s": round(pool.local_s, 2),
        "dispatch_calls": pool.dispatch_calls, "dispatch_s": round(pool.dispatch_s, 2), "events": pool.events,
        "score": {k: s[k] for k in ("cost_kwh_eq", "attainment_pct", "misses", "energy_mj")},
        "machine_factor": machine_factor(),
    }))


if __name__ == "__main__":
    main()
