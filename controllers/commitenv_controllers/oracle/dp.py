"""The oracle's dynamic programme: the objective (`PlanTerms`), DP nodes and plans, the search with energy cells
and a beam, and the exact DP on per-interval tables (`plan_table`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from commitenv.metrics import deviation_cost_kwh


@dataclass(frozen=True)
class PlanTerms:
    """The objective: hourly settlement against ``commitments_j`` + ``miss_weight_kwh`` x misses, subject to
    misses <= ``max_misses`` (None: no constraint) and, with ``hour_budgets`` (one per hour), the misses among each
    arrival hour's requests <= its budget (the SLO gate's form). A pace keeps a search from spending a budget before
    the arrivals it is meant for: ``miss_pace`` (one entry per interval, pooled) caps the estimated misses of a state
    ``k`` intervals in at ``miss_pace[k - 1]``; ``hour_pace`` (one entry per interval) caps those of the arrival hour
    that interval ``k - 1`` lies in."""

    intervals_per_hour: int
    commitments_j: tuple[float, ...]
    lambda_plus: float = 2.0
    lambda_minus: float = 1.0
    miss_weight_kwh: float = 0.0
    max_misses: int | None = None
    miss_pace: tuple[int, ...] | None = None
    hour_budgets: tuple[int, ...] | None = None
    hour_pace: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.intervals_per_hour < 1:
            raise ValueError(f"intervals_per_hour: expected >= 1, got {self.intervals_per_hour}")
        if not self.commitments_j or any(not (c >= 0 and math.isfinite(c)) for c in self.commitments_j):
            raise ValueError(f"commitments_j: expected one finite value >= 0 per hour (0: energy-only), got "
                             f"{self.commitments_j}")
        if not (self.miss_weight_kwh >= 0 and math.isfinite(self.miss_weight_kwh)):
            raise ValueError(f"miss_weight_kwh: expected a finite weight >= 0, got {self.miss_weight_kwh}")
        if self.max_misses is not None and self.max_misses < 0:
            raise ValueError(f"max_misses: expected >= 0 or None, got {self.max_misses}")
        if self.miss_pace is not None and len(self.miss_pace) != self.steps:
            raise ValueError(f"miss_pace: expected one allowance per interval ({self.steps}), got "
                             f"{len(self.miss_pace)}")
        if self.hour_budgets is not None and (len(self.hour_budgets) != len(self.commitments_j)
                                              or any(b < 0 for b in self.hour_budgets)):
            raise ValueError(f"hour_budgets: expected one budget >= 0 per hour ({len(self.commitments_j)}), got "
                             f"{self.hour_budgets}")
        if self.hour_pace is not None and (self.hour_budgets is None or len(self.hour_pace) != self.steps):
            raise ValueError(f"hour_pace: expected hour_budgets and one allowance per interval ({self.steps}), got "
                             f"{None if self.hour_pace is None else len(self.hour_pace)}")

    @property
    def steps(self) -> int:
        return self.intervals_per_hour * len(self.commitments_j)

    @property
    def constrained(self) -> bool:
        """Whether any miss budget applies."""
        return self.max_misses is not None or self.hour_budgets is not None

    def hour_cost(self, energy_j: float, hour: int) -> float:
        return float(deviation_cost_kwh(energy_j, self.commitments_j[hour], self.lambda_plus, self.lambda_minus))

    def feasible(self, misses: int, by_hour: Sequence[int] | None = None) -> bool:
        """``misses`` (and ``by_hour``, per arrival hour) within the budgets."""
        if self.hour_budgets is not None and by_hour is not None:
            if any(m > b for m, b in zip(by_hour, self.hour_budgets)):
                return False
        return self.max_misses is None or misses <= self.max_misses

    def feasible_by(self, k: int, misses: int, by_hour: Sequence[int] | None = None) -> bool:
        """Within the budgets as paced ``k`` intervals into the episode (`feasible` without a pace)."""
        if 0 < k <= self.steps:
            if self.miss_pace is not None and misses > self.miss_pace[k - 1]:
                return False
            if self.hour_pace is not None and by_hour is not None:
                h = (k - 1) // self.intervals_per_hour
                if by_hour[h] > self.hour_pace[k - 1]:
                    return False
        return self.feasible(misses, by_hour)


@dataclass
class Node:
    """A DP state: ``k`` intervals done along ``path`` (config indices), the open hour's energy, the closed hours'
    cost, the certain misses and the ranking estimate (equal to ``misses`` once exact); ``state``: the engine."""

    k: int
    hour_j: float
    closed_kwh: float
    misses: int
    est_misses: int
    path: tuple[int, ...]
    state: Any = None
    interval_j: tuple[float, ...] = ()
    est_hours: tuple[int, ...] | None = None  # the estimate by arrival hour (the misses by hour once exact)

    def feasible_by(self, terms: PlanTerms) -> bool:
        """Within ``terms``' budgets by the estimate, as paced at this node's interval."""
        return terms.feasible_by(self.k, self.est_misses, self.est_hours)

    def objective(self, w: float) -> float:
        """J so far: closed hours' cost + w x estimated misses."""
        return self.closed_kwh + w * self.est_misses

    def key(self, w: float) -> tuple:
        return (self.objective(w), self.est_misses, self.hour_j, self.path)


@dataclass(frozen=True)
class Plan:
    """A schedule (config index per interval) with its exact outcome."""

    schedule: tuple[int, ...]
    cost_kwh: float  # settlement cost, sum over hours
    misses: int
    objective_kwh: float  # cost + w x misses
    feasible: bool  # misses within the budgets (pooled and by arrival hour)
    interval_j: tuple[float, ...] = ()  # energy of every interval (settlement meter)
    stats: dict[str, float] = field(default_factory=dict)
    certain_misses: tuple[int, ...] = ()  # misses certain after each interval (`replay` only)
    misses_by_hour: tuple[int, ...] = ()  # the misses by arrival hour (engine plans)
    certain_by_hour: tuple[tuple[int, ...], ...] = ()  # misses by arrival hour certain after each interval (`replay`)


Expand = Callable[[list[Node]], list[Node]]  # every kept node's children, node by node in order


def _hour_floor(n: Node, terms: PlanTerms, rest: tuple[float, float]) -> float:
    """The least cost the open hour can still settle at from ``n``: that of the energy nearest the commitment within
    hour_j + ``rest`` (the least and the most energy the hour's remaining intervals can draw, estimated); 0 inside
    that band and at an hour's close."""
    K = terms.intervals_per_hour
    if n.k % K == 0:
        return 0.0
    h = n.k // K
    near = min(max(terms.commitments_j[h], n.hour_j + rest[0]), n.hour_j + rest[1])
    return terms.hour_cost(near, h)


def _pareto(nodes: list[Node], w: float, floor: Callable[[Node], float]) -> list[Node]:
    """Nodes not dominated in (J + the open hour's floor, estimated misses) (ties: one, by `Node.key`)."""
    out: list[Node] = []
    best_m = math.inf
    for n in sorted(nodes, key=lambda n: (n.objective(w) + floor(n),) + n.key(w)[1:]):
        if n.est_misses < best_m:
            out.append(n)
            best_m = n.est_misses
    return out


def _thin(nodes: list[Node], terms: PlanTerms, beam: int, floor: Callable[[Node], float],
          rest: tuple[float, float]) -> list[Node]:
    """At most ``beam`` nodes: feasible ones first. Inside an hour: one per stratum of the energy band that can still
    reach the commitment (E*_h - ``rest``, the most and the least energy the hour's rest can draw), the
    safest (by J, then the fewest estimated misses, ties broken by the distance to the even pace E*_h k/K so that the
    kept energies do not drift to one end), then in turns the cheapest (by J plus the open hour's floor,
    `_hour_floor`: an hour that cannot reach its commitment keeps the states nearest it) and the safest of the rest
    (a search on a tight budget needs the safe states, one on an unreachable commitment the cheap ones); at an
    hour's close the best by J."""
    w = terms.miss_weight_kwh
    if terms.constrained:
        feas = [n for n in nodes if n.feasible_by(terms)]
        if feas:
            nodes = feas
    if len(nodes) <= beam:
        return sorted(nodes, key=lambda n: n.key(w))
    K = terms.intervals_per_hour
    k = nodes[0].k
    if k % K == 0:
        return sorted(nodes, key=lambda n: n.key(w))[:beam]
    target = terms.commitments_j[k // K]
    pace = target * (k % K) / K

    def safe(n: Node) -> tuple:
        return (n.objective(w), n.est_misses, abs(n.hour_j - pace), n.path)

    def cheap(n: Node) -> tuple:
        return (n.objective(w) + floor(n), n.est_misses, abs(n.hour_j - pace), n.path)

    es = [n.hour_j for n in nodes]
    lo = max(target - rest[1], min(es))
    hi = min(target - rest[0], max(es))
    chosen: dict[int, Node] = {}
    if hi > lo:
        for n in nodes:
            s = min(max(int((n.hour_j - lo) / (hi - lo) * beam), 0), beam - 1)
            if s not in chosen or safe(n) < safe(chosen[s]):
                chosen[s] = n
    kept = list(chosen.values())
    ids = {id(n) for n in kept}
    orders = [iter(sorted(nodes, key=cheap)), iter(sorted(nodes, key=safe))]
    turn = 0
    while len(kept) < min(beam, len(nodes)):
        for n in orders[turn % 2]:
            if id(n) not in ids:
                kept.append(n)
                ids.add(id(n))
                break
        turn += 1
    return sorted(kept, key=lambda n: n.key(w))


def search(root: Node, expand: Expand, terms: PlanTerms, *, energy_grid_j: float = 0.0,
           beam: int | None = None, on_step: Callable[[int, int], None] | None = None,
           observe: Callable[[list[Node]], None] | None = None,
           reach_j: Sequence[float] | None = None) -> tuple[Node, dict[str, float]]:
    """The DP over (interval, open-hour energy cell): expand every kept node by every configuration, merge the
    children per cell (``energy_grid_j`` wide, 0: equal energies only) keeping their Pareto set in (J + the open
    hour's floor, misses) (`_hour_floor`; equal within a cell of equal energies), thin
    to ``beam`` nodes (None: keep all), and return the best complete node (feasible first) and counters.
    Exact for state-independent transitions when ``energy_grid_j == 0`` and ``beam is None``. ``observe`` sees
    every interval's children before merging; ``on_step(interval, kept)`` reports progress. The rest of an open
    hour can draw R e_lo .. R e_hi (R intervals left, e_lo .. e_hi the interval's range of energies over the
    children within the budgets), or up to the sum of ``reach_j`` over those intervals (one estimate per interval of
    the most energy it can draw, e.g. vLLM's schedule replayed: load varies within an hour)."""
    K = terms.intervals_per_hour
    if reach_j is not None and len(reach_j) != terms.steps:
        raise ValueError(f"reach_j: expected one energy per interval ({terms.steps}), got {len(reach_j)}")
    if energy_grid_j < 0 or not math.isfinite(energy_grid_j):
        raise ValueError(f"energy_grid_j: expected a width >= 0 J, got {energy_grid_j}")
    if beam is not None and beam < 1:
        raise ValueError(f"beam: expected at least 1 state per interval (or None), got {beam}")
    w = terms.miss_weight_kwh
    nodes = [root]
    expanded = 0
    for step in range(root.k, terms.steps):
        children = expand(nodes)
        expanded += len(children)
        if not children:
            raise RuntimeError(f"search: no configuration to expand at interval {step}")
        if observe is not None:
            observe(children)
        # this interval's range of energies, over the children within the budgets where there are any
        feas = [c for c in children if c.feasible_by(terms)] if terms.constrained else children
        steps_j = [c.interval_j[-1] for c in feas or children if c.interval_j]
        e_lo, e_hi = (min(steps_j), max(steps_j)) if steps_j else (0.0, 0.0)
        k, R = step + 1, K - (step + 1) % K
        rest = (R * e_lo, R * e_hi if reach_j is None else float(sum(reach_j[k : k + R])))
        cells: dict[Any, list[Node]] = {}
        for c in children:
            key = (round(c.hour_j / energy_grid_j) if energy_grid_j > 0 else c.hour_j)
            cells.setdefault(key, []).append(c)

        def floor(n: Node) -> float:
            return _hour_floor(n, terms, rest)

        merged = [n for group in cells.values() for n in _pareto(group, w, floor)]
        nodes = merged if beam is None else _thin(merged, terms, beam, floor, rest)
        if on_step is not None:
            on_step(step, len(nodes))
    feas = [n for n in nodes if terms.feasible(n.misses, n.est_hours)]
    best = min(feas, key=lambda n: n.key(w)) if feas else min(nodes, key=lambda n: (n.misses, n.key(w)))
    return best, {"expanded": float(expanded)}


# ---------------------------------------------------------------------------------------------- tables (pure DP)
def plan_table(energy_j: Sequence[Sequence[float]], misses: Sequence[Sequence[int]], terms: PlanTerms, *,
               energy_grid_j: float = 0.0, beam: int | None = None) -> Plan:
    """The DP on per-interval tables (``energy_j[t][c]``, ``misses[t][c]`` for interval t under configuration c,
    independent of earlier choices). With the defaults it is exact: the optimum of J subject to the miss
    constraint (if no schedule is feasible: the fewest misses, then J)."""
    e = np.asarray(energy_j, dtype=np.float64)
    m = np.asarray(misses)
    if e.ndim != 2 or e.shape != m.shape or e.shape[0] != terms.steps or e.shape[1] < 1:
        raise ValueError(f"tables: expected energy_j and misses of shape ({terms.steps}, configs), got {e.shape} "
                         f"and {m.shape}")
    if not np.all(np.isfinite(e)) or np.any(m < 0) or not np.all(m == np.round(m)):
        raise ValueError("tables: energies must be finite and misses whole numbers >= 0")
    m = m.astype(np.int64)
    K = terms.intervals_per_hour

    def expand_one(n: Node) -> list[Node]:
        out = []
        for c in range(e.shape[1]):
            hj = n.hour_j + float(e[n.k, c])
            closed = n.closed_kwh
            if (n.k + 1) % K == 0:
                closed += terms.hour_cost(hj, n.k // K)
                hj = 0.0
            mi = n.misses + int(m[n.k, c])
            out.append(Node(n.k + 1, hj, closed, mi, mi, n.path + (c,), None, n.interval_j + (float(e[n.k, c]),)))
        return out

    def expand(nodes: list[Node]) -> list[Node]:
        return [ch for n in nodes for ch in expand_one(n)]

    best, st = search(Node(0, 0.0, 0.0, 0, 0, ()), expand, terms, energy_grid_j=energy_grid_j, beam=beam)
    return Plan(best.path, best.closed_kwh, best.misses, best.closed_kwh + terms.miss_weight_kwh * best.misses,
                terms.feasible(best.misses), best.interval_j, st)
