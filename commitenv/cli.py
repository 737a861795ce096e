"""The ``commitenv`` command line: simulate a built-in day, list profiles and workloads."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _cmd_simulate(args: argparse.Namespace) -> int:
    import numpy as np

    from commitenv.profiles import load_profile
    from commitenv.sim.fixed import run_fixed
    from commitenv.sim.pool import EngineOptions
    from commitenv.workload import builtin_workload, list_builtin, load_trace

    prof = load_profile(args.profile)
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


def _cmd_profiles(args: argparse.Namespace) -> int:
    from commitenv.profiles import list_profiles, load_profile

    for name in list_profiles():
        p = load_profile(name)
        print(f"{name:<28} {p.gpu.name:<8} {p.model.name:<20} clocks {p.clock_mhz} MHz")
    return 0


def _cmd_workloads(args: argparse.Namespace) -> int:
    from commitenv.workload import list_builtin

    for name in list_builtin():
        print(name)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="commitenv", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("simulate", help="serve a workload with a fixed configuration and print hourly energy")
    s.add_argument("--profile", default="h20-qwen3.8-27b-fp8")
    s.add_argument("--workload", default="azure-code-day", help="built-in name or a trace file")
    s.add_argument("--gpus", type=int, default=32)
    s.add_argument("--active", type=int, default=None, help="active replicas (default: all)")
    s.add_argument("--clock", type=int, default=None, help="GPU clock in MHz (default: the profile's reference)")
    s.add_argument("--alpha", type=float, default=3.0, help="SLO scale: deadline = arrival + alpha * L_ref")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--hours", type=int, default=None, help="only the first N hours")
    s.add_argument("--out", default=None, help="folder for summary.json")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=_cmd_simulate)
    sub.add_parser("profiles", help="list shipped GPU x model profiles").set_defaults(func=_cmd_profiles)
    sub.add_parser("workloads", help="list built-in workloads").set_defaults(func=_cmd_workloads)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
