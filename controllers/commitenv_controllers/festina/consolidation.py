"""Festina's energy-aware workload replacement (paper sec. 3.5): the Energy Waste Ratio, capacity planning
(Phase Two) and EWR-aware placement (Phase Three), the trigger, and the mapping of a plan onto a pool's GPUs (the
latency-aware migration of running requests is the engine's, `commitenv.sim.migration`).

Pure algorithms on plain records; nothing here touches the simulator.

Units. Frequencies are MHz, busy times seconds, SM demand a fraction of one GPU, memory GB. The waste
``sum_g sum_{l in g} t_l * (F_g^3 - F_l^3)`` is in MHz^3 x s: a proxy for energy (dynamic power taken as
proportional to f^3), meaningful only as a ratio (EWR) or a comparison.

Interpretations where the paper (sec. 3.5.2, Algorithm 1 not available in the text) is silent:

* Operating frequency of a shared GPU: the highest preferred frequency among its residents (it must serve the
  most demanding one), unless a frequency is given explicitly.
* Phase Two: N_gpu per the paper is the larger of the two one-dimensional bin-packing optima (SM, memory); that is
  itself a lower bound for packing both dimensions at once, so the exact two-dimensional optimum is solved too and
  is the number of GPUs `place` is first tried with in `plan_and_place`.
* Phase Three seeding: without given frequencies, the LLMs sorted by (F_l, id) are split into n_gpus contiguous
  groups of near-equal count and each GPU is seeded with its group's highest F_l. The seeds stay fixed during the
  pass and only choose the Target / Candidate / fallback order (closest seed first, ties to the lower GPU index).
* "Reduces the total E_waste" for a swap: the total waste after the swap (outlier moved to the Candidate, new LLM on
  the Target) is compared with the total waste of the outcome without a swap (new LLM placed by the fallback rule);
  the swap is taken only if strictly lower, or if no fallback GPU has room (the swap is then the only way to place
  the LLM).
* Fallback order: GPUs by closeness of seed frequency, Target excluded, so the Candidate is tried first.
* Room on a GPU: residents' SM and memory plus the new LLM within (1 - delta) x capacity (delta = 0.05).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from ortools.sat.python import cp_model

_EPS = 1e-9  # absolute slack on float capacity checks (SM fractions, GB)
WALL_BACKSTOP = 20.0  # a solve's wall-clock limit, in units of its deterministic limit (`solve_bin_packing`)


# --------------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class LlmDemand:
    """One LLM's consolidation demand: preferred frequency F_l, SM share SM_l, memory M_l and busy time t_l."""

    llm_id: str
    freq_mhz: float
    sm: float
    mem_gb: float
    busy_s: float

    def __post_init__(self) -> None:
        if self.freq_mhz <= 0:
            raise ValueError(f"{self.llm_id}: preferred frequency must be > 0 MHz, got {self.freq_mhz}")
        for name in ("sm", "mem_gb", "busy_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{self.llm_id}: {name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class GpuState:
    """One active GPU: operating frequency F_g, SM capacity (1.0 = whole GPU), memory capacity and residents."""

    gpu_id: str
    freq_mhz: float
    mem_cap_gb: float
    sm_cap: float = 1.0
    residents: tuple[str, ...] = ()


@dataclass(frozen=True)
class Placement:
    """LLM ids per GPU and, optionally, each GPU's operating frequency (absent: max of its residents' F_l)."""

    assignment: Mapping[str, tuple[str, ...]]
    freqs_mhz: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assignment = {g: tuple(ids) for g, ids in self.assignment.items()}
        seen: set[str] = set()
        for g, ids in assignment.items():
            for llm in ids:
                if llm in seen:
                    raise ValueError(f"LLM {llm!r} placed more than once (again on GPU {g!r})")
                seen.add(llm)
        unknown = set(self.freqs_mhz) - set(assignment)
        if unknown:
            raise ValueError(f"frequencies given for GPUs not in the assignment: {sorted(unknown)}")
        object.__setattr__(self, "assignment", MappingProxyType(assignment))
        object.__setattr__(self, "freqs_mhz", MappingProxyType(dict(self.freqs_mhz)))

    def gpu_of(self, llm_id: str) -> str:
        """The GPU holding ``llm_id``."""
        for g, ids in self.assignment.items():
            if llm_id in ids:
                return g
        raise KeyError(llm_id)

    @property
    def active_gpus(self) -> tuple[str, ...]:
        """GPUs with at least one resident, in assignment order."""
        return tuple(g for g, ids in self.assignment.items() if ids)


def sm_demand(sm_prefill: float, t_prefill_s: float, sm_decode: float, t_decode_s: float) -> float:
    """SM_l = (SM_p*T_p + SM_d*T_d) / (T_p + T_d): the time-weighted SM share over prefill and decode."""
    total = t_prefill_s + t_decode_s
    if t_prefill_s < 0 or t_decode_s < 0 or total <= 0:
        raise ValueError(f"phase times must be >= 0 with a positive sum, got T_p={t_prefill_s}, T_d={t_decode_s}")
    return (sm_prefill * t_prefill_s + sm_decode * t_decode_s) / total


def placement_of(gpus: Sequence[GpuState]) -> Placement:
    """The current placement held by a list of GPU states (their residents and operating frequencies)."""
    return Placement({g.gpu_id: g.residents for g in gpus}, {g.gpu_id: g.freq_mhz for g in gpus})


def moved_llms(before: Placement, after: Placement) -> tuple[tuple[str, str, str], ...]:
    """(llm, from GPU, to GPU) for every LLM present in both placements whose GPU changed, sorted by LLM id."""
    src = {llm: g for g, ids in before.assignment.items() for llm in ids}
    dst = {llm: g for g, ids in after.assignment.items() for llm in ids}
    return tuple((llm, src[llm], dst[llm]) for llm in sorted(src.keys() & dst.keys()) if src[llm] != dst[llm])


# --------------------------------------------------------------------------------------------- EWR (sec. 3.5.1)


def _by_id(demands: Iterable[LlmDemand] | Mapping[str, LlmDemand]) -> dict[str, LlmDemand]:
    if isinstance(demands, Mapping):
        return dict(demands)
    out: dict[str, LlmDemand] = {}
    for d in demands:
        if d.llm_id in out:
            raise ValueError(f"duplicate LLM id {d.llm_id!r}")
        out[d.llm_id] = d
    return out


def operating_freq(placement: Placement, gpu_id: str, demands: Mapping[str, LlmDemand]) -> float | None:
    """F_g: the given frequency, else the max preferred frequency of the residents; None for an empty GPU."""
    if gpu_id in placement.freqs_mhz:
        return float(placement.freqs_mhz[gpu_id])
    ids = placement.assignment[gpu_id]
    return max(demands[i].freq_mhz for i in ids) if ids else None


def energy_waste(placement: Placement, demands: Iterable[LlmDemand] | Mapping[str, LlmDemand]) -> float:
    """E_waste = sum_g sum_{l in g} t_l * (F_g^3 - F_l^3) in MHz^3 x s (signed, as written; >= 0 when F_g = max)."""
    by_id = _by_id(demands)
    total = 0.0
    for g, ids in placement.assignment.items():
        if not ids:
            continue
        f_g = operating_freq(placement, g, by_id)
        assert f_g is not None
        for i in ids:
            d = by_id[i]
            total += d.busy_s * (f_g**3 - d.freq_mhz**3)
    return total


def energy_optimal(demands: Iterable[LlmDemand] | Mapping[str, LlmDemand]) -> float:
    """E_optimal = sum_l t_l * F_l^3 in MHz^3 x s: every LLM at its own preferred frequency."""
    return sum(d.busy_s * d.freq_mhz**3 for d in _by_id(demands).values())


def ewr(placement: Placement, demands: Iterable[LlmDemand] | Mapping[str, LlmDemand]) -> float:
    """EWR = E_waste / E_optimal over the LLMs in ``placement`` (0 when both are 0)."""
    by_id = _by_id(demands)
    placed = [by_id[i] for ids in placement.assignment.values() for i in ids]
    waste, optimal = energy_waste(placement, by_id), energy_optimal(placed)
    if optimal == 0:
        if waste == 0:
            return 0.0
        raise ValueError("E_optimal is 0 (all busy times 0) but E_waste is not")
    return waste / optimal


# --------------------------------------------------------------------------------------------- Phase Two


@dataclass(frozen=True)
class BinPackingResult:
    """A bin packing: bins used, item indices per bin, whether it is proven optimal, and how.

    ``status`` is CP-SAT's status name (OPTIMAL, FEASIBLE, or UNKNOWN with the greedy packing kept), or
    OPTIMAL_BY_BOUND when first-fit decreasing already meets the trivial lower bound and no solve was needed.
    """

    n_bins: int
    bins: tuple[tuple[int, ...], ...]
    proven_optimal: bool
    status: str


@dataclass(frozen=True)
class CapacityPlan:
    """Phase Two: trivial lower bounds, per-dimension bin-packing optima and the joint (SM, memory) optimum."""

    sm_eff: float
    mem_eff_gb: float
    sm_lower_bound: int
    mem_lower_bound: int
    sm_packing: BinPackingResult
    mem_packing: BinPackingResult
    vector_packing: BinPackingResult
    assignment: tuple[tuple[str, ...], ...]

    @property
    def paper_n_gpu(self) -> int:
        """The paper's N_gpu: the larger of the SM and memory bin-packing numbers (a lower bound on the joint)."""
        return max(self.sm_packing.n_bins, self.mem_packing.n_bins)

    @property
    def n_gpu(self) -> int:
        """The fewest GPUs that hold every LLM with both the SM and memory margins (joint optimum)."""
        return self.vector_packing.n_bins

    @property
    def proven_optimal(self) -> bool:
        """True when all three CP-SAT solves finished with status OPTIMAL."""
        return self.sm_packing.proven_optimal and self.mem_packing.proven_optimal and self.vector_packing.proven_optimal


def _units(x: float, scale: int, up: bool) -> int:
    """x * scale as an integer, rounded up (sizes) or down (capacities); float noise around a grid point snaps to it."""
    v = x * scale
    r = round(v)
    if abs(v - r) <= 1e-9 * max(1.0, abs(v)):  # float noise only (0.37 * 1e4 = 3700.0000000000005)
        return int(r)
    return math.ceil(v) if up else math.floor(v)


def trivial_lower_bound(sizes: Sequence[float], capacity: float) -> int:
    """ceil(sum of sizes / capacity), at least 1 when there is an item."""
    if not sizes:
        return 0
    if capacity <= 0:
        raise ValueError(f"capacity must be > 0, got {capacity}")
    ratio = sum(sizes) / capacity
    return max(1, math.ceil(ratio - 1e-9))


def _first_fit_decreasing(sizes: Sequence[Sequence[int]], caps: Sequence[int]) -> list[list[int]]:
    order = sorted(range(len(sizes)), key=lambda i: (-max(s / c if c > 0 else 0.0 for s, c in zip(sizes[i], caps)), i))
    bins: list[list[int]] = []
    loads: list[list[int]] = []
    for i in order:
        for b, load in enumerate(loads):
            if all(l_ + s <= c for l_, s, c in zip(load, sizes[i], caps)):
                bins[b].append(i)
                loads[b] = [l_ + s for l_, s in zip(load, sizes[i])]
                break
        else:
            bins.append([i])
            loads.append(list(sizes[i]))
    return bins


def _canonical(bins: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """Bins ordered by their lowest item index, items ascending (the labelling the CP-SAT model assumes)."""
    return tuple(sorted((tuple(sorted(b)) for b in bins if b), key=lambda b: b[0]))


def solve_bin_packing(
    sizes: Sequence[Sequence[float]],
    capacities: Sequence[float],
    *,
    time_limit_s: float = 10.0,
    seed: int = 0,
    scale: int = 10_000,
) -> BinPackingResult:
    """Fewest bins holding every item in every dimension (vector bin packing; one dimension = classic) via CP-SAT.

    ``sizes[i][k]`` is item i's size in dimension k, ``capacities[k]`` the (already effective) bin capacity.
    ``time_limit_s`` is CP-SAT's deterministic time (about seconds on a desktop core): the same search, hence the same
    packing, on any machine and under any load; a wall-clock limit would let a busy machine change the plan. A wall
    limit of `WALL_BACKSTOP` times it only guards against a runaway solve.
    """
    n, dims = len(sizes), len(capacities)
    if n == 0:
        return BinPackingResult(0, (), True, "OPTIMAL_BY_BOUND")
    if any(len(s) != dims for s in sizes):
        raise ValueError(f"every item needs {dims} sizes")
    # Integer model: sizes rounded UP and capacities DOWN to 1/scale units, so the integer problem is never looser
    # than the real one (any integer-feasible packing is feasible with the real sizes).
    isz = [[_units(s, scale, up=True) for s in row] for row in sizes]
    icap = [_units(c, scale, up=False) for c in capacities]
    for i, row in enumerate(isz):
        if any(s < 0 for s in row):
            raise ValueError(f"item {i}: sizes must be >= 0")
        if any(s > c for s, c in zip(row, icap)):
            raise ValueError(f"item {i} (sizes {list(sizes[i])}) exceeds the bin capacity {list(capacities)}")

    greedy = _canonical(_first_fit_decreasing(isz, icap))
    lb = max(trivial_lower_bound([row[k] for row in isz], icap[k]) if icap[k] > 0 else 1 for k in range(dims))
    ub = len(greedy)
    if lb == ub:
        return BinPackingResult(ub, greedy, True, "OPTIMAL_BY_BOUND")  # greedy meets the bound: no solve

    m = cp_model.CpModel()
    # Symmetry breaking: label bins by their lowest item index, so item i only goes to bins 0..i and used bins are
    # 0..k-1 (every packing can be relabelled this way).
    x = {(i, b): m.new_bool_var(f"x{i}_{b}") for i in range(n) for b in range(min(i + 1, ub))}
    y = [m.new_bool_var(f"y{b}") for b in range(ub)]
    for i in range(n):
        m.add_exactly_one(x[i, b] for b in range(min(i + 1, ub)))
    for b in range(ub):
        members = [i for i in range(b, n)]
        for k in range(dims):
            m.add(sum(isz[i][k] * x[i, b] for i in members) <= icap[k] * y[b])
        for i in members:
            m.add_implication(x[i, b], y[b])
        if b + 1 < ub:
            m.add(y[b] >= y[b + 1])
    m.add(sum(y) >= lb)
    m.minimize(sum(y))
    hint_bin = {i: b for b, items in enumerate(greedy) for i in items}
    for (i, b), var in x.items():
        m.add_hint(var, hint_bin[i] == b)
    for b in range(ub):
        m.add_hint(y[b], b < len(greedy))

    solver = cp_model.CpSolver()
    solver.parameters.max_deterministic_time = time_limit_s
    solver.parameters.max_time_in_seconds = WALL_BACKSTOP * time_limit_s
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    status = solver.solve(m)
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return BinPackingResult(ub, greedy, False, name)  # no solution in time: the greedy packing stands
    bins = [[i for i in range(b, n) if solver.boolean_value(x[i, b])] for b in range(ub)]
    packed = _canonical(bins)
    return BinPackingResult(len(packed), packed, status == cp_model.OPTIMAL, name)


def min_gpus(
    demands: Sequence[LlmDemand],
    *,
    gpu_mem_cap_gb: float,
    gpu_sm_cap: float = 1.0,
    delta: float = 0.05,
    time_limit_s: float = 10.0,
    seed: int = 0,
    scale: int = 10_000,
) -> CapacityPlan:
    """Phase Two: the fewest GPUs for all LLMs within SM_eff = (1-delta)*SM_cap and M_eff = (1-delta)*M_cap."""
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    _by_id(demands)  # unique ids
    sm_eff, mem_eff = (1 - delta) * gpu_sm_cap, (1 - delta) * gpu_mem_cap_gb
    sms, mems = [d.sm for d in demands], [d.mem_gb for d in demands]
    opts = dict(time_limit_s=time_limit_s, seed=seed, scale=scale)
    sm_p = solve_bin_packing([[s] for s in sms], [sm_eff], **opts)
    mem_p = solve_bin_packing([[v] for v in mems], [mem_eff], **opts)
    vec_p = solve_bin_packing([[s, v] for s, v in zip(sms, mems)], [sm_eff, mem_eff], **opts)
    return CapacityPlan(
        sm_eff=sm_eff,
        mem_eff_gb=mem_eff,
        sm_lower_bound=trivial_lower_bound(sms, sm_eff),
        mem_lower_bound=trivial_lower_bound(mems, mem_eff),
        sm_packing=sm_p,
        mem_packing=mem_p,
        vector_packing=vec_p,
        assignment=tuple(tuple(demands[i].llm_id for i in b) for b in vec_p.bins),
    )


# --------------------------------------------------------------------------------------------- Phase Three

Rule = Literal["direct", "swap", "fallback"]


@dataclass(frozen=True)
class PlacementStep:
    """How one LLM was placed: the rule, its GPU, and for a swap the displaced outlier and where it went."""

    llm_id: str
    rule: Rule
    gpu_id: str
    displaced: str | None = None
    displaced_to: str | None = None


@dataclass(frozen=True)
class PlacementResult:
    """Phase Three's outcome: the placement, the seed frequency of each GPU, and one step per LLM in order."""

    placement: Placement
    seed_freqs_mhz: Mapping[str, float]
    steps: tuple[PlacementStep, ...]


def _seed_freqs(ordered: Sequence[LlmDemand], n_gpus: int) -> list[float]:
    """Split the sorted LLMs into n_gpus near-equal contiguous groups; each GPU gets its group's highest F_l."""
    n = len(ordered)
    base, extra = divmod(n, n_gpus)
    seeds: list[float] = []
    start = 0
    for g in range(n_gpus):
        size = base + (1 if g < extra else 0)
        group = ordered[start : start + size]
        start += size
        seeds.append(group[-1].freq_mhz if group else (seeds[-1] if seeds else ordered[-1].freq_mhz))
    return seeds


def _total_waste(groups: Sequence[Sequence[LlmDemand]]) -> float:
    total = 0.0
    for grp in groups:
        if grp:
            f_g = max(d.freq_mhz for d in grp)
            total += sum(d.busy_s * (f_g**3 - d.freq_mhz**3) for d in grp)
    return total


def place(
    demands: Sequence[LlmDemand],
    n_gpus: int,
    *,
    gpu_mem_cap_gb: float,
    gpu_sm_cap: float = 1.0,
    delta: float = 0.05,
    gpu_freqs_mhz: Sequence[float] | None = None,
    gpu_ids: Sequence[str] | None = None,
) -> PlacementResult:
    """Phase Three: place LLMs in order of F_l on n_gpus GPUs by direct placement, EWR-driven swap or fallback.

    Raises ValueError when an LLM fits on none of the GPUs.
    """
    if n_gpus < 1:
        raise ValueError(f"n_gpus must be >= 1, got {n_gpus}")
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    _by_id(demands)  # unique ids
    ids = list(gpu_ids) if gpu_ids is not None else [f"gpu{g}" for g in range(n_gpus)]
    if len(ids) != n_gpus or len(set(ids)) != n_gpus:
        raise ValueError(f"need {n_gpus} distinct GPU ids, got {ids}")
    ordered = sorted(demands, key=lambda d: (d.freq_mhz, d.llm_id))
    if gpu_freqs_mhz is not None:
        if len(gpu_freqs_mhz) != n_gpus:
            raise ValueError(f"need {n_gpus} GPU frequencies, got {len(gpu_freqs_mhz)}")
        seeds = [float(f) for f in gpu_freqs_mhz]
    elif ordered:
        seeds = _seed_freqs(ordered, n_gpus)
    else:
        seeds = [0.0] * n_gpus
    sm_eff, mem_eff = (1 - delta) * gpu_sm_cap, (1 - delta) * gpu_mem_cap_gb
    groups: list[list[LlmDemand]] = [[] for _ in range(n_gpus)]

    def fits(grp: Sequence[LlmDemand], d: LlmDemand) -> bool:
        return (
            sum(r.sm for r in grp) + d.sm <= sm_eff + _EPS
            and sum(r.mem_gb for r in grp) + d.mem_gb <= mem_eff + _EPS
        )

    steps: list[PlacementStep] = []
    for d in ordered:
        order = sorted(range(n_gpus), key=lambda g: (abs(seeds[g] - d.freq_mhz), g))
        target = order[0]
        if fits(groups[target], d):
            groups[target].append(d)
            steps.append(PlacementStep(d.llm_id, "direct", ids[target]))
            continue
        fallback = next((g for g in order[1:] if fits(groups[g], d)), None)
        if len(order) > 1 and groups[target]:
            cand = order[1]
            outlier = min(groups[target], key=lambda r: (r.freq_mhz, r.llm_id))
            rest = [r for r in groups[target] if r is not outlier]
            if fits(groups[cand], outlier) and fits(rest, d):
                swapped = [list(g) for g in groups]
                swapped[target] = rest + [d]
                swapped[cand] = groups[cand] + [outlier]
                take = fallback is None
                if not take:
                    kept = [list(g) for g in groups]
                    kept[fallback].append(d)
                    base = _total_waste(kept)
                    take = _total_waste(swapped) < base - 1e-12 * max(1.0, abs(base))
                if take:
                    groups = swapped
                    steps.append(PlacementStep(d.llm_id, "swap", ids[target], outlier.llm_id, ids[cand]))
                    continue
        if fallback is None:
            raise ValueError(
                f"LLM {d.llm_id!r} (SM {d.sm}, {d.mem_gb} GB) fits on none of the {n_gpus} GPUs "
                f"(effective capacity SM {sm_eff}, {mem_eff} GB)"
            )
        groups[fallback].append(d)
        steps.append(PlacementStep(d.llm_id, "fallback", ids[fallback]))

    placement = Placement(
        {ids[g]: tuple(r.llm_id for r in groups[g]) for g in range(n_gpus)},
        {ids[g]: max(r.freq_mhz for r in groups[g]) for g in range(n_gpus) if groups[g]},
    )
    return PlacementResult(placement, MappingProxyType({ids[g]: seeds[g] for g in range(n_gpus)}), tuple(steps))


def plan_and_place(
    demands: Sequence[LlmDemand],
    *,
    gpu_mem_cap_gb: float,
    gpu_sm_cap: float = 1.0,
    delta: float = 0.05,
    time_limit_s: float = 10.0,
    seed: int = 0,
) -> tuple[CapacityPlan, PlacementResult]:
    """Phase Two then Phase Three, trying N = joint optimum first and one more GPU each time `place` cannot fit all."""
    plan = min_gpus(
        demands, gpu_mem_cap_gb=gpu_mem_cap_gb, gpu_sm_cap=gpu_sm_cap, delta=delta,
        time_limit_s=time_limit_s, seed=seed,
    )
    last: ValueError | None = None
    for n in range(max(1, plan.n_gpu), max(1, len(demands)) + 1):
        try:
            return plan, place(demands, n, gpu_mem_cap_gb=gpu_mem_cap_gb, gpu_sm_cap=gpu_sm_cap, delta=delta)
        except ValueError as err:
            last = err
    raise ValueError(f"no placement found with up to {max(1, len(demands))} GPUs: {last}")


# --------------------------------------------------------------------------------------------- trigger


def should_consolidate(current_active_gpus: int, planned_n: int) -> bool:
    """Replace only if capacity planning needs fewer GPUs than are active (checked on keep-alive expiry)."""
    return planned_n < current_active_gpus


# --------------------------------------------------------------------------------------------- onto the pool


def assign_gpus(groups: Sequence[Sequence[int]], gpu_of: Sequence[int]) -> list[int]:
    """A physical GPU for each planned group of instances (by replica index): greedily, largest group first, the
    unused GPU already hosting most of the group's instances (fewest moves; ties: the lower GPU index)."""
    n_gpus = max(gpu_of) + 1 if gpu_of else 0
    if len([g for g in groups if g]) > n_gpus:
        raise ValueError(f"{len(groups)} groups for {n_gpus} GPUs")
    out = [-1] * len(groups)
    used: set[int] = set()
    for k in sorted(range(len(groups)), key=lambda k: (-len(groups[k]), k)):
        if not groups[k]:
            continue
        free = [g for g in range(n_gpus) if g not in used]
        best = max(free, key=lambda g: (sum(1 for r in groups[k] if gpu_of[r] == g), -g))
        out[k] = best
        used.add(best)
    return out


def consolidated_placement(groups: Sequence[Sequence[int]], gpu_of: Sequence[int], shares: Sequence[float],
                           min_shares: Sequence[float]) -> list[int] | None:
    """GPU of every instance after a consolidation: the planned groups' instances on the GPUs `assign_gpus` picks,
    every other (idle) instance where it is if its share still fits there at its minimum, else on the GPU outside
    the groups with the most room; None when an idle instance fits nowhere. Shares: the instances' current ones
    (``min_shares`` for the idle ones), so the caller's split fits."""
    where = assign_gpus(groups, gpu_of)
    n_gpus = max(gpu_of) + 1
    new = list(gpu_of)
    load = [0.0] * n_gpus
    placed = set()
    for k, grp in enumerate(groups):
        for r in grp:
            new[r] = where[k]
            load[where[k]] += shares[r]
            placed.add(r)
    busy_gpus = {g for g in where if g >= 0}
    idle = [r for r in range(len(gpu_of)) if r not in placed]
    for r in idle:
        if load[gpu_of[r]] + min_shares[r] <= 1.0 + _EPS:
            load[gpu_of[r]] += min_shares[r]
            continue
        spare = [g for g in range(n_gpus) if g not in busy_gpus and load[g] + min_shares[r] <= 1.0 + _EPS]
        if not spare:
            return None
        g = min(spare, key=lambda g: (load[g], g))
        new[r] = g
        load[g] += min_shares[r]
    return new
