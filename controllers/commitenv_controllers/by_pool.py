"""One learned policy per GPU pool: the episode's pool (its profile) picks which of several ``sb3:`` policies acts (the
leaderboard's learned submissions use it: one clone per pool of a suite)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from commitenv.control import Controller, ControllerContext
from commitenv.scenarios import load_scenario
from commitenv_controllers.sb3_policy import SB3Policy


class ByPool(Controller):
    """Runs the policy among ``policies`` (shipped ``sb3:`` names, or folders relative to the working directory, which
    is a submission's folder in the sandbox) whose training scenario has this episode's profile; an episode on a pool
    none was trained on is refused at reset."""

    name = "bc_by_pool"

    def __init__(self, policies: tuple[str, ...] = ("bc-mpc-h200-family", "bc-mpc-h20-family")) -> None:
        self.policies = {}
        for name in policies:
            p = SB3Policy(str(Path(name).resolve()) if Path(name).is_dir() else name)
            scenario = json.loads((p.path / "train.json").read_text())["scenario"]
            self.policies[load_scenario(scenario).pool.profile] = p
        self.inner: SB3Policy | None = None

    def reset(self, ctx: ControllerContext, seed: int | None = None) -> None:
        super().reset(ctx, seed)
        profile = ctx.profile.name if ctx.profile is not None else None
        if profile not in self.policies:
            raise ValueError(f"bc_by_pool: no policy trained on profile {profile!r} (have: {', '.join(self.policies)})")
        self.inner = self.policies[profile]
        self.inner.reset(ctx, seed)

    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict[str, int]:
        assert self.inner is not None, "act() before reset()"
        return self.inner.act(observation, info)
