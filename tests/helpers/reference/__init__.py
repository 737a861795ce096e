"""The step-by-step reference engine the compiled loop is held to (`ReferencePool`), on replica and GPU objects."""

from helpers.reference.pool import ReferencePool
from helpers.reference.switch import step_by_step, use_engine

__all__ = ["ReferencePool", "step_by_step", "use_engine"]
