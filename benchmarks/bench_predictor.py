"""Fidelity of the clean what-if predictor against the noisy ground truth (default engine noise).

From snapshots at several times of azure-code-day (H20, 32 replicas, all active), the predictor gets oracle
lengths and the true arrivals of the next window, so the only difference left is the engine's
truth-versus-prediction noise; reported like the ePACT paper's App. C.5: per-request latency WAPE and the
signed energy error of the window. Prints one JSON object as its last line."""

from __future__ import annotations

import argparse
import json

import numpy as np

from commitenv.profiles import load_profile
from commitenv.sim import EngineOptions, Pool, PoolLayout, simulate, take_snapshot
from commitenv.sim.pool import REPLAY_SLOT_BASE
from commitenv.workload import builtin_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="h20-qwen3.8-27b-fp8")
    ap.add_argument("--window", type=float, default=120.0)
    ap.add_argument("--hours", default="3,10,19", help="hours of the day to sample")
    args = ap.parse_args()
    prof = load_profile(args.profile)
    table = builtin_workload("azure-code-day", seed=0)
    abs_err = tot = 0.0
    e_true = e_pred = 0.0
    rel = []
    for hour in [int(h) for h in args.hours.split(",")]:
        t = hour * 3600.0 + 1800.0
        pool = Pool(prof, PoolLayout.single(32), EngineOptions(seed=hour, oracle_lengths=True))
        pool.attach(table)
        pool.run_until(t)
        pool.settle(t)
        snap = take_snapshot(pool)
        lo, hi = np.searchsorted(table.arrival_s, [t, t + args.window], side="right")
        future = table.take(np.arange(lo, hi))
        w = simulate(snap, 32, prof.reference_clock_mhz, args.window, future, track_arrivals=True)
        e0 = pool.energy_j(t)
        pool.run_until(t + args.window)
        e_true += pool.energy_j(t + args.window) - e0
        e_pred += w.energy_j
        pool.run_until(float("inf"))
        for key, f in w.finish.items():
            slot = key if key < REPLAY_SLOT_BASE else lo + key - REPLAY_SLOT_BASE
            lat_true = pool.finish_t[slot] - table.arrival_s[slot]
            lat_pred = f - table.arrival_s[slot]
            abs_err += abs(lat_pred - lat_true)
            tot += lat_true
            rel.append(abs(lat_pred - lat_true) / lat_true)
    rel = np.array(rel)
    out = {
        "profile": prof.name,
        "requests": int(len(rel)),
        "latency_wape_pct": round(100 * abs_err / tot, 3),
        "latency_p95_rel_err_pct": round(100 * float(np.percentile(rel, 95)), 3),
        "within_5pct": round(float(np.mean(rel <= 0.05)), 4),
        "window_energy_err_pct": round(100 * (e_pred - e_true) / e_true, 3),
    }
    print(f"captured {len(rel)} requests; latency WAPE {out['latency_wape_pct']} %, p95 relative error "
          f"{out['latency_p95_rel_err_pct']} %, window energy error {out['window_energy_err_pct']} %")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
