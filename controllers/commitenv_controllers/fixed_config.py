"""Fixed-Config ablation: one configuration all along (ePACT sec. 5.1: 28 replicas at the top clock)."""

from __future__ import annotations

from typing import Any

import numpy as np

from commitenv_controllers.base import Controller, ControllerContext
from commitenv_controllers.registry import register


@register("fixed_config")
class FixedConfigController(Controller):
    """Keep ``active`` replicas at ``clock_mhz`` (default: the paper's 28 of 32 replicas, scaled to the pool as
    round(28 N / 32), at the profile's reference clock, i.e. 1980 MHz on H20 and 1710 MHz on H200). On a shared pool
    the count is spread over the models in proportion (`ControllerContext.spread_active`, at least one each)."""

    PAPER_SHARE = 28 / 32  # ePACT sec. 5.1: 28 active replicas of a 32-GPU pool

    def __init__(self, active: int | None = None, clock_mhz: int | None = None) -> None:
        self.active = active
        self.clock_mhz = clock_mhz

    def reset(self, ctx: ControllerContext, seed: int | None = None) -> None:
        super().reset(ctx, seed)
        active = self.active if self.active is not None else max(1, round(self.PAPER_SHARE * ctx.n_replicas))
        if not 1 <= active <= ctx.n_replicas:
            raise ValueError(f"fixed_config: active={active} outside 1..{ctx.n_replicas}")
        if ctx.shared:
            active = ctx.spread_active(max(active, len(ctx.replicas_per_model)))
        self._action = ctx.action(active, self.clock_mhz or ctx.reference_clock_mhz)

    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict[str, int]:
        return self._action
