"""The step-by-step reference engine the compiled loop is held to (`ReferencePool`), on replica and GPU objects."""

from helpers.reference.copies import reference_device_state, reference_snapshot
from helpers.reference.pool import ReferencePool
from helpers.reference.switch import step_by_step, use_engine

__all__ = ["ReferencePool", "reference_device_state", "reference_snapshot", "step_by_step", "use_engine"]
