"""A `KernelState`'s prefix caches (mixed into it): the ``pfx`` tuple `commitenv.sim.kernel.cached` works on, built from
new `PrefixCache` objects and requests' hash blocks and prefix lists, and the workload rows' hash blocks as they are
loaded."""

from __future__ import annotations

import numpy as np

from commitenv.sim.kernel.layout import Q_HOFF, Q_NH, Q_PFXN, Q_PROMPT
from commitenv.sim.kernel.prefix import N_ENT, N_ND, N_PR, N_PS, PrefixArrays

_I64 = np.int64


def _no_cache() -> tuple:
    """``pfx`` of a pool without a prefix cache (no replica rows: the blocks are plain counts)."""
    return (np.zeros((0, N_PR), _I64), np.zeros(N_PS, _I64), np.zeros((1, N_ND), _I64), np.zeros((1, N_ENT), _I64),
            np.full(2, -1, _I64), np.zeros(0, _I64), np.zeros(0, _I64), np.zeros(1, _I64))


class KernelPrefix:
    """`KernelState`'s prefix caches: ``self.pfx`` (always set; no replica rows without a cache), ``self._pa`` (the
    `PrefixArrays`, or None), the table's hash blocks (``_row_hoff``, ``_hh0``: where they start in ``hh``)."""

    def _import_prefix(self, pool, live: list, caches: list, caps: list[int]) -> None:
        """The prefix caches ``caches`` (`PrefixCache` objects or None, one per replica, of ``caps`` KV blocks) and the
        hash blocks of the live requests (``live``, at their indices) and of ``pool``'s workload rows (when it has
        them)."""
        self._pa = None
        self._row_hoff = None
        if all(c is None for c in caches):
            self.pfx = _no_cache()
            return
        if any(c is None for c in caches):
            raise ValueError("kernel: some replicas have a prefix cache and some do not")
        pa = PrefixArrays.for_caches(caches, caps)
        head: list[int] = []
        pe_head: list[int] = []
        for k, r in enumerate(live):
            hashes = tuple(r.hashes)
            self.qi[k, Q_HOFF], self.qi[k, Q_NH], self.qi[k, Q_PFXN] = len(head), len(hashes), r.pfx_next
            if r.prefix:
                raise ValueError(f"kernel: request {r.slot} holds cache entries of a cache that is not new")
            head.extend(hashes)
            pe_head.extend([-1] * len(hashes))
        self._hh0 = len(head)
        longest = max([1] + [len(r.hashes) for r in live])
        rows = np.zeros(0, _I64)
        if pool._hashes is not None:
            rows = np.asarray(pool._hashes, _I64)
            self._row_hoff = np.asarray(pool._hoff, _I64)
            self._bt = int(pool.opt.prefix_block_tokens)
            longest = max(longest, int(np.diff(self._row_hoff).max(initial=0)))
        hh = np.concatenate([np.asarray(head, _I64), rows])
        pe = np.concatenate([np.asarray(pe_head, _I64), np.full(len(rows), -1, _I64)])
        self._pa = pa
        self.pfx = (pa.pr, pa.ps, pa.nd, pa.ent, pa.tab, hh, pe, np.zeros(longest, _I64))

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
