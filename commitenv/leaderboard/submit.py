"""``commitenv submit``: score a submission on a suite, append the result and render the board.

The board is a folder (default ``./leaderboard``): ``suites/`` (falls back to the shipped suites), ``references/``
(cached reference runs), ``results/<suite>.jsonl``, ``LEADERBOARD.md`` and ``index.html``. Episodes run through the
evaluation runner (`commitenv.runner.run_jobs`: local processes, or Ray tasks with ``ray_address``), each one
sandboxed (`commitenv.leaderboard.sandbox`).

Before anything runs, the sandbox folders of scorers that were killed are swept (`boxes.sweep`), the isolation is
settled (the kernel boundary; a secret suite is refused where the machine cannot build it) and the submission is
built once in the sandbox (`validate_submission`): one that does not load is refused with its error and nothing is
appended. The episodes' terms (scenario, run seed, commitment scale) are drawn from the secret here, before any
child starts; no child ever sees the secret, and a hidden episode's reason is scrubbed of its terms and the secret.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commitenv.leaderboard import boxes, references
from commitenv.leaderboard.results import append_result, provenance
from commitenv.leaderboard.sandbox import SandboxJob, resolve_isolation, run_sandboxed, validate_submission
from commitenv.leaderboard.score import episode_row, suite_summary
from commitenv.leaderboard.submission import Submission
from commitenv.leaderboard.suite import Episode, episodes, load_suite, read_secret, seeds_hash

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scored:
    """What `submit` produced: the record appended (None when refused) and where, or why it was refused."""

    record: dict[str, Any] | None
    results_file: Path | None
    refused: str | None = None


def run_sandbox_job(job: SandboxJob) -> dict[str, Any]:
    """A runner worker's entry point: `run_sandboxed`, with a host-side error returned, not raised."""
    from commitenv.runner import error_text

    try:
        with boxes.terminate_as_exit():  # a worker SIGTERMed stops its sandbox and removes its folder
            return run_sandboxed(job)
    except Exception as e:  # noqa: BLE001
        return {"error": error_text(e)}


def _suite_episodes(suite_name: str, board: Path, secret_file: str | Path | None, secret: bytes | None = None):
    """(suite, its hash, its episodes, the secret): a secret suite without the secret falls back to ``dev``."""
    suite, shash = load_suite(suite_name, board)
    if not suite.secret:
        return suite, shash, episodes(suite, shash), None
    if secret is None:
        secret = read_secret(secret_file)
    if secret is None:
        log.warning("suite '%s' needs the maintainer's secret (COMMITENV_LEADERBOARD_SECRET or --secret-file); "
                    "running the public 'dev' suite instead", suite.name)
        suite, shash = load_suite("dev", board)
    return suite, shash, episodes(suite, shash, secret), secret


def _references(board: Path, suite, eps, secret, run) -> list:
    """The episodes' (lower, upper) reference summaries; the missing ones are run first, and said so: on a new
    board that is every episode twice, which takes longer than scoring most submissions."""
    path = board / "references" / f"{suite.name}.json"
    todo = references.missing(path, eps, (suite.lower, suite.upper), secret=secret)
    if todo:
        log.warning("%s holds %d of the %d reference runs of suite '%s' (%s and %s on each episode): running the "
                    "%d missing ones first (minutes each for the oracle; `commitenv leaderboard references --suite "
                    "%s --board %s` runs them ahead)", path, 2 * len(eps) - todo, 2 * len(eps), suite.name,
                    suite.lower, suite.upper, todo, suite.name, board)
    return references.ensure(path, eps, (suite.lower, suite.upper),
                             secret=secret, run=lambda jobs: run(jobs, references.run_reference, "references"))


def _runner(n_jobs: int, ray_address: str | None, progress: bool):
    from commitenv.runner import run_jobs

    def run(jobs: list[Any], fn: Any, desc: str) -> list[dict[str, Any]]:
        return run_jobs(jobs, n_jobs=n_jobs, ray_address=ray_address, fn=fn, progress=progress, desc=desc)

    return run


def ensure_references(suite_name: str = "dev", *, board: Path = Path("leaderboard"), n_jobs: int = 1,
                      ray_address: str | None = None, secret_file: str | Path | None = None,
                      progress: bool = False) -> int:
    """Run the suite's missing reference episodes (a maintainer does this once per code change, before the first
    submission); the number of episodes whose references are in place."""
    suite, _, eps, secret = _suite_episodes(suite_name, board, secret_file)
    return len(_references(board, suite, eps, secret, _runner(n_jobs, ray_address, progress)))


def redact(text: str | None, ep: Episode, secret: bytes | None) -> str | None:
    """A reason as published: for a hidden episode, its run seed, commitment scale and the secret replaced."""
    if text is None or not ep.hidden:
        return text
    for term in (secret.decode(errors="replace") if secret else "", str(ep.seed), repr(ep.commitment_scale),
                 str(ep.controller_seed) if ep.controller_seed is not None else ""):
        if term:
            text = text.replace(term, "[hidden]")
    return text


def submit(sub: Submission, suite_name: str = "dev", *, board: Path = Path("leaderboard"), n_jobs: int = 1,
           ray_address: str | None = None, secret_file: str | Path | None = None, progress: bool = False,
           render: bool = True, isolation: str = "auto", secret: bytes | None = None) -> Scored:
    """Score ``sub`` on the suite, append the result to ``board/results/<suite>.jsonl`` and render the board. A
    secret suite without the secret falls back to ``dev`` (logged); ``secret`` (else ``secret_file`` or the
    environment) is the maintainer's. ``isolation``: auto (the kernel boundary where the machine has it), kernel or
    process (public suites only). SubmissionInvalid (a ValueError) when the submission does not load,
    SandboxUnavailable when a secret suite cannot be scored behind the kernel; ValueError for bad input or a failed
    run."""
    t0 = time.perf_counter()
    swept = boxes.sweep()
    if swept:
        log.info("removed %d sandbox folders left by killed scorers", swept)
    suite, shash, eps, secret = _suite_episodes(suite_name, board, secret_file, secret)
    isolation = resolve_isolation(isolation, secret=suite.secret)
    denied = tuple(str(p) for p in (board.resolve(), Path(secret_file).resolve() if secret_file else None) if p)
    refused = validate_submission(sub, suite.limits, denied, isolation)
    if refused:
        return Scored(None, None, refused)
    run = _runner(n_jobs, ray_address, progress)
    refs = _references(board, suite, eps, secret, run)
    outcomes = run([SandboxJob(sub, ep, suite.limits, denied, ep.controller_seed, isolation) for ep in eps],
                   run_sandbox_job, sub.name)
    refused = next((o["refused"] for o in outcomes if "refused" in o), None)
    if refused:
        return Scored(None, None, refused)
    errors = [f"{ep.label}: {redact(o['error'], ep, secret)}" for ep, o in zip(eps, outcomes) if "error" in o]
    if errors:
        raise ValueError("scoring failed (not the submission's fault): " + "; ".join(errors))
    outcomes = [{**o, "reason": redact(o.get("reason"), ep, secret)} for ep, o in zip(eps, outcomes)]
    rows = [episode_row(ep.label, ep.scenario, None if ep.hidden else ep.seed, o, lo, up)
            for ep, o, (lo, up) in zip(eps, outcomes, refs)]
    score, metrics = suite_summary(rows)
    m = sub.meta
    record = {
        "name": m.name, "authors": list(m.authors), "description": m.description, "learns": m.learns,
        "suite": suite.name, "suite_hash": shash, "seeds_hash": seeds_hash(eps) if suite.secret else None,
        "submitted_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "wall_s": round(time.perf_counter() - t0, 3), "jobs": n_jobs, "limits": suite.limits.model_dump(),
        "score": score, "reference": {"lower": suite.lower, "upper": suite.upper}, "metrics": metrics,
        "episodes": rows, "provenance": provenance([ep.scenario for ep in eps], sub.sha256),
    }
    out = board / "results" / f"{suite.name}.jsonl"
    append_result(out, record)
    if render:
        from commitenv.leaderboard.render import render_board

        render_board(board)
    return Scored(record, out)
