"""The sandboxes' folders on the host: made under one parent, named after their owner, removed on every exit path.

Each sandboxed episode gets ``<tmp>/commitenv-sandbox/<pid>.<start>.<random>/`` (``box/``, which the child sees as
its folder, and ``child.log``, its output, which it cannot see), where ``<pid>`` and ``<start>`` (the process's
start time in clock ticks since boot) name the scoring process that made it. The scorer removes its folder when the
episode ends however it ends (the child's exit or SIGKILL, a limit, the host's SIGINT or SIGTERM, which
`commitenv submit` and the runner's workers turn into an exception, `terminate_as_exit`); a scorer that is itself
SIGKILLed cannot, so `sweep` (run when scoring
starts) removes every folder whose owner is no longer running.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path


def parent() -> Path:
    """The folder all sandbox folders live in (made, private to this user, on first use)."""
    p = Path(tempfile.gettempdir()) / "commitenv-sandbox"
    p.mkdir(mode=0o700, exist_ok=True)
    return p


def _start_time(pid: int) -> str | None:
    """Process ``pid``'s start time (clock ticks since boot) as text, None when it is not running."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def new_box() -> Path:
    """A fresh folder owned by this process, with an empty ``box/`` inside."""
    me = os.getpid()
    d = Path(tempfile.mkdtemp(prefix=f"{me}.{_start_time(me)}.", dir=parent()))
    (d / "box").mkdir()
    return d


def remove(path: Path) -> None:
    """Remove a sandbox folder even where the child took away its own permissions on what it wrote."""

    def unlock(func, p, _exc) -> None:
        try:
            os.chmod(os.path.dirname(p), stat.S_IRWXU)
            os.chmod(p, stat.S_IRWXU)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=unlock)


def sweep() -> int:
    """Remove the folders left by scoring processes that are gone (SIGKILLed); how many were removed."""
    n = 0
    for d in parent().iterdir():
        pid, _, rest = d.name.partition(".")
        start = rest.partition(".")[0]
        if not pid.isdigit():
            continue
        if _start_time(int(pid)) != start:  # gone, or the pid reused by another process
            remove(d)
            n += 1
    return n


@contextlib.contextmanager
def terminate_as_exit(forward: bool = False) -> Iterator[None]:
    """SIGTERM raises SystemExit(143) in this process while the block runs, so that every sandbox is stopped and its
    folder removed on the way out (SIGINT already raises KeyboardInterrupt); with ``forward``, the signal is first
    passed on to this process's multiprocessing children (the runner's workers, which do the same). The previous
    handler comes back afterwards; outside the main thread nothing changes."""

    def stop(signum: int, _frame) -> None:
        if forward:
            import multiprocessing

            for child in multiprocessing.active_children():
                try:
                    os.kill(child.pid, signum)
                except OSError:
                    pass
        raise SystemExit(128 + signum)

    try:
        old = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
