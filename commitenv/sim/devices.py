"""What a pool's replicas and GPUs are doing now, as arrays read off the compiled loop's state: what attribution and
the env read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commitenv.sim.kernel.layout import (G_CLOCK, G_NHOST, GF_FLOOR_W, R_GPU, R_MEM, R_MODEL, R_SEG, R_SHARE, R_STATE,
                                         R_T0)

__all__ = ["DeviceState", "device_state"]


@dataclass(frozen=True)
class DeviceState:
    """Per replica (index order) and per GPU: placement, lifecycle, segment in flight, clock and idle floor."""

    replica_gpu: np.ndarray  # int64: the GPU hosting each replica
    replica_model: np.ndarray  # int64: the model each serves (an index of the pool's profiles)
    replica_share: np.ndarray  # float64: its SM share now
    replica_mem_share: np.ndarray  # float64: the memory share it reserves (`commitenv.sim.memory`)
    replica_state: np.ndarray  # int64: lifecycle codes (`commitenv.sim.states`)
    replica_segment: np.ndarray  # int64: the kind of segment in flight (SEG_NONE: none)
    replica_segment_t0: np.ndarray  # float64: when that segment started (meaningless without one)
    gpu_hosts: np.ndarray  # int64: how many replicas each GPU hosts
    gpu_clock_idx: np.ndarray  # int64: each GPU's clock level now
    gpu_floor_w: np.ndarray  # float64: each GPU's idle floor power now (W, its part's power factor included)

    @property
    def n_gpus(self) -> int:
        return len(self.gpu_hosts)


def device_state(pool) -> DeviceState:
    """``pool``'s replicas and GPUs now (see the module docstring); a copy, safe to keep."""
    ks = pool._ks
    ri, rf, gi, gf = ks.ri[: ks.R], ks.rf[: ks.R], ks.gi, ks.gf
    return DeviceState(ri[:, R_GPU].copy(), ri[:, R_MODEL].copy(), rf[:, R_SHARE].copy(), rf[:, R_MEM].copy(),
                       ri[:, R_STATE].copy(), ri[:, R_SEG].copy(), rf[:, R_T0].copy(), gi[:, G_NHOST].copy(),
                       gi[:, G_CLOCK].copy(), gf[:, GF_FLOOR_W].copy())
