"""A `KernelState`'s prefix caches (mixed into it): the ``pfx`` tuple `commitenv.sim.kernel.cached` works on, new and
empty at attach, and the workload rows' hash blocks as they are loaded."""

from __future__ import annotations

import numpy as np

from commitenv.sim.kernel.layout import Q_HOFF, Q_NH, Q_PROMPT, R_BS, R_FREE
from commitenv.sim.kernel.prefix import N_ENT, N_ND, N_PR, N_PS, PrefixArrays
from commitenv.sim.prefix_cache import PrefixCache

_I64 = np.int64


def _no_cache() -> tuple:
    """``pfx`` of a pool without a prefix cache (no replica rows: the blocks are plain counts)."""
    return (np.zeros((0, N_PR), _I64), np.zeros(N_PS, _I64), np.zeros((1, N_ND), _I64), np.zeros((1, N_ENT), _I64),
            np.full(2, -1, _I64), np.zeros(0, _I64), np.zeros(0, _I64), np.zeros(1, _I64))


class KernelPrefix:
    """`KernelState`'s prefix caches: ``self.pfx`` (always set; no replica rows without a cache), ``self._pa`` (the
    `PrefixArrays`, or None), the table's hash blocks (``_row_hoff``, ``_hh0``: where they start in ``hh``)."""

    def _new_prefix_caches(self, pool, block_tokens: int | None) -> None:
        """Empty prefix caches on every replica, ``block_tokens`` tokens per hash block (None: no cache), every free
        KV block in one run as a new `PrefixCache` holds it; and the hash blocks of ``pool``'s workload rows."""
        self._pa = None
        self._row_hoff = None
        if block_tokens is None:
            self.pfx = _no_cache()
            return
        per_entry = [PrefixCache.blocks_per_entry(block_tokens, int(bs)) for bs in self.ri[:, R_BS]]
        pa = PrefixArrays(self.cap_blocks.tolist(), per_entry, [block_tokens] * self.R,
                          free=self.ri[:, R_FREE].tolist())
        self._hh0 = 0  # (no request holds hash blocks before the rows')
        self._row_hoff = np.asarray(pool._hoff, _I64)
        self._bt = int(block_tokens)
        hh = np.asarray(pool._hashes, _I64)
        longest = max(1, int(np.diff(self._row_hoff).max(initial=0)))
        self._pa = pa
        self.pfx = (pa.pr, pa.ps, pa.nd, pa.ent, pa.tab, hh, np.full(len(hh), -1, _I64), np.zeros(longest, _I64))

    def _prefix_rows(self, lo: int, hi: int, a: int, b: int) -> None:
        """The hash blocks of workload rows ``lo:hi`` (at indices ``a:b``): where they start and how many are
        shareable (`PrefixCache.shareable`, as `ReferencePool._arrive` takes them)."""
        if self._row_hoff is None:
            return
        off = self._row_hoff
        self.qi[a:b, Q_HOFF] = self._hh0 + off[lo:hi]
        self.qi[a:b, Q_NH] = np.maximum(np.minimum(off[lo + 1: hi + 1] - off[lo:hi],
                                                   (self.qi[a:b, Q_PROMPT] - 1) // self._bt), 0)

    def _copy_prefix(self, c) -> None:
        """Give the copy ``c`` its own caches and prefix lists (the hash blocks are read only, shared)."""
        if self._pa is None:
            return
        c._pa = self._pa.copy()
        pr, ps, nd, ent, tab, hh, pe, hout = self.pfx
        c.pfx = (c._pa.pr, c._pa.ps, c._pa.nd, c._pa.ent, c._pa.tab, hh, pe.copy(), hout.copy())
