"""The ``commitenv`` command line: run and compare controllers on scenarios, simulate a fixed configuration,
list scenarios, profiles and workloads."""

from __future__ import annotations

import argparse
import json
import os
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


DEFAULT_COMPARE_SCENARIO = "epact-h200-hour-fixed-a30"


def _print_table(rows: list[dict]) -> None:
    cols = ["controller", "attainment_pct", "mean_abs_dev_pct", "hours_within_5pct", "cost_kwh_eq", "energy_mj",
            "commitment_mj", "wall_s"]
    head = ["controller", "attain_%", "|dev|_%", "h<=5%", "cost_kWh", "energy_MJ", "commit_MJ", "wall_s"]
    print("  ".join(f"{h:>12}" for h in head))
    for r in rows:
        cells = []
        for c in cols:
            v = r[c]
            cells.append(f"{v:>12.3f}" if isinstance(v, float) else f"{v!s:>12}")
        print("  ".join(cells))


def _check_out(out: str | None) -> Path | None:
    """Fail early (before any run) when ``out`` cannot become a writable folder; create nothing yet."""
    if out is None:
        return None
    p = Path(out)
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"--out {out}: cannot create folder ({probe} is a file)")
    if not os.access(probe, os.W_OK):
        raise ValueError(f"--out {out}: cannot create folder ({probe} is not writable)")
    return p


def _resolve_names(scenario: str, controllers: list[str]) -> None:
    from commitenv.scenarios import load_scenario
    from controllers import available

    load_scenario(scenario)
    unknown = [c for c in controllers if c not in available()]
    if unknown:
        raise ValueError(f"unknown controller '{unknown[0]}'; available: {', '.join(available())}")


def _cmd_run(args: argparse.Namespace) -> int:
    from commitenv.evaluation import evaluate

    _resolve_names(args.scenario, [args.controller])
    out = _check_out(args.out)
    res = evaluate(args.controller, args.scenario, seed=args.seed, progress=not args.quiet)
    _print_table([res.summary])
    if out is not None:
        res.write(out)
        print(f"wrote {out}/summary.json, hourly.csv, requests.csv, overview.png")
    print(json.dumps(res.summary))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from commitenv.evaluation import evaluate
    from controllers import available

    explicit = bool(args.controllers)
    names = [c for c in args.controllers.split(",") if c] if explicit else available()
    _resolve_names(args.scenario, names)
    out = _check_out(args.out)
    rows = []
    for name in names:
        try:
            res = evaluate(name, args.scenario, seed=args.seed, progress=not args.quiet)
        except ImportError as e:
            if explicit:
                raise ValueError(f"controller '{name}' cannot run here: {e}") from None
            print(f"skipped {name}: {e}", file=sys.stderr)
            continue
        rows.append(res.summary)
        if out is not None:
            res.write(out / name, requests=False)
    _print_table(rows)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / "compare.json.tmp"
        tmp.write_text(json.dumps({"scenario": args.scenario, "seed": args.seed, "results": rows}, indent=2) + "\n")
        tmp.replace(out / "compare.json")
        print(f"wrote {out}/compare.json")
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    if args.paper != "epact":
        raise ValueError(f"unknown reproduction '{args.paper}'; available: epact")
    from commitenv.reproduce.epact import run

    out = _check_out(args.out)
    res = run(out, quick=args.quick, seed=args.seed, workers=args.workers, progress=not args.quiet)
    print(f"wrote {out}/report.md, results.json and figures ({res['wall_s']:.0f} s)")
    return 0


def _cmd_scenarios(args: argparse.Namespace) -> int:
    from commitenv.scenarios import describe_scenarios

    for env_id, desc in describe_scenarios():
        print(f"{env_id:<42} {desc}")
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
    r = sub.add_parser("run", help="run one controller on a scenario and write its results")
    r.add_argument("scenario", help="scenario name or Gymnasium id (commitenv/<name>-v0)")
    r.add_argument("--controller", default="vllm")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", default=None, help="folder for summary.json, hourly.csv, requests.csv, overview.png")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.set_defaults(func=_cmd_run)
    c = sub.add_parser("compare", help="run several controllers on one scenario side by side")
    c.add_argument("scenario", nargs="?", default=DEFAULT_COMPARE_SCENARIO)
    c.add_argument("--controllers", default=None, help="comma-separated names (default: every registered one)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", default=None, help="folder for compare.json and one sub-folder per controller")
    c.add_argument("--quiet", action="store_true")
    c.set_defaults(func=_cmd_compare)
    rp = sub.add_parser("reproduce", help="reproduce a paper's tables (epact) and write a report")
    rp.add_argument("paper", choices=["epact"])
    rp.add_argument("--quick", action="store_true", help="a reduced set (single hour, alpha 3, both GPUs)")
    rp.add_argument("--seed", type=int, default=0)
    rp.add_argument("--workers", type=int, default=None, help="ePACT what-if processes (default: all cores)")
    rp.add_argument("--out", default="runs/reproduce-epact")
    rp.add_argument("--quiet", action="store_true")
    rp.set_defaults(func=_cmd_reproduce)
    sub.add_parser("scenarios", help="list registered scenarios").set_defaults(func=_cmd_scenarios)
    sub.add_parser("profiles", help="list shipped GPU x model profiles").set_defaults(func=_cmd_profiles)
    sub.add_parser("workloads", help="list built-in workloads").set_defaults(func=_cmd_workloads)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
