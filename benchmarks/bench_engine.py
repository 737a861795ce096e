"""Engine speed: the whole azure-code-day on 32 H20 replicas at full capacity, and 40 what-if runs from a
snapshot at the day's busiest hour. Prints one JSON object as its last line."""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np

from commitenv.profiles import load_profile
from commitenv.sim import EngineOptions, observed_arrivals, simulate, take_snapshot
from commitenv.sim.fixed import run_fixed
from commitenv.workload import builtin_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="h20-qwen3.8-27b-fp8")
    ap.add_argument("--gpus", type=int, default=32)
    ap.add_argument("--candidates", type=int, default=40)
    ap.add_argument("--horizon", type=float, default=120.0)
    args = ap.parse_args()
    prof = load_profile(args.profile)
    table = builtin_workload("azure-code-day", seed=0)

    t0 = time.perf_counter()
    res = run_fixed(prof, table, n_gpus=args.gpus, options=EngineOptions(seed=0))
    day_wall = time.perf_counter() - t0
    events = res.pool.events
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

    # what-if: snapshot in the middle of the busiest hour, replaying the last horizon of observed arrivals
    busiest = int(np.argmax(res.hourly_arrivals))
    t_snap = busiest * 3600.0 + 1800.0
    from commitenv.sim import Pool, PoolLayout

    pool = Pool(prof, PoolLayout.single(args.gpus), EngineOptions(seed=0))
    pool.attach(table)
    for k in range(1, int(t_snap // 60) + 1):
        pool.run_until(60.0 * k)
        pool.settle(60.0 * k)
    snap = take_snapshot(pool)
    replay = observed_arrivals(pool, args.horizon)
    reps = np.unique(np.linspace(1, args.gpus, 8).round().astype(int))
    clocks = prof.clock_mhz
    cands = [(int(r), int(c)) for r in reps for c in clocks][: args.candidates]
    t1 = time.perf_counter()
    for r, c in cands:
        simulate(snap, r, c, args.horizon, replay)
    whatif_wall = time.perf_counter() - t1

    print(f"day: {len(table)} requests, {day_wall:.1f} s wall, {events} events, peak RSS {rss_mb:.0f} MB")
    print(f"what-if: {len(cands)} candidates x {args.horizon:.0f} s horizon from t={t_snap:.0f} s "
          f"({snap.n_requests} live, {len(replay)} replayed arrivals): {whatif_wall:.3f} s")
    print(json.dumps({
        "profile": prof.name,
        "day_requests": int(len(table)),
        "day_wall_s": round(day_wall, 3),
        "day_peak_rss_mb": round(rss_mb, 1),
        "events_per_s": round(events / day_wall, 1),
        "whatif_candidates": len(cands),
        "whatif_horizon_s": args.horizon,
        "whatif_wall_s": round(whatif_wall, 4),
    }))


if __name__ == "__main__":
    main()
