"""Interchangeable controllers, registered by name (``commitenv_controllers.make('vllm')``), or given as ``module:Class``,
``path/to/file.py:Class`` or an entry point of the group ``commitenv.controllers`` (see `commitenv_controllers.registry`)."""

import inspect as _inspect

from commitenv_controllers import epact, fixed_config, vllm  # noqa: F401  (registration)
from commitenv_controllers import dynamollm  # noqa: F401
from commitenv_controllers.festina import controller as _festina  # noqa: F401  (registration)
from commitenv_controllers.base import Controller, ControllerContext, Probe
from commitenv_controllers.epact import EPACT as _EPACT
from commitenv_controllers.registry import (
    ENTRY_POINT_GROUP,
    all_names,
    available,
    check_kwargs,
    describe_as,
    discover,
    make,
    origin_of,
    register,
    register_factory,
    resolve,
    spec_from_origin,
)


class StaticTarget(_EPACT):
    """ePACT's Static-Target ablation: the same search, each interval aiming at its nominal share (no feedback)."""

    name = "static_target"

    def __init__(self, **kwargs) -> None:
        if "static_target" in kwargs:
            raise TypeError("StaticTarget() got an unexpected keyword argument 'static_target'")
        super().__init__(static_target=True, **kwargs)


StaticTarget.__signature__ = _inspect.signature(_EPACT).replace(  # type: ignore[attr-defined]
    parameters=[p for n, p in _inspect.signature(_EPACT).parameters.items() if n != "static_target"])
describe_as("static_target", StaticTarget)  # registered by commitenv_controllers.epact as a factory of EPACT

__all__ = ["ENTRY_POINT_GROUP", "Controller", "ControllerContext", "Probe", "StaticTarget", "all_names", "available",
           "check_kwargs", "discover", "make", "origin_of", "register", "register_factory", "resolve",
           "spec_from_origin"]
