"""The controller protocol lives in the library (`commitenv.control`); re-exported here for the built-ins and for
code written against ``commitenv_controllers.base``."""

from commitenv.control import Controller, ControllerContext, EnvProbe, Probe

__all__ = ["Controller", "ControllerContext", "EnvProbe", "Probe"]
