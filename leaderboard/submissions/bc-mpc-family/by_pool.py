"""One behaviour clone per GPU pool: the episode's pool (its profile) picks which shipped clone of MPC acts."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from commitenv.control import Controller, ControllerContext
from commitenv.scenarios import load_scenario
from commitenv_controllers.sb3_policy import SB3Policy


class ByPool(Controller):
    """Runs the clone among ``policies`` (shipped ``sb3:`` names) whose training scenario has this episode's profile;
    an episode on a pool none was trained on is refused at reset."""

    name = "bc_by_pool"

    def __init__(self, policies: tuple[str, ...] = ("bc-mpc-h200-family", "bc-mpc-h20-family")) -> None:
        self.policies = {}
        for name in policies:
            p = SB3Policy(name)
            scenario = json.loads((p.path / "train.json").read_text())["scenario"]
            self.policies[load_scenario(scenario).pool.profile] = p
        self.inner: SB3Policy | None = None

    def reset(self, ctx: ControllerContext, seed: int | None = None) -> None:
        super().reset(ctx, seed)
        profile = ctx.profile.name if ctx.profile is not None else None
        if profile not in self.policies:
            raise ValueError(f"bc_by_pool: no clone trained on profile {profile!r} (have: {', '.join(self.policies)})")
        self.inner = self.policies[profile]
        self.inner.reset(ctx, seed)

    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict[str, int]:
        assert self.inner is not None, "act() before reset()"
        return self.inner.act(observation, info)
