"""``commitenv attribute``: bill every request of a finished run (`commitenv.run_bills`) and print the totals."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def cmd_attribute(args: argparse.Namespace) -> int:
    """Bill every request of a finished run: re-run its deterministic episode with attribution on, check that it
    reproduces summary.json, write bills.csv into the run folder, print the busy, idle and tenant totals."""
    from commitenv.run_bills import ReplayOptions, RunNotFound, bill_run, read_run

    run = Path(args.run_dir)
    summary = read_run(run)
    if args.pairs < 2:
        raise ValueError(f"--pairs: need at least 2 antithetic pairs for an error bar, got {args.pairs}")
    if args.window < 1:
        raise ValueError(f"--window: expected at least 1 request, got {args.window}")
    if not os.access(run, os.W_OK):
        raise ValueError(f"{run}: not writable; cannot write bills.csv")
    replay = None
    if args.replay:
        replay = ReplayOptions(window=args.window, pairs=args.pairs, max_windows=args.max_windows,
                               own_mode=args.replay_own)
    try:
        billed = bill_run(run, summary, args.scenario, replay=replay, progress=not args.quiet)
    except RunNotFound as e:
        raise ValueError(str(e) + ("" if args.scenario else " (give the scenario with --scenario NAME_OR_FILE)")
                         ) from None
    report = billed.report
    print(f"{report['requests']} requests billed: busy {report['busy_mj']:.4f} MJ (shares), idle "
          f"{report['idle_mj']:.4f} MJ (not billed)")
    for name, mj in report["tenant_mj"].items():
        print(f"  tenant {name}: {mj:.4f} MJ")
    if billed.replay is not None:
        print(billed.replay.summary())
    print(f"wrote {billed.path}")
    print(json.dumps(report))
    return 0
