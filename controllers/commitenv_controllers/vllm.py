"""The vLLM default: every replica active at the top (reference) clock, whatever the commitment."""

from __future__ import annotations

from typing import Any

import numpy as np

from commitenv_controllers.base import Controller
from commitenv_controllers.registry import register


@register("vllm")
class VLLMController(Controller):
    """Latency-first baseline of the ePACT paper (sec. 5.1): all N replicas, clock ceiling (on a shared pool:
    every instance at its placed SM share, MuxServe-like)."""

    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict[str, int]:
        return self.ctx.action(self.ctx.all_active, self.ctx.reference_clock_mhz)
