"""The serving simulation engine (vLLM V1 scheduling on a GPU pool) and its what-if interface."""

from commitenv.sim.noise import NoiseSpec
from commitenv.sim.pool import Pool
from commitenv.sim.records import EngineOptions, Instance, PoolLayout, StepLogEntry
from commitenv.sim.view import ReplicaView, RequestView, Snapshot, take_snapshot
from commitenv.sim.whatif import WhatIf, observed_arrivals, simulate

__all__ = [
    "EngineOptions",
    "Instance",
    "NoiseSpec",
    "Pool",
    "PoolLayout",
    "ReplicaView",
    "RequestView",
    "Snapshot",
    "StepLogEntry",
    "WhatIf",
    "observed_arrivals",
    "simulate",
    "take_snapshot",
]
