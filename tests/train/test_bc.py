"""Behaviour cloning (`commitenv.train.bc`): the fit reproduces a hand-written rule on synthetic data, and a clone of
vLLM's constant configuration, saved as a run folder, runs as ``sb3:DIR`` and acts as vLLM does."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest


def test_fit_policy_learns_a_hand_checkable_rule():
    pytest.importorskip("stable_baselines3")
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from commitenv.envs.wrappers import ACTION_WRAPPERS
    from commitenv.envs.commit_serve import CommitServeEnv
    from commitenv.train.bc import fit_policy

    torch.manual_seed(0)
    env = DummyVecEnv([lambda: ACTION_WRAPPERS["flat"](CommitServeEnv("bench-h200-hour-fixed-a30"))])
    model = PPO("MlpPolicy", env, seed=0, device="cpu", n_steps=64)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 16)).astype(np.float32)
    # the rule: feature 0 > 0 -> every replica at the top clock (indices 31, 4); else 8 replicas at clock 1 (7, 1)
    y = np.where(x[:, :1] > 0, [[31, 4]], [[7, 1]]).astype(np.int64)
    losses = fit_policy(model, x, y, epochs=40, batch_size=64, lr=3e-3, seed=0)
    assert losses[-1] < 0.1 * losses[0]
    pred, _ = model.predict(x, deterministic=True)
    assert (pred == y).all()
    test = np.zeros((2, 16), dtype=np.float32)
    test[0, 0], test[1, 0] = 2.0, -2.0
    assert model.predict(test, deterministic=True)[0].tolist() == [[31, 4], [7, 1]]


def test_clone_of_vllm_runs_as_sb3_controller_and_acts_as_vllm(tmp_path):
    pytest.importorskip("stable_baselines3")
    from commitenv.control import ControllerContext
    from commitenv.envs.commit_serve import CommitServeEnv
    from commitenv.registry import resolve
    from commitenv.train.bc import BCSpec, train_bc

    demos = tmp_path / "demos.npz"
    spec = BCSpec("bench-h200-hour-fixed-a30", tmp_path / "bc", expert="vllm", demo_episodes=1, epochs=30,
                  batch_size=16, learning_rate=3e-3, demos=demos)
    rec = train_bc(spec, progress=False)
    assert demos.is_file() and rec["bc"]["demo_samples"] == 60  # 60 one-minute intervals
    assert rec["bc"]["rounds"][-1]["train_accuracy"] == [1.0, 1.0]
    saved = json.loads((tmp_path / "bc" / "train.json").read_text())
    assert saved["algo"] == "ppo" and saved["action_mapping"] == "flat" and "commitenv.train.bc" in saved["command"]
    ctrl = resolve(f"sb3:{tmp_path / 'bc'}").make()
    env = CommitServeEnv("bench-h200-hour-fixed-a30")
    obs, info = env.reset(seed=100000)
    ctrl.reset(ControllerContext.from_env(env), 0)
    for _ in range(3):
        assert ctrl.act(obs, info) == {"active": 32, "clock": 4}  # vLLM: every replica at the top clock
        obs, _, _, _, info = env.step({"active": 32, "clock": 4})
    # a second learner seed reuses the cached demonstrations; another expert's file is refused
    train_bc(BCSpec("bench-h200-hour-fixed-a30", tmp_path / "bc2", expert="vllm", demo_episodes=1, epochs=2,
                    seed=1, demos=demos), progress=False)
    with pytest.raises(ValueError, match="--demos"):
        train_bc(BCSpec("bench-h200-hour-fixed-a30", tmp_path / "bc3", expert="fixed_config", demo_episodes=1,
                        epochs=2, demos=demos), progress=False)
    with pytest.raises(ValueError, match="already holds"):
        train_bc(BCSpec("bench-h200-hour-fixed-a30", tmp_path / "bc", expert="vllm", demo_episodes=1, demos=demos),
                 progress=False)


def test_bc_config_file_checked_and_flags_win(tmp_path, monkeypatch):
    from commitenv.train import bc

    bad = tmp_path / "bad.yaml"
    bad.write_text("expert: mpc\ndemo_episode: 3\n")
    with pytest.raises(ValueError, match="bad.yaml: unknown key 'demo_episode'"):
        bc.load_options(bad)
    bad.write_text("epochs: ten\n")
    with pytest.raises(ValueError, match="epochs: wrong type"):
        bc.load_options(bad)
    good = tmp_path / "bc.yaml"
    good.write_text("expert: epact_plus\nepochs: 7\nnet_arch: [32, 16]\nlearning_rate: 3.0e-4\n")
    seen = {}
    monkeypatch.setattr(bc, "train_bc",
                        lambda spec: seen.setdefault("spec", spec) and {"wall_s": 0, "bc": {"rounds": []}})
    argv = ["bench-h200-hour-fixed-a30", "--config", str(good), "--epochs", "9", "--out", str(tmp_path / "o")]
    assert bc.main(argv) == 0
    spec = seen["spec"]
    assert (spec.expert, spec.epochs, spec.net_arch, spec.learning_rate) == ("epact_plus", 9, [32, 16], 3e-4)
    assert "--config" in spec.command()


def test_demonstrations_go_round_robin_over_one_pools_scenarios_with_drawn_commitment_scales():
    from commitenv.scenarios import load_scenario
    from commitenv.scenarios.loader import scaled_commitment
    from commitenv.train.bc import demo_episodes

    names = ["bench-h200-hour-fixed-a30", "bench-h200-hour-decreasing-a25", "bench-h200-hour-fixed-a35"]
    lows = [load_scenario(n).seeds.train[0] for n in names]
    eps = demo_episodes(names, 0, 7, (0.9, 1.1))
    # episode j: scenario j mod 3, its train seed number j // 3
    assert [(e.scenario, e.seed) for e in eps] == [(names[j % 3], lows[j % 3] + j // 3) for j in range(7)]
    assert all(0.9 <= e.commitment_scale <= 1.1 for e in eps) and len({e.commitment_scale for e in eps}) == 7
    assert demo_episodes(names, 3, 4, (0.9, 1.1)) == eps[3:]  # DAgger rounds continue the same sequence
    assert {e.commitment_scale for e in demo_episodes(names, 0, 4, (1.0, 1.0))} == {1.0}
    # the scale reaches the commitment: fractions of the reference run, scaled
    base, scaled = load_scenario(names[0]), scaled_commitment(names[0], 1.1)
    assert scaled.commitment.fractions == pytest.approx([f * 1.1 for f in base.commitment.fractions])


def test_one_policy_serves_one_pool(tmp_path):
    pytest.importorskip("stable_baselines3")
    from commitenv.train.bc import BCSpec, train_bc

    spec = BCSpec(["bench-h200-hour-fixed-a30", "bench-h20-hour-fixed-a30"], tmp_path / "bc", expert="vllm",
                  demo_episodes=2, epochs=1)
    with pytest.raises(ValueError, match="bench-h20-hour-fixed-a30: its pool .* differs from bench-h200-hour-fixed"):
        train_bc(spec, progress=False)
    with pytest.raises(ValueError, match="--commitment-scale"):
        train_bc(BCSpec("bench-h200-hour-fixed-a30", tmp_path / "bc", commitment_scale=(1.1, 0.9)), progress=False)
    assert not (tmp_path / "bc").exists()


def test_expert_arguments_reach_the_expert_and_key_its_demonstrations(tmp_path, monkeypatch):
    from commitenv.train import bc

    # the labels are the configured expert's: Fixed-Config told to keep 20 replicas at 1035 MHz (clock index 2)
    eps = [bc.DemoEpisode("bench-h200-hour-fixed-a30", 0)]
    data = bc.collect(eps, "fixed_config", expert_args={"active": 20, "clock_mhz": 1035})
    assert data["act"].tolist() == [[19, 2]] * 60  # flat codec: active - 1, clock index
    # the command line: values as JSON, validated against the expert's declared arguments
    seen = {}
    monkeypatch.setattr(bc, "train_bc",
                        lambda spec: seen.setdefault("spec", spec) and {"wall_s": 0, "bc": {"rounds": []}})
    assert bc.main(["bench-h200-hour-fixed-a30", "--expert", "fixed_config", "--expert-arg", "active=20",
                    "--out", str(tmp_path / "o")]) == 0
    spec = seen["spec"]
    assert spec.expert_args == {"active": 20} and "--expert-arg active=20" in spec.command()
    assert bc.main(["bench-h200-hour-fixed-a30", "--expert", "fixed_config", "--expert-arg", "actve=20",
                    "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o").exists()
    # a demonstration file of the unconfigured expert is not taken for the configured one's
    demos = tmp_path / "d.npz"
    plain = bc.BCSpec("bench-h200-hour-fixed-a30", tmp_path / "a", expert="fixed_config", demo_episodes=1,
                      demos=demos)
    bc._demos(plain, eps, progress=False)
    configured = bc.BCSpec("bench-h200-hour-fixed-a30", tmp_path / "b", expert="fixed_config", demo_episodes=1,
                           demos=demos, expert_args={"active": 20})
    with pytest.raises(ValueError, match="--demos"):
        bc._demos(configured, eps, progress=False)


def test_a_scenario_can_have_its_own_teacher(tmp_path, monkeypatch):
    """Per-scenario teachers (``experts`` / ``--teacher``): each episode is labelled by its scenario's teacher, the
    demonstration file is keyed by them, and a bad entry is one error naming it, nothing written."""
    from commitenv.train import bc

    h200 = ["bench-h200-hour-fixed-a30", "bench-h200-hour-decreasing-a30"]
    eps = [bc.DemoEpisode(h200[0], 0), bc.DemoEpisode(h200[1], 0)]
    spec = bc.BCSpec(h200, tmp_path / "a", expert="fixed_config", expert_args={"active": 20, "clock_mhz": 1035},
                     experts={h200[1]: {"expert": "fixed_config", "args": {"active": 7, "clock_mhz": 1710}}})
    data = bc.collect(eps, spec.expert, expert_args=spec.expert_args, teachers=spec.teachers())
    from commitenv.envs import CommitServeEnv

    clocks = list(CommitServeEnv(h200[0]).clocks_mhz)
    first, second = data["act"][data["episode"] == 0], data["act"][data["episode"] == 1]
    assert first.tolist() == [[19, clocks.index(1035)]] * 60
    assert second.tolist() == [[6, clocks.index(1710)]] * 60
    # the command line and config give the same teachers; the command records them
    seen = {}
    monkeypatch.setattr(bc, "train_bc", lambda s: seen.setdefault("spec", s) and {"wall_s": 0, "bc": {"rounds": []}})
    cfg = tmp_path / "bc.yaml"
    cfg.write_text(f"expert: mpc\nexperts:\n  {h200[1]}: epact_plus\n")
    assert bc.main([*h200, "--config", str(cfg), "--out", str(tmp_path / "o")]) == 0
    assert seen.pop("spec").teachers() == {h200[0]: ("mpc", {}), h200[1]: ("epact_plus", {})}
    assert bc.main([*h200, "--teacher", f'{h200[0]}={{"expert": "fixed_config", "args": {{"active": 3}}}}',
                    "--out", str(tmp_path / "o")]) == 0
    got = seen.pop("spec")
    assert got.teachers()[h200[0]] == ("fixed_config", {"active": 3})
    import shlex

    assert bc.main(shlex.split(got.command())[3:]) == 0  # the recorded command gives the same teachers back
    assert seen.pop("spec").teachers() == got.teachers()
    # a demonstration file made with other teachers is refused
    demos = tmp_path / "d.npz"
    bc._demos(bc.BCSpec(h200, tmp_path / "b", expert="vllm", demos=demos), eps[:1], progress=False)
    with pytest.raises(ValueError, match="--demos"):
        bc._demos(bc.BCSpec(h200, tmp_path / "c", expert="vllm", demos=demos, experts={h200[1]: {"expert": "mpc"}}),
                  eps[:1], progress=False)
    # bad entries: a scenario not trained on, an unknown controller, an undeclared argument, a malformed value
    for item, msg in [("bench-h20-hour-fixed-a30=mpc", "not one of the scenarios trained on"),
                      (f"{h200[0]}=no_such_controller", f"experts: {h200[0]}"),
                      (f'{h200[0]}={{"expert": "fixed_config", "args": {{"actve": 3}}}}', "actve"),
                      (f'{h200[0]}={{"expert": "mpc", "extra": 1}}', "expected a controller spec")]:
        buf = io.StringIO()
        with contextlib.redirect_stderr(buf):
            assert bc.main([*h200, "--teacher", item, "--out", str(tmp_path / "bad")]) == 2
        assert msg in buf.getvalue(), (item, buf.getvalue())
        assert not (tmp_path / "bad").exists()


class _FixedLogits:
    """A stand-in SB3 policy whose MultiDiscrete head gives the same per-component probabilities for every row."""

    def __init__(self, *probs):
        self.probs = probs

    def get_distribution(self, obs):
        import torch

        n = obs.shape[0]
        cats = [torch.distributions.Categorical(probs=torch.tensor([p] * n, dtype=torch.float32)) for p in self.probs]
        return type("Dist", (), {"distribution": cats})()


def test_support_decoding_picks_the_most_probable_demonstrated_pair_by_hand():
    pytest.importorskip("torch")
    from commitenv.train.policy import support_argmax

    # count: [0.6, 0.4]; clock: [0.55, 0.45]. Each component's argmax is (0, 0), never demonstrated. Joint
    # probabilities of the demonstrated pairs: (0, 1) 0.6 x 0.45 = 0.27, (1, 0) 0.4 x 0.55 = 0.22 -> (0, 1)
    policy = _FixedLogits([0.6, 0.4], [0.55, 0.45])
    obs = np.zeros((3, 16), dtype=np.float32)
    support = np.array([[1, 0], [0, 1]])
    assert support_argmax(policy, obs, support).tolist() == [[0, 1]] * 3
    # with (0, 0) demonstrated too, it is the joint argmax, as independent decoding gives
    assert support_argmax(policy, obs, np.array([[1, 0], [0, 1], [0, 0]])).tolist() == [[0, 0]] * 3
    # one demonstrated pair: always that one
    assert support_argmax(policy, obs, np.array([[1, 1]])).tolist() == [[1, 1]] * 3


def test_support_decoding_equals_a_brute_force_over_sb3_log_probabilities():
    pytest.importorskip("stable_baselines3")
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from commitenv.envs.commit_serve import CommitServeEnv
    from commitenv.envs.wrappers import ACTION_WRAPPERS
    from commitenv.train.policy import support_argmax

    env = DummyVecEnv([lambda: ACTION_WRAPPERS["flat"](CommitServeEnv("bench-h200-hour-fixed-a30"))])
    model = PPO("MlpPolicy", env, seed=3, device="cpu", n_steps=64)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 16)).astype(np.float32) * 3
    support = np.array([[13, 4], [18, 2], [22, 3], [27, 4], [31, 1], [9, 4], [31, 4]])
    got = support_argmax(model.policy, x, support)
    with torch.no_grad():
        dist = model.policy.get_distribution(torch.as_tensor(x))
        for i in range(len(x)):  # SB3's own joint log-probability of every demonstrated pair, row by row
            lp = [float(dist.log_prob(torch.as_tensor(np.tile(a, (len(x), 1))))[i]) for a in support]
            assert got[i].tolist() == support[int(np.argmax(lp))].tolist()


def test_action_support_in_train_json_checked_and_decodes_the_sb3_controller(tmp_path):
    pytest.importorskip("stable_baselines3")
    from commitenv.control import ControllerContext
    from commitenv.envs.commit_serve import CommitServeEnv
    from commitenv.registry import resolve
    from commitenv.train.bc import BCSpec, train_bc
    from commitenv.train.policy import TrainedPolicy

    # a clone of vLLM decoded to its teacher's pairs: vLLM played one pair, so that is all the clone may play
    rec = train_bc(BCSpec("bench-h200-hour-fixed-a30", tmp_path / "bc", expert="vllm", demo_episodes=1, epochs=1,
                          batch_size=16, decode="support"), progress=False)
    assert rec["action_support"] == [{"action": [31, 4], "demonstrations": 60}]
    assert "--decode support" in rec["command"]
    ctrl = resolve(f"sb3:{tmp_path / 'bc'}").make()  # one epoch: far from fitted, yet it plays only (32, top clock)
    env = CommitServeEnv("bench-h200-hour-fixed-a30")
    obs, info = env.reset(seed=100000)
    ctrl.reset(ControllerContext.from_env(env), 0)
    for _ in range(5):
        a = ctrl.act(obs, info)
        assert a == {"active": 32, "clock": 4}
        obs, _, _, _, info = env.step(a)
    path = tmp_path / "bc" / "train.json"
    saved = json.loads(path.read_text())
    for bad, why in (([{"action": [32, 4], "demonstrations": 1}], "action_support\\[0\\]"),
                     ([{"action": [3], "demonstrations": 1}], "action_support\\[0\\]"),
                     ([], "action_support: expected a non-empty list")):
        path.write_text(json.dumps({**saved, "action_support": bad}))
        with pytest.raises(ValueError, match=f"train.json: {why}"):
            TrainedPolicy(tmp_path / "bc", "final")
    with pytest.raises(ValueError, match="--decode"):
        train_bc(BCSpec("bench-h200-hour-fixed-a30", tmp_path / "bc4", expert="vllm", demo_episodes=1,
                        decode="joint"), progress=False)


def test_dagger_executes_the_learner_and_records_the_experts_labels():
    pytest.importorskip("stable_baselines3")
    from commitenv.train.bc import DemoEpisode, collect

    # the learner keeps 8 replicas at clock level 1 (flat action [7, 1]); vLLM labels every state with its own choice
    data = collect([DemoEpisode("bench-h200-hour-fixed-a30", 0)], "vllm", learner=lambda o: np.array([7, 1]))
    assert data["act"].tolist() == [[31, 4]] * 60  # the labels are the expert's
    obs = data["obs"]
    # from the second interval on, the observation shows the learner's configuration, not the expert's
    assert np.allclose(obs[1:, 13], 8 / 32) and np.allclose(obs[1:, 14], 1 / 4)


def test_dagger_rounds_grow_the_data_and_the_support(tmp_path):
    pytest.importorskip("stable_baselines3")
    from commitenv.train.bc import BCSpec, DemoEpisode, collect, train_bc

    rec = train_bc(BCSpec("bench-h200-hour-fixed-a30", tmp_path / "bc", expert="vllm", demo_episodes=1,
                          dagger_rounds=1, dagger_episodes=1, epochs=1, batch_size=16, decode="support"),
                   progress=False)
    rounds = rec["bc"]["rounds"]
    assert [r["samples"] for r in rounds] == [60, 120]  # the demonstration, then one DAgger episode labelled
    assert rounds[0]["dagger_episodes"] == [{"scenario": "bench-h200-hour-fixed-a30", "seed": 1,
                                             "commitment_scale": 1.0}]  # the next train seed
    # vLLM's single pair is the whole support, so the decoded learner played vLLM's configuration: its return is
    # the expert's own on that seed, and the support counts both rounds' labels
    assert rec["action_support"] == [{"action": [31, 4], "demonstrations": 120}]
    assert rounds[-1]["train_accuracy"] == [1.0, 1.0]
    expert = collect([DemoEpisode("bench-h200-hour-fixed-a30", 1)], "vllm")["episode_return"][0]
    assert rounds[0]["learner_episode_return"] == expert
