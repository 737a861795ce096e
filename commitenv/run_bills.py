"""Bills of a finished run: re-run its recorded episode with attribution on (no step log is stored with a
run), check that it reproduces the recorded summary.json, and bill every request (bills.csv)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from commitenv.attribution.windows import WindowCorrection
    from commitenv.envs import CommitServeEnv
    from commitenv.evaluation import EvalResult

# the summary's numbers a re-run must reproduce for its bills to belong to the recorded run
REPRODUCED = ("energy_mj", "cost_kwh_eq", "attainment_pct", "misses", "requests")


class RunNotFound(ValueError):
    """The recorded controller or scenario of a run cannot be found again (the scenario may need naming)."""


@dataclass
class ReplayOptions:
    """The scheduler-replay correction per attribution window (`commitenv.attribution.windows`)."""

    window: int = 16  # requests per attribution window
    pairs: int = 10  # antithetic permutation pairs per window
    max_windows: int | None = None  # replay only the first N windows
    own_mode: str = "replayed"  # 'replayed' or 'fixed' (StepSplit Eq. 6)


@dataclass
class RunBills:
    """What billing a run produced: ``report`` (the JSON-able totals), ``path`` (bills.csv) and, with the replay
    correction, its ``replay`` result."""

    report: dict[str, Any]
    path: Path
    replay: WindowCorrection | None = None


def read_run(run: Path) -> dict[str, Any]:
    """The summary.json of the run folder ``run``, checked to name its scenario, controller and seed."""
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
    return summary


def rerun_recorded(run: Path, summary: dict[str, Any], scenario: str | None = None, *,
                   progress: bool = False) -> tuple[CommitServeEnv, EvalResult]:
    """(env, EvalResult) of the recorded episode re-run with attribution on, after checking that it reproduces
    every `REPRODUCED` number of ``summary`` (ValueError otherwise). ``scenario``: where to find the scenario
    when the recorded name or file does not lead to it (`RunNotFound` when neither does)."""
    from commitenv.evaluation import run_episode
    from commitenv.registry import resolve, spec_from_origin
    from commitenv.scenarios import load_scenario

    spath = run / "summary.json"
    scenario = scenario or summary.get("scenario_file") or summary["scenario"]
    controller, seed = summary["controller"], int(summary["seed"])
    try:
        spec = spec_from_origin(summary.get("controller_origin"), controller)
        load_scenario(scenario)
        resolved = resolve(spec)
    except ValueError as e:
        raise RunNotFound(f"{spath}: cannot re-run the episode: {e}") from None
    if resolved.name != controller:
        raise ValueError(f"{spath}: cannot re-run the episode: the controller recorded as '{controller}' "
                         f"({summary.get('controller_origin')}) is now named '{resolved.name}'")
    env, res = run_episode(spec, scenario, seed, progress=progress, attribution=True,
                           controller_kwargs=summary.get("controller_kwargs"))
    for k in REPRODUCED:
        if k in summary and not _close(summary[k], res.summary.get(k)):
            raise ValueError(
                f"{spath}: re-running {controller} on {scenario} (seed {seed}) gives {k} = {res.summary.get(k)}, "
                f"but the run recorded {summary[k]}; the bills would not belong to this run (another code version, "
                f"scenario file or controller setting?)"
            )
    return env, res


def bill_run(run: Path, summary: dict[str, Any], scenario: str | None = None, *,
             replay: ReplayOptions | None = None, progress: bool = False) -> RunBills:
    """Re-run the recorded episode of ``run`` (`rerun_recorded`), bill every request (StepSplit shares; with
    ``replay`` also the scheduler-replay correction, columns replay_j and replay_se_j) and write bills.csv
    into the run folder atomically."""
    import numpy as np

    from commitenv.evaluation import write_bills

    env, res = rerun_recorded(run, summary, scenario, progress=progress)
    seed = int(summary["seed"])
    bills = dict(res.bills)
    total = float(bills["total_j"].sum())
    metered = float(env.pool.energy_j())
    report = {
        "run": str(run),
        "scenario": res.scenario,
        "controller": summary["controller"],
        "seed": seed,
        "requests": int(np.count_nonzero(env.pool.replica_of >= 0)),
        "busy_mj": total / 1e6,
        "idle_mj": (metered - total) / 1e6,
        "tenant_mj": {env.table.tenant_names[t]: float(bills["total_j"][bills["tenant"] == t].sum() / 1e6)
                      for t in np.unique(bills["tenant"]).tolist()},
    }
    corr = None
    if replay is not None:
        corr = _replay(env, bills, replay, seed, progress)
        bills["replay_j"] = corr.shares
        bills["replay_se_j"] = corr.se
        report["replay"] = corr.as_dict()
    tmp = run / f".bills.csv.tmp-{os.getpid()}"
    try:
        write_bills(tmp, bills)
        tmp.replace(run / "bills.csv")
    finally:
        tmp.unlink(missing_ok=True)
    return RunBills(report=report, path=run / "bills.csv", replay=corr)


def _replay(env: CommitServeEnv, bills: dict[str, Any], opts: ReplayOptions, seed: int,
            progress: bool) -> WindowCorrection:
    """The scheduler-replay correction of the re-run episode ``env`` (a progress bar per window with ``progress``)."""
    from commitenv.attribution.windows import attribution_windows, replay_correction

    n_win = len(attribution_windows(env.pool.replica_of, opts.window))
    todo = n_win if opts.max_windows is None else min(n_win, opts.max_windows)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=todo, unit="window", desc="replay", leave=False)
    # when each request left the engine (finish_t is what the client sees: serving overheads included)
    oh = env.pool.overhead_s
    finish = env.pool.finish_t if oh is None else env.pool.finish_t - oh
    try:
        return replay_correction(
            env.table, bills["total_j"], env.profile, env.pool.replica_of, finish_s=finish,
            actions=env.actions, initial_clock_mhz=env.clocks_mhz[env._init_clock], window=opts.window,
            n_pairs=opts.pairs, seed=seed, max_windows=opts.max_windows,
            progress=None if bar is None else (lambda k: bar.update(1)), own_mode=opts.own_mode,
        )
    finally:
        if bar is not None:
            bar.close()


def _close(a: Any, b: Any, rel: float = 1e-9) -> bool:
    """Equal numbers within ``rel`` (relative) or equal values of other kinds."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= rel * max(abs(a), abs(b)) + 1e-12
    return a == b
