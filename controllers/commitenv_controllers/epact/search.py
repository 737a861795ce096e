"""ePACT's adaptive action search (section 4.4): a catalog of up to 8 replica counts x 5 clocks at about
uniform rank intervals, a coarse lattice plus current and warm starts, then coarse-to-fine refinement
around the best configuration until every unit-step neighbour of the best has been evaluated."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

Rank = tuple[int, int]  # (replica-count rank, clock rank)


def uniform_ranks(n: int, m: int) -> list[int]:
    """Up to ``m`` of the indices 0..n-1 at about uniform intervals, both endpoints kept."""
    if n <= m:
        return list(range(n))
    return sorted({int(round(x)) for x in np.linspace(0, n - 1, m)})


@dataclass(frozen=True)
class Catalog:
    """The configurations the search may visit (at most len(replicas) x len(clocks), A <= 40)."""

    replicas: tuple[int, ...]
    clocks: tuple[int, ...]

    @staticmethod
    def build(n_replicas: int, clocks_mhz: Sequence[int], max_replicas: int = 8, max_clocks: int = 5,
              min_replicas: int = 1) -> "Catalog":
        counts = list(range(min_replicas, n_replicas + 1))
        reps = tuple(counts[i] for i in uniform_ranks(len(counts), max_replicas))
        clk = sorted(clocks_mhz)
        return Catalog(reps, tuple(clk[i] for i in uniform_ranks(len(clk), max_clocks)))

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.replicas), len(self.clocks)

    def config(self, r: Rank) -> tuple[int, int]:
        return self.replicas[r[0]], self.clocks[r[1]]

    def nearest(self, active: int, clock_mhz: int) -> Rank:
        """Rank of the catalog configuration closest to (active, clock)."""
        i = int(np.argmin([abs(a - active) for a in self.replicas]))
        j = int(np.argmin([abs(c - clock_mhz) for c in self.clocks]))
        return i, j

    def all_ranks(self) -> list[Rank]:
        R, C = self.shape
        return [(i, j) for i in range(R) for j in range(C)]


@dataclass
class SearchResult:
    best: Rank | None
    order: list[Rank] = field(default_factory=list)  # evaluation order
    batches: list[list[Rank]] = field(default_factory=list)
    fallback: bool = False  # the rest of the catalog was evaluated because nothing was valid


def _neighbours(c: Rank, sr: int, sc: int, shape: tuple[int, int]) -> list[Rank]:
    R, C = shape
    out = []
    for di in (-sr, 0, sr):
        for dj in (-sc, 0, sc):
            if di == 0 and dj == 0:
                continue
            i, j = c[0] + di, c[1] + dj
            if 0 <= i < R and 0 <= j < C:
                out.append((i, j))
    return out


def adaptive_search(
    catalog: Catalog,
    evaluate: Callable[[list[Rank]], None],
    key: Callable[[Rank], tuple],
    is_valid: Callable[[Rank], bool],
    current: Rank,
    warm: Sequence[Rank] = (),
) -> SearchResult:
    """Run the search. ``evaluate(batch)`` predicts a batch of new configurations (in parallel);
    ``key(rank)`` ranks an evaluated configuration by the selection rule (smaller is better);
    ``is_valid(rank)`` says whether its prediction is complete and valid. Each configuration is
    evaluated at most once."""
    R, C = catalog.shape
    seen: set[Rank] = set()
    res = SearchResult(best=None)

    def run(batch: Sequence[Rank]) -> None:
        new = []
        for r in batch:
            if r not in seen:
                seen.add(r)
                new.append(r)
        if new:
            evaluate(new)
            res.order.extend(new)
            res.batches.append(new)

    def best_of() -> Rank:
        return min(seen, key=key)

    lo_r, mid_r, hi_r = 0, (R - 1) // 2, R - 1
    lo_c, mid_c, hi_c = 0, (C - 1) // 2, C - 1
    lattice = [(i, j) for i in (lo_r, mid_r, hi_r) for j in (lo_c, mid_c, hi_c)]
    run(list(dict.fromkeys(lattice + [current] + list(warm))))
    best = best_of()
    sr, sc = max(1, round((R - 1) / 4)), max(1, round((C - 1) / 4))
    while True:
        if all(n in seen for n in _neighbours(best, 1, 1, (R, C))):
            break
        run(_neighbours(best, sr, sc, (R, C)))
        cand = best_of()
        if key(cand) < key(best):
            best = cand  # recentre at the same stride
            continue
        sr, sc = max(1, sr // 2), max(1, sc // 2)
    if not any(is_valid(r) for r in seen):
        res.fallback = True
        run([r for r in catalog.all_ranks() if r not in seen])
        best = best_of()
    res.best = best
    return res
