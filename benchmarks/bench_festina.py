"""Festina (or another controller) on one episode: the wall and CPU time, the engine's local-policy plans (made inside
the compiled loop by a compiled policy, `commitenv.sim.local_compiled`, or called back to the host, with the time spent
there) and dispatch calls (views built and the policy run on the host), with the run's score (the same on every
repeat) and the machine factor of ../shared/tools/machine_factor.py.

    python benchmarks/bench_festina.py [--scenario festina-h100-shared] [--controller festina] [--seed 100000]
        [--repeat 1] [--against epact]

``--against C``: also time controller C on the same episode, in the same process, and print the wall-time ratio
(issue 36 asks for a Festina hour within 2x an ePACT hour).
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
    ap.add_argument("--against", default=None, help="a second controller timed on the same episode (ratio printed)")
    a = ap.parse_args()
    out = {"machine_factor": machine_factor(), "runs": [time_controller(c, a.scenario, a.seed, a.repeat)
                                                          for c in [a.controller] + ([a.against] if a.against else [])]}
    if a.against:
        w = [min(r["wall_s"]) for r in out["runs"]]
        out["wall_ratio"] = round(w[0] / w[1], 2)
    print(json.dumps(out, indent=1))


def time_controller(controller: str, scenario: str, seed: int, repeat: int) -> dict:
    """Wall and CPU time of ``repeat`` episodes of ``controller`` (their scores must agree), with the engine's
    counts."""
    walls, cpus, scores = [], [], set()
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        # (the runner's charge of each decision's measured time is left out: it makes repeats differ with the load)
        env, res = run_episode(controller, scenario, seed, charge_planning=False)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        s = res.summary
        scores.add(json.dumps({k: s[k] for k in ("cost_kwh_eq", "attainment_pct", "misses", "energy_mj")}))
    if len(scores) > 1:
        raise SystemExit(f"repeats disagree: {scores}")
    pool = env.pool
    return {"scenario": scenario, "controller": controller, "seed": seed,
            "wall_s": [round(w, 2) for w in walls], "cpu_s": [round(c, 2) for c in cpus],
            "compiled_plans": pool.compiled_plans, "host_plans": pool.local_calls,
            "host_plans_s": round(pool.local_s, 2),
            "dispatch_calls": pool.dispatch_calls, "dispatch_s": round(pool.dispatch_s, 2),
            "events": pool.events, "score": json.loads(scores.pop())}


if __name__ == "__main__":
    main()
