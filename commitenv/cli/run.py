"""``commitenv run`` and ``commitenv compare``: parse their options, run through `commitenv.evaluation` and
`commitenv.comparison`, print the tables and write the results under ``--out``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from commitenv.cli.args import (check_out, check_seed_flags, compared_controllers, controller_kwargs,
                                parse_backend, parse_controller_args, resolve_names, write_run)
from commitenv.cli.tables import print_seed_table, print_table

if TYPE_CHECKING:  # pragma: no cover
    from commitenv.comparison import ComparedController, Comparison
    from commitenv.evaluation import EvalResult

DEFAULT_COMPARE_SCENARIO = "bench-h200-hour-fixed-a30"


def _references(args: argparse.Namespace, scenario: str, seeds: list[int]) -> dict[int, tuple[dict, dict]]:
    """The objective's reference runs of every seed (`commitenv.references.seed_references`), unless --no-score."""
    from commitenv.references import seed_references

    if not getattr(args, "score", True):
        return {}
    return seed_references(scenario, seeds, jobs=getattr(args, "jobs", None) or 1, progress=not args.quiet)


def cmd_run(args: argparse.Namespace) -> int:
    """One controller on one scenario: one episode (the simulator or ``--backend``), or many with ``--seeds``."""
    from commitenv.comparison import ComparedController
    from commitenv.evaluation import evaluate
    from commitenv.scoring import apply_score

    check_seed_flags(args)
    (resolved,) = resolve_names(args.scenario, [args.controller])
    cargs = parse_controller_args(args.controller_arg)
    scoped = [s for s, _, _ in cargs if s is not None]
    if scoped:
        raise ValueError(f"--controller-arg: '{scoped[0]}.' scopes an argument to a controller, which only "
                         "`compare` needs; give KEY=VALUE")
    kwargs = controller_kwargs(resolved, args.controller, cargs, scoped=False)
    backend = parse_backend(args.backend)
    if args.seeds is not None:
        if backend is not None:
            raise ValueError("--backend: one episode at a time (a pool of GPUs serves one trace), not with --seeds")
        return _run_seeds(args, [ComparedController(resolved, kwargs)])
    out = check_out(args.out, beside=True)
    refs = _references(args, args.scenario, [args.seed]).get(args.seed) if backend is None else None
    if backend is not None:
        from commitenv.evaluation import run_episode

        res = run_episode(args.controller, args.scenario, args.seed, progress=not args.quiet,
                          controller_kwargs=kwargs or None, backend=backend)[1]
    else:
        res = evaluate(args.controller, args.scenario, seed=args.seed, progress=not args.quiet,
                       controller_kwargs=kwargs or None)
    apply_score(res.summary, refs)
    print_table([res.summary])
    if out is not None:
        write_run(res, out, out)
        print(f"wrote {out}/summary.json, hourly.csv, decisions.csv, requests.csv, overview.png")
    else:
        _nothing_written("summary.json, hourly.csv, decisions.csv (per interval), requests.csv and overview.png")
    print(json.dumps(res.summary))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Several controllers side by side on one scenario (one seed, or many with ``--seeds``)."""
    from commitenv.comparison import compare_seed

    check_seed_flags(args)
    explicit = bool(args.controllers)
    todo = compared_controllers(args)
    if args.seeds is not None:
        return _run_seeds(args, todo)
    out = check_out(args.out)
    refs = _references(args, args.scenario, [args.seed]).get(args.seed)
    names = [e.resolved.name for e in todo]

    def after_run(cmp: Comparison, entry: ComparedController, res: EvalResult | None) -> None:
        if out is None:
            return
        if res is not None:
            write_run(res, out / entry.resolved.name, out, requests=False)
        _write_compare(out, args, cmp, names)

    cmp = compare_seed(todo, args.scenario, args.seed, refs=refs, explicit=explicit, progress=not args.quiet,
                       after_run=after_run)
    print_table(cmp.rows)
    for e in cmp.errors:
        print(f"{e['controller']}: FAILED ({e['error']})")
    if out is not None:
        _write_compare(out, args, cmp, names)
        print(f"wrote {out}/compare.json")
    else:
        _nothing_written("compare.json and each controller's run files")
    return 1 if cmp.errors else 0


def _nothing_written(what: str) -> None:
    """One line on stderr after a run without ``--out`` (stdout stays the results)."""
    print(f"nothing written: give --out DIR to write {what}", file=sys.stderr)


def _write_compare(out: Path, args: argparse.Namespace, cmp: Comparison, names: list[str]) -> None:
    """compare.json (`commitenv.comparison.write_compare`), an OSError restated about ``--out``."""
    from commitenv.comparison import write_compare

    try:
        write_compare(out, args.scenario, args.seed, cmp, names)
    except OSError as e:
        raise ValueError(f"--out {out}: cannot write compare.json ({e.strerror or e})") from None


def _run_seeds(args: argparse.Namespace, todo: list[ComparedController]) -> int:
    """Every (controller, seed) episode of ``--seeds`` (`commitenv.comparison.run_seeds`), then the aggregate
    (mean and 95 % CI per metric) printed and written as OUT/compare.json and compare.csv."""
    from commitenv.comparison import run_seeds
    from commitenv.runner import import_ray, parse_seeds, scenario_seeds, write_aggregate
    from commitenv.scenarios import load_scenario

    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs: expected at least 1 {'episode at a time' if args.ray else 'process'}, "
                         f"got {args.jobs}")
    if args.ray is not None:
        try:
            import_ray("--ray")
        except ImportError as e:
            raise ValueError(str(e)) from None
    sc = load_scenario(args.scenario)
    seeds = scenario_seeds(args.seeds, sc.seeds)
    if seeds is None:
        seeds = parse_seeds(args.seeds)
    out = check_out(args.out)
    refs = _references(args, args.scenario, seeds)

    def write(doc: dict) -> None:
        if out is not None:
            try:
                write_aggregate(out, doc)
            except OSError as e:
                raise ValueError(f"--out {out}: cannot write compare.json ({e.strerror or e})") from None

    doc = run_seeds(todo, args.scenario, seeds, out=out, refs=refs, rerun=args.rerun, jobs=args.jobs, ray=args.ray,
                    progress=not args.quiet, write=write)
    print_seed_table(doc)
    if out is not None:
        print(f"wrote {out}/compare.json, compare.csv and {out}/<controller>/seed-<s>/")
    else:
        _nothing_written("compare.json, compare.csv and every episode's run files")
    return 1 if doc["errors"] else 0
