"""The ``commitenv`` parser: subcommands, their options and help texts, each bound to its handler."""

from __future__ import annotations

import argparse

from commitenv.argtypes import seed as seed_arg
from commitenv.cli.attribute import cmd_attribute
from commitenv.cli.listing import cmd_controllers, cmd_profiles, cmd_scenarios, cmd_workloads
from commitenv.cli.reproduce import cmd_reproduce
from commitenv.cli.run import DEFAULT_COMPARE_SCENARIO, cmd_compare, cmd_run
from commitenv.cli.simulate import cmd_simulate
from commitenv.runner import RAY_LOCAL
from commitenv.sim.compile import main as compile_main

DESCRIPTION = """The ``commitenv`` command line: run and compare controllers on scenarios, simulate a fixed configuration,
bill the requests of a finished run, list scenarios, profiles and workloads."""


def build_parser() -> argparse.ArgumentParser:
    """The ``commitenv`` parser: every subcommand, each bound to its handler (``args.func``)."""
    ap = argparse.ArgumentParser(prog="commitenv", description=DESCRIPTION)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("simulate", help="serve a workload with a fixed configuration and print hourly energy")
    s.add_argument("--profile", default="h20-qwen3.8-27b-fp8")
    s.add_argument("--workload", default="azure-code-day", help="built-in name or a trace file")
    s.add_argument("--gpus", type=int, default=32)
    s.add_argument("--active", type=int, default=None, help="active replicas (default: all)")
    s.add_argument("--clock", type=int, default=None, help="GPU clock in MHz (default: the profile's reference)")
    s.add_argument("--alpha", type=float, default=3.0, help="SLO scale: deadline = arrival + alpha * L_ref")
    s.add_argument("--seed", type=seed_arg, default=0)
    s.add_argument("--hours", type=int, default=None, help="only the first N hours")
    s.add_argument("--out", default=None, help="folder for summary.json")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_simulate)
    r = sub.add_parser("run", help="run one controller on a scenario and write its results")
    r.add_argument("scenario", help="scenario name, Gymnasium id (commitenv/<name>-v0) or path of a scenario YAML file")
    r.add_argument("--controller", default="vllm",
                   help="a registered or entry-point name, module:Class or path/to/file.py:Class")
    r.add_argument("--controller-arg", action="append", metavar="KEY=VALUE",
                   help="constructor argument (repeatable); VALUE is read as JSON when it is valid JSON, else text")
    add_seed_args(r)
    r.add_argument("--out", default=None,
                   help="folder for summary.json, hourly.csv, decisions.csv, requests.csv, overview.png (with "
                        "--seeds: OUT/<controller>/seed-<s>/ and compare.json)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument("--backend", default=None, metavar="sim|fake[:SPEED]",
                   help="serve on the simulator (default) or on the hardware backend's CPU fakes, a GPU pool replayed "
                        "in real time SPEED times faster (default 200); a replay that falls behind real time warns "
                        "and is marked backend_lagging (docs/real-gpu.md)")
    r.set_defaults(func=cmd_run)
    c = sub.add_parser("compare", help="run several controllers on one scenario side by side")
    c.add_argument("scenario", nargs="?", default=DEFAULT_COMPARE_SCENARIO,
                   help="scenario name, Gymnasium id or path of a scenario YAML file (default: %(default)s)")
    c.add_argument("--controllers", default=None,
                   help="comma-separated specs, each a name, module:Class, path/to/file.py:Class or sb3:DIR "
                        "(default: every registered and entry-point controller except the hindsight bound 'oracle', "
                        "which plans for minutes with the true trace: name it to add its row)")
    c.add_argument("--controller-arg", action="append", metavar="[CONTROLLER.]KEY=VALUE",
                   help="constructor argument (repeatable), for every controller or, with CONTROLLER., for one")
    add_seed_args(c)
    c.add_argument("--out", default=None, help="folder for compare.json and one sub-folder per controller")
    c.add_argument("--quiet", action="store_true")
    c.set_defaults(func=cmd_compare)
    rp = sub.add_parser("reproduce", help="reproduce a paper's tables (epact, festina) and write a report")
    rp.add_argument("paper", choices=["epact", "festina"])
    rp.add_argument("--quick", action="store_true", help="a reduced set (epact: single hour, alpha 3, both GPUs; festina: seed 100000 only)")
    rp.add_argument("--seed", type=seed_arg, default=0)
    rp.add_argument("--workers", type=int, default=None, help="ePACT what-if processes (default: all cores)")
    rp.add_argument("--out", default="runs/reproduce-epact")
    rp.add_argument("--quiet", action="store_true")
    rp.set_defaults(func=cmd_reproduce)
    at = sub.add_parser("attribute", help="bill every request of a finished run (bills.csv; StepSplit shares)")
    at.add_argument("run_dir", help="a run folder (the --out of `commitenv run`)")
    at.add_argument("--replay", action="store_true",
                    help="also apply the scheduler-replay correction per attribution window (replay_j, replay_se_j)")
    at.add_argument("--pairs", type=int, default=10, help="antithetic permutation pairs per window (--replay)")
    at.add_argument("--window", type=int, default=16, help="requests per attribution window (--replay)")
    at.add_argument("--max-windows", type=int, default=None, help="replay only the first N windows (--replay)")
    at.add_argument("--replay-own", choices=["replayed", "fixed"], default="replayed",
                    help="own energy in the replay game (--replay): 'replayed' sums each coalition's replayed steps, "
                         "so recompute after a preemption is shared by who caused it (the engine's game, default); "
                         "'fixed' keeps every request's own energy of the full window (StepSplit Eq. 6), which bills "
                         "all recompute to the preempted request")
    at.add_argument("--scenario", default=None, help="scenario name or file, when summary.json does not locate it")
    at.add_argument("--quiet", action="store_true", help="no progress bars")
    at.set_defaults(func=cmd_attribute)
    sub.add_parser("scenarios", help="list registered scenarios").set_defaults(func=cmd_scenarios)
    sub.add_parser("controllers", help="list registered and entry-point controllers: name, origin, description"
                   ).set_defaults(func=cmd_controllers)
    sub.add_parser("profiles", help="list shipped GPU x model profiles").set_defaults(func=cmd_profiles)
    sub.add_parser("workloads", help="list built-in workloads").set_defaults(func=cmd_workloads)
    comp = sub.add_parser("compile", help="compile the engine's event loop ahead of any run, into numba's cache (once; "
                          "python -m commitenv.sim.compile)")
    comp.add_argument("--clean", action="store_true", help="empty the cache first (after editing a kernel module: "
                      "numba does not notice a callee's change in a cached caller)")
    comp.set_defaults(func=lambda args: compile_main(["--clean"] if args.clean else []))
    from commitenv.train.cli import add_train_parser  # `commitenv train` (no learning stack loaded until it runs)

    add_train_parser(sub)
    from commitenv.leaderboard.cli import add_leaderboard_parsers

    add_leaderboard_parsers(sub)
    from commitenv.cli.site import add_site_parser

    add_site_parser(sub)
    from commitenv.backends.cli import add_calibrate_parser

    add_calibrate_parser(sub)
    return ap


def add_seed_args(p: argparse.ArgumentParser) -> None:
    """The episode options of ``run`` and ``compare``: one seed or many, processes or Ray, resuming, scoring."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--seed", type=seed_arg, default=0)
    g.add_argument("--seeds", default=None, metavar="LIST",
                   help="many episodes: 0-9, 0,3,7, 0-4,10, or test[:N] / train[:N] (the scenario's declared seed "
                        "ranges); results under OUT/<controller>/seed-<s>/ with the "
                        "aggregate (mean, 95 %% CI) in OUT/compare.json and compare.csv; finished episodes are kept")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="with --seeds: episodes run in N processes (default 1); with --ray: at most N episodes at "
                        "a time (default: all), and a local Ray gets N CPUs")
    p.add_argument("--ray", nargs="?", const=RAY_LOCAL, default=None, metavar="ADDRESS",
                   help="with --seeds: run the episodes as Ray tasks, on a new local Ray or on the cluster at "
                        "ADDRESS (ray://HOST:10001, auto); this process writes the results (needs the 'ray' extra: "
                        'pip install "commitenv[ray]")')
    p.add_argument("--rerun", action="store_true", help="with --seeds: run again episodes already in OUT")
    p.add_argument("--no-score", dest="score", action="store_false",
                   help="skip the reference runs (the objective's lower and upper controllers, cached per scenario and "
                        "seed) that the normalised score and a relative SLO gate need")
