"""Moving work between GPUs: the cost of transferring a running request's KV cache to another instance, and the
migration modes a model-instance move offers (Festina sec. 3.5: latency-aware migration).

An instance move (`Pool.move`) unloads the instance from its GPU and cold-starts it on another one (the profile's
``latencies.load_s`` at ``load_w``). Its running requests either finish where they are before it leaves
(``"none"``), or travel to another active instance of their model with their KV cache (``"all"``), or travel only
when their predicted remaining time exceeds the transfer time (``"latency_aware"``: near-completion requests stay).
The defaults below are an 8-GPU HGX H100 board's NVLink; where no public figure exists the text says so
(docs/festina.md, "Placement and migration").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIGRATE_MODES = ("none", "latency_aware", "all")


@dataclass(frozen=True)
class MigrationSpec:
    """KV transfer between two GPUs: ``link_gbs`` usable GB/s per direction, a fixed ``setup_s`` per request, and
    ``j_per_gb`` of link energy per GB moved (charged to the source GPU)."""

    link_gbs: float = 360.0  # NVLink 4 on HGX H100: 450 GB/s per direction (NVIDIA), 0.8 of it assumed usable
    setup_s: float = 0.01  # handoff (scheduler RPC, block-table setup): an assumption, no public figure
    j_per_gb: float = 0.0104  # 1.3 pJ/bit: NVIDIA's NVLink-C2C figure, the closest public one (none for GPU-GPU)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.link_gbs) and self.link_gbs > 0):
            raise ValueError(f"migration.link_gbs: expected a bandwidth > 0 GB/s, got {self.link_gbs}")
        for k in ("setup_s", "j_per_gb"):
            v = getattr(self, k)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"migration.{k}: expected a finite value >= 0, got {v}")

    def transfer_s(self, kv_bytes: float) -> float:
        """Seconds a request is away while ``kv_bytes`` of its KV cache cross the link (setup included)."""
        return self.setup_s + kv_bytes / (self.link_gbs * 1e9)

    def transfer_j(self, kv_bytes: float) -> float:
        """Link energy of moving ``kv_bytes``."""
        return kv_bytes / 1e9 * self.j_per_gb
