"""Which slow cases run: the ones that skip themselves unless asked for."""

from __future__ import annotations

import os


def slow_requested(config) -> bool:
    """Slow cases that skip themselves run only when asked for: ``-m slow`` (or any marker expression selecting
    ``slow`` without ``not slow``) or ``COMMITENV_RUN_SLOW=1``; a plain run stays quick."""
    expr = (config.getoption("markexpr") or "").replace(" ", "")
    return os.environ.get("COMMITENV_RUN_SLOW") == "1" or ("slow" in expr and "notslow" not in expr)
