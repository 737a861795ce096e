"""The request table every workload source produces: one column array per field, sorted by arrival."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class WorkloadError(ValueError):
    """Malformed workload input; the message names the file, line and problem."""


@dataclass(frozen=True)
class RequestTable:
    """Requests as parallel column arrays, sorted by ``arrival_s`` (seconds from the trace start).

    ``prefix_offsets``/``prefix_hashes`` hold optional prefix-block hash ids in CSR form: request ``i``
    owns ``prefix_hashes[prefix_offsets[i]:prefix_offsets[i+1]]`` (Mooncake ``hash_ids``).
    """

    arrival_s: np.ndarray  # float64, non-decreasing, >= 0
    prompt_tokens: np.ndarray  # int64, >= 1
    output_tokens: np.ndarray  # int64, >= 1
    tenant: np.ndarray  # int32 index into tenant_names
    request_id: np.ndarray  # int64, unique
    tenant_names: tuple[str, ...] = ("default",)
    prefix_offsets: np.ndarray | None = None
    prefix_hashes: np.ndarray | None = None
    source: str = "<memory>"
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("prompt_tokens", "output_tokens", "tenant", "request_id"):
            if len(getattr(self, name)) != n:
                raise WorkloadError(f"{self.source}: column {name} has {len(getattr(self, name))} rows, expected {n}")
        if n and np.any(np.diff(self.arrival_s) < 0):
            raise WorkloadError(f"{self.source}: arrival_s is not sorted")
        if self.prefix_offsets is not None and len(self.prefix_offsets) != n + 1:
            raise WorkloadError(f"{self.source}: prefix_offsets must have {n + 1} entries")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0

    def prefix_of(self, i: int) -> np.ndarray:
        """Prefix-block hash ids of request ``i`` (empty when the table has none)."""
        if self.prefix_offsets is None or self.prefix_hashes is None:
            return np.empty(0, dtype=np.int64)
        return self.prefix_hashes[self.prefix_offsets[i] : self.prefix_offsets[i + 1]]

    def take(self, idx: np.ndarray) -> "RequestTable":
        """Rows ``idx`` (must keep arrival order) as a new table."""
        idx = np.asarray(idx, dtype=np.int64)
        po = ph = None
        if self.prefix_offsets is not None and self.prefix_hashes is not None:
            lens = self.prefix_offsets[idx + 1] - self.prefix_offsets[idx]
            po = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
            ph = (
                np.concatenate([self.prefix_hashes[self.prefix_offsets[i] : self.prefix_offsets[i + 1]] for i in idx])
                if len(idx)
                else np.empty(0, dtype=np.int64)
            ).astype(np.int64)
        return RequestTable(
            arrival_s=self.arrival_s[idx],
            prompt_tokens=self.prompt_tokens[idx],
            output_tokens=self.output_tokens[idx],
            tenant=self.tenant[idx],
            request_id=self.request_id[idx],
            tenant_names=self.tenant_names,
            prefix_offsets=po,
            prefix_hashes=ph,
            source=self.source,
            meta=dict(self.meta),
        )


def make_table(
    arrival_s,
    prompt_tokens,
    output_tokens,
    tenant=None,
    request_id=None,
    *,
    source: str = "<memory>",
    tenant_names: tuple[str, ...] = ("default",),
) -> RequestTable:
    """Build a table from plain sequences (used by tests and small hand-made workloads)."""
    arr = np.asarray(arrival_s, dtype=np.float64)
    n = len(arr)
    return RequestTable(
        arrival_s=arr,
        prompt_tokens=np.asarray(prompt_tokens, dtype=np.int64),
        output_tokens=np.asarray(output_tokens, dtype=np.int64),
        tenant=np.zeros(n, dtype=np.int32) if tenant is None else np.asarray(tenant, dtype=np.int32),
        request_id=np.arange(n, dtype=np.int64) if request_id is None else np.asarray(request_id, dtype=np.int64),
        tenant_names=tenant_names,
        source=source,
    )
