"""Fixed-Config ablation: one configuration all along (ePACT sec. 5.1: 28 replicas at the top clock)."""

from __future__ import annotations

from typing import Any

import numpy as np

from commitenv_controllers.base import Controller, ControllerContext
from commitenv_controllers.registry import register


@register("fixed_config")
class FixedConfigController(Controller):
    """Keep ``active`` replicas at ``clock_mhz`` (default: 28 at the profile's reference clock, i.e. 1980 MHz
    on H20 and 1710 MHz on H200, as the paper's Fixed-Config)."""

    def __init__(self, active: int = 28, clock_mhz: int | None = None) -> None:
        self.active = active
        self.clock_mhz = clock_mhz

    def reset(self, ctx: ControllerContext, seed: int | None = None) -> None:
        super().reset(ctx, seed)
        if not 1 <= self.active <= ctx.n_replicas:
            raise ValueError(f"fixed_config: active={self.active} outside 1..{ctx.n_replicas}")
        self._action = ctx.action(self.active, self.clock_mhz or ctx.reference_clock_mhz)

    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict[str, int]:
        return self._action
