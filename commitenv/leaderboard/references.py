"""The two reference runs of every suite episode (``lower`` scores 0, ``upper`` 100), kept in
``<board>/references/<suite>.json``: the leaderboard's use of `commitenv.references` (the same keys and runs as
`run` and `compare` use; for a secret suite an HMAC with the secret, so the file says nothing about its seeds)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from commitenv import references as lib
from commitenv.leaderboard.suite import Episode

KEEP = lib.KEEP


@dataclass(frozen=True)
class ReferenceJob:
    controller: str
    episode: Episode


def run_reference(job: ReferenceJob) -> dict[str, Any]:
    """One reference episode (a worker's entry point): ``{"summary": ...}`` or ``{"error": ...}``."""
    from commitenv.leaderboard.sandbox import episode_scenario
    from commitenv.runner import error_text

    try:
        sc = episode_scenario(job.episode)
    except Exception as e:  # noqa: BLE001
        return {"error": error_text(e)}
    return lib.run_reference(lib.ScenarioReferenceJob(job.controller, sc, job.episode.seed))


def reference_key(ep: Episode, controller: str, secret: bytes | None = None) -> str:
    """The cache key of ``controller``'s run on ``ep``."""
    from commitenv.leaderboard.sandbox import episode_scenario

    return lib.reference_key(episode_scenario(ep), ep.seed, controller, secret, scale=ep.commitment_scale)


def ensure(path: Path, eps: list[Episode], controllers: tuple[str, str], *, secret: bytes | None = None,
           run: Callable[[list[ReferenceJob]], list[dict[str, Any]]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """For each episode its (lower, upper) reference summaries: read from ``path``, the missing ones computed by
    ``run(jobs)`` and saved, entries under keys no longer current dropped. ValueError naming the episode when a
    reference run fails."""
    wanted = [lib.Wanted(reference_key(ep, c, secret), ep.label, c, ReferenceJob(c, ep)) for ep in eps
              for c in controllers]
    got = lib.ensure(path, wanted, run, drop_stale=True)
    return [(got[2 * i], got[2 * i + 1]) for i in range(len(eps))]


def missing(path: Path, eps: list[Episode], controllers: tuple[str, str], *, secret: bytes | None = None) -> int:
    """How many of the episodes' reference runs ``path`` does not hold yet (what `ensure` would run)."""
    have = lib.load(path)
    return sum(1 for ep in eps for c in controllers if reference_key(ep, c, secret) not in have)
