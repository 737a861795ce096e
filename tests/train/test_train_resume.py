"""``commitenv train --resume``: a run killed at arbitrary points (SIGKILL, SIGTERM) and resumed each time ends with
the same model, normalizer statistics and evaluation log as the same run left alone; resume restores the options
the run started with, refuses conflicting ones, another algorithm or scenario, and a half-written evaluation log, each
in one line; train.json never stays ``running`` after a handled exit."""

from __future__ import annotations

import json
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

SCENARIO = "bench-h200-hour-fixed-a30"  # 60 steps per episode
TINY = "n_steps: 32\nbatch_size: 16\nn_epochs: 1\n"  # rollouts of 32 steps: boundaries fall inside episodes
STEPS = 160
FLAGS = ["--eval-freq", "64", "--eval-episodes", "1", "--checkpoint-freq", "32", "--seed", "3", "--quiet",
         "--no-score"]


def _argv(out: Path, cfg: Path | None, resume: bool) -> list[str]:
    if resume:  # only what resuming needs: the options come from train.json
        return ["train", SCENARIO, "--out", str(out), "--resume", "--quiet", "--no-score"]
    return ["train", SCENARIO, "--steps", str(STEPS), "--config", str(cfg), "--out", str(out), *FLAGS]


def _spawn(argv: list[str]) -> subprocess.Popen:
    code = f"import sys; from commitenv.cli import main; sys.exit(main({argv!r}))"
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _complete_checkpoints(out: Path) -> int:
    return len(list((out / "checkpoints").glob("model_state_*_steps.pkl"))) if (out / "checkpoints").is_dir() else 0


def _training_pid(out: Path) -> int | None:
    """The pid of the process training in ``out`` (train.json is rewritten with it when a segment starts)."""
    try:
        return json.loads((out / "train.json").read_text()).get("pid")
    except (OSError, ValueError):
        return None


def _params(path: Path) -> dict[str, np.ndarray]:
    from stable_baselines3 import PPO

    model = PPO.load(str(path), device="cpu")
    return {k: v.numpy().copy() for k, v in model.policy.state_dict().items()}


def _obs_stats(path: Path) -> tuple[np.ndarray, np.ndarray, float]:
    with path.open("rb") as fh:
        norm = pickle.load(fh)
    return norm.obs_rms.mean, norm.obs_rms.var, norm.ret_rms.var


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The run left alone."""
    from commitenv.cli import main

    d = tmp_path_factory.mktemp("ref")
    cfg = d / "ppo.yaml"
    cfg.write_text(TINY)
    assert main(_argv(d / "run", cfg, resume=False)) == 0
    return d / "run"


def test_killed_and_resumed_run_ends_with_the_same_model(reference, tmp_path):
    """Three interruptions at points drawn at random once the process trains (right away, then after the 2nd and
    4th checkpoint, each up to a rollout's time later, i.e. mostly mid-rollout): SIGKILL, SIGTERM, SIGKILL; resumed
    after each."""
    cfg = tmp_path / "ppo.yaml"
    cfg.write_text(TINY)
    out = tmp_path / "run"
    rng = random.Random(2026)
    kills = [(0, signal.SIGKILL), (2, signal.SIGTERM), (4, signal.SIGKILL)]  # (checkpoints written, signal)
    first = True
    for after, sig in kills:
        proc = _spawn(_argv(out, cfg, resume=not first))
        first = False
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if _training_pid(out) == proc.pid and _complete_checkpoints(out) >= after:
                break
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.4))  # up to about one rollout of 32 steps
        if proc.poll() is None:
            proc.send_signal(sig)
        rc = proc.wait(timeout=120)
        if sig == signal.SIGTERM and rc == 130:  # handled: a checkpoint written, the exit recorded
            assert json.loads((out / "train.json").read_text())["status"] == "interrupted"
    if json.loads((out / "train.json").read_text())["status"] != "finished":  # (else the last kill came too late)
        proc = _spawn(_argv(out, cfg, resume=True))
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err.decode()[-2000:]

    rec = json.loads((out / "train.json").read_text())
    ref = json.loads((reference / "train.json").read_text())
    assert rec["status"] == "finished" and rec["steps_done"] == ref["steps_done"] == STEPS
    for name in ("model.zip", "best_model.zip"):
        a, b = _params(reference / name), _params(out / name)
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{name}: {k}")
    for x, y in zip(_obs_stats(reference / "vecnormalize.pkl"), _obs_stats(out / "vecnormalize.pkl")):
        np.testing.assert_array_equal(x, y)
    with np.load(reference / "eval" / "evaluations.npz") as za, np.load(out / "eval" / "evaluations.npz") as zb:
        assert list(za["timesteps"]) == [64, 128, 160]  # every 64 steps, and the final policy after its update
        for key in ("timesteps", "results", "ep_lengths"):
            np.testing.assert_array_equal(za[key], zb[key])
    assert rec["evaluations"]["final"] == ref["evaluations"]["final"]


def test_resume_restores_the_options_it_started_with(reference, tmp_path):
    """The reported crash: started with --eval-episodes 1 (2 in the report), resumed without it. The resumed run
    now evaluates on the run's episodes; a conflicting option is refused in one line naming it."""
    import shutil

    from commitenv.train.trainer import TrainSpec, train

    d = tmp_path / "run"
    shutil.copytree(reference, d)
    with pytest.raises(ValueError) as e:
        train(TrainSpec(SCENARIO, steps=224, out=d, resume=True, eval_episodes=5, envs=2, progress=False))
    msg = str(e.value)
    assert "\n" not in msg and "--eval-episodes 5 (started with 1)" in msg and "--envs 2 (started with 1)" in msg
    with pytest.raises(ValueError, match=r"trained scenario 'bench-h200-hour-fixed-a30', not 'bench-h20-hour"):
        train(TrainSpec("bench-h20-hour-fixed-a30", steps=224, out=d, resume=True, progress=False))
    with pytest.raises(ValueError, match="trained algo 'ppo', not 'a2c'"):
        train(TrainSpec(SCENARIO, "a2c", steps=224, out=d, resume=True, progress=False))
    rec = train(TrainSpec(SCENARIO, steps=192, out=d, resume=True, progress=False, score=False))
    assert rec["status"] == "finished" and rec["steps_done"] == 192
    assert rec["options"] == {"algo": "ppo", "steps": 192, "envs": 1, "seed": 3, "eval_freq": 64,
                              "eval_episodes": 1, "checkpoint_freq": 32}
    assert [h["steps"] for h in rec["evaluations"]["history"]] == [64, 128, 160, 192]
    assert rec["segments"][-1]["start_step"] == 160


def test_a_half_written_evaluation_log_is_refused_in_one_line(reference, tmp_path):
    """The file the reported crash left (timesteps only) is refused naming it; a log whose rows are cut short is
    repaired to its complete rows."""
    import shutil

    from commitenv.train.resume import read_evaluations
    from commitenv.train.trainer import TrainSpec, train

    d = tmp_path / "run"
    shutil.copytree(reference, d)
    path = d / "eval" / "evaluations.npz"
    np.savez(path, timesteps=np.array([64, 128]))
    with pytest.raises(ValueError) as e:
        train(TrainSpec(SCENARIO, steps=224, out=d, resume=True, progress=False))
    assert "\n" not in str(e.value) and str(path) in str(e.value) and "half-written (no results, ep_lengths)" in str(e.value)
    assert json.loads((d / "train.json").read_text())["status"] == "finished"  # refused before anything ran
    np.savez(path, timesteps=np.array([64, 128, 160]), results=np.array([[-1.0], [-2.0]]),
             ep_lengths=np.array([[60], [60]]))
    log = read_evaluations(path, 1)
    assert log.timesteps == [64, 128] and log.results == [[-1.0], [-2.0]]
    with pytest.raises(ValueError, match="holds evaluations of 1 episodes, the run evaluates 2"):
        read_evaluations(path, 2)


def test_a_failure_is_recorded_not_left_running(reference, tmp_path, monkeypatch):
    """An exception inside training marks train.json ``failed`` with the error."""
    import shutil

    from stable_baselines3 import PPO

    from commitenv.train.trainer import TrainSpec, train

    d = tmp_path / "run"
    shutil.copytree(reference, d)

    def boom(self, *a, **k):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(PPO, "learn", boom)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(TrainSpec(SCENARIO, steps=224, out=d, resume=True, progress=False, score=False))
    rec = json.loads((d / "train.json").read_text())
    assert rec["status"] == "failed" and rec["error"] == "RuntimeError: simulated crash"


def test_a_run_killed_inside_its_final_evaluation_keeps_the_best_model(reference, tmp_path, monkeypatch):
    """Killed in the final evaluation after it found a new best, before that best was on disk: resumed, it evaluates
    the final policy again and saves the same best model (the evaluation's log row is written after the best, so a
    logged row never stands for a best that was not saved)."""
    from commitenv.train import callbacks
    from commitenv.train.trainer import TrainSpec, train

    ref_log = np.load(reference / "eval" / "evaluations.npz")
    means = ref_log["results"].mean(axis=1)
    if not means[-1] > means[:-1].max():
        pytest.skip("the final policy is not the best of this run: no best to save in its final evaluation")
    real = callbacks.save_atomically

    def killed(save, path):
        if path.name == "best_model.zip" and (path.parent / "model.zip").is_file():  # (the final evaluation's)
            raise KeyboardInterrupt("killed")
        real(save, path)

    cfg = tmp_path / "ppo.yaml"
    cfg.write_text(TINY)
    out = tmp_path / "run"
    monkeypatch.setattr(callbacks, "save_atomically", killed)
    with pytest.raises(KeyboardInterrupt):
        train(TrainSpec(SCENARIO, steps=STEPS, out=out, config=cfg, eval_freq=64, eval_episodes=1,
                        checkpoint_freq=32, seed=3, progress=False, score=False))
    monkeypatch.setattr(callbacks, "save_atomically", real)
    rec = train(TrainSpec(SCENARIO, steps=STEPS, out=out, resume=True, progress=False, score=False))
    assert rec["status"] == "finished"
    a, b = _params(reference / "best_model.zip"), _params(out / "best_model.zip")
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    with np.load(out / "eval" / "evaluations.npz") as z:
        assert list(z["timesteps"]) == list(ref_log["timesteps"])
