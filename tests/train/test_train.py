"""``commitenv train`` and trained policies as controllers (``sb3:DIR``): the action codecs and their inverses, the
hyperparameter file checks, a short PPO run (model, normalizer, train.json), resuming it, the controller acting
exactly as the SB3 policy on the same normalized observations, the spec and its recorded origin, clear errors."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from commitenv.envs.wrappers import (ACTION_WRAPPERS, BoxCodec, DiscreteCodec, FlatCodec, codec_for)
from commitenv.train.config import load_config, parse_config
from helpers.paths import ROOT

SCENARIO = "bench-h200-hour-fixed-a30"
N, LEVELS = 32, 5


# ================================================================================================ codecs
@pytest.mark.parametrize("cls", [FlatCodec, BoxCodec, DiscreteCodec])
@pytest.mark.parametrize("n, levels", [(N, LEVELS), (3, 1), (1, 4), (1, 1)])
def test_codec_inverse_is_exact_on_every_configuration(cls, n, levels):
    codec = cls(n, levels)
    seen = set()
    for a in range(1, n + 1):
        for c in range(levels):
            x = codec.encode(a, c)
            assert codec.space.contains(np.asarray(x, dtype=codec.space.dtype) if cls is not DiscreteCodec else x)
            assert codec.decode(x) == {"active": a, "clock": c}
            seen.add(np.asarray(x).tobytes())
    assert len(seen) == n * levels  # one learner action per configuration


def test_discrete_codec_is_a_bijection():
    codec = DiscreteCodec(N, LEVELS)
    assert codec.space.n == 160
    for k in range(160):
        d = codec.decode(np.int64(k))
        assert codec.encode(d["active"], d["clock"]) == k
    for bad in (160, -1, 2.0, True, np.array([1, 2])):
        with pytest.raises(ValueError, match="discrete action"):
            codec.decode(bad)


def test_flat_codec_is_a_bijection():
    codec = FlatCodec(N, LEVELS)
    for a0 in range(N):
        for c in range(LEVELS):
            d = codec.decode(np.array([a0, c]))
            assert d == {"active": a0 + 1, "clock": c}
            np.testing.assert_array_equal(codec.encode(**d), [a0, c])


def test_box_codec_rounds_to_the_nearest_grid_point_deterministically():
    codec = BoxCodec(N, LEVELS)
    rng = np.random.default_rng(0)
    for u in rng.uniform(-1, 1, (2000, 2)).astype(np.float32):
        d = codec.decode(u)
        grid = codec.encode(d["active"], d["clock"])
        # the nearest point: within half a grid step of the action, on both axes
        assert abs(float(u[0]) - grid[0]) <= 1.0 / (N - 1) + 1e-6
        assert abs(float(u[1]) - grid[1]) <= 1.0 / (LEVELS - 1) + 1e-6
        assert codec.decode(grid) == d
    assert codec.decode(np.array([-1.0, -1.0])) == {"active": 1, "clock": 0}
    assert codec.decode(np.array([1.0, 1.0])) == {"active": N, "clock": LEVELS - 1}
    assert codec.decode([0.0, 0.0]) == {"active": 1 + math.floor(15.5 + 0.5), "clock": 2}  # half up
    for bad in ([np.nan, 0.0], [0.0, np.inf], [1.5, 0.0], [0.0], "x"):
        with pytest.raises(ValueError, match="box action"):
            codec.decode(bad)


@pytest.mark.parametrize("kind", list(ACTION_WRAPPERS))
def test_wrappers_map_through_their_codec(kind):
    from commitenv.envs import CommitServeEnv

    env = ACTION_WRAPPERS[kind](CommitServeEnv(SCENARIO))
    codec = env.codec
    assert env.action_space == codec.space
    assert codec.same_shape(codec_for(kind, N, LEVELS))  # what a trained policy's controller rebuilds
    for a, c in ((1, 0), (17, 3), (N, LEVELS - 1)):
        x = env.reverse_action({"active": a, "clock": c})
        assert env.action(x) == {"active": a, "clock": c} == codec.decode(x)


# ================================================================================================ config
def test_config_unknown_key_names_the_file_and_the_key(tmp_path):
    f = tmp_path / "ppo.yaml"
    f.write_text("n_steps: 128\nn_step: 5\n")
    with pytest.raises(ValueError) as e:
        load_config(f, "ppo")
    msg = str(e.value)
    assert msg.startswith(f"{f}: unknown key 'n_step' for --algo ppo") and "n_steps" in msg
    f.write_text("policy_kwargs:\n  net_arch: [32]\n  width: 3\n")
    with pytest.raises(ValueError, match=r"unknown key 'policy_kwargs\.width' .*accepted: net_arch, activation_fn"):
        load_config(f, "ppo")
    f.write_text("exploration_fraction: 0.2\n")  # a DQN key is unknown to PPO
    with pytest.raises(ValueError, match="unknown key 'exploration_fraction' for --algo ppo"):
        load_config(f, "ppo")
    assert load_config(f, "dqn").exploration_fraction == 0.2
    f.write_text("batch_size: many\n")
    with pytest.raises(ValueError, match=rf"^{f}: batch_size: .*'many'"):
        load_config(f, "ppo")
    f.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="expected a mapping"):
        load_config(f, "ppo")
    with pytest.raises(ValueError, match="file not found"):
        load_config(tmp_path / "none.yaml", "ppo")
    cfg = parse_config({"learning_rate": "1e-4"}, "a2c")  # YAML reads 1e-4 as text: accepted as the number
    assert cfg.learning_rate == 1e-4 and cfg.n_steps == 5


# ================================================================================================ training
PPO_SMALL = "n_steps: 64\nbatch_size: 32\nn_epochs: 2\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A 128-step PPO run through the CLI (1 env), evaluated at 64 and 128 steps on one test seed, scored."""
    pytest.importorskip("stable_baselines3")
    from commitenv.cli import main

    d = tmp_path_factory.mktemp("train")
    cfg = d / "ppo.yaml"
    cfg.write_text(PPO_SMALL)
    out = d / "run"
    rc = main(["train", SCENARIO, "--algo", "ppo", "--steps", "128", "--envs", "1", "--config", str(cfg), "--out",
               str(out), "--eval-freq", "64", "--eval-episodes", "1", "--checkpoint-freq", "64", "--quiet"])
    assert rc == 0
    return out


def test_training_writes_model_normalizer_and_record(run_dir):
    for f in ("model.zip", "vecnormalize.pkl", "best_model.zip", "best_vecnormalize.pkl", "train.json",
              "checkpoints/model_64_steps.zip", "checkpoints/model_vecnormalize_128_steps.pkl", "eval/evaluations.npz"):
        assert (run_dir / f).is_file(), f
    if importlib.util.find_spec("tensorboard") is not None:  # (the rl extra installs it)
        assert (run_dir / "tb" / "progress.csv").is_file() and list((run_dir / "tb").glob("events.out.tfevents.*"))
    else:
        assert (run_dir / "logs" / "progress.csv").is_file()
    rec = json.loads((run_dir / "train.json").read_text())
    assert rec["status"] == "finished" and rec["steps_done"] == 128 and rec["algo"] == "ppo"
    assert rec["scenario"] == SCENARIO and rec["action_mapping"] == "flat"
    assert rec["command"].startswith(f"commitenv train {SCENARIO} --algo ppo --steps 128 --envs 1 --config ")
    assert rec["hyperparameters"]["n_steps"] == 64 and rec["hyperparameters"]["policy_kwargs"]["net_arch"] == [64, 64]
    assert rec["seed_ranges"] == {"train": [0, 100000], "test": [100000, 100100], "source": "scenario"}
    assert rec["train_seeds_used"] == ["0-2"]  # 128 steps of 60-step episodes: three traces started
    assert rec["eval_seeds"] == [100099]  # the end of the test range: test:N stays unseen by model selection
    assert [e["steps"] for e in rec["evaluations"]["history"]] == [64, 128]
    assert set(rec["versions"]) >= {"commitenv", "stable_baselines3", "torch", "gymnasium", "numpy", "python"}
    for which in ("final", "best"):
        s = rec["scores"][which]
        assert s["per_seed"][0]["seed"] == 100099
        assert s["cost_kwh_eq"] >= 0 and 0 <= s["attainment_pct"] <= 100
    best = rec["evaluations"]["best"]
    assert rec["scores"]["best"]["penalised_return"] == pytest.approx(best["mean_return"], rel=1e-6)
    # the final evaluation is of the final policy, after its last update (it was the one before, issue 38)
    assert rec["scores"]["final"]["penalised_return"] == pytest.approx(rec["evaluations"]["final"]["mean_return"],
                                                                       rel=1e-6)


def test_resume_continues_the_step_count(run_dir, tmp_path):
    from stable_baselines3 import PPO

    from commitenv.train.trainer import TrainSpec, train

    d = tmp_path / "run"
    shutil.copytree(run_dir, d)
    spec = TrainSpec(SCENARIO, steps=192, out=d, resume=True, progress=False, score=False)  # options: the run's
    rec = train(spec)
    assert rec["steps_done"] == 192 and rec["status"] == "finished"
    assert [(s["start_step"], s["end_step"]) for s in rec["segments"]] == [(0, 128), (128, 192)]
    # 60-step episodes: seed 2's episode (steps 120-179) was under way at 128 and is rebuilt, seed 3's starts at 180
    assert rec["segments"][1]["train_seeds"] == ["2-3"]
    assert rec["train_seeds_used"] == ["0-3"]
    assert (d / "checkpoints" / "model_192_steps.zip").is_file()
    assert PPO.load(str(d / "model.zip"), device="cpu").num_timesteps == 192
    assert [e["steps"] for e in rec["evaluations"]["history"]] == [64, 128, 192]
    with pytest.raises(ValueError, match="has trained 192 steps already"):
        train(TrainSpec(SCENARIO, "ppo", steps=150, out=d, resume=True, progress=False))
    with pytest.raises(ValueError, match="already holds a training run"):
        train(TrainSpec(SCENARIO, "ppo", steps=64, out=d, progress=False))
    with pytest.raises(ValueError, match="trained algo 'ppo', not 'a2c'"):
        train(TrainSpec(SCENARIO, "a2c", steps=400, out=d, resume=True, progress=False))
    with pytest.raises(ValueError, match="train.json not found"):
        train(TrainSpec(SCENARIO, "ppo", steps=400, out=tmp_path / "empty", resume=True, progress=False))


def test_controller_acts_exactly_as_the_sb3_policy(run_dir):
    """Step an episode in the training env setup (VecNormalize frozen, SB3's predict on its normalized
    observations) and ask the controller with the raw observation at every step: same normalized input, same
    action."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from commitenv.control import ControllerContext
    from commitenv.envs import CommitServeEnv, FlatActionWrapper
    from commitenv.registry import resolve

    for which, (zip_name, pkl) in {"final": ("model.zip", "vecnormalize.pkl"),
                                   "best": ("best_model.zip", "best_vecnormalize.pkl")}.items():
        model = PPO.load(str(run_dir / zip_name), device="cpu")
        venv = VecNormalize.load(str(run_dir / pkl), DummyVecEnv([lambda: FlatActionWrapper(CommitServeEnv(SCENARIO))]))
        venv.training, venv.norm_reward = False, False
        ctrl = resolve(f"sb3:{run_dir}").make(which=which)
        assert ctrl.which == which
        venv.seed(100000)
        obs = venv.reset()
        ctrl.reset(ControllerContext.from_env(venv.envs[0]), 0)
        info: dict = {}
        done, steps = False, 0
        while not done:
            raw = venv.get_original_obs()[0]
            np.testing.assert_array_equal(ctrl.policy.normalize(raw), obs)
            ref, _ = model.predict(obs, deterministic=True)
            got = ctrl.act(raw, info)
            assert got == venv.envs[0].codec.decode(ref[0]), f"step {steps}"
            obs, _, dones, infos = venv.step(ref)
            done, info, steps = bool(dones[0]), infos[0], steps + 1
        assert steps == 60
        venv.close()


SHIPPED_POLICIES = {"ppo-h200-hour": SCENARIO, "ppo-h20-hour": "bench-h20-hour-fixed-a30",
                    "ppo-h200-day": "bench-h200-day", "ppo-h20-day": "bench-h20-day"}
# behaviour cloning (commitenv.train.bc), docs/results/learners.md
SHIPPED_CLONES = {"bc-mpc-h200-hour": SCENARIO, "bc-mpc-h20-hour": "bench-h20-hour-fixed-a30",
                  # one clone per pool over its six dev-family hours (the record's scenario: the first of them)
                  "bc-mpc-h200-family": "bench-h200-hour-fixed-a25", "bc-mpc-h20-family": "bench-h20-hour-fixed-a25",
                  # one clone per pool over every public hour family of its pool (dev's and the held-out ones)
                  "bc-mpc-h200-public": "bench-h200-hour-fixed-a25", "bc-mpc-h20-public": "bench-h20-hour-fixed-a25",
                  # the same families with a teacher per scenario (MPC or ePACT+, the better on its train seeds)
                  "bc-mix-h200-public": "bench-h200-hour-fixed-a25", "bc-mix-h20-public": "bench-h20-hour-fixed-a25",
                  # the same families taught by ePACT+ with its miss margin (the planner that keeps the SLO gate)
                  "bc-margin-h200-public": "bench-h200-hour-fixed-a25", "bc-margin-h20-public": "bench-h20-hour-fixed-a25",
                  # the same teacher, with DAgger rounds and the clone decoded to its teacher's (count, clock) pairs
                  "dagger-margin-h200-public": "bench-h200-hour-fixed-a25",
                  "dagger-margin-h20-public": "bench-h20-hour-fixed-a25",
                  # ... with MPC with its margin teaching the hours where ePACT+ with its margin failed the gate
                  "dagger-gate-h200-public": "bench-h200-hour-fixed-a25",
                  # a day's clone of ePACT+ with its miss margin (the expert's arguments in its bc.yaml)
                  "bc-epactplus-h200-day": "bench-h200-day", "bc-epactplus-h20-day": "bench-h20-day"}


def test_every_shipped_baseline_is_listed():
    from commitenv_controllers.sb3_policy import shipped

    assert shipped() == sorted({**SHIPPED_POLICIES, **SHIPPED_CLONES})


@pytest.mark.parametrize("name", sorted(SHIPPED_CLONES))
def test_the_shipped_clone_is_its_recorded_run(name):
    """A shipped behaviour-cloned policy ships its option file, its record says it was fitted with exactly those
    options on its scenario, and it runs as ``sb3:<name>`` (a PPO policy on the flat action)."""
    pytest.importorskip("stable_baselines3")
    from commitenv.control import ControllerContext
    from commitenv.envs import CommitServeEnv
    from commitenv.registry import resolve
    from commitenv.train.bc import load_options

    base = ROOT / "controllers" / "commitenv_controllers" / "data" / name
    rec = json.loads((base / "train.json").read_text())
    assert (rec["scenario"], rec["algo"], rec["action_mapping"], rec["status"]) == (SHIPPED_CLONES[name], "ppo",
                                                                                   "flat", "finished")
    for k, v in load_options(base / "bc.yaml").items():
        if k == "experts":  # (recorded as validated: a spec given alone becomes {expert: spec})
            v = {n: ({"expert": t} if isinstance(t, str) else t) for n, t in v.items()}
        assert rec["bc"][k] == v, k
    env = CommitServeEnv(SHIPPED_CLONES[name])
    assert rec["bc"]["demo_samples"] == env.H * env.K * rec["bc"]["demo_episodes"]  # one sample per decision
    ctrl = resolve(f"sb3:{name}").make()
    obs, info = env.reset(seed=100000)
    ctrl.reset(ControllerContext.from_env(env), 0)
    for _ in range(3):
        a = ctrl.act(obs, info)
        assert 1 <= a["active"] <= env.n_replicas and 0 <= a["clock"] < len(env.clocks_mhz)
        obs, _, _, _, info = env.step(a)


@pytest.mark.parametrize("name", sorted(SHIPPED_POLICIES))
def test_the_shipped_baseline_is_its_recorded_run_and_acts_as_sb3(name):
    """A shipped policy (`sb3:ppo-h200-hour`, `sb3:ppo-h20-hour`, `sb3:ppo-h200-day`, `sb3:ppo-h20-day`) ships its
    hyperparameter file, its record says it was trained with exactly those settings on its scenario, and the
    controller takes SB3's deterministic action on the first steps of a report seed."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from commitenv.control import ControllerContext
    from commitenv.envs import CommitServeEnv, FlatActionWrapper
    from commitenv.registry import resolve

    scenario = SHIPPED_POLICIES[name]
    base = ROOT / "controllers" / "commitenv_controllers" / "data" / name
    rec = json.loads((base / "train.json").read_text())
    assert (rec["scenario"], rec["algo"], rec["status"]) == (scenario, "ppo", "finished")
    assert rec["steps_done"] >= rec["steps"]
    # (a key added since the run reads as its default)
    assert parse_config(rec["hyperparameters"], "ppo") == load_config(base / "ppo.yaml", "ppo")
    model = PPO.load(str(base / "best_model.zip"), device="cpu")
    venv = VecNormalize.load(str(base / "best_vecnormalize.pkl"),
                             DummyVecEnv([lambda: FlatActionWrapper(CommitServeEnv(scenario))]))
    venv.training, venv.norm_reward = False, False
    ctrl = resolve(f"sb3:{name}").make()
    venv.seed(100000)
    obs = venv.reset()
    ctrl.reset(ControllerContext.from_env(venv.envs[0]), 0)
    info: dict = {}
    for step in range(5):
        ref, _ = model.predict(obs, deterministic=True)
        assert ctrl.act(venv.get_original_obs()[0], info) == venv.envs[0].codec.decode(ref[0]), f"step {step}"
        obs, _, _, infos = venv.step(ref)
        info = infos[0]
    venv.close()


def test_sb3_spec_resolves_and_round_trips_through_its_origin(run_dir, monkeypatch):
    from commitenv.evaluation import evaluate
    from commitenv.registry import check_kwargs, origin_of, resolve, spec_from_origin

    r = resolve(f"sb3:{run_dir}")
    assert r.origin == f"sb3:{run_dir.resolve()}" and r.name == f"sb3-{run_dir.name}"
    assert spec_from_origin(r.origin, r.name) == r.origin
    again = resolve(spec_from_origin(r.origin, r.name))
    assert (again.name, again.origin) == (r.name, r.origin)
    monkeypatch.chdir(run_dir.parent)
    assert resolve(f"sb3:{run_dir.name}").origin == r.origin  # a relative folder records its absolute path
    assert check_kwargs(r, {"which": "final"}) == {"which": "final"}
    with pytest.raises(ValueError, match="unknown argument 'path'"):
        check_kwargs(r, {"path": "/elsewhere"})
    with pytest.raises(ValueError, match="which"):
        check_kwargs(r, {"which": "latest"})
    ctrl = r.make()
    assert origin_of(ctrl) == r.origin and ctrl.name == r.name
    res = evaluate(f"sb3:{run_dir}", SCENARIO, seed=100000, controller_kwargs={"which": "final"})
    assert res.summary["controller"] == r.name and res.summary["controller_origin"] == r.origin
    assert res.summary["controller_kwargs"] == {"which": "final"}


def test_sb3_spec_errors_are_clear(tmp_path):
    from commitenv.registry import resolve

    with pytest.raises(ValueError, match=r"controller 'sb3:/no/such/run': no folder /no/such/run \(expected the --out"):
        resolve("sb3:/no/such/run")
    with pytest.raises(ValueError, match="expected sb3:DIR"):
        resolve("sb3:")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "model.zip").write_bytes(b"")
    (tmp_path / "half" / "train.json").write_text("{}")
    with pytest.raises(ValueError, match="not a finished training run: missing vecnormalize.pkl"):
        resolve(f"sb3:{tmp_path / 'half'}")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file but not a .zip"):
        resolve(f"sb3:{tmp_path / 'file'}")
    (tmp_path / "broken.zip").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="broken.zip: not a stable-baselines3 model zip"):
        resolve(f"sb3:{tmp_path / 'broken.zip'}").make()


def test_policy_refuses_another_pool_shape(run_dir):
    from commitenv.train.policy import TrainedPolicy

    p = TrainedPolicy(run_dir, "final")
    with pytest.raises(ValueError, match=r"this pool \(8 replicas x 5 clock levels\)"):
        p.codec(8, (345, 690, 1035, 1380, 1710))
    with pytest.raises(ValueError, match=r"expects observations of shape \(16,\)"):
        p.predict(np.zeros(15, np.float32))


def test_cli_reports_a_bad_config_key(tmp_path, capsys):
    from commitenv.cli import main

    cfg = tmp_path / "bad.yaml"
    cfg.write_text("learning_rat: 0.001\n")
    assert main(["train", SCENARIO, "--config", str(cfg), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{cfg}: unknown key 'learning_rat' for --algo ppo" in err
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_initial_action_sets_the_new_policy_s_first_choices(tmp_path):
    """``initial_action`` makes a new PPO policy pick the configuration with the given probability per component,
    the other values sharing the rest evenly, on any observation; a configuration outside the pool is refused
    before anything is written."""
    pytest.importorskip("stable_baselines3")
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from commitenv.envs import CommitServeEnv
    from commitenv.envs.wrappers import FlatActionWrapper
    from commitenv.train.config import InitialAction
    from commitenv.train.trainer import TrainSpec, start_near, train

    venv = DummyVecEnv([lambda: FlatActionWrapper(CommitServeEnv(SCENARIO))])
    codec = venv.get_attr("codec")[0]
    n, levels = codec.n, codec.levels
    assert (n, levels) == (32, 5)
    rng = np.random.default_rng(3)
    obs = torch.as_tensor(np.concatenate([venv.reset(), rng.normal(0.0, 3.0, (7, venv.observation_space.shape[0]))]),
                          dtype=torch.float32)
    for init, (a_idx, c_idx) in ((InitialAction(active=30, clock=2, probability=0.7), (29, 2)),
                                 (InitialAction(), (n - 1, levels - 1))):
        model = PPO("MlpPolicy", venv, seed=0, device="cpu")
        chosen = start_near(model, codec, init)
        assert chosen == {"active": a_idx + 1, "clock": c_idx}
        p = init.probability
        with torch.no_grad():
            probs = [d.probs.numpy() for d in model.policy.get_distribution(obs).distribution]
        for comp, (k, size) in zip(probs, ((a_idx, n), (c_idx, levels))):
            expected = np.full(size, (1.0 - p) / (size - 1))
            expected[k] = p
            np.testing.assert_allclose(comp, np.broadcast_to(expected, comp.shape), atol=0.01)
    model = PPO("MlpPolicy", venv, seed=0, device="cpu")
    with pytest.raises(ValueError, match=r"initial_action\.active: expected 'all' or 1\.\.32 .*got 33"):
        start_near(model, codec, InitialAction(active=33))
    with pytest.raises(ValueError, match=r"initial_action\.clock: expected 'top' or a clock index in 0\.\.4, got 5"):
        start_near(model, codec, InitialAction(clock=5))
    with pytest.raises(ValueError, match="probability"):
        parse_config({"initial_action": {"probability": 1.0}}, "ppo")
    with pytest.raises(ValueError, match="unknown key 'initial_action' for --algo dqn"):
        parse_config({"initial_action": {}}, "dqn")
    out = tmp_path / "o"
    with pytest.raises(ValueError, match=r"initial_action\.active"):
        train(TrainSpec(SCENARIO, "ppo", steps=64, out=out, progress=False,
                        hyperparameters={"initial_action": {"active": 40}}))
    assert not out.exists()  # nothing half-written


def test_importing_the_training_cli_loads_no_learning_stack():
    code = ("import sys, commitenv.cli, commitenv.train, commitenv.train.cli, commitenv.train.config; "
            "bad = [m for m in ('torch', 'stable_baselines3', 'commitenv_controllers') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ================================================================================================ observation
def test_observation_is_scaled_for_learners():
    from commitenv.envs import OBS_FEATURES, CommitServeEnv

    env = CommitServeEnv(SCENARIO)
    obs, _ = env.reset(seed=100000)
    f = dict(zip(OBS_FEATURES, obs.tolist()))
    assert f["target"] == pytest.approx(0.0, abs=1e-6)  # on track: the remaining commitment's even split is nominal
    assert f["last_interval_energy"] == pytest.approx(-math.log(2))  # no energy yet: slog(0 - 1)
    assert f["hour_energy"] == 0.0 and f["hour_of_horizon"] == 0.0
    for k in range(5):
        obs, *_ = env.step({"active": N, "clock": LEVELS - 1})
        assert env.observation_space.contains(obs)
        assert np.all(np.abs(obs) <= 1.5), dict(zip(OBS_FEATURES, obs.tolist()))


# ================================================================================================ slow
@pytest.mark.slow
@pytest.mark.parametrize("algo, mapping", [("sac", "box"), ("dqn", "discrete"), ("a2c", "flat")])
def test_other_algorithms_train_and_run_as_controllers(algo, mapping, tmp_path):
    pytest.importorskip("stable_baselines3")
    from commitenv.evaluation import evaluate
    from commitenv.train.trainer import TrainSpec, train

    hp = {"sac": {"learning_starts": 16, "batch_size": 16}, "dqn": {"learning_starts": 16, "batch_size": 16},
          "a2c": {}}[algo]
    rec = train(TrainSpec(SCENARIO, algo, steps=64, out=tmp_path / algo, eval_freq=0, eval_episodes=1,
                          progress=False, score=False, hyperparameters=hp))
    assert rec["action_mapping"] == mapping and rec["steps_done"] >= 64
    res = evaluate(f"sb3:{tmp_path / algo}", SCENARIO, seed=100000)
    assert res.summary["controller"] == f"sb3-{algo}"


@pytest.mark.slow
def test_two_envs_in_subprocesses(tmp_path):
    pytest.importorskip("stable_baselines3")
    from commitenv.train.trainer import TrainSpec, train

    rec = train(TrainSpec(SCENARIO, "ppo", steps=256, envs=2, out=tmp_path / "r", eval_freq=0, eval_episodes=1,
                          progress=False, score=False, hyperparameters={"n_steps": 64, "batch_size": 32}))
    assert rec["steps_done"] == 256 and rec["envs"] == 2
    assert rec["train_seeds_used"] == ["0-5"]  # env 0: 0, 2, 4; env 1: 1, 3, 5


# ================================================================================================ ppo-lagrangian
def test_ppo_lagrangian_updates_one_shared_multiplier_by_dual_ascent(tmp_path):
    pytest.importorskip("stable_baselines3")
    from commitenv.train.trainer import TrainSpec, train

    rec = train(TrainSpec(SCENARIO, "ppo-lagrangian", steps=192, out=tmp_path / "lag", eval_freq=0, eval_episodes=1,
                          progress=False, score=False,
                          hyperparameters={"n_steps": 64, "batch_size": 32, "lagrangian": {"lr": 0.5}}))
    lag = rec["lagrangian"]
    assert rec["algo"] == "ppo-lagrangian" and rec["action_mapping"] == "flat"
    assert lag["limit"] == 0.01 and lag["lr"] == 0.5 and len(lag["history"]) == 3  # an episode ends in each rollout
    lam = 0.015  # the scenario's miss penalty: where the multiplier starts
    for steps, got, worst in lag["history"]:
        assert 0.0 <= worst <= 1.0
        lam = max(0.0, lam + 0.5 * (worst - 0.01))  # dual ascent on the measured violation, by hand
        assert got == pytest.approx(lam, rel=1e-12)
    assert lag["multiplier"] == pytest.approx(lam, rel=1e-12)


def test_lagrangian_reward_refuses_bad_multipliers_and_config():
    from commitenv.envs import CommitServeEnv, LagrangianReward
    from commitenv.train.config import parse_config

    env = CommitServeEnv(SCENARIO)
    for bad in ("0.1", -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="multiplier must be a finite number >= 0"):
            LagrangianReward(env, bad)
    with pytest.raises(ValueError, match="lagrangian.initial_multiplier"):
        parse_config({"lagrangian": {"initial_multiplier": "high"}}, "ppo-lagrangian")
    with pytest.raises(ValueError, match="lagrangian"):
        parse_config({"lagrangian": {"lr": 1.0}}, "ppo")  # only ppo-lagrangian has a multiplier
