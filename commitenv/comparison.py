"""Controllers side by side on one scenario: which controllers a comparison runs by default, one seed's runs
(compare.json), and many seeds' episodes, resumable, aggregated (mean and 95 % CI per metric)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover
    from commitenv.evaluation import EvalResult
    from commitenv.registry import Resolved

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ComparedController:
    """One controller of a comparison: its resolved spec and validated constructor arguments."""

    resolved: Resolved
    kwargs: dict[str, Any]


@dataclass
class Comparison:
    """One seed's comparison so far: the summaries of the runs that finished, and ``{"controller", "error"}`` of
    those that failed."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)


def gate_word(passed: bool | None) -> str:
    """A run's SLO gate as a word: ``-`` (none recorded), ``pass`` or ``FAIL``."""
    return "-" if passed is None else ("pass" if passed else "FAIL")


def default_controllers() -> list[tuple[str, Resolved]]:
    """(name, resolved) of every registered and entry-point controller, except hindsight bounds (the ``oracle``
    plans minutes ahead with the true trace: it is named explicitly when wanted); one that cannot be loaded is
    skipped with a warning."""
    from commitenv.hindsight import uses_hindsight
    from commitenv.registry import all_names, resolve

    out = []
    for name in all_names():
        try:
            r = resolve(name)
        except ValueError as e:
            log.warning("skipped %s: %s", name, e)
            continue
        if uses_hindsight(r.target):
            continue
        out.append((name, r))
    return out


def compare_seed(entries: list[ComparedController], scenario: str, seed: int, *,
                 refs: tuple[dict, dict] | None, explicit: bool, progress: bool,
                 after_run: Callable[[Comparison, ComparedController, EvalResult | None], None] | None = None
                 ) -> Comparison:
    """Run every controller of ``entries`` on ``scenario`` at ``seed``, each scored against ``refs``. A controller
    that fails is recorded in ``errors`` and the others still run; one that cannot be imported here is skipped
    with a warning unless ``explicit`` (named by the user). ``after_run(comparison, entry, result)`` follows every
    run that was not skipped (``result`` None when it failed), so partial results can be written as they come."""
    from commitenv.evaluation import evaluate
    from commitenv.runner import error_text
    from commitenv.scoring import apply_score

    cmp = Comparison()
    for e in entries:
        name = e.resolved.name
        res = None
        try:
            res = evaluate(e.resolved.spec, scenario, seed=seed, progress=progress,
                           controller_kwargs=e.kwargs or None)
        except ImportError as ex:
            if not explicit:
                log.warning("skipped %s: %s", name, ex)
                continue
            cmp.errors.append({"controller": name, "error": f"cannot run here: {ex}"})
        except Exception as ex:  # noqa: BLE001  (one failing controller must not lose the others' results)
            cmp.errors.append({"controller": name, "error": error_text(ex)})
        else:
            apply_score(res.summary, refs)
            cmp.rows.append(res.summary)
        if cmp.errors and cmp.errors[-1]["controller"] == name:
            log.error("%s failed: %s", name, cmp.errors[-1]["error"])
        if after_run is not None:
            after_run(cmp, e, res)
    return cmp


def write_compare(out: Path, scenario: str, seed: int, cmp: Comparison, names: list[str]) -> None:
    """compare.json of a single-seed comparison: ``results`` (the summaries of the runs that finished),
    ``errors`` (``{"controller", "error"}`` of those that failed) and ``gate`` (pass / FAIL / error, in the
    order of ``names``); written atomically (an OSError leaves no temporary file)."""
    word = {r["controller"]: gate_word(r.get("slo_gate_pass")) for r in cmp.rows}
    word.update({e["controller"]: "error" for e in cmp.errors})
    gate = {n: word[n] for n in names if n in word}
    doc = {"scenario": scenario, "seed": seed, "gate": gate, "results": cmp.rows, "errors": cmp.errors}
    tmp = out / "compare.json.tmp"
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        tmp.replace(out / "compare.json")
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise


def run_seeds(entries: list[ComparedController], scenario: str, seeds: list[int], *, out: Path | None,
              refs: dict[int, tuple[dict, dict]], rerun: bool, jobs: int | None, ray: str | None, progress: bool,
              write: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every (controller, seed) episode (``jobs`` processes, or Ray tasks at address ``ray``), each under
    OUT/<controller>/seed-<s>/; episodes already finished there are kept unless ``rerun``. ``write(doc)`` gets
    the aggregate (`commitenv.runner.aggregate`) after every episode; the final aggregate is returned."""
    from commitenv.evaluation import _scenario_file
    from commitenv.runner import Job, aggregate, episode_dir, finished, run_jobs
    from commitenv.scenarios import load_scenario
    from commitenv.scoring import apply_score

    sc = load_scenario(scenario)
    sc_name, sc_file = sc.name, _scenario_file(sc)
    controllers = [{"controller": e.resolved.name, "origin": e.resolved.origin, "kwargs": e.kwargs} for e in entries]
    episodes: dict[str, dict[int, dict]] = {e.resolved.name: {} for e in entries}
    errors: list[dict] = []
    pending: list = []
    for e in entries:
        r = e.resolved
        for s in seeds:
            dest = None if out is None else str(episode_dir(out, r.name, s))
            job = Job(r.spec, r.name, r.origin, e.kwargs, scenario, s, dest, references=refs.get(s))
            prev = None if rerun else finished(job, sc_name, sc_file)
            if prev is not None:
                apply_score(prev, refs.get(s))
                episodes[r.name][s] = prev
            else:
                pending.append(job)
    n_all = len(entries) * len(seeds)
    if n_all > len(pending):
        log.info("resuming: %d of %d episodes already finished in %s", n_all - len(pending), n_all, out)

    def on_done(job, result: dict) -> None:
        if "summary" in result:
            episodes[job.name][job.seed] = result["summary"]
        else:
            errors.append({"controller": job.name, "seed": job.seed, "error": result["error"]})
            log.error("%s seed %s failed: %s", job.name, job.seed, result["error"])
        if write is not None:
            write(aggregate(sc_name, seeds, controllers, episodes, errors))

    run_jobs(pending, n_jobs=jobs, progress=progress, on_done=on_done, ray_address=ray)
    errors.sort(key=lambda e: ([c["controller"] for c in controllers].index(e["controller"]), e["seed"]))
    doc = aggregate(sc_name, seeds, controllers, episodes, errors)
    if write is not None:
        write(doc)
    return doc
