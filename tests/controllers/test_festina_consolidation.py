"""Festina's workload replacement (sec. 3.5): EWR by hand, CP-SAT bin packing against brute force, and the three
placement rules on hand-built cases."""

from __future__ import annotations

import random

import pytest

from commitenv_controllers.festina.consolidation import (
    LlmDemand,
    assign_gpus,
    consolidated_placement,
    Placement,
    energy_optimal,
    energy_waste,
    ewr,
    min_gpus,
    moved_llms,
    place,
    plan_and_place,
    should_consolidate,
    sm_demand,
    solve_bin_packing,
    trivial_lower_bound,
)


def llm(name: str, f: float, mem: float = 10.0, t: float = 1.0, sm: float = 0.1) -> LlmDemand:
    return LlmDemand(llm_id=name, freq_mhz=f, sm=sm, mem_gb=mem, busy_s=t)


# ----------------------------------------------------------------------------------------------- EWR


def test_ewr_by_hand_two_gpus_three_llms():
    a, b, c = llm("A", 1000, t=2.0), llm("B", 1200, t=1.0), llm("C", 900, t=3.0)
    p = Placement({"g0": ("A", "B"), "g1": ("C",)})
    # g0 runs at max(1000, 1200) = 1200: A wastes 2 * (1200^3 - 1000^3) = 2 * (1.728e9 - 1.0e9) = 1.456e9, B 0.
    # g1 holds C alone at 900: 0.
    assert energy_waste(p, [a, b, c]) == pytest.approx(1.456e9)
    # optimal = 2 * 1.0e9 + 1 * 1.728e9 + 3 * 0.729e9 = 5.915e9
    assert energy_optimal([a, b, c]) == pytest.approx(5.915e9)
    assert ewr(p, [a, b, c]) == pytest.approx(1.456e9 / 5.915e9)
    # An explicit F_g for g1 of 1000 MHz adds 3 * (1.0e9 - 0.729e9) = 0.813e9.
    q = Placement({"g0": ("A", "B"), "g1": ("C",)}, {"g1": 1000.0})
    assert energy_waste(q, [a, b, c]) == pytest.approx(1.456e9 + 0.813e9)
    # Perfect alignment: every LLM alone.
    alone = Placement({"g0": ("A",), "g1": ("B",), "g2": ("C",)})
    assert ewr(alone, [a, b, c]) == 0.0


def test_placement_rejects_duplicates_and_stray_freqs():
    with pytest.raises(ValueError):
        Placement({"g0": ("A",), "g1": ("A",)})
    with pytest.raises(ValueError):
        Placement({"g0": ("A",)}, {"g9": 1000.0})


def test_sm_demand_time_weighted():
    # (0.8 * 1 + 0.2 * 3) / (1 + 3) = 1.4 / 4 = 0.35
    assert sm_demand(0.8, 1.0, 0.2, 3.0) == pytest.approx(0.35)
    with pytest.raises(ValueError):
        sm_demand(0.5, 0.0, 0.5, 0.0)


# ----------------------------------------------------------------------------------------------- Phase Two


def _partitions(n: int):
    """All set partitions of range(n) as restricted growth strings (block label per item)."""

    def rec(i: int, labels: list[int], k: int):
        if i == n:
            yield list(labels)
            return
        for b in range(k + 1):
            labels.append(b)
            yield from rec(i + 1, labels, max(k, b + 1))
            labels.pop()

    yield from rec(0, [], 0)


def _brute_force(sizes: list[list[int]], caps: list[int]) -> int:
    best = len(sizes)
    for labels in _partitions(len(sizes)):
        k = max(labels) + 1
        if k >= best:
            continue
        loads = [[0] * len(caps) for _ in range(k)]
        for i, b in enumerate(labels):
            for d, s in enumerate(sizes[i]):
                loads[b][d] += s
        if all(load[d] <= caps[d] for load in loads for d in range(len(caps))):
            best = k
    return best


@pytest.mark.parametrize("inst", range(20))
def test_cp_sat_equals_brute_force(inst: int):
    rng = random.Random(1000 + inst)
    n = rng.randint(4, 7)
    sm_c = [rng.randint(5, 70) for _ in range(n)]  # hundredths of a GPU
    mem_c = [rng.randint(100, 2500) for _ in range(n)]  # hundredths of a GB
    demands = [
        LlmDemand(f"m{i}", 900.0 + 60 * i, sm_c[i] / 100, mem_c[i] / 100, 1.0) for i in range(n)
    ]
    plan = min_gpus(demands, gpu_mem_cap_gb=40.0, delta=0.05, time_limit_s=5.0)
    # Effective capacities in hundredths: 0.95 GPU -> 95, 38 GB -> 3800.
    assert plan.sm_packing.n_bins == _brute_force([[s] for s in sm_c], [95])
    assert plan.mem_packing.n_bins == _brute_force([[m] for m in mem_c], [3800])
    assert plan.n_gpu == _brute_force([[s, m] for s, m in zip(sm_c, mem_c)], [95, 3800])
    assert plan.proven_optimal
    # Lower bounds never exceed the optima; the paper's N_gpu never exceeds the joint optimum.
    assert plan.sm_lower_bound <= plan.sm_packing.n_bins
    assert plan.mem_lower_bound <= plan.mem_packing.n_bins
    assert plan.paper_n_gpu <= plan.n_gpu
    # The returned assignment holds every LLM once and respects the delta margin in both dimensions.
    flat = [x for grp in plan.assignment for x in grp]
    assert sorted(flat) == sorted(d.llm_id for d in demands)
    assert len(plan.assignment) == plan.n_gpu
    by_id = {d.llm_id: d for d in demands}
    for grp in plan.assignment:
        assert sum(by_id[x].sm for x in grp) <= 0.95 + 1e-9
        assert sum(by_id[x].mem_gb for x in grp) <= 38.0 + 1e-9
    for res, caps in ((plan.sm_packing, [95]), (plan.mem_packing, [3800])):
        sizes = sm_c if res is plan.sm_packing else mem_c
        assert all(sum(sizes[i] for i in b) <= caps[0] for b in res.bins)


def test_scaling_never_looser_than_real_problem():
    # 0.47501 + 0.47501 = 0.95002 > 0.95: two bins. Rounding to nearest 1e-4 unit would give 4750 + 4750 = 9500
    # and wrongly one bin; rounding sizes up gives 4751 + 4751 > 9500.
    res = solve_bin_packing([[0.47501], [0.47501]], [0.95])
    assert res.n_bins == 2
    # Exactly on the capacity still fits (float noise in 0.95 is snapped, not floored away).
    assert solve_bin_packing([[0.5], [0.45]], [(1 - 0.05) * 1.0]).n_bins == 1


def test_time_limited_solve_still_valid():
    rng = random.Random(0)
    sizes = [[rng.randint(20, 50) / 100, rng.randint(10, 40)] for _ in range(40)]  # the bound is not met by FFD
    res = solve_bin_packing(sizes, [0.95, 76.0], time_limit_s=1e-3)
    assert res.proven_optimal == res.status.startswith("OPTIMAL")
    assert sorted(i for b in res.bins for i in b) == list(range(40))
    for b in res.bins:
        assert sum(sizes[i][0] for i in b) <= 0.95 + 1e-9 and sum(sizes[i][1] for i in b) <= 76.0 + 1e-9


def test_trivial_lower_bound_and_oversize():
    assert trivial_lower_bound([0.5, 0.5, 0.5], 0.95) == 2  # ceil(1.5 / 0.95) = 2
    assert trivial_lower_bound([], 1.0) == 0
    with pytest.raises(ValueError):
        min_gpus([llm("big", 1000, mem=39.0)], gpu_mem_cap_gb=40.0)  # 39 GB > 38 GB effective


# ----------------------------------------------------------------------------------------------- Phase Three


def _assert_margin(result, demands, mem_cap=100.0, delta=0.05):
    by_id = {d.llm_id: d for d in demands}
    for ids in result.placement.assignment.values():
        assert sum(by_id[i].mem_gb for i in ids) <= (1 - delta) * mem_cap + 1e-9
        assert sum(by_id[i].sm for i in ids) <= (1 - delta) * 1.0 + 1e-9


def test_direct_placement_with_default_seeds():
    ds = [llm("A", 800), llm("B", 900), llm("C", 1500), llm("D", 1600)]
    # Sorted groups [A, B] and [C, D] -> seeds 900 and 1600; each LLM fits on its closest GPU.
    res = place(ds, 2, gpu_mem_cap_gb=100.0)
    assert dict(res.seed_freqs_mhz) == {"gpu0": 900.0, "gpu1": 1600.0}
    assert dict(res.placement.assignment) == {"gpu0": ("A", "B"), "gpu1": ("C", "D")}
    assert dict(res.placement.freqs_mhz) == {"gpu0": 900.0, "gpu1": 1600.0}
    assert [s.rule for s in res.steps] == ["direct"] * 4
    _assert_margin(res, ds)


def test_swap_taken_when_it_reduces_waste():
    ds = [llm("A", 900, mem=20), llm("B", 1000, mem=20), llm("C", 1300, mem=50), llm("D", 1350, mem=50)]
    res = place(ds, 2, gpu_mem_cap_gb=100.0, gpu_freqs_mhz=[1000.0, 1400.0])
    # D's target gpu1 (holds C, 50 + 50 > 95 GB). Swap: C -> gpu0 (40 + 50 = 90 GB), D on gpu1.
    #   waste = (1300^3 - 900^3) + (1300^3 - 1000^3) = 1.468e9 + 1.197e9 = 2.665e9
    # Without swap D falls back to gpu0 (40 + 50 = 90 GB): waste = (1350^3 - 900^3) + (1350^3 - 1000^3)
    #   = 1.731375e9 + 1.460375e9 = 3.19175e9 > 2.665e9, so the swap is taken.
    assert dict(res.placement.assignment) == {"gpu0": ("A", "B", "C"), "gpu1": ("D",)}
    assert res.steps[-1].rule == "swap"
    assert (res.steps[-1].gpu_id, res.steps[-1].displaced, res.steps[-1].displaced_to) == ("gpu1", "C", "gpu0")
    assert [s.rule for s in res.steps[:3]] == ["direct"] * 3
    assert energy_waste(res.placement, ds) == pytest.approx(2.665e9)
    _assert_margin(res, ds)


def test_swap_refused_when_it_would_increase_waste():
    ds = [
        llm("A", 900, mem=20), llm("B", 1000, mem=20),
        llm("C1", 1250, mem=30), llm("C2", 1300, mem=30, t=100.0),
        llm("D", 1400, mem=40),
    ]
    res = place(ds, 2, gpu_mem_cap_gb=100.0, gpu_freqs_mhz=[1000.0, 1300.0])
    # D's target gpu1 holds C1, C2 (60 + 40 > 95 GB). Swap C1 -> gpu0 is resource-valid but costs
    #   (1250^3 - 900^3) + (1250^3 - 1000^3) + 100 * (1400^3 - 1300^3) = 2.17725e9 + 54.7e9 = 56.87725e9,
    # the fallback (D on gpu0, 40 + 40 = 80 GB) costs (1400^3 - 900^3) + (1400^3 - 1000^3) + (1300^3 - 1250^3)
    #   = 2.015e9 + 1.744e9 + 0.243875e9 = 4.002875e9, so the swap is refused.
    assert dict(res.placement.assignment) == {"gpu0": ("A", "B", "D"), "gpu1": ("C1", "C2")}
    assert res.steps[-1].rule == "fallback" and res.steps[-1].gpu_id == "gpu0"
    assert energy_waste(res.placement, ds) == pytest.approx(4.002875e9)
    _assert_margin(res, ds)


def test_swap_taken_when_no_fallback_has_room():
    ds = [llm("A", 900, mem=30), llm("B", 1000, mem=30), llm("C", 1300, mem=30), llm("D", 1350, mem=70)]
    res = place(ds, 2, gpu_mem_cap_gb=100.0, gpu_freqs_mhz=[1000.0, 1400.0])
    # D fits neither gpu1 (30 + 70) nor gpu0 (60 + 70); moving C to gpu0 (90 GB) frees gpu1 for D.
    assert dict(res.placement.assignment) == {"gpu0": ("A", "B", "C"), "gpu1": ("D",)}
    assert res.steps[-1].rule == "swap"
    _assert_margin(res, ds)


def test_fallback_when_swap_is_not_resource_valid():
    ds = [llm("W", 950, mem=60), llm("X", 1150, mem=90), llm("Y", 1180, mem=50)]
    res = place(ds, 3, gpu_mem_cap_gb=100.0, gpu_freqs_mhz=[1000.0, 1200.0, 1600.0])
    # Y's target gpu1 (X, 90 + 50 > 95); the outlier X does not fit the candidate gpu0 (60 + 90);
    # fallback in order of closeness: gpu0 (60 + 50 > 95) then gpu2 (50 GB).
    assert dict(res.placement.assignment) == {"gpu0": ("W",), "gpu1": ("X",), "gpu2": ("Y",)}
    assert [s.rule for s in res.steps] == ["direct", "direct", "fallback"]
    assert res.steps[-1].gpu_id == "gpu2"
    _assert_margin(res, ds)


def test_place_raises_when_nothing_fits():
    with pytest.raises(ValueError, match="fits on none"):
        place([llm("A", 1000, mem=60), llm("B", 1100, mem=60)], 1, gpu_mem_cap_gb=100.0)


def _random_demands(seed: int, n: int) -> list[LlmDemand]:
    rng = random.Random(seed)
    return [
        LlmDemand(f"m{i}", rng.choice(range(795, 1636, 90)), rng.randint(5, 60) / 100, rng.randint(5, 40),
                  rng.uniform(10, 100))
        for i in range(n)
    ]


def test_deterministic_and_order_independent():
    ds = _random_demands(7, 10)
    p1, r1 = plan_and_place(ds, gpu_mem_cap_gb=80.0)
    p2, r2 = plan_and_place(ds, gpu_mem_cap_gb=80.0)
    assert p1 == p2 and r1 == r2
    shuffled = list(reversed(ds))
    assert place(shuffled, len(r1.placement.assignment), gpu_mem_cap_gb=80.0) == r1
    # Every LLM placed once, within the margin, never more GPUs than LLMs.
    flat = [x for ids in r1.placement.assignment.values() for x in ids]
    assert sorted(flat) == sorted(d.llm_id for d in ds)
    _assert_margin(r1, ds, mem_cap=80.0)
    assert ewr(r1.placement, ds) >= 0.0
    assert len(r1.placement.assignment) >= p1.n_gpu


def test_moved_llms():
    before = Placement({"g0": ("A",), "g1": ("B", "C")})
    after = Placement({"g0": ("A", "B"), "g1": ("C",)})
    assert moved_llms(before, after) == (("B", "g1", "g0"),)


# ----------------------------------------------------------------------------------------------- trigger, migration


def test_trigger_rule():
    assert should_consolidate(4, 3) is True
    assert should_consolidate(3, 3) is False


# ----------------------------------------------------------------------------------------------- onto the pool


def test_planned_groups_go_to_the_gpus_holding_most_of_them():
    # replicas 0..5 on GPUs 0 0 1 1 2 2; group {2, 4, 5} has two on GPU 2, group {0, 3} one each on GPU 0 and 1
    gpu_of = [0, 0, 1, 1, 2, 2]
    assert assign_gpus([[0, 3], [2, 4, 5]], gpu_of) == [0, 2]
    assert assign_gpus([[1], [0]], gpu_of) == [0, 1]  # both want GPU 0: the first (equal size) gets it
    with pytest.raises(ValueError):
        assign_gpus([[0], [1], [2], [3]], gpu_of)


def test_idle_instances_make_room_or_leave_for_a_freed_gpu():
    gpu_of = [0, 0, 1, 1, 2, 2]
    shares = [0.5, 0.45, 0.4, 0.6, 0.4, 0.6]
    mins = [0.1] * 6
    # actives 0 and 3 consolidate on GPU 0 (0.5 + 0.6 = 1.1 > 1 would not fit: use 0.3 + 0.6)
    shares[0] = 0.3
    new = consolidated_placement([[0, 3]], gpu_of, shares, mins)
    # 3 joins GPU 0; idle 1 (GPU 0) no longer fits there at its minimum (0.3 + 0.6 + 0.1 = 1.0 fits exactly), stays;
    # idle 2 stays on GPU 1, idle 4 and 5 stay on GPU 2
    assert new == [0, 0, 1, 0, 2, 2]
    shares[0] = 0.35  # now 0.35 + 0.6 + 0.1 > 1: idle 1 goes to the freed GPU with the most room (GPU 1: 0.1)
    assert consolidated_placement([[0, 3]], gpu_of, shares, mins) == [0, 1, 1, 0, 2, 2]
    # no room anywhere for an idle instance: None
    assert consolidated_placement([[0, 3]], [0, 0, 1, 1], [0.35, 0.1, 0.1, 0.6], [0.1, 0.6, 0.95, 0.1]) is None


def test_the_time_limit_is_deterministic_so_a_busy_machine_cannot_change_the_plan(monkeypatch):
    """The limit is CP-SAT's deterministic time (the wall clock only a far backstop): a hard packing cut short by
    its limit comes out the same on every solve, whatever else the machine runs."""
    from ortools.sat.python import cp_model

    used = []
    real = cp_model.CpSolver

    class Recording(real):
        def solve(self, model, *a, **k):
            used.append((self.parameters.max_deterministic_time, self.parameters.max_time_in_seconds))
            return super().solve(model, *a, **k)

    monkeypatch.setattr(cp_model, "CpSolver", Recording)
    rng = random.Random(3)
    sizes = [[rng.randint(20, 50) / 100, rng.randint(10, 40)] for _ in range(60)]
    runs = {solve_bin_packing(sizes, [0.95, 76.0], time_limit_s=0.05) for _ in range(3)}
    assert len(runs) == 1  # the same bins and status each time
    assert used and all(d == 0.05 and w >= 20 * 0.05 for d, w in used)
