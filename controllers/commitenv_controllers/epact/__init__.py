"""ePACT (the paper's two-level controller), its Static-Target ablation (a flag, not a copy) and ePACT+
(forecast-aware nominal allocation, `plus`)."""

from commitenv_controllers.epact.controller import EPACT
from commitenv_controllers.epact.plus import EPACTPlus
from commitenv_controllers.registry import register_factory

register_factory("static_target", lambda **kw: EPACT(static_target=True, **kw))

__all__ = ["EPACT", "EPACTPlus"]
