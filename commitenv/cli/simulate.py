"""``commitenv simulate``: serve a workload with a fixed configuration (`commitenv.sim.fixed.run_fixed`) and
print hourly energy and attainment."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from commitenv.cli.args import check_out


def cmd_simulate(args: argparse.Namespace) -> int:
    """Serve a workload (a trace file or a built-in) with a fixed configuration; print hourly energy and a summary."""
    import numpy as np

    from commitenv.profiles import load_profile
    from commitenv.sim.fixed import run_fixed
    from commitenv.sim.pool import EngineOptions
    from commitenv.workload import builtin_workload, list_builtin, load_trace

    prof = load_profile(args.profile)
    check_out(args.out)
    if Path(args.workload).exists():
        table = load_trace(args.workload)
    elif args.workload in list_builtin():
        table = builtin_workload(args.workload, seed=args.seed)
    else:
        print(f"error: workload '{args.workload}' is neither a file nor a built-in ({', '.join(list_builtin())})",
              file=sys.stderr)
        return 2
    if args.hours is not None:
        from commitenv.workload import time_window

        table = time_window(table, 0.0, args.hours * 3600.0)
    t0 = time.perf_counter()
    res = run_fixed(
        prof,
        table,
        n_gpus=args.gpus,
        active=args.active,
        clock_mhz=args.clock,
        options=EngineOptions(alpha=args.alpha, seed=args.seed),
        hours=args.hours,
        progress=not args.quiet,
    )
    wall = time.perf_counter() - t0
    print(f"{'hour':>4} {'arrivals':>9} {'energy_MJ':>10} {'attain_%':>9}")
    for h, (n, e, a) in enumerate(zip(res.hourly_arrivals, res.hourly_energy_j, res.hourly_attainment)):
        print(f"{h:>4} {int(n):>9} {e / 1e6:>10.3f} {100 * a:>9.2f}")
    summary = {
        "profile": prof.name,
        "workload": args.workload,
        "seed": args.seed,
        "gpus": args.gpus,
        "active": args.active or args.gpus,
        "clock_mhz": args.clock or prof.reference_clock_mhz,
        "requests": int(len(table)),
        "energy_mj": float(np.sum(res.hourly_energy_j) / 1e6),
        "attainment_pct": 100 * res.attainment,
        "wall_s": round(wall, 3),
    }
    print(json.dumps(summary))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2))
        tmp.replace(out / "summary.json")
    return 0
