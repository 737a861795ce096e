"""The serving simulation engine (vLLM V1 scheduling on a GPU pool) and its what-if interface."""

from commitenv.sim.noise import NoiseSpec
from commitenv.sim.pool import EngineOptions, Instance, Pool, PoolLayout, StepLogEntry
from commitenv.sim.whatif import Snapshot, WhatIf, observed_arrivals, simulate, take_snapshot

__all__ = [
    "EngineOptions",
    "Instance",
    "NoiseSpec",
    "Pool",
    "PoolLayout",
    "Snapshot",
    "StepLogEntry",
    "WhatIf",
    "observed_arrivals",
    "simulate",
    "take_snapshot",
]
