"""Planning time charged by the runner: how long a controller's decision took, measured around its ``act()``, becomes
the delay before the action applies (the scenario's ``realism.planning_delay.mode: measured``, the default at
``paper`` and ``hard``). A controller cannot report itself faster than it is: the charge is the larger of the wall
time and the CPU time of its process (all threads) and of every live process it started (worker pools), and at
least what it reports through ``probe.report_planning_delay``. The leaderboard's host charges its sandboxed child
the same way.

The charge is rounded to ``realism.planning_delay.resolution_s`` (default 0.1 s, half up), so a policy that decides
in a few milliseconds is charged 0 and its runs stay bit-reproducible; a planner that takes seconds is charged what
it took, which varies a little from run to run and from machine to machine (for bit-reproducible tables use
``planning_delay: {mode: fixed, seconds: s}``).

In your own Gymnasium loop, time each decision with a `PlanningClock` and hand the seconds to the env::

    clock = PlanningClock()
    with clock:
        action = ctrl.act(obs, info)
    env.unwrapped.charge_planning(clock.seconds)
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

__all__ = ["PlanningClock", "descendant_cpu_s", "quantize"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (Linux: /proc/<pid>/task/*/children); [] where /proc has no such file."""
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for t in tasks:
        try:
            out.extend(int(x) for x in (t / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return out


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads), 0 when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14, 15 of proc(5))


def descendant_cpu_s(pid: int | None = None) -> dict[int, float]:
    """CPU seconds of every live descendant process of ``pid`` (default: this process), by pid."""
    root = os.getpid() if pid is None else pid
    seen: dict[int, float] = {}
    todo = _children(root)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen[p] = _proc_cpu_s(p)
        todo.extend(_children(p))
    return seen


def quantize(seconds: float, resolution_s: float) -> float:
    """``seconds`` rounded half up to a multiple of ``resolution_s`` (0: unchanged)."""
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise ValueError(f"planning time: expected a finite number of seconds >= 0, got {seconds}")
    if resolution_s <= 0:
        return float(seconds)
    return math.floor(seconds / resolution_s + 0.5) * resolution_s


class PlanningClock:
    """Measures one decision: ``seconds`` = max(wall time, CPU of this process + CPU its live descendants spent)
    between entering and leaving the ``with`` block (a worker that exits during the decision is counted through
    the reaped children's usage)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.wall_s = 0.0
        self.cpu_s = 0.0

    def __enter__(self) -> "PlanningClock":
        import resource

        self._wall0 = time.perf_counter()
        self._cpu0 = time.process_time()
        self._kids0 = descendant_cpu_s()
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        self._reaped0 = ru.ru_utime + ru.ru_stime
        return self

    def __exit__(self, *exc: object) -> None:
        import resource

        self.wall_s = time.perf_counter() - self._wall0
        own = time.process_time() - self._cpu0
        kids = descendant_cpu_s()
        live = sum(max(0.0, c - self._kids0.get(p, 0.0)) for p, c in kids.items())
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        gone = sum(c for p, c in self._kids0.items() if p not in kids)  # their time before the decision
        reaped = max(0.0, ru.ru_utime + ru.ru_stime - self._reaped0 - gone)
        self.cpu_s = own + live + reaped
        self.seconds = max(self.wall_s, self.cpu_s)
