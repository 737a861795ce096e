"""The two reference runs of every suite episode (``lower`` scores 0, ``upper`` 100), run in this process by
trusted built-in controllers and kept in ``<board>/references/<suite>.json`` under a key that changes with the
scenario, the engine's code, the controller's code, the run seed and the commitment scale (for a secret suite an
HMAC with the secret, so the file says nothing about its seeds)."""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from commitenv.leaderboard.score import RAW
from commitenv.leaderboard.suite import Episode

KEEP = RAW + ("slo_gate_pass", "requests")


@dataclass(frozen=True)
class ReferenceJob:
    controller: str
    episode: Episode


def run_reference(job: ReferenceJob) -> dict[str, Any]:
    """One reference episode (a worker's entry point): ``{"summary": ...}`` or ``{"error": ...}``."""
    from commitenv.evaluation import run_episode
    from commitenv.leaderboard.sandbox import episode_scenario
    from commitenv.runner import error_text

    try:
        _, res = run_episode(job.controller, episode_scenario(job.episode), job.episode.seed)
    except Exception as e:  # noqa: BLE001  (reported with the episode's label)
        return {"error": error_text(e)}
    return {"summary": {k: res.summary[k] for k in KEEP}}


_RUN_FILES = ("control.py", "evaluation.py", "hindsight.py", "metrics.py", "settlement.py")  # beside envs/


@functools.lru_cache(maxsize=None)
def _code_sha256(controller: str) -> str:
    """The code a reference run executes: the engine, the env, the episode loop and scoring, and the built-in
    controller package (not the CLI or the leaderboard, so editing those keeps the cached runs); read once per
    process."""
    import commitenv
    import commitenv_controllers
    from commitenv.scenarios.commitments import engine_code_sha256, source_sha256

    root = Path(commitenv.__file__).resolve().parent
    ctrl = Path(commitenv_controllers.__file__).resolve().parent
    h = hashlib.sha256(engine_code_sha256().encode())
    h.update(source_sha256(root, ("envs",)).encode())
    for name in _RUN_FILES:
        h.update(name.encode() + b"\0" + (root / name).read_bytes())
    h.update(source_sha256(ctrl, tuple(sorted({str(p.parent.relative_to(ctrl)) for p in ctrl.rglob("*.py")}))).encode())
    h.update(controller.encode())
    return h.hexdigest()


def reference_key(ep: Episode, controller: str, secret: bytes | None = None) -> str:
    """The cache key of ``controller``'s run on ``ep``."""
    from commitenv.leaderboard.sandbox import episode_scenario

    sc = episode_scenario(ep)
    doc = {"scenario": sc.model_dump(mode="json"), "seed": ep.seed, "scale": ep.commitment_scale,
           "code": _code_sha256(controller)}
    text = json.dumps(doc, sort_keys=True, default=str).encode()
    return hmac.new(secret, text, hashlib.sha256).hexdigest() if secret else hashlib.sha256(text).hexdigest()


def load(path: Path) -> dict[str, Any]:
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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps({"runs": dict(sorted(runs.items()))}, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def ensure(path: Path, eps: list[Episode], controllers: tuple[str, str], *, secret: bytes | None = None,
           run: Callable[[list[ReferenceJob]], list[dict[str, Any]]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """For each episode its (lower, upper) reference summaries: read from ``path``, the missing ones computed by
    ``run(jobs)`` and saved, entries under keys no longer current dropped. ValueError naming the episode when a
    reference run fails."""
    runs = load(path)
    keys = [[reference_key(ep, c, secret) for c in controllers] for ep in eps]
    current = {k for ks in keys for k in ks}
    stale = set(runs) - current  # made by other code or for episodes the suite no longer has
    if stale:
        runs = {k: v for k, v in runs.items() if k in current}
    todo = [(i, j) for i, ks in enumerate(keys) for j, k in enumerate(ks) if k not in runs]
    if todo:
        results = run([ReferenceJob(controllers[j], eps[i]) for i, j in todo])
        errors = []
        for (i, j), r in zip(todo, results):
            if "summary" in r:
                runs[keys[i][j]] = {"controller": controllers[j], "label": eps[i].label, **r["summary"]}
            else:
                errors.append(f"{controllers[j]} on {eps[i].label}: {r.get('error')}")
        save(path, runs)
        if errors:
            raise ValueError("reference runs failed: " + "; ".join(errors))
    elif stale:
        save(path, runs)
    return [(runs[a], runs[b]) for a, b in keys]
