"""The oracle's search on the ground-truth engine: DP nodes expanded by stepping forks of the truth
(`commitenv.hindsight.TruthRun`), in this process or in worker processes, and the exact replay of a schedule."""

from __future__ import annotations

import multiprocessing as mp
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from commitenv_controllers.oracle.dp import Node, Plan, PlanTerms, search


def _outcome(run: Any, a: int, clk: int, estimate: bool, terms: PlanTerms) -> tuple[float, int, int, tuple[int, ...]]:
    """Step ``run`` one interval under (a, clk): (interval energy, certain misses, ranking estimate, the estimate by
    arrival hour). The estimate is, hour by hour, the larger of the certain misses and `TruthRun.optimistic_misses`'
    (skipped where the certain misses already break a budget)."""
    e = run.step(a, clk)
    by_hour = run.misses_by_hour()
    mi = int(by_hour.sum())
    if estimate and not run.done and terms.feasible(mi, by_hour):
        by_hour = np.maximum(by_hour, run.optimistic_misses_by_hour())
    return e, mi, int(by_hour.sum()), tuple(int(x) for x in by_hour)


class _Workers:
    """Worker processes (forked after the hindsight access was made, so they hold the trace and the truth model)
    that keep ground-truth forks by path and expand them on request; the parent only sees numbers, and moves a
    kept state between workers as bytes (`HindsightAccess.dumps`)."""

    def __init__(self, n: int, access: Any, root: Any, configs: Sequence[tuple[int, int]], estimate: bool,
                 terms: PlanTerms) -> None:
        ctx = mp.get_context("fork")
        self.access = access
        self.conns = []
        self.procs = []
        blob = access.dumps(root)
        for _ in range(n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(child, access, list(configs), estimate, terms), daemon=True)
            proc.start()
            child.close()
            parent.send(("put", (), blob))
            self.conns.append(parent)
            self.procs.append(proc)
        self.has: dict[tuple[int, ...], set[int]] = {(): set(range(n))}  # which workers hold a node's state

    def expand(self, nodes: list[Node], todo: list[list[int]]) -> list[tuple[Node, int, tuple]]:
        """Children outcomes ((node, config, (k, hour_j, closed_kwh, e, misses, est, est_hours))) in node-then-config
        order."""
        W = len(self.conns)
        keep = {n.path for n in nodes}
        for conn in self.conns:
            conn.send(("keep", keep))
        self.has = {p: ws for p, ws in self.has.items() if p in keep}
        for n in nodes:  # every worker gets every kept state
            owners = self.has[n.path]
            missing = [w for w in range(W) if w not in owners]
            if missing:
                src = self.conns[min(owners)]
                src.send(("get", n.path))
                blob = _reply(src)
                for w in missing:
                    self.conns[w].send(("put", n.path, blob))
                owners.update(missing)
        tasks: list[list[tuple[tuple[int, ...], int]]] = [[] for _ in range(W)]
        i = 0
        for n, cs in zip(nodes, todo):
            for c in cs:
                tasks[i % W].append((n.path, c))
                i += 1
        for w, conn in enumerate(self.conns):
            conn.send(("expand", tasks[w]))
        results: dict[tuple[tuple[int, ...], int], tuple] = {}
        for w, conn in enumerate(self.conns):
            for (path, c), out in zip(tasks[w], _reply(conn)):
                results[(path, c)] = out
                self.has[path + (c,)] = {w}
        return [(n, c, results[(n.path, c)]) for n, cs in zip(nodes, todo) for c in cs]

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(("stop",))
                conn.close()
            except OSError:
                pass
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()


def _worker_main(conn: Any, access: Any, configs: list[tuple[int, int]], estimate: bool, terms: PlanTerms) -> None:
    """A `_Workers` process: holds forks by path; ops put / get / keep / expand / stop. A failure is answered to
    the next request that expects a reply (get, expand) as ("__error__", traceback), and the process ends."""
    states: dict[tuple[int, ...], Any] = {}
    failed: str | None = None
    while True:
        msg = conn.recv()
        op = msg[0]
        if op == "stop":
            return
        if failed is not None:
            if op in ("get", "expand"):
                conn.send(("__error__", failed))
                return
            continue
        try:
            if op == "put":
                states[msg[1]] = access.loads(msg[2])
            elif op == "get":
                conn.send(access.dumps(states[msg[1]]))
            elif op == "keep":
                states = {p: st for p, st in states.items() if p in msg[1]}
            elif op == "expand":
                out = []
                for path, c in msg[1]:
                    run = states[path].fork()
                    e, mi, est, est_h = _outcome(run, *configs[c], estimate, terms)
                    states[path + (c,)] = run
                    out.append((run.k, run.hour_energy_j, run.closed_kwh, e, mi, est, est_h))
                conn.send(out)
        except Exception:  # noqa: BLE001 - reported to the parent, which raises
            failed = traceback.format_exc()
            if op in ("get", "expand"):
                conn.send(("__error__", failed))
                return


def _reply(conn: Any) -> Any:
    """A worker's answer, or RuntimeError with the worker's traceback."""
    try:
        out = conn.recv()
    except EOFError:
        raise RuntimeError("oracle: a planning worker process ended unexpectedly") from None
    if isinstance(out, tuple) and len(out) == 2 and out[0] == "__error__":
        raise RuntimeError(f"oracle: a planning worker failed:\n{out[1]}")
    return out


def plan_engine(root: Any, configs: Sequence[tuple[int, int]], terms: PlanTerms, *, beam: int | None = 6,
                energy_grid_j: float = 0.0, estimate: bool = True, screen_after: int = 2, recheck: int = 10,
                incumbents: Sequence[Sequence[int]] = (), workers: int = 0, access: Any = None,
                on_step: Callable[[int, int], None] | None = None, reach_j: Sequence[float] | None = None) -> Plan:
    """The DP with the real engine from ``root`` (a `commitenv.hindsight.TruthRun` at a boundary): transitions are
    ground-truth interval runs of ``configs`` ((active, clock MHz) pairs). ``estimate``: rank unfinished nodes by
    `TruthRun.optimistic_misses` (else by the misses certain so far). ``incumbents``: whole schedules (config
    indices) replayed through the truth and returned instead when better (e.g. vLLM's). ``workers`` > 0 expands
    in that many forked processes (needs ``access``, the `HindsightAccess` that made ``root``, the ``fork`` start
    method and a non-daemon process; otherwise it plans in this process); the plan does not depend on it.
    ``reach_j``: an estimate of the most energy each interval can draw (`search`).

    Screening (``screen_after`` > 0; 0 expands every configuration always): a configuration that was *hopeless*
    (its child over the miss budget by the estimate) from every kept state for ``screen_after`` intervals in a
    row is skipped, re-tried every ``recheck`` intervals, in every hour's last interval and from each hour's start
    on (a new hour brings a new budget). (A dominance rule that
    also skipped configurations trading a few misses for energy was tried and dropped: on bench-h200-hour-fixed-a30
    seed 100000 it cut planning 3.5x but raised the plan's cost from 0.0008 to 0.029 kWh-eq.)"""
    if not configs:
        raise ValueError("configs: expected at least one (active, clock) configuration")
    if screen_after < 0 or recheck < 1:
        raise ValueError(f"screen_after >= 0 and recheck >= 1 expected, got {screen_after}, {recheck}")
    if workers < 0:
        raise ValueError(f"workers: expected >= 0 processes (0: plan in this process), got {workers}")
    if workers > 0 and (access is None or "fork" not in mp.get_all_start_methods() or mp.current_process().daemon):
        workers = 0  # no fork start method, no access to ship states with, or a daemon (no children): in-process
    w = terms.miss_weight_kwh
    K = terms.intervals_per_hour
    C = len(configs)
    sims = [0]
    streak = [0] * C
    skip_until = [-1] * C  # skipped while the interval index is below this
    skipped = [0]

    def todo_of(n: Node) -> list[int]:
        last = (n.k + 1) % K == 0
        todo = [c for c in range(C) if last or n.k >= skip_until[c]] or list(range(C))
        skipped[0] += C - len(todo)
        return todo

    def expand_here(nodes: list[Node]) -> list[Node]:
        out = []
        for n in nodes:
            todo = todo_of(n)
            for i, c in enumerate(todo):
                run = n.state if i == len(todo) - 1 else n.state.fork()  # the last child steps the parent in place
                e, mi, est, est_h = _outcome(run, *configs[c], estimate, terms)
                out.append(Node(run.k, run.hour_energy_j, run.closed_kwh, mi, est, n.path + (c,), run,
                                n.interval_j + (e,), est_h))
        sims[0] += len(out)
        return out

    pool: _Workers | None = None

    def expand_workers(nodes: list[Node]) -> list[Node]:
        todo = [todo_of(n) for n in nodes]
        out = []
        for n, c, (k, hj, closed, e, mi, est, est_h) in pool.expand(nodes, todo):
            out.append(Node(k, hj, closed, mi, est, n.path + (c,), None, n.interval_j + (e,), est_h))
        sims[0] += len(out)
        return out

    def observe(children: list[Node]) -> None:
        if screen_after == 0 or not terms.constrained:
            return
        step = children[0].k - 1
        if step % K == 0:  # a new hour, a new budget: every configuration starts afresh
            streak[:] = [0] * C
        hopeless = {ch.path[-1] for ch in children}
        for ch in children:
            if ch.feasible_by(terms):
                hopeless.discard(ch.path[-1])
        for c in {ch.path[-1] for ch in children}:
            streak[c] = streak[c] + 1 if c in hopeless else 0
            if streak[c] >= screen_after:
                skip_until[c] = min(step + 1 + recheck, (step // K + 1) * K)  # (never into the next hour)
                streak[c] = screen_after - 1  # one more hopeless try skips it again

    h0 = tuple(int(x) for x in root.misses_by_hour())
    m0 = sum(h0)
    if workers > 0:
        pool = _Workers(workers, access, root, configs, estimate, terms)
        start = Node(root.k, root.hour_energy_j, root.closed_kwh, m0, m0, (), est_hours=h0)
    else:
        start = Node(root.k, root.hour_energy_j, root.closed_kwh, m0, m0, (), root.fork(), est_hours=h0)  # root intact
    try:
        best, st = search(start, expand_workers if pool is not None else expand_here, terms,
                          energy_grid_j=energy_grid_j, beam=beam, on_step=on_step, observe=observe, reach_j=reach_j)
    finally:
        if pool is not None:
            pool.close()
    plan = Plan(best.path, best.closed_kwh, best.misses, best.closed_kwh + w * best.misses,
                terms.feasible(best.misses, best.est_hours), best.interval_j, dict(st),
                misses_by_hour=best.est_hours or ())
    for sched in incumbents:
        inc = replay(root, configs, sched, terms)
        better = (inc.feasible, -inc.objective_kwh, -inc.misses) > (plan.feasible, -plan.objective_kwh, -plan.misses)
        if better:
            plan = Plan(inc.schedule, inc.cost_kwh, inc.misses, inc.objective_kwh, inc.feasible, inc.interval_j,
                        {**plan.stats, "incumbent_won": 1.0}, misses_by_hour=inc.misses_by_hour)
    plan.stats["engine_steps"] = float(sims[0])
    plan.stats["screened_out"] = float(skipped[0])
    plan.stats["workers"] = float(workers)
    return plan


def replay(root: Any, configs: Sequence[tuple[int, int]], schedule: Sequence[int], terms: PlanTerms) -> Plan:
    """The exact outcome of ``schedule`` (config indices for the remaining intervals) on a fork of ``root``."""
    run = root.fork()
    es, hs = [], []
    for c in schedule:
        es.append(run.step(*configs[c]))
        hs.append(tuple(int(x) for x in run.misses_by_hour()))
    if not run.done:
        raise ValueError(f"replay: the schedule covers {len(schedule)} intervals, the run needs more")
    by_hour = tuple(int(x) for x in run.misses_by_hour())
    mi = sum(by_hour)
    return Plan(tuple(schedule), run.closed_kwh, mi, run.closed_kwh + terms.miss_weight_kwh * mi,
                terms.feasible(mi, by_hour), tuple(es), certain_misses=tuple(sum(h) for h in hs),
                misses_by_hour=by_hour, certain_by_hour=tuple(hs))
