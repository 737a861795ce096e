"""The controller registry lives in the library (`commitenv.registry`); re-exported here for code written against
``commitenv_controllers.registry``."""

from commitenv.registry import *  # noqa: F401,F403
from commitenv.registry import __all__  # noqa: F401
