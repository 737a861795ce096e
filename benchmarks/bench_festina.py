"""Festina (or another controller) on one episode, on each engine: the wall and CPU time, the engine's local-policy
plans and dispatch calls and the time spent in them (views built and policies run), with the run's score (a speed
change must leave it unchanged: the script stops if two engines disagree) and the machine factor of
../shared/tools/machine_factor.py.

Engines: ``python`` (the Python event loop), ``kernel`` (the compiled loop where it covers the pool: a pool with a
local policy stays on the Python loop, `commitenv.sim.kernel.state.LOCAL_ON_KERNEL`), ``kernel-local`` (the compiled
loop with every local plan called back to the host).

    python benchmarks/bench_festina.py [--scenario festina-h100-shared] [--controller festina] [--seed 100000]
        [--engines python,kernel,kernel-local] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import time

from commitenv.evaluation import run_episode
from commitenv.sim import kernel
from commitenv.sim.kernel import state
from machine import machine_factor  # benchmarks/machine.py (run as python benchmarks/NAME.py)

ENGINES = {"python": (False, False), "kernel": (True, False), "kernel-local": (True, True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="festina-h100-shared")
    ap.add_argument("--controller", default="festina")
    ap.add_argument("--seed", type=int, default=100000)
    ap.add_argument("--engines", default="python,kernel,kernel-local")
    ap.add_argument("--repeat", type=int, default=1, help="episodes to time per engine (the score of each is the same)")
    a = ap.parse_args()
    rows, scores = [], {}
    for name in a.engines.split(","):
        kernel.ENABLED, state.LOCAL_ON_KERNEL = ENGINES[name]
        walls, cpus = [], []
        for _ in range(a.repeat):
            c0, t0 = time.process_time(), time.perf_counter()
            env, res = run_episode(a.controller, a.scenario, a.seed)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        pool, s = env.pool, res.summary
        scores[name] = {k: s[k] for k in ("cost_kwh_eq", "attainment_pct", "misses", "energy_mj")}
        rows.append({"engine": name, "on_kernel_at_end": pool._ks is not None, "wall_s": [round(w, 2) for w in walls],
                     "cpu_s": [round(c, 2) for c in cpus], "local_plans": pool.local_calls,
                     "local_s": round(pool.local_s, 2), "dispatch_calls": pool.dispatch_calls,
                     "dispatch_s": round(pool.dispatch_s, 2), "events": pool.events})
    if len({json.dumps(v, sort_keys=True) for v in scores.values()}) > 1:
        raise SystemExit(f"the engines disagree: {scores}")
    print(json.dumps({"scenario": a.scenario, "controller": a.controller, "seed": a.seed, "engines": rows,
                      "score": next(iter(scores.values())), "machine_factor": machine_factor()}, indent=1))


if __name__ == "__main__":
    main()
