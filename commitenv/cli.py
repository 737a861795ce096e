"""The ``commitenv`` command line: run and compare controllers on scenarios, simulate a fixed configuration,
bill the requests of a finished run, list scenarios, profiles and workloads."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from commitenv.argtypes import seed as seed_arg
from commitenv.runner import RAY_LOCAL
from commitenv.runner import log as _runner_log

log = logging.getLogger(__name__)


def _cmd_simulate(args: argparse.Namespace) -> int:
    import numpy as np

    from commitenv.profiles import load_profile
    from commitenv.sim.fixed import run_fixed
    from commitenv.sim.pool import EngineOptions
    from commitenv.workload import builtin_workload, list_builtin, load_trace

    prof = load_profile(args.profile)
    _check_out(args.out)
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


DEFAULT_COMPARE_SCENARIO = "bench-h200-hour-fixed-a30"


_TABLE = [  # (summary key, header, width)
    ("controller", "controller", 12), ("attainment_pct", "attain_%", 12), ("mean_abs_dev_pct", "|dev|_%", 12),
    ("hours_within_5pct", "h<=5%", 12), ("cost_kwh_eq", "cost_kWh", 12), ("energy_mj", "energy_MJ", 12),
    ("commitment_mj", "commit_MJ", 12), ("misses", "misses", 8), ("rejected", "rejected", 8),
    ("slo_gate_pass", "gate", 5), ("score", "score", 9), ("wall_s", "wall_s", 12),
]


def _gate_word(passed: bool | None) -> str:
    return "-" if passed is None else ("pass" if passed else "FAIL")


_ENERGY_ONLY_CELLS = {"mean_abs_dev_pct": "energy-only", "hours_within_5pct": "-", "commitment_mj": "-"}


def _print_table(rows: list[dict]) -> None:
    """One line per run; ``gate`` is the scenario's SLO gate (every arrival hour attains >= 100 (1 - epsilon) %),
    followed by a note for every run with rejected requests. A run without commitment (``"settlement":
    "energy_only"``) shows ``energy-only`` for the deviation and ``-`` for the hours within 5 % and the commitment."""
    print("  ".join(f"{h:>{w}}" for _, h, w in _TABLE))
    for r in rows:
        cells = []
        energy_only = r.get("settlement") == "energy_only"
        for c, _, w in _TABLE:
            v = r.get(c)
            if c == "slo_gate_pass":
                cells.append(f"{_gate_word(v):>{w}}")
            elif energy_only and c in _ENERGY_ONLY_CELLS:
                cells.append(f"{_ENERGY_ONLY_CELLS[c]:>{w}}")
            elif v is None:
                cells.append(f"{'-':>{w}}")
            else:
                cells.append(f"{v:>{w}.3f}" if isinstance(v, float) else f"{v!s:>{w}}")
        print("  ".join(cells))
    if any(r.get("settlement") == "energy_only" for r in rows):
        print("energy-only: no commitment; cost_kWh = lambda_plus x energy in kWh (no deviation)")
    if rows:
        print(_gate_text(rows[0]))
        print(_SCORE_TEXT)
    for r in rows:
        if r.get("rejected"):
            print(f"{r['controller']}: {r['rejected']} of {r['requests']} requests rejected ({r['rejected_reason']}), "
                  f"counted as misses")


_SCORE_TEXT = ("score: 100 (cost_vllm - cost) / (cost_vllm - cost_oracle) on the same episode (vLLM 0, the hindsight "
               "optimum 100); a failed gate scores min(score, 0) - shortfall in pp (commitenv.scoring)")


def _gate_text(summary: dict) -> str:
    """What the scenario's SLO gate asks, from a run's recorded objective."""
    obj = summary.get("objective") or {}
    gate = obj.get("gate") or {}
    if gate.get("kind") == "relative":
        return (f"gate: every arrival hour attains >= {obj.get('lower', 'vllm')}'s own attainment in that hour - "
                f"{gate['tolerance_pp']:g} pp (relative gate)")
    eps = obj.get("epsilon", summary.get("slo_gate_epsilon"))
    return "gate: every arrival hour attains >= " + (f"{100 * (1 - eps):g} % (epsilon {eps:g})" if eps is not None
                                                     else "the scenario's threshold")


def _references(args: argparse.Namespace, scenario: str, seeds: list[int]) -> dict[int, tuple[dict, dict]]:
    """The objective's reference runs of every seed (`commitenv.references.seed_references`), unless --no-score."""
    from commitenv.references import seed_references

    if not getattr(args, "score", True):
        return {}
    return seed_references(scenario, seeds, jobs=getattr(args, "jobs", None) or 1, progress=not args.quiet)


def _apply_score(summary: dict, refs: tuple[dict, dict] | None) -> None:
    from commitenv.scoring import apply_score

    apply_score(summary, refs)


def _check_out(out: str | None, *, beside: bool = False) -> Path | None:
    """Fail early (before any run) when ``out`` cannot become a writable folder: create it (and any missing
    parents) and a temporary file in it, then remove all that was created, so nothing is left behind. With
    ``beside`` also create a temporary folder next to ``out`` (where `EvalResult.write` builds its files)."""
    if out is None:
        return None
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder")
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ValueError(f"--out {out}: cannot create folder ({probe} is a file)")
    made: list[Path] = []
    step = "cannot create folder"
    try:
        for d in reversed([p, *p.parents]):
            if not d.exists():
                step = f"cannot create folder {d}" if d != p else "cannot create folder"
                d.mkdir()
                made.append(d)
        step = "cannot write a file in it"
        fd, f = tempfile.mkstemp(prefix=".commitenv-probe-", dir=p)
        os.close(fd)
        os.unlink(f)
        if beside:
            step = f"cannot write beside it in {p.parent}"
            os.rmdir(tempfile.mkdtemp(prefix=".commitenv-probe-", dir=p.parent))
    except OSError as e:
        raise ValueError(f"--out {out}: {step} ({e.strerror or type(e).__name__})") from None
    finally:
        for d in reversed(made):
            try:
                d.rmdir()
            except OSError:
                pass
    return p


def _write_run(res, dest: Path, out: Path, **kw) -> None:
    """``res.write(dest)`` (``dest`` is ``out`` or a sub-folder of it), an OSError restated about the user's
    ``--out`` folder."""
    try:
        res.write(dest, **kw)
    except OSError as e:
        msg = (e.strerror or str(e)).removeprefix(f"{dest}: ")
        where = "" if dest == out else f" ({dest.name}/)"
        raise ValueError(f"--out {out}{where}: {msg}") from None


def _resolve_names(scenario: str, controllers: list[str]) -> list:
    """Check the scenario and resolve every controller spec (`controllers.resolve`); ValueError otherwise."""
    from commitenv.scenarios import load_scenario
    from commitenv.registry import resolve

    load_scenario(scenario)
    return [resolve(c) for c in controllers]


_ARG = re.compile(r"^(?:(?P<scope>[^=]+)\.)?(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$", re.S)


def _parse_controller_args(items: list[str] | None) -> list[tuple[str | None, str, str]]:
    """``--controller-arg [CONTROLLER.]KEY=VALUE`` items as (scope, key, raw value)."""
    out = []
    for item in items or []:
        m = _ARG.match(item)
        if not m:
            raise ValueError(f"--controller-arg {item}: expected KEY=VALUE (KEY a Python identifier; in compare "
                             "optionally CONTROLLER.KEY=VALUE)")
        out.append((m.group("scope"), m.group("key"), m.group("value")))
    return out


def _controller_kwargs(resolved, given: str, args: list[tuple[str | None, str, str]], *,
                       scoped: bool) -> dict:
    """The validated constructor arguments of one controller (``given``: the spec as typed): unscoped
    arguments, and with ``scoped`` those whose scope is its spec or its name."""
    from commitenv.registry import check_kwargs
    from commitenv.registry import parse_arg_value

    raw = {}
    for scope, key, value in args:
        if scope is None or (scoped and scope in (given, resolved.name)):
            raw[key] = value
    kwargs = check_kwargs(resolved, {k: parse_arg_value(v) for k, v in raw.items()}, raw)
    return kwargs


_RAY_ADDRESS = re.compile(r"^(auto|local|ray://\S+|[\w.-]+:\d+)$")


def _check_seed_flags(args: argparse.Namespace) -> None:
    """--jobs, --rerun and --ray belong to --seeds (many episodes); --ray's ADDRESS must look like one."""
    if args.seeds is None:
        given = [flag for flag, on in (("--jobs", args.jobs not in (None, 1)), ("--rerun", args.rerun),
                                       ("--ray", args.ray is not None)) if on]
        if given:
            raise ValueError(f"{given[0]}: only with --seeds (many episodes)")
    if args.ray is not None and not _RAY_ADDRESS.match(args.ray):
        raise ValueError(f"--ray {args.ray}: not a Ray address (ray://HOST:10001, HOST:PORT or auto); to start a "
                         f"local Ray give --ray without one, after the scenario")


def _cmd_run(args: argparse.Namespace) -> int:
    from commitenv.evaluation import evaluate

    _check_seed_flags(args)
    (resolved,) = _resolve_names(args.scenario, [args.controller])
    cargs = _parse_controller_args(args.controller_arg)
    scoped = [s for s, _, _ in cargs if s is not None]
    if scoped:
        raise ValueError(f"--controller-arg: '{scoped[0]}.' scopes an argument to a controller, which only "
                         "`compare` needs; give KEY=VALUE")
    kwargs = _controller_kwargs(resolved, args.controller, cargs, scoped=False)
    backend = _backend(args.backend)
    if args.seeds is not None:
        if backend is not None:
            raise ValueError("--backend: one episode at a time (a pool of GPUs serves one trace), not with --seeds")
        return _run_seeds(args, [(resolved, kwargs)])
    out = _check_out(args.out, beside=True)
    refs = _references(args, args.scenario, [args.seed]).get(args.seed) if backend is None else None
    if backend is not None:
        from commitenv.evaluation import run_episode

        res = run_episode(args.controller, args.scenario, args.seed, progress=not args.quiet,
                          controller_kwargs=kwargs or None, backend=backend)[1]
    else:
        res = evaluate(args.controller, args.scenario, seed=args.seed, progress=not args.quiet,
                       controller_kwargs=kwargs or None)
    _apply_score(res.summary, refs)
    _print_table([res.summary])
    if out is not None:
        _write_run(res, out, out)
        print(f"wrote {out}/summary.json, hourly.csv, decisions.csv, requests.csv, overview.png")
    else:
        _nothing_written("summary.json, hourly.csv, decisions.csv (per interval), requests.csv and overview.png")
    print(json.dumps(res.summary))
    return 0


def _backend(text: str | None):
    """``--backend fake[:SPEED]``: the CPU fakes of a GPU pool on a clock SPEED times real time (default 200)."""
    if text is None or text == "sim":
        return None
    kind, colon, speed = text.partition(":")
    if kind != "fake":
        raise ValueError(f"--backend {text}: expected sim or fake[:SPEED] (real GPUs: build a pool factory in Python, "
                         "docs/real-gpu.md)")
    try:
        x = float(speed) if colon else 200.0
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"--backend {text}: SPEED must be a finite number > 0 (how many times real time the fakes "
                         f"run, e.g. fake:20), got {speed!r}")
    from commitenv.backends.pool import fake_backend

    return fake_backend(speed=x)


def _compare_controllers(args: argparse.Namespace) -> list[tuple]:
    """(resolved controller, kwargs) of every controller to compare; names must be distinct. Without
    ``--controllers``: every registered and entry-point controller (one that cannot be loaded is skipped) except
    hindsight bounds (the ``oracle`` plans minutes ahead with the true trace: name it to add its row)."""
    from commitenv.hindsight import uses_hindsight
    from commitenv.registry import all_names, resolve

    cargs = _parse_controller_args(args.controller_arg)
    explicit = bool(args.controllers)
    if explicit:
        given = [c.strip() for c in args.controllers.split(",") if c.strip()]
        if not given:
            raise ValueError("--controllers: no controller given")
        resolved = _resolve_names(args.scenario, given)
    else:
        _resolve_names(args.scenario, [])
        given, resolved = [], []
        for name in all_names():
            try:
                r = resolve(name)
            except ValueError as e:
                log.warning("skipped %s: %s", name, e)
                continue
            if uses_hindsight(r.target):  # a bound, named explicitly when wanted (--controllers help)
                continue
            resolved.append(r)
            given.append(name)
    seen: dict[str, str] = {}
    for g, r in zip(given, resolved):
        if r.name in seen:
            raise ValueError(f"--controllers: '{seen[r.name]}' and '{g}' are both named '{r.name}'; their results "
                             "would share a folder")
        seen[r.name] = g
    for scope, key, _ in cargs:
        if scope is not None and scope not in seen and scope not in seen.values():
            raise ValueError(f"--controller-arg {scope}.{key}: no controller '{scope}' in this comparison "
                             f"({', '.join(seen)})")
    return [(r, _controller_kwargs(r, g, cargs, scoped=True)) for g, r in zip(given, resolved)]


def _cmd_compare(args: argparse.Namespace) -> int:
    from commitenv.evaluation import evaluate

    _check_seed_flags(args)
    explicit = bool(args.controllers)
    todo = _compare_controllers(args)
    if args.seeds is not None:
        return _run_seeds(args, todo)
    out = _check_out(args.out)
    refs = _references(args, args.scenario, [args.seed]).get(args.seed)
    rows: list[dict] = []
    errors: list[dict] = []
    for resolved, kwargs in todo:
        name = resolved.name
        try:
            res = evaluate(resolved.spec, args.scenario, seed=args.seed, progress=not args.quiet,
                           controller_kwargs=kwargs or None)
        except ImportError as e:
            if not explicit:
                log.warning("skipped %s: %s", name, e)
                continue
            errors.append({"controller": name, "error": f"cannot run here: {e}"})
        except Exception as e:  # noqa: BLE001  (one failing controller must not lose the others' results)
            from commitenv.runner import error_text

            errors.append({"controller": name, "error": error_text(e)})
        else:
            _apply_score(res.summary, refs)
            rows.append(res.summary)
            if out is not None:
                _write_run(res, out / name, out, requests=False)
        if errors and errors[-1]["controller"] == name:
            log.error("%s failed: %s", name, errors[-1]["error"])
        if out is not None:
            _write_compare(out, args, rows, errors, [r.name for r, _ in todo])
    _print_table(rows)
    for e in errors:
        print(f"{e['controller']}: FAILED ({e['error']})")
    if out is not None:
        _write_compare(out, args, rows, errors, [r.name for r, _ in todo])
        print(f"wrote {out}/compare.json")
    else:
        _nothing_written("compare.json and each controller's run files")
    return 1 if errors else 0


def _nothing_written(what: str) -> None:
    """One line on stderr after a run without ``--out`` (stdout stays the results)."""
    print(f"nothing written: give --out DIR to write {what}", file=sys.stderr)


def _write_compare(out: Path, args: argparse.Namespace, rows: list[dict], errors: list[dict], names: list[str]) -> None:
    """compare.json of a single-seed comparison: ``results`` (the summaries of the runs that finished),
    ``errors`` (``{"controller", "error"}`` of those that failed) and ``gate`` (pass / FAIL / error, in the
    order of ``names``)."""
    word = {r["controller"]: _gate_word(r.get("slo_gate_pass")) for r in rows}
    word.update({e["controller"]: "error" for e in errors})
    gate = {n: word[n] for n in names if n in word}
    doc = {"scenario": args.scenario, "seed": args.seed, "gate": gate, "results": rows, "errors": errors}
    tmp = out / "compare.json.tmp"
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        tmp.replace(out / "compare.json")
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise ValueError(f"--out {out}: cannot write compare.json ({e.strerror or e})") from None


_SEED_TABLE = [  # (metric, header, format)
    ("score", "score", ".2f"), ("attainment_pct", "attain_%", ".3f"), ("mean_abs_dev_pct", "|dev|_%", ".3f"),
    ("cost_kwh_eq", "cost_kWh", ".4f"), ("energy_mj", "energy_MJ", ".3f"), ("misses", "misses", ".1f"),
    ("rejected", "rejected", ".1f"),
]


def _run_seeds(args: argparse.Namespace, todo: list[tuple]) -> int:
    """Every (controller, seed) episode of ``--seeds`` (``--jobs`` processes, or Ray tasks with ``--ray``),
    resumable under OUT/<controller>/seed-<s>/, then the aggregate (mean and 95 % CI per metric) printed and
    written as OUT/compare.json and compare.csv."""
    from commitenv.evaluation import _scenario_file
    from commitenv.runner import (Job, aggregate, episode_dir, finished, import_ray, parse_seeds, run_jobs,
                                  scenario_seeds, write_aggregate)
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
    sc_name, sc_file = sc.name, _scenario_file(sc)
    out = _check_out(args.out)
    refs = _references(args, args.scenario, seeds)
    controllers = [{"controller": r.name, "origin": r.origin, "kwargs": kw} for r, kw in todo]
    episodes: dict[str, dict[int, dict]] = {r.name: {} for r, _ in todo}
    errors: list[dict] = []
    pending: list = []
    for r, kw in todo:
        for s in seeds:
            dest = None if out is None else str(episode_dir(out, r.name, s))
            job = Job(r.spec, r.name, r.origin, kw, args.scenario, s, dest, references=refs.get(s))
            prev = None if args.rerun else finished(job, sc_name, sc_file)
            if prev is not None:
                _apply_score(prev, refs.get(s))
                episodes[r.name][s] = prev
            else:
                pending.append(job)
    n_all = len(todo) * len(seeds)
    if n_all > len(pending):
        log.info("resuming: %d of %d episodes already finished in %s", n_all - len(pending), n_all, out)

    def write() -> None:
        if out is not None:
            try:
                write_aggregate(out, aggregate(sc_name, seeds, controllers, episodes, errors))
            except OSError as e:
                raise ValueError(f"--out {out}: cannot write compare.json ({e.strerror or e})") from None

    def on_done(job, result: dict) -> None:
        if "summary" in result:
            episodes[job.name][job.seed] = result["summary"]
        else:
            errors.append({"controller": job.name, "seed": job.seed, "error": result["error"]})
            log.error("%s seed %s failed: %s", job.name, job.seed, result["error"])
        write()

    run_jobs(pending, n_jobs=args.jobs, progress=not args.quiet, on_done=on_done, ray_address=args.ray)
    errors.sort(key=lambda e: ([c["controller"] for c in controllers].index(e["controller"]), e["seed"]))
    doc = aggregate(sc_name, seeds, controllers, episodes, errors)
    write()
    _print_seed_table(doc)
    if out is not None:
        print(f"wrote {out}/compare.json, compare.csv and {out}/<controller>/seed-<s>/")
    else:
        _nothing_written("compare.json, compare.csv and every episode's run files")
    return 1 if errors else 0


def _print_seed_table(doc: dict) -> None:
    """One line per controller: episodes, SLO gate passes, and each key metric as mean +- 95 % CI half-width."""
    w = max([10] + [len(c["controller"]) for c in doc["controllers"]])
    head = f"{'controller':>{w}}  {'n':>3}  {'gate':>6}" + "".join(f"  {h:>20}" for _, h, _ in _SEED_TABLE)
    print(head)
    for c in doc["controllers"]:
        cells = [f"{c['controller']:>{w}}", f"{c['episodes']:>3}", f"{c['slo_gate_pass_count']:>3}/{c['episodes']:<2}"]
        for k, _, fmt in _SEED_TABLE:
            m = c["metrics"].get(k)
            if m is None and k == "mean_abs_dev_pct" and doc.get("settlement") == "energy_only":
                cells.append(f"{'energy-only':>20}")
            elif m is None or m["mean"] is None:
                cells.append(f"{'-':>20}")
            elif m["half_width"] is None:
                cells.append(f"{format(m['mean'], fmt):>20}")
            else:
                cells.append(f"{format(m['mean'], fmt) + ' +- ' + format(m['half_width'], fmt):>20}")
        print("  ".join(cells))
    print(f"mean +- 95 % CI half-width (t-distribution) over seeds {_seed_text(doc['seeds'])}; gate: SLO gate passes")
    print(_SCORE_TEXT)
    for c in doc["controllers"]:
        rej = c["metrics"].get("rejected")
        if rej and rej["mean"]:
            print(f"{c['controller']}: {rej['mean']:.1f} requests rejected per episode on average (prompt at or over the "
                  f"context limit), counted as misses")
    for e in doc["errors"]:
        print(f"{e['controller']} seed {e['seed']}: FAILED ({e['error']})")


def _seed_text(seeds: list[int]) -> str:
    if seeds and seeds == list(range(seeds[0], seeds[0] + len(seeds))) and len(seeds) > 2:
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))


def _cmd_reproduce(args: argparse.Namespace) -> int:
    if args.paper not in ("epact", "festina"):
        raise ValueError(f"unknown reproduction '{args.paper}'; available: epact, festina")
    if args.paper == "festina":
        from commitenv.reproduce.festina import run as run_festina

        out = _check_out(args.out if args.out != "runs/reproduce-epact" else "runs/reproduce-festina")
        seeds = (100000,) if args.quick else (100000, 100001, 100002)
        res = run_festina(out, seeds=seeds, progress=not args.quiet)
        print(f"wrote {out}/report.md and results.json ({res['wall_s']:.0f} s)")
        return 0
    from commitenv.reproduce.epact import run

    out = _check_out(args.out)
    res = run(out, quick=args.quick, seed=args.seed, workers=args.workers, progress=not args.quiet)
    print(f"wrote {out}/report.md, results.json and figures ({res['wall_s']:.0f} s)")
    return 0


_REPRODUCED = ("energy_mj", "cost_kwh_eq", "attainment_pct", "misses", "requests")


def _cmd_attribute(args: argparse.Namespace) -> int:
    """Bill every request of a finished run: re-run its deterministic episode with attribution on (no step log
    is stored with a run), check that it reproduces summary.json, write bills.csv into the run folder."""
    import numpy as np

    from commitenv.evaluation import run_episode, write_bills

    run = Path(args.run_dir)
    spath = run / "summary.json"
    if not run.is_dir():
        raise ValueError(f"{run}: not a folder; expected the --out folder of `commitenv run`")
    try:
        summary = json.loads(spath.read_text())
    except FileNotFoundError:
        raise ValueError(f"{spath}: not found; expected the --out folder of `commitenv run`") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{spath}: not valid JSON ({e})") from None
    missing = [k for k in ("scenario", "controller", "seed") if k not in summary]
    if missing:
        raise ValueError(f"{spath}: missing {', '.join(missing)}; cannot re-run the episode")
    if args.pairs < 2:
        raise ValueError(f"--pairs: need at least 2 antithetic pairs for an error bar, got {args.pairs}")
    if args.window < 1:
        raise ValueError(f"--window: expected at least 1 request, got {args.window}")
    if not os.access(run, os.W_OK):
        raise ValueError(f"{run}: not writable; cannot write bills.csv")
    scenario = args.scenario or summary.get("scenario_file") or summary["scenario"]
    controller, seed = summary["controller"], int(summary["seed"])
    try:
        from commitenv.registry import spec_from_origin

        spec = spec_from_origin(summary.get("controller_origin"), controller)
        (resolved,) = _resolve_names(scenario, [spec])
    except ValueError as e:
        raise ValueError(f"{spath}: cannot re-run the episode: {e}"
                         + ("" if args.scenario else " (give the scenario with --scenario NAME_OR_FILE)")) from None
    if resolved.name != controller:
        raise ValueError(f"{spath}: cannot re-run the episode: the controller recorded as '{controller}' "
                         f"({summary.get('controller_origin')}) is now named '{resolved.name}'")
    env, res = run_episode(spec, scenario, seed, progress=not args.quiet, attribution=True,
                           controller_kwargs=summary.get("controller_kwargs"))
    for k in _REPRODUCED:
        if k in summary and not _close(summary[k], res.summary.get(k)):
            raise ValueError(
                f"{spath}: re-running {controller} on {scenario} (seed {seed}) gives {k} = {res.summary.get(k)}, "
                f"but the run recorded {summary[k]}; the bills would not belong to this run (another code version, "
                f"scenario file or controller setting?)"
            )
    bills = dict(res.bills)
    total = float(bills["total_j"].sum())
    metered = float(env.pool.energy_j())
    report = {
        "run": str(run),
        "scenario": res.scenario,
        "controller": controller,
        "seed": seed,
        "requests": int(np.count_nonzero(env.pool.replica_of >= 0)),
        "busy_mj": total / 1e6,
        "idle_mj": (metered - total) / 1e6,
        "tenant_mj": {env.table.tenant_names[t]: float(bills["total_j"][bills["tenant"] == t].sum() / 1e6)
                      for t in np.unique(bills["tenant"]).tolist()},
    }
    if args.replay:
        from commitenv.attribution.windows import attribution_windows, replay_correction

        n_win = len(attribution_windows(env.pool.replica_of, args.window))
        todo = n_win if args.max_windows is None else min(n_win, args.max_windows)
        bar = None
        if not args.quiet:
            from tqdm import tqdm

            bar = tqdm(total=todo, unit="window", desc="replay", leave=False)
        # when each request left the engine (finish_t is what the client sees: serving overheads included)
        oh = env.pool.overhead_s
        finish = env.pool.finish_t if oh is None else env.pool.finish_t - oh
        try:
            corr = replay_correction(
                env.table, bills["total_j"], env.profile, env.pool.replica_of, finish_s=finish,
                actions=env.actions, initial_clock_mhz=env.clocks_mhz[env._init_clock], window=args.window,
                n_pairs=args.pairs, seed=seed, max_windows=args.max_windows,
                progress=None if bar is None else (lambda k: bar.update(1)), own_mode=args.replay_own,
            )
        finally:
            if bar is not None:
                bar.close()
        bills["replay_j"] = corr.shares
        bills["replay_se_j"] = corr.se
        report["replay"] = corr.as_dict()
    tmp = run / f".bills.csv.tmp-{os.getpid()}"
    try:
        write_bills(tmp, bills)
        tmp.replace(run / "bills.csv")
    finally:
        tmp.unlink(missing_ok=True)
    print(f"{report['requests']} requests billed: busy {report['busy_mj']:.4f} MJ (shares), idle "
          f"{report['idle_mj']:.4f} MJ (not billed)")
    for name, mj in report["tenant_mj"].items():
        print(f"  tenant {name}: {mj:.4f} MJ")
    if args.replay:
        print(corr.summary())
    print(f"wrote {run / 'bills.csv'}")
    print(json.dumps(report))
    return 0


def _close(a, b, rel: float = 1e-9) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= rel * max(abs(a), abs(b)) + 1e-12
    return a == b


def _cmd_scenarios(args: argparse.Namespace) -> int:
    from commitenv.scenarios import describe_scenarios

    for env_id, desc in describe_scenarios():
        print(f"{env_id:<42} {desc}")
    return 0


def _cmd_controllers(args: argparse.Namespace) -> int:
    from commitenv.registry import discover

    rows = discover()
    w = max(len(r.name) for r in rows)
    wo = max(len(r.origin) for r in rows)
    for r in rows:
        print(f"{r.name:<{w}}  {r.origin:<{wo}}  {r.doc}".rstrip())
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
    s.add_argument("--seed", type=seed_arg, default=0)
    s.add_argument("--hours", type=int, default=None, help="only the first N hours")
    s.add_argument("--out", default=None, help="folder for summary.json")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=_cmd_simulate)
    r = sub.add_parser("run", help="run one controller on a scenario and write its results")
    r.add_argument("scenario", help="scenario name, Gymnasium id (commitenv/<name>-v0) or path of a scenario YAML file")
    r.add_argument("--controller", default="vllm",
                   help="a registered or entry-point name, module:Class or path/to/file.py:Class")
    r.add_argument("--controller-arg", action="append", metavar="KEY=VALUE",
                   help="constructor argument (repeatable); VALUE is read as JSON when it is valid JSON, else text")
    _seed_args(r)
    r.add_argument("--out", default=None,
                   help="folder for summary.json, hourly.csv, decisions.csv, requests.csv, overview.png (with "
                        "--seeds: OUT/<controller>/seed-<s>/ and compare.json)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument("--backend", default=None, metavar="sim|fake[:SPEED]",
                   help="serve on the simulator (default) or on the hardware backend's CPU fakes, a GPU pool replayed "
                        "in real time SPEED times faster (default 200); a replay that falls behind real time warns "
                        "and is marked backend_lagging (docs/real-gpu.md)")
    r.set_defaults(func=_cmd_run)
    c = sub.add_parser("compare", help="run several controllers on one scenario side by side")
    c.add_argument("scenario", nargs="?", default=DEFAULT_COMPARE_SCENARIO,
                   help="scenario name, Gymnasium id or path of a scenario YAML file (default: %(default)s)")
    c.add_argument("--controllers", default=None,
                   help="comma-separated specs, each a name, module:Class, path/to/file.py:Class or sb3:DIR "
                        "(default: every registered and entry-point controller except the hindsight bound 'oracle', "
                        "which plans for minutes with the true trace: name it to add its row)")
    c.add_argument("--controller-arg", action="append", metavar="[CONTROLLER.]KEY=VALUE",
                   help="constructor argument (repeatable), for every controller or, with CONTROLLER., for one")
    _seed_args(c)
    c.add_argument("--out", default=None, help="folder for compare.json and one sub-folder per controller")
    c.add_argument("--quiet", action="store_true")
    c.set_defaults(func=_cmd_compare)
    rp = sub.add_parser("reproduce", help="reproduce a paper's tables (epact, festina) and write a report")
    rp.add_argument("paper", choices=["epact", "festina"])
    rp.add_argument("--quick", action="store_true", help="a reduced set (single hour, alpha 3, both GPUs)")
    rp.add_argument("--seed", type=seed_arg, default=0)
    rp.add_argument("--workers", type=int, default=None, help="ePACT what-if processes (default: all cores)")
    rp.add_argument("--out", default="runs/reproduce-epact")
    rp.add_argument("--quiet", action="store_true")
    rp.set_defaults(func=_cmd_reproduce)
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
    at.set_defaults(func=_cmd_attribute)
    sub.add_parser("scenarios", help="list registered scenarios").set_defaults(func=_cmd_scenarios)
    sub.add_parser("controllers", help="list registered and entry-point controllers: name, origin, description"
                   ).set_defaults(func=_cmd_controllers)
    sub.add_parser("profiles", help="list shipped GPU x model profiles").set_defaults(func=_cmd_profiles)
    sub.add_parser("workloads", help="list built-in workloads").set_defaults(func=_cmd_workloads)
    from commitenv.train.cli import add_train_parser  # `commitenv train` (no learning stack loaded until it runs)

    add_train_parser(sub)
    from commitenv.leaderboard.cli import add_leaderboard_parsers

    add_leaderboard_parsers(sub)
    from commitenv.backends.cli import add_calibrate_parser

    add_calibrate_parser(sub)
    return ap


def _seed_args(p: argparse.ArgumentParser) -> None:
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


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (not the stream of the moment the handler was
    made), above any progress bar: progress (INFO) as the bare message, warnings and errors as ``level: message``."""

    @property
    def stream(self):  # noqa: D102
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        return msg if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {msg}"

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        with tqdm.external_write_mode(file=sys.stderr):
            super().emit(record)


def _console_configured() -> bool:
    """Whether the root logger writes to the terminal already (a program that set up logging calls `main`)."""
    consoles = (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)
    return any(isinstance(h, logging.StreamHandler) and h.stream in consoles for h in logging.getLogger().handlers)


@contextmanager
def _cli_logging() -> Iterator[None]:
    """For one command, the package's messages (logger ``commitenv`` and its children) from INFO up on stderr:
    the command's own (progress such as "resuming: ...", failed episodes) always, the library's warnings (such
    as rejected requests) unless the root logger has handlers (the caller routes them). A root logger that
    writes to the terminal already gets them all instead, so nothing shows twice. Undone afterwards, so a
    program that calls `main` keeps its logging as it was."""
    lg = logging.getLogger("commitenv")
    level = lg.level
    h = None if _console_configured() else _StderrHandler()
    if h is not None:
        if logging.getLogger().handlers:
            own = (log.name, _runner_log.name)
            h.addFilter(lambda record: record.name in own or record.name.startswith("commitenv.leaderboard"))
        lg.addHandler(h)
    if lg.getEffectiveLevel() > logging.INFO:
        lg.setLevel(logging.INFO)
    try:
        yield
    finally:
        lg.setLevel(level)
        if h is not None:
            lg.removeHandler(h)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with _cli_logging():
        try:
            return args.func(args)
        except (ValueError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
