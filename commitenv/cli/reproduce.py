"""``commitenv reproduce``: run a paper's reproduction (ePACT or Festina) and write its report."""

from __future__ import annotations

import argparse

from commitenv.cli.args import check_out


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Reproduce a paper's tables (`commitenv.reproduce`) and say where the report went."""
    if args.paper not in ("epact", "festina"):
        raise ValueError(f"unknown reproduction '{args.paper}'; available: epact, festina")
    if args.paper == "festina":
        from commitenv.reproduce.festina import run as run_festina

        out = check_out(args.out if args.out != "runs/reproduce-epact" else "runs/reproduce-festina")
        seeds = (100000,) if args.quick else (100000, 100001, 100002)
        family_seeds = (100000,) if args.quick else (100000, 100001)
        res = run_festina(out, seeds=seeds, family_seeds=family_seeds, progress=not args.quiet)
        print(f"wrote {out}/report.md and results.json ({res['wall_s']:.0f} s)")
        return 0
    from commitenv.reproduce.epact import run

    out = check_out(args.out)
    res = run(out, quick=args.quick, seed=args.seed, workers=args.workers, progress=not args.quiet)
    print(f"wrote {out}/report.md, results.json and figures ({res['wall_s']:.0f} s)")
    return 0
