"""Many episodes: seed lists, a local process pool or Ray, resumable run folders and the seed aggregate.

``commitenv run|compare SCENARIO ... --seeds 0-9 --jobs N`` runs every (controller, seed) episode, in a
``ProcessPoolExecutor`` with the ``spawn`` start method when N > 1 (each worker builds its controller from the
spec string, so a controller given as ``path/to/file.py:Class`` works there too). With ``--ray [ADDRESS]`` the
same jobs run as Ray tasks (one CPU each, at most N in flight), on a local Ray or a cluster; a task returns its
episode's files and this process writes them, so the workers need not share this disk (they do need commitenv
and any scenario or controller file named by path). Each episode is written atomically into
``OUT/<controller>/seed-<s>/``; a folder whose summary.json matches the scenario, controller,
origin, arguments and seed is finished and is not run again. `aggregate` reports per controller each numeric
summary metric's mean with a 95 % confidence interval (Student t: mean +- t_{0.975, n-1} sd / sqrt(n)), the
per-seed values and the SLO gate pass count.

This module imports no controller code and no Ray at import time (workers import the controller when they
build it; Ray is imported when it is asked for).
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import json
import logging
import math
import os
import re
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

# ============================================================================================== seeds
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def scenario_seeds(text: str, ranges) -> list[int] | None:
    """``"test"`` / ``"train"`` (optionally ``":N"``, the first N) -> seeds of the scenario's declared range
    (``ranges``: its `SeedRanges` or None); None when ``text`` names no range."""
    name, _, n = str(text).strip().partition(":")
    if name not in ("test", "train"):
        return None
    if ranges is None:
        raise ValueError(f"--seeds {text}: this scenario declares no seed ranges (scenario field 'seeds')")
    lo, hi = getattr(ranges, name)
    if n and not n.isdigit():
        raise ValueError(f"--seeds {text}: expected {name} or {name}:N with N a whole number")
    count = hi - lo if not n else int(n)
    if not 1 <= count <= hi - lo:
        raise ValueError(f"--seeds {text}: the {name} range [{lo}, {hi}) holds {hi - lo} seeds, asked for {count}")
    return list(range(lo, lo + count))


def parse_seeds(text: str) -> list[int]:
    """``"0-4"`` -> [0, 1, 2, 3, 4]; ``"0,3,7"``; mixed ``"0-2,10"``. Duplicates are an error, order kept."""
    seeds: list[int] = []
    for part in str(text).split(","):
        if not part.strip():
            raise ValueError(f"--seeds {text}: empty item; expected e.g. 0-9 or 0,3,7")
        m = _RANGE.match(part)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if hi < lo:
                raise ValueError(f"--seeds {text}: range {part.strip()} runs backwards")
            seeds += range(lo, hi + 1)
        elif part.strip().isdigit():
            seeds.append(int(part))
        else:
            raise ValueError(f"--seeds {text}: '{part.strip()}' is not a seed (a whole number >= 0) or a range a-b")
    dup = sorted({s for s in seeds if seeds.count(s) > 1})
    if dup:
        raise ValueError(f"--seeds {text}: seed {dup[0]} given twice")
    return seeds


# ============================================================================================== t quantiles
# t_{0.975, df} for df = 1..30 (two-sided 95 %), to 4 decimals as printed in every statistics table
_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
         2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
         2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)
_Z975 = 1.959963984540054


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom: the table for df <= 30, beyond it the
    Cornish-Fisher expansion around the normal quantile (error < 1e-5 for df > 30)."""
    if df < 1:
        raise ValueError(f"t quantile: need df >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def mean_ci95(values: list[float]) -> dict[str, Any]:
    """``n``, ``mean``, ``sd`` (n - 1), ``half_width`` = t_{0.975,n-1} sd / sqrt(n) and ``ci95`` [lo, hi];
    sd and the interval are None for a single value."""
    x = [float(v) for v in values]
    n = len(x)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None, "half_width": None, "ci95": None}
    mean = math.fsum(x) / n
    if n == 1:
        return {"n": 1, "mean": mean, "sd": None, "half_width": None, "ci95": None}
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in x) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "half_width": half, "ci95": [mean - half, mean + half]}


# ============================================================================================== episodes
@dataclass(frozen=True)
class Job:
    """One episode: the controller's spec string (what `commitenv_controllers.make` accepts), the name and origin it
    resolved to (for the folder and the resume check), its arguments, the scenario and seed, and the folder
    to write (None: do not write)."""

    spec: str
    name: str
    origin: str | None
    kwargs: dict[str, Any]
    scenario: str
    seed: int
    out: str | None = None
    requests: bool = False
    figure: bool = True
    references: tuple[dict[str, Any], dict[str, Any]] | None = None  # (lower, upper) summaries: score the episode


def episode_dir(out: str | Path, name: str, seed: int) -> Path:
    """``OUT/<controller>/seed-<s>``."""
    return Path(out) / name / f"seed-{seed}"


def finished(job: Job, scenario_name: str, scenario_file: str | None = None) -> dict[str, Any] | None:
    """The summary of ``job``'s folder when it holds this very episode (scenario name and file, controller,
    origin, arguments, seed), else None."""
    if job.out is None:
        return None
    try:
        s = json.loads((Path(job.out) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(s, dict):
        return None
    same = (s.get("scenario") == scenario_name and s.get("scenario_file") == scenario_file
            and s.get("controller") == job.name and s.get("seed") == job.seed
            and (s.get("controller_kwargs") or {}) == (job.kwargs or {})
            and s.get("controller_origin", job.origin) == job.origin)
    return s if same else None


def run_job(job: Job) -> dict[str, Any]:
    """Run one episode and write its folder (a worker's entry point). Returns ``{"summary": ...}`` or
    ``{"error": "..."}``; never raises for a failing controller or scenario."""
    from commitenv import evaluation

    try:
        _, res = evaluation.run_episode(job.spec, job.scenario, job.seed, controller_kwargs=job.kwargs or None)
        from commitenv.scoring import apply_score

        apply_score(res.summary, job.references)
        if job.out is not None:
            res.write(job.out, requests=job.requests, figure=job.figure)
        return {"summary": res.summary}
    except Exception as e:  # noqa: BLE001  (a failing episode is recorded, the others go on)
        return {"error": error_text(e)}


def error_text(e: BaseException) -> str:
    """``ValueError``s (our clear messages) as they are; anything else with its type."""
    return str(e) if isinstance(e, ValueError) and str(e) else f"{type(e).__name__}: {e}"


RAY_LOCAL = "local"  # the Ray address that starts a new local Ray (Ray's own spelling)
RAY_EXTRA = 'pip install "commitenv[ray]"'


def import_ray(what: str = "the Ray backend"):
    """The ``ray`` module; ImportError saying that ``what`` needs the 'ray' extra when Ray is missing."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(f"{what} needs the 'ray' extra: {RAY_EXTRA} ({e})") from e
    return ray


def run_jobs(jobs: list[Any], *, n_jobs: int | None = 1, progress: bool = False,
             on_done: Callable[[Any, dict[str, Any]], None] | None = None,
             ray_address: str | None = None, fn: Callable[[Any], dict[str, Any]] | None = None,
             desc: str = "episodes") -> list[dict[str, Any]]:
    """Run ``jobs`` (serially, in ``n_jobs`` spawned processes, or with ``ray_address`` as Ray tasks, at most
    ``n_jobs`` in flight, None: all; ``RAY_LOCAL`` starts a local Ray); the results in the jobs' order.
    ``fn`` (a module-level function, default `run_job` on `Job`s) runs one job and returns a dict;
    ``on_done(job, result)`` is called in this process as each one finishes."""
    fn = fn or run_job
    results: list[dict[str, Any] | None] = [None] * len(jobs)
    ray, started = None, False
    if ray_address is not None and jobs:  # before the progress bar, which Ray's start-up messages would break
        ray = import_ray()
        started = _ray_init(ray, ray_address, n_jobs)
    bar = None
    if progress and jobs:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), unit="episode", desc=desc)

    def done(i: int, r: dict[str, Any]) -> None:
        results[i] = r
        if on_done is not None:
            on_done(jobs[i], r)
        if bar is not None:
            bar.update(1)

    try:
        if ray is not None:
            _run_ray(ray, jobs, done, in_flight=n_jobs, fn=fn)
        elif (n_jobs or 1) <= 1 or len(jobs) <= 1:
            for i, job in enumerate(jobs):
                done(i, fn(job))
        else:
            with ProcessPoolExecutor(max_workers=min(n_jobs, len(jobs)), mp_context=get_context("spawn")) as ex:
                futures = {ex.submit(fn, job): i for i, job in enumerate(jobs)}
                for fut in as_completed(futures):
                    i = futures[fut]
                    try:
                        r = fut.result()
                    except Exception as e:  # noqa: BLE001  (a worker that died: BrokenProcessPool, pickling)
                        r = {"error": error_text(e)}
                    done(i, r)
    finally:
        if bar is not None:
            bar.close()
        if started:
            ray.shutdown()
    return [r if r is not None else {"error": "not run"} for r in results]


# ============================================================================================== Ray
def _run_ray(ray, jobs: list[Any], done: Callable[[int, dict[str, Any]], None], *, in_flight: int | None,
             fn: Callable[[Any], dict[str, Any]] = run_job) -> None:
    """Run ``jobs`` as Ray tasks (one CPU each), keeping at most ``in_flight`` submitted (None: all), and pass
    each result, its files written here (for `run_job`), to ``done(index, result)`` as it finishes."""
    task = ray.remote(num_cpus=1, runtime_env=ray_runtime_env())(run_job_shipped if fn is run_job else fn)
    limit = in_flight or len(jobs)
    todo = iter(enumerate(jobs))
    waiting: dict[Any, int] = {}
    try:
        while True:
            for i, job in itertools.islice(todo, limit - len(waiting)):
                waiting[task.remote(job)] = i
            if not waiting:
                break
            ready, _ = ray.wait(list(waiting), num_returns=1)
            for ref in ready:
                i = waiting.pop(ref)
                try:
                    r = ray.get(ref)
                except Exception as e:  # noqa: BLE001  (a task that failed or whose worker died)
                    r = {"error": error_text(getattr(e, "cause", None) or e)}
                done(i, _place(jobs[i], r) if fn is run_job else r)
    finally:
        for ref in waiting:  # interrupted: do not leave tasks running on a cluster
            with contextlib.suppress(Exception):  # the interruption is what to report, not a failed cancel
                ray.cancel(ref, force=True)


def ray_runtime_env() -> dict[str, Any] | None:
    """What a Ray task or actor of ours needs from this process's environment: its cache folder (the compiled engine,
    the reference runs), when one is set."""
    cache = os.environ.get("COMMITENV_CACHE")
    return {"env_vars": {"COMMITENV_CACHE": cache}} if cache else None


RAY_CONNECT_TIMEOUT_S = 5.0  # how long an address given as HOST:PORT may take to accept a connection


def _check_answers(address: str) -> None:
    """ValueError within seconds when nothing accepts a connection at a HOST:PORT (or ray://HOST:PORT) address:
    Ray itself retries such an address for minutes before it gives up."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or address in (RAY_LOCAL, "auto"):
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise ValueError(f"Ray at {address}: nothing answers at {host}:{port} within {RAY_CONNECT_TIMEOUT_S:g} s "
                         f"({e.strerror or type(e).__name__}); is the cluster's head node up, and is this its "
                         f"address (ray://HOST:10001 for a client, HOST:6379 from a node)?") from None


def _ray_init(ray, address: str, in_flight: int | None) -> bool:
    """Start a local Ray (``RAY_LOCAL``; ``in_flight`` CPUs when given) or connect to ``address``, unless Ray is
    initialized in this process already; whether this call did it (then `run_jobs` shuts it down: stops the
    local Ray, or disconnects from the cluster). ValueError when Ray cannot be started or reached."""
    if ray.is_initialized():
        log.info("ray: using the Ray already initialized in this process")
        return False
    extra = {"num_cpus": max(in_flight, 1)} if address == RAY_LOCAL and in_flight else {}
    _check_answers(address)
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True, **extra)
    except Exception as e:  # noqa: BLE001  (ConnectionError, RuntimeError, ...: say where and why)
        raise ValueError(f"Ray at {address}: cannot {'start' if address == RAY_LOCAL else 'connect'} "
                         f"({error_text(e)})") from None
    where = "a local Ray" if address == RAY_LOCAL else f"Ray at {address}"
    log.info("ray: %s with %g CPUs", where, ray.cluster_resources().get("CPU", 0))
    return True


def run_job_shipped(job: Job) -> dict[str, Any]:
    """A Ray task: `run_job` into a temporary folder on the worker, whose files come back with the summary
    (``{"files": {name: bytes}}``), since a cluster's worker need not share the disk of ``job.out``."""
    if job.out is None:
        return run_job(job)
    with tempfile.TemporaryDirectory(prefix="commitenv-episode-") as d:
        folder = Path(d) / "episode"
        r = run_job(replace(job, out=str(folder)))
        if "summary" in r:
            r["files"] = {f.name: f.read_bytes() for f in folder.iterdir() if f.is_file()}
        return r


def _place(job: Job, r: dict[str, Any]) -> dict[str, Any]:
    """Write the files a Ray task shipped back into ``job.out``, each atomically and summary.json last (a folder
    with summary.json is complete); ``r`` without them, or an error when they cannot be written."""
    files = r.get("files")
    r = {k: v for k, v in r.items() if k != "files"}
    if files is None or job.out is None:
        return r
    out = Path(job.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in sorted(files, key=lambda n: n == "summary.json"):
            _atomic(out / name, files[name])
    except OSError as e:
        return {"error": f"{out}: cannot write the results there ({e.strerror or e})"}
    return r


# ============================================================================================== aggregate
def aggregate(scenario: str, seeds: list[int], controllers: list[dict[str, Any]],
              episodes: dict[str, dict[int, dict[str, Any]]], errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The compare.json document of a multi-seed run. ``controllers``: ``{"controller", "origin", "kwargs"}``
    in order; ``episodes[name][seed]``: a finished episode's summary; ``errors``: ``{"controller", "seed",
    "error"}`` of the episodes that failed."""
    out = {"scenario": scenario, "seeds": seeds, "controllers": [], "errors": errors}
    kinds = {s.get("settlement") for runs in episodes.values() for s in runs.values()} - {None}
    if kinds == {"energy_only"}:  # no commitment: the deviation metrics are None, so absent from `metrics`
        out["settlement"] = "energy_only"
    for c in controllers:
        name = c["controller"]
        runs = episodes.get(name, {})
        done = [s for s in seeds if s in runs]
        entry: dict[str, Any] = {"controller": name, "origin": c.get("origin"), "kwargs": c.get("kwargs") or {},
                                 "episodes": len(done), "seeds": done,
                                 "failed_seeds": [e["seed"] for e in errors if e["controller"] == name]}
        gate = [runs[s].get("slo_gate_pass") for s in done]
        entry["slo_gate_pass_count"] = sum(1 for g in gate if g is True)
        metrics: dict[str, Any] = {}
        keys = _numeric_keys([runs[s] for s in done])
        for k in keys:
            vals = [runs[s][k] for s in done]
            metrics[k] = {**mean_ci95(vals), "per_seed": {str(s): v for s, v in zip(done, vals)}}
        metrics["slo_gate_pass"] = {**mean_ci95([1.0 if g else 0.0 for g in gate]),
                                    "per_seed": {str(s): g for s, g in zip(done, gate)}}
        entry["metrics"] = metrics
        out["controllers"].append(entry)
    return out


_NOT_METRICS = {"seed", "slo_gate_epsilon"}


def _numeric_keys(summaries: list[dict[str, Any]]) -> list[str]:
    if not summaries:
        return []
    keys = [k for k, v in summaries[0].items()
            if k not in _NOT_METRICS and isinstance(v, (int, float)) and not isinstance(v, bool)]
    return [k for k in keys
            if all(isinstance(s.get(k), (int, float)) and not isinstance(s.get(k), bool) for s in summaries)]


def write_aggregate(out: Path, doc: dict[str, Any]) -> None:
    """compare.json (the whole document) and compare.csv (one row per controller and metric: n, mean, sd,
    ci95_low, ci95_high, then one column per seed), each written to a temporary file and renamed."""
    seeds = doc["seeds"]
    rows = []
    for c in doc["controllers"]:
        for k, m in c["metrics"].items():
            lo, hi = (m["ci95"] or [None, None])
            row = {"controller": c["controller"], "metric": k, "n": m["n"], "mean": m["mean"], "sd": m["sd"],
                   "ci95_low": lo, "ci95_high": hi}
            row.update({f"seed_{s}": m["per_seed"].get(str(s)) for s in seeds})
            rows.append(row)
    out.mkdir(parents=True, exist_ok=True)
    _atomic(out / "compare.json", json.dumps(doc, indent=2) + "\n")
    tmp = out / f".compare.csv.tmp-{os.getpid()}"
    try:
        with tmp.open("w", newline="") as fh:
            cols = ["controller", "metric", "n", "mean", "sd", "ci95_low", "ci95_high"] + [f"seed_{s}" for s in seeds]
            w = csv.DictWriter(fh, fieldnames=cols)
            w.writeheader()
            for r in rows:
                w.writerow({k: ("" if v is None else (int(v) if isinstance(v, bool) else v)) for k, v in r.items()})
        tmp.replace(out / "compare.csv")
    finally:
        tmp.unlink(missing_ok=True)


def _atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
