"""An environment with attribution on (its step hook set at reset), on a one-model pool and on a shared pool with SM
shares and placement, with a snapshot taken before every decision: rewards and attribution on the compiled loop equal
those of the same episode on the reference engine (tests/helpers/reference), both step by step."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.reference import reference_snapshot, step_by_step, use_engine

from commitenv.envs import CommitServeEnv
from commitenv.sim import Pool


def _episode(scenario: str, steps: int, seed: int = 3) -> tuple[list[str], CommitServeEnv]:
    """Each step's reward and attribution (as JSON text), random actions from the seeded action space; the env."""
    env = CommitServeEnv(scenario, attribution=True)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    out = []
    for _ in range(steps):
        reference_snapshot(env.pool)
        _, r, term, trunc, info = env.step(env.action_space.sample())
        out.append(json.dumps([r, info.get("attribution")], default=lambda o: np.asarray(o).tolist(), sort_keys=True))
        if term or trunc:
            break
    return out, env


@pytest.mark.parametrize("scenario,steps", [("bench-h200-hour-fixed-a30", 20), ("festina-h100-shared", 12)])
def test_an_episode_with_attribution_equals_the_reference(monkeypatch, scenario, steps):
    step_by_step(monkeypatch)
    use_engine(monkeypatch, reference=False)
    fast, env = _episode(scenario, steps)
    assert type(env.pool) is Pool
    use_engine(monkeypatch, reference=True)
    slow, ref = _episode(scenario, steps)
    assert type(ref.pool) is not Pool
    assert len(fast) == steps and "tenant_j" in fast[-1]  # (attribution was there to compare)
    assert fast == slow
