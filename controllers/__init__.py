"""Interchangeable controllers, registered by name (``controllers.make('vllm')``)."""

from controllers import epact, fixed_config, vllm  # noqa: F401  (registration)
from controllers import dynamollm  # noqa: F401
from controllers.base import Controller, ControllerContext, Probe
from controllers.registry import available, make, register, register_factory

__all__ = ["Controller", "ControllerContext", "Probe", "available", "make", "register", "register_factory"]
