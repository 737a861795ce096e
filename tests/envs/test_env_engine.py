"""An environment's pool stays on the compiled loop for a whole episode: with attribution on (its step hook set at
reset), on a shared pool with SM shares and placement, and with a snapshot taken before every decision, nothing hands
the engine back to the Python loop and no replica or GPU object is ever built (the pool's state is made from its
layout, `commitenv.sim.kernel.fresh`); rewards and attribution equal those of the same episode on the Python loop."""

from __future__ import annotations

import json

import numpy as np
import pytest

from commitenv.envs import CommitServeEnv
from commitenv.sim import Pool, kernel, take_snapshot


def _episode(scenario: str, steps: int, seed: int = 3) -> tuple[list[str], CommitServeEnv]:
    """Each step's reward and attribution (as JSON text), random actions from the seeded action space; the env."""
    env = CommitServeEnv(scenario, attribution=True)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    out = []
    for _ in range(steps):
        take_snapshot(env.pool)
        _, r, term, trunc, info = env.step(env.action_space.sample())
        out.append(json.dumps([r, info.get("attribution")], default=lambda o: np.asarray(o).tolist(), sort_keys=True))
        if term or trunc:
            break
    return out, env


@pytest.mark.parametrize("scenario,steps", [("bench-h200-hour-fixed-a30", 20), ("festina-h100-shared", 12)])
def test_an_episode_never_hands_the_pool_back(monkeypatch, scenario, steps):
    def refuse(self):
        raise AssertionError("the pool was handed back to the Python loop")

    real = Pool._leave_kernel
    monkeypatch.setattr(kernel, "ENABLED", True)
    monkeypatch.setattr(Pool, "_leave_kernel", refuse)
    fast, env = _episode(scenario, steps)
    assert "_replicas" not in env.pool.__dict__ and "_gpus" not in env.pool.__dict__  # (no device object was built)
    monkeypatch.setattr(Pool, "_leave_kernel", real)
    monkeypatch.setattr(kernel, "ENABLED", False)
    slow, _ = _episode(scenario, steps)
    assert len(fast) == steps and "tenant_j" in fast[-1]  # (attribution was there to compare)
    assert fast == slow
