"""Engine speed: the whole azure-code-day on 32 H20 replicas at full capacity, 40 what-if runs from a snapshot at
the day's busiest hour, and the same 40 what-if runs in a long-context hour (prompts of about 8,000 tokens, as in
Mooncake conversation traces, which are not shipped: a synthetic stand-in, stated in the output). Prints one JSON
object as its last line."""

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
from machine import machine_factor  # benchmarks/machine.py (run as python benchmarks/NAME.py)



def long_context_table(seconds: float, rate: float, limit: int, seed: int = 0):
    """Poisson arrivals at ``rate``/s over ``seconds`` with log-normal prompts (median 7,000 tokens, sigma 0.6,
    512..limit-512) and outputs (median 250, sigma 0.7, 16..2,000): a long-context conversation hour."""
    from commitenv.workload.table import RequestTable

    rng = np.random.default_rng(seed)
    n = int(rng.poisson(rate * seconds))
    t = np.sort(rng.uniform(0.0, seconds, n))
    p = np.clip(np.rint(rng.lognormal(np.log(7000), 0.6, n)), 512, limit - 512).astype(np.int64)
    o = np.clip(np.rint(rng.lognormal(np.log(250), 0.7, n)), 16, 2000).astype(np.int64)
    return RequestTable(arrival_s=t, prompt_tokens=p, output_tokens=o, tenant=np.zeros(n, dtype=np.int32),
                        request_id=np.arange(n, dtype=np.int64))


def whatif_wall(prof, table, gpus: int, t_snap: float, candidates: int,
                horizon: float) -> tuple[float, int, int, int, float, float]:
    """Serve ``table`` to ``t_snap`` (60-s boundaries), snapshot, and time ``candidates`` what-if runs of
    ``horizon`` s replaying the last ``horizon`` s of arrivals, after one untimed warm-up run (the compiled kernel's
    first call loads or compiles it): (wall s, candidates, live, replayed, warm-up s, snapshot s: one decision's
    snapshot)."""
    from commitenv.sim import Pool, PoolLayout

    pool = Pool(prof, PoolLayout.single(gpus), EngineOptions(seed=0))
    pool.attach(table)
    for k in range(1, int(t_snap // 60) + 1):
        pool.run_until(60.0 * k)
        pool.settle(60.0 * k)
    snap = take_snapshot(pool)  # (untimed: the first call loads the copy's compiled helpers)
    ts = time.perf_counter()
    for _ in range(5):
        snap = take_snapshot(pool)
    snap_s = (time.perf_counter() - ts) / 5
    replay = observed_arrivals(pool, horizon)
    reps = np.unique(np.linspace(1, gpus, 8).round().astype(int))
    cands = [(int(r), int(c)) for r in reps for c in prof.clock_mhz][:candidates]
    t0 = time.perf_counter()
    simulate(snap, *cands[0], horizon, replay)
    t1 = time.perf_counter()
    for r, c in cands:
        simulate(snap, r, c, horizon, replay)
    return time.perf_counter() - t1, len(cands), snap.n_requests, len(replay), t1 - t0, snap_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="h20-qwen3.8-27b-fp8")
    ap.add_argument("--gpus", type=int, default=32)
    ap.add_argument("--candidates", type=int, default=40)
    ap.add_argument("--horizon", type=float, default=120.0)
    ap.add_argument("--long-rate", type=float, default=6.0,
                    help="arrivals/s of the long-context hour (6: about 30 live and 730 replayed requests at the "
                         "snapshot, one what-if ~0.1 s, as on a long-prompt Mooncake hour)")
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
    whatif, n_cands, live, replayed, warm, snap_s = whatif_wall(prof, table, args.gpus, t_snap, args.candidates,
                                                                 args.horizon)
    long_table = long_context_table(3600.0, args.long_rate, prof.scheduler.context_limit)
    long_wall, _, long_live, long_replayed, long_warm, _ = whatif_wall(prof, long_table, args.gpus, 1800.0,
                                                                       args.candidates, args.horizon)
    print(f"day: {len(table)} requests, {day_wall:.1f} s wall, {events} events, peak RSS {rss_mb:.0f} MB")
    print(f"what-if: {n_cands} candidates x {args.horizon:.0f} s horizon from t={t_snap:.0f} s "
          f"({live} live, {replayed} replayed arrivals): {whatif:.3f} s (target 0.2 s); first run {warm:.2f} s; "
          f"snapshot {snap_s * 1e3:.1f} ms")
    print(f"what-if, long-context hour (synthetic: {len(long_table)} requests, median prompt 7,000 tokens): "
          f"{n_cands} candidates x {args.horizon:.0f} s from t=1800 s ({long_live} live, {long_replayed} replayed): "
          f"{long_wall:.3f} s (target 0.5 s); first run {long_warm:.2f} s")
    factor = machine_factor()
    print(f"machine factor {factor} (1.0 = reference)")
    print(json.dumps({
        "profile": prof.name,
        "day_requests": int(len(table)),
        "day_wall_s": round(day_wall, 3),
        "day_peak_rss_mb": round(rss_mb, 1),
        "events_per_s": round(events / day_wall, 1),
        "whatif_candidates": n_cands,
        "whatif_horizon_s": args.horizon,
        "whatif_wall_s": round(whatif, 4),
        "whatif_first_run_s": round(warm, 3),
        "snapshot_s": round(snap_s, 5),
        "whatif_long_context_wall_s": round(long_wall, 4),
        "whatif_long_context_live": long_live,
        "whatif_long_context_requests": int(len(long_table)),
        "machine_factor": factor,
    }))


if __name__ == "__main__":
    main()
