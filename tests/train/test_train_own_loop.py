"""Bring your own model and loop: the SB3 script of docs/training.md ("Your own loop") runs as written (with tiny
step counts) and its saved model runs as ``sb3:DIR`` and ``sb3:PATH.zip``; a zip of another observation size is
refused in one line naming both shapes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.paths import ROOT

pytest.importorskip("stable_baselines3")

SCENARIO = "bench-h200-hour-fixed-a30"


def own_loop_snippet() -> str:
    """The first python block under "## Your own loop" in docs/training.md."""
    doc = (ROOT / "docs" / "training.md").read_text()
    part = doc.split("## Your own loop", 1)[1]
    return re.search(r"```python\n(.*?)```", part, re.S).group(1)


@pytest.fixture(scope="module")
def own_run(tmp_path_factory) -> Path:
    """The documented loop, step counts cut to one rollout of 64 steps, run in a fresh interpreter."""
    code = own_loop_snippet()
    assert "torch.set_num_threads(1)" in code and "progress_bar=True" in code
    tiny = code.replace("STEPS = 4096", "STEPS = 64").replace("n_steps=512", "n_steps=64")
    assert tiny != code and tiny.count("64") >= 3
    d = tmp_path_factory.mktemp("own")
    proc = subprocess.run([sys.executable, "-c", tiny], cwd=d, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return d / "runs" / "own"


def test_the_documented_loop_saves_a_model_that_runs_as_sb3_dir(own_run):
    from stable_baselines3 import PPO

    from commitenv.evaluation import evaluate
    from commitenv.registry import resolve

    assert PPO.load(str(own_run / "model.zip"), device="cpu").num_timesteps == 64
    r = resolve(f"sb3:{own_run}")
    assert r.name == "sb3-own" and r.origin == f"sb3:{own_run.resolve()}"
    ctrl = r.make()
    assert ctrl.policy.algo == "ppo" and ctrl.policy.mapping == "flat" and ctrl.policy.normalizer is not None
    res = evaluate(f"sb3:{own_run / 'model.zip'}", SCENARIO, seed=100000)
    assert res.summary["controller"] == "sb3-own" and 0 <= res.summary["attainment_pct"] <= 100


def test_the_zip_acts_as_sb3_on_its_normalized_observation(own_run):
    """The controller's action on an observation = PPO's deterministic action on that observation normalized with
    the saved statistics (computed here by hand: (x - mean) / sqrt(var + eps), clipped at clip_obs)."""
    import pickle

    from stable_baselines3 import PPO

    from commitenv.train.policy import TrainedPolicy

    policy = TrainedPolicy(own_run / "model.zip")
    model = PPO.load(str(own_run / "model.zip"), device="cpu")
    with (own_run / "vecnormalize.pkl").open("rb") as fh:
        norm = pickle.load(fh)
    rng = np.random.default_rng(0)
    for _ in range(5):
        obs = rng.uniform(-1, 1, 16).astype(np.float32)
        by_hand = np.clip((obs - norm.obs_rms.mean) / np.sqrt(norm.obs_rms.var + norm.epsilon), -norm.clip_obs,
                          norm.clip_obs).astype(np.float32)
        expected, _ = model.predict(by_hand[None], deterministic=True)
        np.testing.assert_array_equal(policy.predict(obs), expected[0])


def test_a_zip_of_another_observation_size_is_refused_naming_both(tmp_path):
    import gymnasium as gym
    from stable_baselines3 import A2C

    from commitenv.registry import resolve

    model = A2C("MlpPolicy", gym.make("CartPole-v1"), n_steps=8, seed=0, device="cpu")
    model.save(str(tmp_path / "cartpole.zip"))
    with pytest.raises(ValueError) as e:
        resolve(f"sb3:{tmp_path / 'cartpole.zip'}").make()
    msg = str(e.value)
    assert "\n" not in msg and "shape (4,)" in msg and "16 features, shape (16,)" in msg and "cartpole.zip" in msg


def test_sb3_folder_without_a_model_is_refused(tmp_path):
    from commitenv.registry import resolve

    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"no model to run: expected model.zip .* found no .zip"):
        resolve(f"sb3:{tmp_path / 'empty'}")
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(ValueError, match="is a file but not a .zip"):
        resolve(f"sb3:{tmp_path / 'notes.txt'}")
