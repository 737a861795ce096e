"""Fixtures and hooks for every test: the toy profile, the run's reference cache, each process's temp folder and
the slow cases' timeout.
Shared helpers (profiles, scenarios, controllers) live in ``helpers/``, imported as ``helpers.*``."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from helpers.profiles import toy_profile

SLOW_TIMEOUT_S = 1800  # a slow case's own per-test timeout (the default, pyproject's `timeout`, is 300 s)


def pytest_collection_modifyitems(config, items):
    """Slow cases (episode-scale runs) get a longer timeout than the default unless they set their own."""
    for item in items:
        if item.get_closest_marker("slow") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))


@pytest.fixture
def toy():
    """The toy profile (`helpers.profiles.toy_profile`)."""
    return toy_profile()


@pytest.fixture(scope="session", autouse=True)
def _session_reference_cache(tmp_path_factory):
    """Every test shares one reference-commitment cache in the run's temp folder (all xdist workers' too), never
    ~/.cache (tests that exercise the cache itself point COMMITENV_CACHE elsewhere with monkeypatch)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # xdist workers share their run's folder (the cache writes atomically)
        base = base.parent
    d = base / "commitenv-cache"
    d.mkdir(exist_ok=True)
    mp = pytest.MonkeyPatch()
    mp.setenv("COMMITENV_CACHE", str(d))
    yield d
    mp.undo()


def _sweep_temp_dirs(parent: Path) -> None:
    """Remove the temp folders of earlier test processes that are gone (named ``commitenv-test-<worker>-<pid>-*``)."""
    for d in parent.glob("commitenv-test-*"):
        pid = d.name.split("-")[3] if d.name.count("-") >= 4 else ""
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _session_temp_dir(_session_reference_cache):
    """Each test process (an xdist worker, or the only one) gets its own temp folder for what the code under test
    puts in the system's temp dir (the leaderboard's sandbox folders, Ray's session files), so parallel workers never
    see each other's folders; a short path under the system's temp dir (Ray's socket paths must stay under 107
    bytes). Child processes inherit it through TMPDIR. It outlives the session (multiprocessing removes its own
    folders in it at exit), and the next run removes it."""
    system = Path(tempfile.gettempdir())
    _sweep_temp_dirs(system)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    d = tempfile.mkdtemp(prefix=f"commitenv-test-{worker}-{os.getpid()}-", dir=system)
    mp = pytest.MonkeyPatch()
    mp.setenv("TMPDIR", d)
    mp.setattr(tempfile, "tempdir", d)
    yield Path(d)
    mp.undo()
