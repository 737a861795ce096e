"""Pure transformations of request tables; each returns a new :class:`RequestTable` and leaves its input alone."""

from __future__ import annotations

import numpy as np

from .table import RequestTable, WorkloadError


def _gather_csr(offsets: np.ndarray, values: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR rows ``idx`` of ``(offsets, values)`` as a new CSR pair (vectorised)."""
    starts = offsets[idx]
    lens = offsets[idx + 1] - starts
    new = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    pos = np.repeat(starts - new[:-1], lens) + np.arange(new[-1], dtype=np.int64)
    return new, values[pos].astype(np.int64)


def _gather_prefix(table: RequestTable, idx: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
    if table.prefix_offsets is None or table.prefix_hashes is None:
        return None, None
    return _gather_csr(table.prefix_offsets, table.prefix_hashes, idx)


def _rows(table: RequestTable, idx: np.ndarray, *, arrival: np.ndarray | None = None, request_id=None,
          source: str | None = None, meta_add: dict | None = None) -> RequestTable:
    """Rows ``idx`` of ``table`` with optional replacement arrival times / ids (already in ``idx`` order)."""
    idx = np.asarray(idx, dtype=np.int64)
    po, ph = _gather_prefix(table, idx)
    return RequestTable(
        arrival_s=table.arrival_s[idx] if arrival is None else arrival,
        prompt_tokens=table.prompt_tokens[idx],
        output_tokens=table.output_tokens[idx],
        tenant=table.tenant[idx],
        request_id=table.request_id[idx] if request_id is None else request_id,
        tenant_names=table.tenant_names,
        prefix_offsets=po,
        prefix_hashes=ph,
        source=source or table.source,
        meta={**table.meta, **(meta_add or {})},
    )


def select_rows(table: RequestTable, rows: np.ndarray) -> RequestTable:
    """Rows ``rows`` (increasing indices) of ``table``, in order: a subset of its requests, times unchanged."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) and (rows[0] < 0 or rows[-1] >= len(table) or np.any(np.diff(rows) <= 0)):
        raise WorkloadError(f"select_rows: expected increasing row indices in [0, {len(table)})")
    return _rows(table, rows)


def concat_tables(a: RequestTable, b: RequestTable) -> RequestTable:
    """``a``'s requests, then ``b``'s (arriving no earlier than ``a``'s last; the same tenants, or ``a`` empty; no
    prefix blocks): a workload grown by a later part."""
    if len(a) and a.tenant_names != b.tenant_names:
        raise WorkloadError(f"concat_tables: tenants {b.tenant_names} differ from {a.tenant_names}")
    if a.prefix_offsets is not None or b.prefix_offsets is not None:
        raise WorkloadError("concat_tables: tables with prefix blocks are not concatenated")
    return RequestTable(
        arrival_s=np.concatenate([a.arrival_s, b.arrival_s]),
        prompt_tokens=np.concatenate([a.prompt_tokens, b.prompt_tokens]),
        output_tokens=np.concatenate([a.output_tokens, b.output_tokens]),
        tenant=np.concatenate([a.tenant, b.tenant]).astype(np.int32),
        request_id=np.concatenate([a.request_id, b.request_id]),
        tenant_names=b.tenant_names if not len(a) else a.tenant_names,
        source=a.source,
        meta=dict(a.meta),
    )


def time_window(table: RequestTable, start_s: float, end_s: float, rebase: bool = True) -> RequestTable:
    """Requests with ``start_s <= arrival_s < end_s``; with ``rebase`` times are shifted so ``start_s`` is 0
    (the window start, not its first request, becomes time 0, so hour boundaries stay where they were)."""
    if not end_s >= start_s:
        raise WorkloadError(f"time_window: end_s {end_s} is before start_s {start_s}")
    lo, hi = np.searchsorted(table.arrival_s, [start_s, end_s], side="left")
    idx = np.arange(lo, hi)
    arrival = table.arrival_s[lo:hi] - (start_s if rebase else 0.0)
    return _rows(table, idx, arrival=arrival, meta_add={"window_s": [float(start_s), float(end_s)]})


def scale_rate(table: RequestTable, factor: float, seed: int, *, jitter_s: float = 60.0) -> RequestTable:
    """Scale the arrival rate by ``factor`` while keeping the time-of-day shape.

    ``factor < 1`` keeps ``round(factor * n)`` requests chosen uniformly without replacement (seeded).
    ``factor > 1`` keeps every original and adds ``floor(factor) - 1`` full copies plus a seeded
    ``round(frac(factor) * n)``-request sample of one more; every added request is its original moved by an
    independent uniform jitter in ``[-jitter_s/2, jitter_s/2]`` (reflected to stay within the table's span),
    with its lengths and prefix kept. Rate structure coarser than ``jitter_s`` is preserved; superposing
    copies makes finer bursts more Poisson-like. Added requests get fresh ids above the originals'.
    """
    if not (np.isfinite(factor) and factor > 0):
        raise WorkloadError(f"scale_rate: factor must be > 0, got {factor}")
    n = len(table)
    rng = np.random.default_rng(seed)
    meta = {"rate_scale": float(factor)}
    if factor <= 1.0:
        keep = np.sort(rng.choice(n, size=int(round(factor * n)), replace=False)) if n else np.empty(0, np.int64)
        return _rows(table, keep, meta_add=meta)
    extra_full = int(np.floor(factor)) - 1
    part = int(round((factor - np.floor(factor)) * n))
    src = np.concatenate([np.tile(np.arange(n), extra_full), np.sort(rng.choice(n, size=part, replace=False))])
    lo, hi = (float(table.arrival_s[0]), float(table.arrival_s[-1])) if n else (0.0, 0.0)
    t = table.arrival_s[src] + rng.uniform(-jitter_s / 2, jitter_s / 2, size=len(src))
    t = np.where(t < lo, 2 * lo - t, t)
    t = np.where(t > hi, 2 * hi - t, t)
    t = np.clip(t, lo, hi)
    arrival = np.concatenate([table.arrival_s, t])
    all_src = np.concatenate([np.arange(n), src])
    base = int(table.request_id.max()) + 1 if n else 0
    ids = np.concatenate([table.request_id, base + np.arange(len(src), dtype=np.int64)])
    order = np.lexsort((ids, arrival))
    return _rows(table, all_src[order], arrival=arrival[order], request_id=ids[order], meta_add=meta)


def compress_time(table: RequestTable, factor: float) -> RequestTable:
    """Arrival times divided by ``factor`` (``factor = 24`` plays a day in an hour at 24x the rate)."""
    if not (np.isfinite(factor) and factor > 0):
        raise WorkloadError(f"compress_time: factor must be > 0, got {factor}")
    return _rows(table, np.arange(len(table)), arrival=table.arrival_s / factor,
                 meta_add={"time_compression": float(factor)})


def tag_tenant(table: RequestTable, name: str) -> RequestTable:
    """Every request assigned to the single tenant ``name``."""
    t = _rows(table, np.arange(len(table)))
    return RequestTable(t.arrival_s, t.prompt_tokens, t.output_tokens, np.zeros(len(t), dtype=np.int32),
                        t.request_id, (name,), t.prefix_offsets, t.prefix_hashes, t.source, t.meta)


def merge(*tables: RequestTable) -> RequestTable:
    """Multi-tenant merge: all requests sorted by arrival (ties keep argument order), tenants matched by name
    (names in order of first appearance), request ids offset per table so they stay unique. Prefix ids are
    kept as they are (requests of a table without prefixes get none)."""
    if not tables:
        raise WorkloadError("merge: no tables given")
    names: list[str] = []
    for t in tables:
        names.extend(x for x in t.tenant_names if x not in names)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("arrival", "prompt", "output", "tenant", "id", "plen", "ph")}
    offset = 0
    has_prefix = any(t.prefix_offsets is not None for t in tables)
    for t in tables:
        remap = np.array([names.index(x) for x in t.tenant_names], dtype=np.int32)
        cols["arrival"].append(t.arrival_s)
        cols["prompt"].append(t.prompt_tokens)
        cols["output"].append(t.output_tokens)
        cols["tenant"].append(remap[t.tenant] if len(t) else t.tenant.astype(np.int32))
        cols["id"].append(t.request_id + offset)
        offset += int(t.request_id.max()) + 1 if len(t) else 0
        if t.prefix_offsets is not None and t.prefix_hashes is not None:
            cols["plen"].append(np.diff(t.prefix_offsets))
            cols["ph"].append(t.prefix_hashes[t.prefix_offsets[0] : t.prefix_offsets[-1]])
        else:
            cols["plen"].append(np.zeros(len(t), dtype=np.int64))
    arrival = np.concatenate(cols["arrival"])
    order = np.argsort(arrival, kind="stable")
    po = ph = None
    if has_prefix:
        plen = np.concatenate(cols["plen"]).astype(np.int64)
        hashes = np.concatenate(cols["ph"]).astype(np.int64) if cols["ph"] else np.empty(0, np.int64)
        po, ph = _gather_csr(np.concatenate([[0], np.cumsum(plen)]).astype(np.int64), hashes, order)
    return RequestTable(
        arrival_s=arrival[order],
        prompt_tokens=np.concatenate(cols["prompt"])[order],
        output_tokens=np.concatenate(cols["output"])[order],
        tenant=np.concatenate(cols["tenant"])[order].astype(np.int32),
        request_id=np.concatenate(cols["id"])[order],
        tenant_names=tuple(names),
        prefix_offsets=po,
        prefix_hashes=ph,
        source="merge(" + ", ".join(t.source for t in tables) + ")",
        meta={"merged_from": [t.source for t in tables]},
    )
