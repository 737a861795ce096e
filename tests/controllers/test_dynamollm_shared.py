"""DynamoLLM on shared pools: one DynamoLLM per model, each GPU at the highest clock its active instances need
(checked against the env's own replica states), an idle model dropping to one instance, and the one-model path
unchanged (a fixed action sequence recorded before the shared branch existed)."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("ortools", reason='dynamollm needs OR-Tools (a core dependency): pip install commitenv')

import commitenv  # noqa: F401  (registers the scenario ids)
from commitenv.envs import CommitServeEnv
from commitenv_controllers import ControllerContext, make
from commitenv_controllers.dynamollm import DynamoLLMController
from helpers.scenarios import HOUR_SCENARIO, write_trace
from helpers.scenarios import shared_scenario


def steady_shared(folder: Path, mix: dict[str, float]) -> str:
    """The toy shared pool (3 GPUs; 'small' on all three, 'big' on GPUs 0 and 2) with an arrival every 0.5 s,
    tenants 's' / 'b' (not named as their models) drawn from ``mix``, 600-s intervals over one hour."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    t = np.arange(0.0, 3600.0, 0.5)
    trace = write_trace(folder / "steady.csv", t, rng.integers(4, 24, len(t)), rng.integers(2, 24, len(t)))
    return str(shared_scenario(folder, workload={"trace": str(trace), "tenant_mix": mix}))


def run_checked(scenario: str, seed: int, steps: int | None = None) -> tuple[DynamoLLMController, list[dict]]:
    """Run the controller, checking every action against the env: accepted and applied, per-model counts as decided,
    and each GPU's clock the highest decided clock of the models with an active (or waking) replica on it there,
    the lowest clock where none is. Returns the controller and, per step, its action, decisions and GPU facts."""
    env = CommitServeEnv(scenario)
    obs, info = env.reset(seed=seed)
    ctrl = make("dynamollm")
    assert isinstance(ctrl, DynamoLLMController)
    ctx = ControllerContext.from_env(env)
    ctrl.reset(ctx, seed)
    rows = []
    done = False
    while not done and (steps is None or len(rows) < steps):
        a = ctrl.act(obs, info)
        decisions = list(ctrl.decisions)
        obs, _, done, _, info = env.step(a)  # the env accepts the action (raises otherwise)
        assert not info["stale_decision"]
        assert a["active"] == [n for n, _ in decisions] == info["active_by_model"]
        assert all(1 <= n <= cap for n, cap in zip(a["active"], ctx.replicas_per_model))
        reps = env.snapshot().replicas
        hosted_active = []
        expected = []
        for g in range(len(ctx.placement)):
            on = sorted({int(reps.model[r]) for r in range(len(reps))
                         if reps.gpu[r] == g and reps.state[r] in ("active", "waking")})
            hosted_active.append(on)
            expected.append(max((decisions[m][1] for m in on), default=min(ctx.clocks_mhz)))
        for m, (n, _) in enumerate(decisions):
            assert sum(1 for r in range(len(reps)) if reps.model[r] == m and reps.state[r] in ("active", "waking")) == n
        assert [ctx.clocks_mhz[c] for c in a["clocks"]] == expected == info["clocks_mhz"]
        assert ctx.clocks_mhz[a["clock"]] == max(expected)
        rows.append({"action": a, "decisions": decisions, "hosted_active": hosted_active, "clocks": expected})
    env.close()
    return ctrl, rows


def test_shared_toy_pool_per_gpu_clock_is_the_max_of_its_active_models(tmp_path):
    ctrl, rows = run_checked(steady_shared(tmp_path, {"s": 0.3, "b": 0.7}), seed=0)
    assert len(rows) == 6
    assert len(ctrl.subs) == 2 and [s.ctx.n_replicas for s in ctrl.subs] == [3, 2]
    assert [s._share for s in ctrl.subs] == [0.4, 0.5]  # each model's smallest placed share
    # both cases occur: a GPU whose instances are all inactive, and co-hosted active models asking different clocks
    assert any(not on for r in rows for on in r["hosted_active"])
    assert any(len({r["decisions"][m][1] for m in on}) > 1 for r in rows for on in r["hosted_active"])
    assert any(r["decisions"][0][0] < 3 for r in rows)  # it does scale a model in
    assert all(s.load.sum() > 0 for s in ctrl.subs)  # both models' forecasts see their tenants' arrivals


def test_shipped_shared_scenario_few_steps():
    ctrl, rows = run_checked("festina-h100-shared", seed=100000, steps=6)
    assert len(ctrl.subs) == 3 and [s.ctx.n_replicas for s in ctrl.subs] == [6, 6, 2]
    # co-hosted models asked for different clocks at least once, and the GPU took the higher one
    assert any(len({r["decisions"][m][1] for m in on}) > 1 for r in rows for on in r["hosted_active"])


def test_model_without_arrivals_drops_to_one_instance(tmp_path):
    ctrl, rows = run_checked(steady_shared(tmp_path, {"s": 1.0}), seed=0)
    assert rows[0]["action"]["active"] == [3, 2]  # before the first plan: as configured
    for r in rows[1:]:  # from the first plan (t = 600 s) on: 'big' gets no request
        assert r["decisions"][1][0] == 1
    assert ctrl.subs[1].plan.active == 1 and not ctrl.subs[1].load.any()


# Recorded with the one-model controller before the shared branch was added (epact-h200-hour-fixed-a30, seed 0).
ONE_MODEL_SEED0 = [
    (32, 4), (3, 4), (6, 4), (6, 4), (6, 1), (6, 4), (6, 2), (3, 4), (3, 4), (3, 4), (3, 4), (6, 4), (6, 2), (6, 2),
    (6, 2), (6, 2), (3, 4), (3, 4), (6, 4), (6, 2), (6, 2), (6, 2), (6, 1), (3, 4), (3, 4), (3, 2), (6, 4), (6, 2),
    (12, 4), (12, 0), (24, 4), (24, 0), (32, 4), (32, 1), (32, 1), (32, 1), (32, 2), (4, 4), (8, 4), (8, 2), (8, 1),
    (8, 4), (8, 1), (4, 4), (4, 4), (4, 4), (4, 4), (4, 3), (4, 4), (4, 4), (8, 4), (8, 1), (8, 4), (8, 2), (8, 2),
    (16, 4), (16, 0), (32, 4), (32, 1), (32, 2),
]


def test_one_model_actions_unchanged():
    env = gym.make(f"commitenv/{HOUR_SCENARIO}-v0")
    obs, info = env.reset(seed=0)
    ctrl = make("dynamollm")
    ctrl.reset(ControllerContext.from_env(env), 0)
    acts = []
    done = False
    while not done:
        a = ctrl.act(obs, info)
        assert set(a) == {"active", "clock"}
        acts.append((a["active"], a["clock"]))
        obs, _, done, _, info = env.step(a)
    env.close()
    assert acts == ONE_MODEL_SEED0
