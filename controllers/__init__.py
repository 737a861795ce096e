"""Interchangeable controllers, registered by name (``controllers.make('vllm')``)."""

from controllers import fixed_config, vllm  # noqa: F401  (registration)
from controllers.base import Controller, ControllerContext, Probe
from controllers.registry import available, make, register

__all__ = ["Controller", "ControllerContext", "Probe", "available", "make", "register"]
