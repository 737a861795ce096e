"""``commitenv submit PATH`` and ``commitenv leaderboard render``: the participant's and the maintainer's commands."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from commitenv.runner import RAY_LOCAL


DEFAULT_BOARD = Path("leaderboard")


def _board(given: str | None, command: str) -> Path:
    """``--board``, else ./leaderboard where it exists (a commitenv checkout); elsewhere ValueError saying what to
    give, rather than a board made (and reference episodes run) in whatever folder the command was started from."""
    if given is not None:
        return Path(given)
    if DEFAULT_BOARD.is_dir():
        return DEFAULT_BOARD
    what = {"submit": "an existing board, or a new folder (its first submission runs the suite's reference "
                      "episodes first, vLLM and the oracle on each: many minutes)",
            "render": "a leaderboard folder with results/<suite>.jsonl"}[command]
    raise ValueError(f"{command}: no ./leaderboard folder here (it is in a commitenv checkout): give --board DIR, "
                     f"{what}")


def _cmd_submit(args: argparse.Namespace) -> int:
    from commitenv.leaderboard.boxes import terminate_as_exit
    from commitenv.leaderboard.sandbox import SubmissionInvalid
    from commitenv.leaderboard.submission import load_submission
    from commitenv.leaderboard.submit import submit
    from commitenv.leaderboard.suite import SECRET_ENV, read_secret

    if args.jobs < 1:
        raise ValueError(f"--jobs: expected at least 1, got {args.jobs}")
    board = _board(args.board, "submit")
    sub = load_submission(args.path, name=args.name)
    # read once here, then out of the environment, so that no process started from now on inherits it
    secret = read_secret(args.secret_file)
    os.environ.pop(SECRET_ENV, None)
    try:
        with terminate_as_exit(forward=True):
            res = submit(sub, args.suite, board=board, n_jobs=args.jobs, ray_address=args.ray,
                         secret_file=args.secret_file, progress=not args.quiet, render=not args.no_render,
                         isolation=args.isolation, secret=secret)
    except SubmissionInvalid as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if res.refused:
        print(f"refused: {sub.name}: {res.refused}")
        return 3
    rec = res.record
    print(f"{'episode':<40} {'status':<14} {'score':>8} {'cost kWh-eq':>12} {'attain %':>9}  gate")
    for r in rec["episodes"]:
        sc = "-" if r["score"] is None else f"{r['score']:.1f}"
        print(f"{r['label']:<40} {r['status']:<14} {sc:>8} {r['cost_kwh_eq']:>12.4f} "
              f"{r['attainment_pct']:>9.3f}  {'pass' if r['slo_gate_pass'] else 'FAIL'}")
        if r.get("unscored"):
            print(f"    no score: {r['unscored']}")
        if r["reason"]:
            print(f"    {r['reason']}")
    s = rec["score"]
    ci = f" (95 % CI {s['ci95'][0]:.1f} to {s['ci95'][1]:.1f})" if s["ci95"] else ""
    m = rec["metrics"]
    unscored = f" ({m['unscored']} without a score)" if m.get("unscored") else ""
    print(f"{sub.name} on {rec['suite']}: score {s['mean']:.1f}{ci} over {s['n']} episodes{unscored}, "
          f"{m['gate_failures']} failed the SLO gate, {m['lost']} lost; {rec['wall_s']:.0f} s")
    print(f"appended to {res.results_file}")
    return 0


def _cmd_render(args: argparse.Namespace) -> int:
    from commitenv.leaderboard.render import render_board

    md, html = render_board(_board(args.board, "render"))
    print(f"wrote {md} and {html}")
    return 0


def _cmd_references(args: argparse.Namespace) -> int:
    from commitenv.leaderboard.submit import ensure_references

    n = ensure_references(args.suite, board=Path(args.board), n_jobs=args.jobs, secret_file=args.secret_file,
                          progress=not args.quiet)
    print(f"references of the {n} episodes of suite {args.suite} up to date in {Path(args.board) / 'references'}")
    return 0


def add_leaderboard_parsers(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("submit", help="score a controller on a leaderboard suite, in a sandbox, and record the result")
    s.add_argument("path", metavar="PATH",
                   help="a folder with submission.yaml (name, authors, description, learns, controller, kwargs), "
                        "that file, or file.py:Class")
    s.add_argument("--suite", default="dev", help="dev (public), test (drawn from the maintainer's secret; without it "
                                                  "dev runs), or a suite file")
    s.add_argument("--name", default=None, help="the name in the table (default: submission.yaml's)")
    s.add_argument("--board", default=None, metavar="DIR",
                   help="the leaderboard folder: suites/, references/, results/ (default ./leaderboard, which must "
                        "exist; a new folder runs the suite's reference episodes first)")
    s.add_argument("--jobs", type=int, default=1, metavar="N", help="episodes at a time (processes, or Ray tasks)")
    s.add_argument("--ray", nargs="?", const=RAY_LOCAL, default=None, metavar="ADDRESS",
                   help="run the episodes as Ray tasks (a new local Ray, or the cluster at ADDRESS)")
    s.add_argument("--secret-file", default=None, metavar="FILE",
                   help="the maintainer's secret for the test suite (else $COMMITENV_LEADERBOARD_SECRET)")
    s.add_argument("--no-render", action="store_true", help="do not re-render LEADERBOARD.md and index.html")
    s.add_argument("--isolation", choices=("auto", "kernel", "process"), default="auto",
                   help="the sandbox: kernel (namespaces, seccomp, rlimits: bubblewrap), process (a plain process "
                        "behind Python's audit hook; public suites only), auto (kernel where the machine allows)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=_cmd_submit)
    lb = sub.add_parser("leaderboard", help="leaderboard maintenance: render the table from the results")
    lsub = lb.add_subparsers(dest="lb_cmd", required=True)
    r = lsub.add_parser("render", help="write LEADERBOARD.md and index.html from results/*.jsonl")
    r.add_argument("--board", default=None, metavar="DIR", help="the leaderboard folder (default ./leaderboard)")
    r.set_defaults(func=_cmd_render)
    rf = lsub.add_parser("references", help="run (or check) the reference episodes of a suite (vLLM and the oracle), "
                                            "as the first submission would")
    rf.add_argument("--suite", default="dev")
    rf.add_argument("--board", default="leaderboard", metavar="DIR")
    rf.add_argument("--jobs", type=int, default=1, metavar="N")
    rf.add_argument("--secret-file", default=None, metavar="FILE")
    rf.add_argument("--quiet", action="store_true")
    rf.set_defaults(func=_cmd_references)
