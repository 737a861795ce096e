"""Scored submissions, one JSON line each in ``<board>/results/<suite>.jsonl``, appended atomically: under an
exclusive lock the file is rewritten to a temporary file with the new line and renamed over the old one, so a crash
mid-write leaves the previous file whole and no partial line. Each record carries its provenance."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("numpy", "gymnasium", "pydantic", "cvxpy", "ortools", "numba", "stable-baselines3", "torch", "ray")


def append_result(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one line of ``path`` (created with its folder when missing), atomically."""
    line = json.dumps(record, sort_keys=True, allow_nan=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = path.read_bytes() if path.exists() else b""
        if old and not old.endswith(b"\n"):
            raise ValueError(f"{path}: the last line is incomplete; the file was not written by commitenv")
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as fh:
                fh.write(old)
                fh.write(line.encode())
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def _git_commit() -> dict[str, Any]:
    """The commit of the commitenv checkout this runs from (None when installed from a wheel) and whether its
    tree had local changes."""
    import commitenv

    root = Path(commitenv.__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return {"git_commit": None, "git_dirty": None}
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip() != ""
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None, "git_dirty": None}
    return {"git_commit": head, "git_dirty": dirty}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _sha256_json(doc: Any) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def scenario_hashes(name: str) -> dict[str, str]:
    """Hashes of a scenario (its validated fields), its profile (fields) and its workload: the trace file's bytes,
    or for a built-in generator its parameters and the workload package's code."""
    from commitenv.profiles import load_profile
    from commitenv.scenarios.commitments import source_sha256
    from commitenv.scenarios.loader import load_scenario

    sc = load_scenario(name)
    prof = load_profile(sc.pool.profile)
    wl = sc.workload
    if wl.trace is not None:  # the loader resolved it against the scenario's folder
        workload = _sha256_file(Path(wl.trace).expanduser())
    else:
        import commitenv

        workload = _sha256_json({"spec": wl.model_dump(mode="json"),
                                 "code": source_sha256(Path(commitenv.__file__).resolve().parent, ("workload",))})
    return {"scenario_sha256": _sha256_json(sc.model_dump(mode="json")),
            "profile_sha256": _sha256_json(prof.model_dump(mode="json")), "workload_sha256": workload}


def provenance(scenarios: list[str], submission_sha256: str) -> dict[str, Any]:
    """Where a result comes from: code versions, the machine's Python and packages, the inputs' hashes."""
    return {"commitenv_version": _version("commitenv"), **_git_commit(), "python": platform.python_version(),
            "platform": platform.platform(), "packages": {p: _version(p) for p in PACKAGES if _version(p)},
            "scenarios": {s: scenario_hashes(s) for s in sorted(set(scenarios))},
            "submission_hash": submission_sha256}
