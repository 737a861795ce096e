"""Prefix caching in the energy game (StepSplit section 6.7): each cached block's prefill split equally among
the requests that contain it.

With prefix caching a shared prompt block is computed once whenever any request holding it is present, so its
prefill energy is a second shared cost beside the weight read. In the model game

    v(S) = sum_{k in T(S)} a(m_k) + sum_{i in S} r_i + sum_{b in B(S)} e_b

(``r_i`` the request's own energy without its shareable blocks, ``B(S)`` the union of the blocks of S, ``e_b``
the prefill terms of block b's tokens at its position) every block is a museum-pass good, and the Shapley value
adds ``e_b / n_b`` to each of the ``n_b`` holders of b. `prefix_split` applies this on top of step sharing:
starting from the closed form of a logged run, the prefill terms that fall inside each request's shareable
blocks are taken out of whoever computed them (the run's "First" split) and the energy each block was computed
with (all its computations in the window, scaled like their segments) is split equally among the window's
holders. A block held in the window but computed before it (cached state at the window start) costs the window
nothing. Which blocks a request can share follows the engine's cache (`commitenv.sim.prefix_cache`): its
leading hash blocks that end before its last prompt token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from commitenv.attribution.closed_form import Attribution, closed_form
from commitenv.attribution.law import StepLaw, StepTable, decompose
from commitenv.attribution.shapley import ModelGame, mask_of
from commitenv.sim.prefix_cache import PrefixCache
from commitenv.workload.table import RequestTable


def shareable_hashes(table: RequestTable, row: int, block_tokens: int) -> np.ndarray:
    """The hash ids of row ``row``'s blocks that the engine's prefix cache may share."""
    h = table.prefix_of(row)
    return h[: PrefixCache.shareable(len(h), int(table.prompt_tokens[row]), block_tokens)]


def block_prefill_terms(c1: float, c2: float, lo: int, hi: int) -> float:
    """Prefill law terms of prompt tokens ``lo+1..hi`` (1-based positions): ``c1*(hi-lo) + c2*sum(positions)``,
    the same terms a chunk of ``hi-lo`` tokens after ``lo`` computed ones pays."""
    return c1 * (hi - lo) + c2 * (hi * (hi + 1) - lo * (lo + 1)) / 2


@dataclass(frozen=True)
class PrefixTerms:
    """The prefix blocks of a decomposed log: what each player computed inside its shareable blocks
    (``moved``, J, scaled like its segments) and, per block, its computed energy and its holders."""

    moved: np.ndarray  # per player
    block_j: dict[int, float]  # hash id -> energy of its computations in the log
    holders: dict[int, list[int]]  # hash id -> player indices holding it (shareable)


def prefix_terms(log: Sequence, table: RequestTable, law: StepLaw, block_tokens: int, steps: StepTable,
                 scale: str = "step") -> PrefixTerms:
    """Split every logged prefill chunk at the shareable block boundaries of its request (see the module
    docstring); ``steps`` is ``decompose(log, ...)`` and fixes the players."""
    f = steps.scale(scale)
    index = {int(s): j for j, s in enumerate(steps.players.tolist())}
    span = {}  # player index -> (shareable tokens, hash ids)
    holders: dict[int, list[int]] = {}
    for s, j in index.items():
        hs = shareable_hashes(table, s, block_tokens)
        span[j] = (len(hs) * block_tokens, hs)
        for h in hs.tolist():
            holders.setdefault(h, []).append(j)
    moved = np.zeros(steps.n)
    block_j: dict[int, float] = {}
    for x, e in enumerate(log):
        if e.n_steps != 1:
            continue  # decode runs never touch prompt blocks
        if len(e.decode) != len(e.slots):
            raise ValueError(f"log entry {x}: prefix_split needs the engine's per-member decode flags")
        c = law.coeffs(e.replica)
        for s, k, c0, dec in zip(e.slots, e.new_tokens, e.computed_before, e.decode):
            if dec:
                continue
            j = index[s]
            limit, hs = span[j]
            lo, hi = c0, min(c0 + k, limit)
            while lo < hi:  # the chunk's tokens inside shareable block number lo // block_tokens
                b = lo // block_tokens
                end = min(hi, (b + 1) * block_tokens)
                part = f[x] * block_prefill_terms(c.c1, c.c2, lo, end)
                moved[j] += part
                h = int(hs[b])
                block_j[h] = block_j.get(h, 0.0) + part
                lo = end
    return PrefixTerms(moved, block_j, holders)


def prefix_split(
    log: Sequence,
    table: RequestTable,
    law: StepLaw,
    block_tokens: int = 512,
    *,
    players: Sequence[int] | None = None,
    scale: str = "step",
    total_j: float | None = None,
    steps: StepTable | None = None,
) -> Attribution:
    """Step sharing plus the equal split of every shared block's prefill energy (see the module docstring).

    ``log`` holds `StepLogEntry` records whose slots are rows of ``table`` (a window served alone, or the
    entries of one window); ``players`` default to the logged slots. Shares add up to the logged energy (or
    ``total_j``); the block parts are reported in ``shared`` (they are a shared cost), the rest in ``own``.
    """
    st = steps if steps is not None else decompose(log, table.prompt_tokens, law, players=players)
    base = closed_form(st, scale=scale)
    terms = prefix_terms(log, table, law, block_tokens, st, scale)
    split = np.zeros(st.n)
    for h, ej in terms.block_j.items():
        who = terms.holders[h]
        split[who] += ej / len(who)
    own = base.own - terms.moved
    shared = base.shared + split
    out = Attribution(st.players, own + shared, own, shared, None, "prefix_split")
    return out if total_j is None else out.normalized(total_j)


class PrefixModelGame(ModelGame):
    """StepSplit's model game with prefix blocks: the logged segments, own energies without the shareable
    blocks, and every block's energy paid once when any holder is present. Its Shapley value is
    `prefix_split`; it is the control variate of the replay game when the workload has prefix blocks."""

    def __init__(self, log: Sequence, table: RequestTable, law: StepLaw, block_tokens: int, steps: StepTable,
                 scale: str = "step") -> None:
        super().__init__(steps, scale)
        self._log, self._table, self._law, self._bt = log, table, law, block_tokens
        terms = prefix_terms(log, table, law, block_tokens, steps, scale)
        self._moved = terms.moved
        self._own = self._own - terms.moved
        self._blocks = [(mask_of(terms.holders[h]), np.asarray(terms.holders[h]), ej)
                        for h, ej in terms.block_j.items()]

    def value(self, mask: int) -> float:
        v = super().value(mask)
        for bm, _, ej in self._blocks:
            if bm & mask:
                v += ej
        return float(v)

    def values_all(self) -> np.ndarray:
        v = super().values_all()
        S = np.arange(1 << self.n, dtype=np.int64)
        for bm, _, ej in self._blocks:
            v[(S & bm) != 0] += ej
        return v

    def marginals(self, perm: np.ndarray) -> np.ndarray:
        out = super().marginals(perm)
        rank = np.empty(self.n, dtype=np.int64)
        rank[np.asarray(perm, dtype=np.int64)] = np.arange(self.n)
        for _, who, ej in self._blocks:  # the holder that comes first pays the block
            out[who[np.argmin(rank[who])]] += ej
        return out

    def _cost_groups(self) -> list[tuple[int, float, np.ndarray | None]]:
        return super()._cost_groups() + [(bm, ej, None) for bm, _, ej in self._blocks]

    def shapley(self) -> np.ndarray:
        return prefix_split(self._log, self._table, self._law, self._bt, scale=self.scale_mode,
                            steps=self.steps).shares
