"""ePACT's adaptive action search (paper section 4.4) on synthetic landscapes.

Expectations come from the paper's text, not from running the implementation: a catalog of up to eight
replica counts and five clocks at about uniform rank intervals (both endpoints kept); a first batch made of
the 3 x 3 low/mid/high lattice plus the current configuration and warm starts, deduplicated; coarse-to-fine
refinement whose stride starts at about a quarter of each rank span, recentres (same stride) on
improvement and halves otherwise; a stop as soon as every unit-step neighbour of the best is evaluated;
each configuration evaluated at most once; the rest of the catalog as a fallback when nothing is valid.

``adaptive_search`` is driven by a fake ``evaluate`` that records its calls and a ``key`` computed from a
known function of the rank pair (smaller is better).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from commitenv_controllers.epact.search import Catalog, adaptive_search

H200_CLOCKS = (345, 690, 1035, 1380, 1710)


# ------------------------------------------------------------------------------------------ helpers
def unit_neighbours(r, shape):
    """The (up to 8) configurations one rank step away in one or both dimensions."""
    R, C = shape
    out = set()
    for di in (-1, 0, 1):
        for dj in (-1, 0, 1):
            if (di, dj) != (0, 0) and 0 <= r[0] + di < R and 0 <= r[1] + dj < C:
                out.add((r[0] + di, r[1] + dj))
    return out


class Recorder:
    """A fake evaluator: remembers every call and refuses a second evaluation of any configuration."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[int, int]]] = []
        self.done: set[tuple[int, int]] = set()

    def __call__(self, batch):
        batch = list(batch)
        assert batch, "evaluate called with an empty batch"
        assert len(set(batch)) == len(batch), f"duplicate inside one batch: {batch}"
        again = self.done & set(batch)
        assert not again, f"configurations evaluated twice: {sorted(again)}"
        self.done |= set(batch)
        self.calls.append(batch)


def run_search(shape, f: Callable[[tuple[int, int]], float], current, warm=(), valid=lambda r: True,
               catalog: Catalog | None = None):
    """Run the search on a catalog of ``shape`` ranks with key (f(rank), rank) (unique keys)."""
    if catalog is None:
        R, C = shape
        catalog = Catalog(tuple(range(1, R + 1)), tuple(100 * (j + 1) for j in range(C)))
    rec = Recorder()

    def key(r):
        assert r in rec.done, f"key asked for an unevaluated configuration {r}"
        return (f(r), r)

    def is_valid(r):
        assert r in rec.done, f"validity asked for an unevaluated configuration {r}"
        return valid(r)

    res = adaptive_search(catalog, rec, key, is_valid, current, list(warm))
    return res, rec, key


def check_common(res, rec, key, shape):
    """Invariants every search must satisfy."""
    # bookkeeping agrees with what evaluate saw; nothing evaluated twice
    assert res.batches == rec.calls
    assert res.order == [r for b in rec.calls for r in b]
    assert len(res.order) == len(set(res.order))
    R, C = shape
    assert all(0 <= i < R and 0 <= j < C for i, j in res.order)
    # the returned best is the best evaluated configuration
    assert res.best in res.order
    assert res.best == min(res.order, key=key)


def check_stops_exactly(res, key, shape):
    """The search ends once every unit neighbour of the best is evaluated, and not one batch later; it
    also never went on past an earlier point where the incumbent's unit neighbourhood was complete."""
    seen = set(res.order)
    assert unit_neighbours(res.best, shape) <= seen
    before_last = set(res.order[: len(res.order) - len(res.batches[-1])])
    if len(res.batches) > 1:
        assert not (unit_neighbours(res.best, shape) | {res.best}) <= before_last, (
            "the unit neighbourhood of the final best was already complete before the last batch")
    prefix: set = set()
    for b in res.batches[:-1]:
        prefix |= set(b)
        inc = min(prefix, key=key)
        assert not unit_neighbours(inc, shape) <= prefix, (
            f"after batch {b} the incumbent {inc} had every unit neighbour evaluated, yet the search went on")


def strides_of(res, key):
    """For each refinement batch: (centre, row stride or None, col stride or None, improved).

    The centre is the best configuration evaluated before the batch (keys are unique). Every member of a
    batch must lie at (+-sr | 0, +-sc | 0) from the centre."""
    out = []
    prefix = set(res.batches[0])
    for b in res.batches[1:]:
        centre = min(prefix, key=key)
        rows = {abs(i - centre[0]) for i, _ in b} - {0}
        cols = {abs(j - centre[1]) for _, j in b} - {0}
        assert len(rows) <= 1 and len(cols) <= 1, f"batch {b} around {centre}: mixed strides {rows} {cols}"
        assert centre not in b
        prefix |= set(b)
        improved = min(prefix, key=key) != centre
        out.append((centre, next(iter(rows), None), next(iter(cols), None), improved))
    return out


# ------------------------------------------------------------------------------------------ catalog
def test_catalog_32_replicas_five_clocks():
    cat = Catalog.build(32, H200_CLOCKS)
    reps = cat.replicas
    assert len(reps) == 8
    assert reps[0] == 1 and reps[-1] == 32  # both endpoints kept
    assert list(reps) == sorted(set(reps))
    # about uniform rank intervals: 31/7 = 4.43 between neighbours, each count within half a rank of the ideal
    for i, r in enumerate(reps):
        assert abs(r - (1 + i * 31 / 7)) <= 0.5 + 1e-9, reps
    assert all(b - a in (4, 5) for a, b in zip(reps, reps[1:])), reps
    assert cat.clocks == H200_CLOCKS  # exactly five levels: all kept
    assert cat.shape == (8, 5)
    assert len(cat.all_ranks()) == 40 and len(set(cat.all_ranks())) == 40


def test_catalog_more_clocks_uniform_with_endpoints():
    clocks = [100 * (i + 1) for i in range(9)]  # 9 levels: ranks 0, 2, 4, 6, 8 are exactly uniform
    cat = Catalog.build(32, list(reversed(clocks)))
    assert cat.clocks == (100, 300, 500, 700, 900)
    clocks13 = [10 * (i + 1) for i in range(13)]  # 13 levels: ranks 0, 3, 6, 9, 12
    assert Catalog.build(4, clocks13).clocks == (10, 40, 70, 100, 130)


def test_catalog_fewer_levels_keeps_all():
    cat = Catalog.build(5, [900, 300, 600])
    assert cat.replicas == (1, 2, 3, 4, 5)
    assert cat.clocks == (300, 600, 900)
    cat8 = Catalog.build(8, H200_CLOCKS)
    assert cat8.replicas == tuple(range(1, 9))
    one = Catalog.build(1, [1000])
    assert one.replicas == (1,) and one.clocks == (1000,)


def test_catalog_config_and_nearest_roundtrip():
    cat = Catalog.build(32, H200_CLOCKS)
    for r in cat.all_ranks():
        assert cat.nearest(*cat.config(r)) == r


# ------------------------------------------------------------------------------------------ first batch
def lattice(shape):
    """The 3 x 3 low / middle / high lattice; the middle of an even rank count may be either centre rank."""
    R, C = shape
    mids_r = {(R - 1) // 2, R // 2}
    mids_c = {(C - 1) // 2, C // 2}
    return mids_r, mids_c


def test_initial_batch_is_lattice_current_and_warm_deduplicated():
    shape = (8, 5)
    current = (5, 3)  # off the lattice
    warm = [(6, 1), (0, 0), (6, 1), current]  # a lattice point, a repeat and the current one again
    res, rec, key = run_search(shape, lambda r: (r[0] - 5) ** 2 + (r[1] - 3) ** 2, current, warm)
    first = rec.calls[0]
    assert len(first) == len(set(first))
    mids_r, mids_c = lattice(shape)
    lat = [r for r in first if r not in (current, (6, 1))]
    assert len(lat) == 9
    rows = sorted({i for i, _ in lat})
    cols = sorted({j for _, j in lat})
    assert rows[0] == 0 and rows[2] == 7 and rows[1] in mids_r
    assert cols == [0, 2, 4] and (2 in mids_c)
    assert {(i, j) for i in rows for j in cols} == set(lat)
    assert current in first and (6, 1) in first
    assert len(first) == 11
    check_common(res, rec, key, shape)


def test_initial_batch_without_extras_is_nine_points():
    shape = (8, 5)
    res, rec, key = run_search(shape, lambda r: r[0] + r[1], current=(0, 0))
    assert len(rec.calls[0]) == 9  # the current configuration is a lattice corner


def test_tiny_catalog_lattice_collapses():
    # 2 x 2: low/mid/high collapse onto the 4 configurations; every unit neighbour is evaluated at once
    res, rec, key = run_search((2, 2), lambda r: -r[0] - r[1], current=(0, 0))
    assert set(rec.calls[0]) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert len(rec.calls) == 1
    assert res.best == (1, 1)


# ------------------------------------------------------------------------------------------ refinement
def bowl(ci, cj, wi=1.0, wj=2.0):
    return lambda r: wi * (r[0] - ci) ** 2 + wj * (r[1] - cj) ** 2


@pytest.mark.parametrize("centre", [(5, 1), (2, 3), (6, 4), (1, 0), (3, 2), (7, 0)])
@pytest.mark.parametrize("current", [(0, 0), (7, 4), (4, 1)])
def test_convex_bowl_finds_minimum(centre, current):
    shape = (8, 5)
    res, rec, key = run_search(shape, bowl(*centre), current)
    check_common(res, rec, key, shape)
    # a separable convex bowl has no unit-step local minimum other than its global one
    assert res.best == centre
    assert not res.fallback
    check_stops_exactly(res, key, shape)
    assert len(res.order) < 40  # a local search, not an exhaustive one


def test_local_minimum_is_where_a_local_search_stops():
    """A bowl around (2, 2) plus a single deep pit at (6, 4): no lattice point, and no stride-2 or unit
    neighbour of the bowl's basin, touches the pit, so the search settles in the bowl's minimum."""
    shape = (8, 5)
    base = bowl(2, 2, 1.0, 1.0)

    def f(r):
        return -100.0 if r == (6, 4) else base(r)

    res, rec, key = run_search(shape, f, current=(0, 0))
    check_common(res, rec, key, shape)
    check_stops_exactly(res, key, shape)
    assert res.best == (2, 2)
    assert (6, 4) not in res.order
    # a unit-step local minimum among what was evaluated
    assert all(key(res.best) < key(n) for n in unit_neighbours(res.best, shape))


def test_local_minimum_found_when_the_start_is_near_the_pit():
    shape = (8, 5)
    base = bowl(2, 2, 1.0, 1.0)

    def f(r):
        return -100.0 if r == (6, 4) else base(r)

    res, rec, key = run_search(shape, f, current=(6, 4))  # the current configuration is the pit
    assert res.best == (6, 4)
    check_stops_exactly(res, key, shape)


def test_flat_landscape_terminates_without_repeats():
    shape = (8, 5)
    rec = Recorder()
    cat = Catalog(tuple(range(1, 9)), H200_CLOCKS)
    res = adaptive_search(cat, rec, lambda r: (0.0,), lambda r: True, (3, 2), [])
    assert res.order == [r for b in rec.calls for r in b]
    assert len(res.order) == len(set(res.order)) < 40
    assert unit_neighbours(res.best, shape) <= set(res.order)
    assert not res.fallback


def test_flat_landscape_with_rank_tiebreak_stops_exactly():
    shape = (8, 5)
    res, rec, key = run_search(shape, lambda r: 0.0, current=(4, 2))  # ties broken by rank: (0, 0) wins
    check_common(res, rec, key, shape)
    assert res.best == (0, 0)
    check_stops_exactly(res, key, shape)


def test_strides_on_the_real_catalog_start_near_a_quarter():
    shape = (8, 5)
    res, rec, key = run_search(shape, bowl(5, 1), current=(0, 0))
    steps = strides_of(res, key)
    assert steps, "the search should refine beyond the first batch"
    _, sr, sc, _ = steps[0]
    # rank spans 7 and 4: a quarter is 1.75 (closest integer 2) and 1
    assert sr in (None, 2) and sc in (None, 1)


def test_strides_quarter_then_halve_and_recentre_at_same_stride():
    """A 17 x 17 rank grid (spans 16): the stride starts at 4, stays put while the search recentres on
    improvements, and halves (4 -> 2 -> 1) only after a batch without improvement."""
    shape = (17, 17)
    res, rec, key = run_search(shape, bowl(13, 5, 1.0, 1.3), current=(8, 8))
    check_common(res, rec, key, shape)
    assert res.best == (13, 5)
    check_stops_exactly(res, key, shape)
    steps = strides_of(res, key)
    assert steps
    first_r, first_c = steps[0][1], steps[0][2]
    assert first_r == 4 and first_c == 4
    stride = 4
    prev_improved = None
    seen_strides = []
    for centre, sr, sc, improved in steps:
        s = {x for x in (sr, sc) if x is not None}
        assert len(s) == 1, "equal spans: the two strides must agree"
        (now,) = s
        if prev_improved:
            assert now == stride, "recentering keeps the stride"
        else:
            assert now <= stride
        # a power-of-two fraction of the previous stride
        assert stride % now == 0 and (stride // now) & (stride // now - 1) == 0
        stride = now
        seen_strides.append(now)
        prev_improved = improved
    assert seen_strides[0] == 4 and seen_strides[-1] == 1
    assert set(seen_strides) <= {4, 2, 1}
    # recentring happened at least once at the coarse stride (the minimum is far from the start)
    assert any(improved for _, sr, sc, improved in steps if 4 in (sr, sc))


def test_recentres_on_improvement():
    shape = (17, 17)
    res, rec, key = run_search(shape, bowl(15, 2), current=(8, 8))
    steps = strides_of(res, key)
    # every improving batch moves the next batch's centre to the new best
    for (c0, _, _, imp), (c1, _, _, _) in zip(steps, steps[1:]):
        if imp:
            assert c1 != c0
        else:
            assert c1 == c0
    assert res.best == (15, 2)


def test_rectangular_strides():
    # spans 16 (rows) and 4 (clocks): quarters 4 and 1
    shape = (17, 5)
    res, rec, key = run_search(shape, bowl(11, 1), current=(0, 0))
    steps = strides_of(res, key)
    assert steps[0][1] == 4 and steps[0][2] in (None, 1)
    assert res.best == (11, 1)
    check_stops_exactly(res, key, shape)


# ------------------------------------------------------------------------------------------ fallback
def test_all_invalid_evaluates_the_rest_of_the_catalog():
    shape = (8, 5)
    res, rec, key = run_search(shape, bowl(3, 3), current=(2, 2), valid=lambda r: False)
    assert res.fallback is True
    assert set(res.order) == {(i, j) for i in range(8) for j in range(5)}
    assert len(res.order) == 40
    # the fallback batch is exactly the configurations the search had not reached
    before = set(res.order[: len(res.order) - len(res.batches[-1])])
    assert set(res.batches[-1]) == {(i, j) for i in range(8) for j in range(5)} - before
    assert before, "the fallback comes after the ordinary search"


def test_one_valid_configuration_means_no_fallback():
    shape = (8, 5)
    res, rec, key = run_search(shape, bowl(3, 3), current=(2, 2), valid=lambda r: r == (0, 0))
    assert res.fallback is False
    assert len(res.order) < 40


def test_valid_only_outside_the_searched_region_is_found_by_fallback():
    shape = (8, 5)
    only = (6, 1)  # not on the lattice and far from the bowl's minimum
    res, rec, key = run_search(shape, bowl(1, 3), current=(0, 4), valid=lambda r: r == only)
    assert res.fallback is True
    assert only in res.order
    assert len(res.order) == 40
