"""The reference runs a score needs (the objective's ``lower`` and ``upper`` controllers on the same episode), run by
trusted built-in controllers and cached on disk under a key that changes with the scenario, the run seed, the
engine's, env's, scoring's and controllers' code (for the leaderboard's secret suite an HMAC with the secret, so the
file says nothing about its seeds). `run` and `compare` keep theirs in ``<cache>/score-references/<scenario>.json``
(`commitenv.scenarios.commitments.cache_root`); the leaderboard keeps its own in ``<board>/references/``."""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from commitenv.scenarios.schema import Scenario

# what a reference run keeps of its summary: the raw metrics, the gate's inputs and the objective
KEEP = ("cost_kwh_eq", "attainment_pct", "misses", "energy_mj", "mean_abs_dev_pct", "slo_gate_pass", "requests",
        "slo_arrivals_by_hour", "slo_misses_by_hour", "objective", "tail_energy_mj")

_RUN_FILES = ("control.py", "evaluation.py", "hindsight.py", "metrics.py", "settlement.py", "scoring.py",
              "planning.py")  # beside envs/


@functools.lru_cache(maxsize=None)
def code_sha256(controller: str) -> str:
    """The code a reference run executes: the engine, the env, the episode loop and scoring, and the built-in
    controller package (not the CLI or the leaderboard, so editing those keeps the cached runs); read once per
    process."""
    import commitenv
    from commitenv._paths import package_dir
    from commitenv.scenarios.commitments import engine_code_sha256, source_sha256

    root = Path(commitenv.__file__).resolve().parent
    ctrl = package_dir("commitenv_controllers").resolve()
    h = hashlib.sha256(engine_code_sha256().encode())
    h.update(source_sha256(root, ("envs",)).encode())
    for name in _RUN_FILES:
        f = root / name
        h.update(name.encode() + b"\0" + (f.read_bytes() if f.is_file() else b""))
    h.update(source_sha256(ctrl, tuple(sorted({str(p.parent.relative_to(ctrl)) for p in ctrl.rglob("*.py")}))).encode())
    h.update(controller.encode())
    return h.hexdigest()


def reference_key(scenario: Scenario, seed: int, controller: str, secret: bytes | None = None,
                  **extra: Any) -> str:
    """The cache key of ``controller``'s run of ``scenario`` at ``seed`` (``extra``: more terms of the episode)."""
    doc = {"scenario": scenario.model_dump(mode="json"), "seed": seed, "code": code_sha256(controller), **extra}
    text = json.dumps(doc, sort_keys=True, default=str).encode()
    return hmac.new(secret, text, hashlib.sha256).hexdigest() if secret else hashlib.sha256(text).hexdigest()


def load(path: Path) -> dict[str, Any]:
    """The cached runs of ``path`` ({} when it does not exist)."""
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read the reference runs ({e}); delete it to recompute them") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), dict):
        raise ValueError(f"{path}: expected {{\"runs\": {{key: summary}}}}; delete it to recompute them")
    return doc["runs"]


def save(path: Path, runs: dict[str, Any]) -> None:
    """Write ``runs`` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps({"runs": dict(sorted(runs.items()))}, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class Wanted:
    """One reference run wanted: its cache key, a label for errors and records, its controller, and the job that
    computes it (whatever ``run`` accepts)."""

    key: str
    label: str
    controller: str
    job: Any


def ensure(path: Path, wanted: list[Wanted], run: Callable[[list[Any]], list[dict[str, Any]]], *,
           drop_stale: bool = False) -> list[dict[str, Any]]:
    """The summaries of the ``wanted`` runs, in order: read from ``path``, the missing ones computed by
    ``run(jobs)`` (each ``{"summary": ...}`` or ``{"error": ...}``) and saved; ``drop_stale`` also drops the cached
    entries not wanted (a suite's file holds exactly its episodes). ValueError naming the runs that failed."""
    runs = load(path)
    current = {w.key for w in wanted}
    stale = drop_stale and bool(set(runs) - current)
    if stale:
        runs = {k: v for k, v in runs.items() if k in current}
    todo = list({w.key: w for w in wanted if w.key not in runs}.values())
    if todo:
        results = run([w.job for w in todo])
        errors = []
        for w, r in zip(todo, results):
            if "summary" in r:
                runs[w.key] = {"controller": w.controller, "label": w.label, **r["summary"]}
            else:
                errors.append(f"{w.controller} on {w.label}: {r.get('error')}")
        save(path, runs)
        if errors:
            raise ValueError("reference runs failed: " + "; ".join(errors))
    elif stale:
        save(path, runs)
    return [runs[w.key] for w in wanted]


@dataclass(frozen=True)
class ScenarioReferenceJob:
    """A reference episode of a scenario (by name or file) at one seed."""

    controller: str
    scenario: str
    seed: int


def run_reference(job: Any) -> dict[str, Any]:
    """One reference episode (a worker's entry point): ``{"summary": ...}`` (the `KEEP` fields) or ``{"error": ...}``."""
    from commitenv.evaluation import run_episode
    from commitenv.runner import error_text

    quiet = logging.getLogger("commitenv")  # the episode's own warnings (rejections) belong to the scored runs
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        _, res = run_episode(job.controller, job.scenario, job.seed)
    except Exception as e:  # noqa: BLE001  (reported with the episode's label)
        return {"error": error_text(e)}
    finally:
        quiet.setLevel(level)
    return {"summary": {k: res.summary[k] for k in KEEP if k in res.summary}}


def seed_references(scenario: str | Scenario, seeds: list[int], *, jobs: int = 1,
                    progress: bool = False) -> dict[int, tuple[dict[str, Any], dict[str, Any]]]:
    """{seed: (lower, upper)} reference summaries of ``scenario`` from the user's cache, the missing ones run in
    ``jobs`` processes; {} with a warning when they cannot be had (the runs then carry no score, and a relative gate
    stays undecided)."""
    from commitenv.runner import run_jobs
    from commitenv.scenarios import load_scenario

    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)

    def run(batch: list[Any]) -> list[dict[str, Any]]:
        return run_jobs(batch, n_jobs=jobs, fn=run_reference, progress=progress, desc="references")

    try:
        refs = scenario_references(sc, seeds, run=run)
    except (ValueError, OSError) as e:
        logging.getLogger("commitenv").warning("no score: the reference runs (%s, %s) failed: %s",
                                               sc.objective.lower, sc.objective.upper, e)
        return {}
    return dict(zip(seeds, refs))


def scenario_references(scenario: Scenario, seeds: list[int], *, run: Callable[[list[Any]], list[dict[str, Any]]],
                        path: Path | None = None) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """For each seed the (lower, upper) reference summaries of ``scenario``'s objective, from the user's cache
    (``path``; default ``<cache>/score-references/<scenario>.json``), the missing ones run by ``run``."""
    from commitenv.scenarios.commitments import cache_root

    if path is None:
        path = cache_root() / "score-references" / f"{scenario.name}.json"
    spec = scenario._source or scenario.name
    ctrls = (scenario.objective.lower, scenario.objective.upper)
    wanted = [Wanted(reference_key(scenario, s, c), f"{scenario.name}/{s}", c, ScenarioReferenceJob(c, spec, s))
              for s in seeds for c in ctrls]
    got = ensure(path, wanted, run)
    return [(got[2 * i], got[2 * i + 1]) for i in range(len(seeds))]
