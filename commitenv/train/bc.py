"""Behaviour cloning (and DAgger) of a planner into a policy that ``--controller sb3:DIR`` runs.

``python -m commitenv.train.bc SCENARIO [SCENARIO ...] --expert mpc --demo-episodes 40 --seed 0 --out DIR``:

1. **Demonstrations.** The expert (any controller spec: ``mpc``, ``epact_plus``, ...) plays ``--demo-episodes``
   episodes, in turn over the scenarios given (one pool: equal action and observation spaces), on the first seeds
   of each scenario's TRAIN range, each episode's commitments scaled by a factor drawn from
   ``--commitment-scale LO HI`` (default 1 1; the leaderboard's secret draw uses 0.9 1.1), so that one policy
   learns a family rather than one hour; every step's env observation (the learner's 16
   features, `commitenv.envs.OBS_FEATURES`) and the expert's action (encoded by the flat codec: active - 1, clock
   index) are recorded. The expert's planning time is not charged here (it acts at the interval start, as the
   learned policy will), so the demonstrations are the same on every run; ``--demos FILE`` caches them (an ``.npz``
   keyed by scenario, expert and seeds), so the learner seeds of one recipe share one expert run.
2. **Cloning.** A stable-baselines3 PPO ``MlpPolicy`` (the shipped recipe's [64, 64] tanh network, flat
   ``MultiDiscrete`` action head) is fitted by maximum likelihood of the expert's actions (Adam, minibatches), on
   observations standardized with the demonstrations' mean and variance, saved as a ``VecNormalize`` exactly as
   ``commitenv train`` saves it. ``--seed`` sets the network's initialization and the minibatch order.
3. **DAgger** (``--dagger-rounds R``, Ross et al. 2011): each round the current policy plays ``--dagger-episodes``
   further train seeds while the expert, fed the same observations, labels every state the policy visits; the
   labelled states join the data set and the policy is refitted. The expert's own bookkeeping sees the learner's
   configuration (``info["active"]``, ``info["clock_mhz"]``) as it would its own.
4. **Decoding** (``--decode support``): the clone plays the most probable of the joint actions its teachers played
   (the data set's distinct (count, clock) pairs, recorded in train.json as ``action_support``), not each
   component's own argmax, which can pair values never played together (`commitenv.train.policy.support_argmax`).

The folder holds ``train.json`` (``algo: ppo``, ``action_mapping: flat``, the command, the data set's size and the
fit's figures), ``model.zip`` and ``vecnormalize.pkl``, like a ``commitenv train`` run: ``sb3:DIR`` runs it
(fine-tuning it with PPO is not offered yet). Results and commands: docs/training.md, "Learned controllers under the
one objective".
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from commitenv.argtypes import seed as seed_arg

__all__ = ["BCSpec", "DemoEpisode", "collect", "demo_episodes", "fit_policy", "train_bc", "main"]


@dataclass
class BCSpec:
    """What ``python -m commitenv.train.bc`` was asked for (``scenario``: one name or several of one pool)."""

    scenario: str | list[str]
    out: str | Path
    expert: str = "mpc"
    demo_episodes: int = 40
    dagger_rounds: int = 0
    dagger_episodes: int = 10
    seed: int = 0
    epochs: int = 60
    batch_size: int = 128
    learning_rate: float = 1e-3
    net_arch: list[int] = field(default_factory=lambda: [64, 64])
    demos: str | Path | None = None
    torch_threads: int = 1
    config: str | Path | None = None  # the YAML the options came from (recorded in the command)
    commitment_scale: tuple[float, float] = (1.0, 1.0)
    expert_args: dict[str, Any] = field(default_factory=dict)  # the expert's constructor arguments (validated)
    # per scenario, a teacher other than ``expert``: {scenario: {"expert": spec, "args": {...}}} (validated)
    experts: dict[str, dict[str, Any]] = field(default_factory=dict)
    # how the clone picks its action: "independent" (each component's most probable value) or "support" (the most
    # probable of the joint actions its teachers played, `commitenv.train.policy.support_argmax`)
    decode: str = "independent"

    @property
    def scenarios(self) -> list[str]:
        return [self.scenario] if isinstance(self.scenario, str) else list(self.scenario)

    def teachers(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """Each scenario's teacher: (controller spec, constructor arguments); ``experts`` overrides ``expert``."""
        return {n: ((self.experts[n]["expert"], dict(self.experts[n].get("args", {}))) if n in self.experts
                    else (self.expert, dict(self.expert_args))) for n in self.scenarios}

    def command(self) -> str:
        parts = ["python", "-m", "commitenv.train.bc", *self.scenarios, "--expert", self.expert, "--demo-episodes",
                 str(self.demo_episodes), "--dagger-rounds", str(self.dagger_rounds), "--dagger-episodes",
                 str(self.dagger_episodes), "--seed", str(self.seed), "--epochs", str(self.epochs), "--batch-size",
                 str(self.batch_size), "--learning-rate", str(self.learning_rate), "--net-arch",
                 ",".join(map(str, self.net_arch)), "--out", str(self.out)]
        for k, v in self.expert_args.items():
            parts += ["--expert-arg", f"{k}={json.dumps(v)}"]
        for n, t in self.experts.items():
            parts += ["--teacher", f"{n}={json.dumps(t, sort_keys=True, separators=(',', ':'))}"]
        if self.decode != "independent":
            parts += ["--decode", self.decode]
        if tuple(self.commitment_scale) != (1.0, 1.0):
            parts += ["--commitment-scale", *(str(x) for x in self.commitment_scale)]
        if self.demos is not None:
            parts += ["--demos", str(self.demos)]
        if self.config is not None:
            parts += ["--config", str(self.config)]
        return " ".join(shlex.quote(p) for p in parts)


# ================================================================================================ data
@dataclass(frozen=True)
class DemoEpisode:
    """One demonstration episode: a scenario (by name), a run seed of its train range, its commitment scale."""

    scenario: str
    seed: int
    commitment_scale: float = 1.0


def demo_episodes(scenarios: list[str], first: int, count: int, scale: tuple[float, float]) -> list[DemoEpisode]:
    """Episodes ``first`` .. ``first + count - 1`` of the round robin over ``scenarios``: episode j plays scenario
    j mod S on its train seed number j // S, with a commitment scale drawn uniformly in ``scale`` from (seed, j)."""
    from commitenv.scenarios import load_scenario
    from commitenv.train.envs import seed_ranges

    lows = [seed_ranges(load_scenario(n)).train for n in scenarios]
    out = []
    for j in range(first, first + count):
        name, (lo, hi) = scenarios[j % len(scenarios)], lows[j % len(scenarios)]
        seed = lo + j // len(scenarios)
        if seed >= hi:
            raise ValueError(f"{name}: {count} demonstration episodes need train seeds up to {seed}, beyond its "
                             f"train range [{lo}, {hi})")
        a, b = scale
        u = float(np.random.default_rng([seed, j]).random()) if b > a else 0.0
        out.append(DemoEpisode(name, seed, a + (b - a) * u))
    return out


def collect(episodes: list[DemoEpisode], expert: str, learner: Callable[[np.ndarray], Any] | None = None,
            progress: bool = False, expert_args: dict[str, Any] | None = None,
            teachers: dict[str, tuple[str, dict[str, Any]]] | None = None) -> dict[str, np.ndarray]:
    """Observations and the expert's flat actions on ``episodes``; with ``learner`` (raw observation -> flat action)
    the learner's action is executed and the expert only labels (DAgger). ``teachers`` gives some scenarios another
    expert (spec, arguments) than ``expert``/``expert_args``. Returns ``obs`` (n, F) float32, ``act``
    (n, 2) int64, ``seed`` (n,), ``episode`` (n,: the index in ``episodes``) and, per episode, the return of whoever
    acted (minus the settlement cost plus the scenario's constant ``reward_offset_kwh``) in ``episode_return``."""
    from commitenv.control import ControllerContext
    from commitenv.envs import CommitServeEnv
    from commitenv.envs.wrappers import codec_for
    from commitenv.registry import resolve
    from commitenv.scenarios.build import derived_seed
    from commitenv.scenarios.loader import scaled_commitment

    obs_l, act_l, seed_l, ep_l, costs = [], [], [], [], []
    for i, ep in enumerate(episodes):
        s = ep.seed
        name, kwargs = (teachers or {}).get(ep.scenario, (expert, expert_args or {}))
        ctrl = resolve(name).make(**kwargs)
        env = CommitServeEnv(scaled_commitment(ep.scenario, ep.commitment_scale))
        obs, info = env.reset(seed=int(s))
        ctrl.reset(ControllerContext.from_env(env), derived_seed(int(s), "controller"))
        if ctrl.dispatch_policy() is not None or ctrl.local_policy() is not None:
            raise ValueError(f"expert {name}: sets a dispatch or local policy, which a learned policy cannot")
        codec = codec_for("flat", env.n_replicas, len(env.clocks_mhz), 1, tuple(env.clocks_mhz))
        terminated, ret = False, 0.0
        try:
            while not terminated:
                a = ctrl.act(obs, info)
                label = codec.encode(int(a["active"]), int(a["clock"]))
                obs_l.append(np.asarray(obs, dtype=np.float32))
                act_l.append(label)
                seed_l.append(int(s))
                ep_l.append(i)
                step = codec.decode(learner(obs)) if learner is not None else {"active": int(a["active"]),
                                                                                 "clock": int(a["clock"])}
                obs, reward, terminated, _, info = env.step(step)
                ret += float(reward)
        finally:
            ctrl.close()
        costs.append(ret)
        if progress:
            print(f"  {'dagger' if learner else 'demo'} {ep.scenario} seed {s} x{ep.commitment_scale:.3f}: "
                  f"{len(act_l)} samples", file=sys.stderr, flush=True)
    return {"obs": np.stack(obs_l), "act": np.stack(act_l).astype(np.int64), "seed": np.asarray(seed_l),
            "episode": np.asarray(ep_l), "episode_return": np.asarray(costs)}


def _concat(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([a[k], b[k]]) for k in ("obs", "act", "seed")}


def _one_pool(scenarios: list[str]) -> None:
    """Refuse scenarios whose env spaces differ (one policy network serves them all)."""
    from commitenv.envs import CommitServeEnv

    spaces = {}
    for n in scenarios:
        env = CommitServeEnv(n)
        spaces[n] = (env.observation_space, env.n_replicas, tuple(env.clocks_mhz))
    first = scenarios[0]
    for n, sp in spaces.items():
        if sp != spaces[first]:
            raise ValueError(f"{n}: its pool ({sp[1]} replicas, clocks {list(sp[2])} MHz) differs from {first}'s "
                             f"({spaces[first][1]} replicas, clocks {list(spaces[first][2])} MHz): one policy serves "
                             "one pool")


# ================================================================================================ fitting
def fit_policy(model: Any, obs_norm: np.ndarray, act: np.ndarray, epochs: int, batch_size: int, lr: float,
               seed: int) -> list[float]:
    """Maximum likelihood of ``act`` under ``model``'s policy (SB3 ``ActorCriticPolicy``) for standardized
    observations; returns the mean negative log-likelihood of each epoch. Only the actor is trained (the value head
    stays at its initialization)."""
    import torch

    policy = model.policy
    policy.set_training_mode(True)
    params = list(policy.mlp_extractor.policy_net.parameters()) + list(policy.action_net.parameters())
    if policy.share_features_extractor:
        params += list(policy.features_extractor.parameters())
    opt = torch.optim.Adam(params, lr=lr)
    x = torch.as_tensor(obs_norm, dtype=torch.float32)
    y = torch.as_tensor(act, dtype=torch.long)
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(epochs):
        order = rng.permutation(len(x))
        total = 0.0
        for i in range(0, len(x), batch_size):
            idx = torch.as_tensor(order[i:i + batch_size])
            dist = policy.get_distribution(x[idx])
            loss = -dist.log_prob(y[idx]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        losses.append(total / len(x))
    policy.set_training_mode(False)
    return losses


def _build(scenario: str, seed: int, net_arch: list[int], obs: np.ndarray) -> tuple[Any, Any]:
    """A PPO model as ``commitenv train --algo ppo`` builds it, and its ``VecNormalize`` with the observation
    statistics of ``obs`` (frozen)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
    from torch import nn

    from commitenv.scenarios import load_scenario
    from commitenv.train.envs import make_env, seed_ranges

    lo, hi = seed_ranges(load_scenario(scenario)).train
    venv = DummyVecEnv([lambda: make_env(scenario, "flat", lo, hi, lo)])
    norm = VecNormalize(venv, gamma=0.99, norm_obs=True, norm_reward=True, clip_obs=10.0, clip_reward=10.0)
    norm.obs_rms.mean = obs.mean(axis=0).astype(np.float64)
    norm.obs_rms.var = obs.var(axis=0).astype(np.float64)
    norm.obs_rms.count = float(len(obs))
    norm.training = False
    model = PPO("MlpPolicy", norm, seed=seed, device="cpu", verbose=0, n_steps=512,
                policy_kwargs={"net_arch": list(net_arch), "activation_fn": nn.Tanh})
    return model, norm


DECODE = ("independent", "support")


def _decide(model: Any, obs_norm: np.ndarray, support: np.ndarray | None) -> np.ndarray:
    """The clone's actions for standardized observations (rows): ``model``'s own argmax, or restricted to
    ``support`` (as `commitenv.train.policy.TrainedPolicy` decodes a run that declares one)."""
    from commitenv.train.policy import support_argmax

    if support is not None:
        return support_argmax(model.policy, obs_norm, support)
    pred, _ = model.predict(obs_norm, deterministic=True)
    return np.asarray(pred)


def _accuracy(model: Any, obs_norm: np.ndarray, act: np.ndarray, support: np.ndarray | None = None) -> list[float]:
    pred = _decide(model, obs_norm, support)
    return [float(np.mean(pred[:, j] == act[:, j])) for j in range(act.shape[1])]


def _demos(spec: BCSpec, episodes: list[DemoEpisode], progress: bool) -> dict[str, np.ndarray]:
    path = Path(spec.demos) if spec.demos is not None else None
    if spec.scenarios == [spec.scenarios[0]] and all(e.commitment_scale == 1.0 for e in episodes):
        key = {"scenario": spec.scenarios[0], "expert": spec.expert, "seeds": [e.seed for e in episodes]}
    else:
        key = {"expert": spec.expert, "episodes": [asdict(e) for e in episodes]}
    if spec.expert_args:  # (a key without them stays as before, so earlier demonstration files still match)
        key["expert_args"] = spec.expert_args
    if spec.experts:
        key["experts"] = {n: spec.experts[n] for n in sorted(spec.experts)}
    key = json.dumps(key)
    if path is not None and path.is_file():
        with np.load(path, allow_pickle=False) as z:
            if str(z["key"]) == key:
                return {k: z[k] for k in ("obs", "act", "seed", "episode_return")}
        raise ValueError(f"--demos {path}: holds other demonstrations (not {key}); give another file")
    data = collect(episodes, spec.expert, progress=progress, expert_args=spec.expert_args, teachers=spec.teachers())
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, key=key, **data)
    return data


def train_bc(spec: BCSpec, progress: bool = True) -> dict[str, Any]:
    """Collect, clone (and DAgger) as ``spec`` says; writes the run folder and returns its train.json record."""
    import torch

    from commitenv.envs.commit_serve import OBS_FEATURES
    from commitenv.scenarios import load_scenario
    from commitenv.train.policy import support_record
    from commitenv.train.trainer import _versions, _write_json

    for name in ("demo_episodes", "epochs", "batch_size", "torch_threads"):
        v = getattr(spec, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"--{name.replace('_', '-')}: expected a whole number >= 1, got {v!r}")
    for name in ("dagger_rounds", "dagger_episodes"):
        v = getattr(spec, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"--{name.replace('_', '-')}: expected a whole number >= 0, got {v!r}")
    if spec.decode not in DECODE:
        raise ValueError(f"--decode: expected one of {', '.join(DECODE)}, got {spec.decode!r}")
    a, b = spec.commitment_scale
    if not (0 < a <= b <= 2):
        raise ValueError(f"--commitment-scale: expected 0 < LO <= HI <= 2, got {a} {b}")
    out = Path(spec.out)
    if (out / "train.json").exists():
        raise ValueError(f"--out {out}: already holds a run (train.json); give another folder")
    names = spec.scenarios
    _one_pool(names)
    torch.set_num_threads(spec.torch_threads)
    torch.manual_seed(spec.seed)
    sc = load_scenario(names[0])
    t0 = time.perf_counter()
    demos = demo_episodes(names, 0, spec.demo_episodes, (a, b))
    data = _demos(spec, demos, progress)
    demo_return = float(np.mean(data["episode_return"]))
    t_demo = time.perf_counter() - t0
    model, norm = _build(names[0], spec.seed, spec.net_arch, data["obs"])
    rounds = []
    support: np.ndarray | None = None  # the joint actions played so far, with decode "support"

    def refit() -> None:
        nonlocal support
        # statistics from the whole data set so far, then the fit (continued from the current weights)
        norm.obs_rms.mean = data["obs"].mean(axis=0).astype(np.float64)
        norm.obs_rms.var = data["obs"].var(axis=0).astype(np.float64)
        norm.obs_rms.count = float(len(data["obs"]))
        x = norm.normalize_obs(data["obs"])
        losses = fit_policy(model, x, data["act"], spec.epochs, spec.batch_size, spec.learning_rate, spec.seed
                            + len(rounds))
        support = np.unique(data["act"], axis=0) if spec.decode == "support" else None
        rounds.append({"samples": int(len(x)), "nll_first": losses[0], "nll_last": losses[-1],
                       "train_accuracy": _accuracy(model, x, data["act"], support)})

    refit()
    demo_samples = len(data["obs"])
    nxt = spec.demo_episodes
    for r in range(spec.dagger_rounds):
        eps = demo_episodes(names, nxt, spec.dagger_episodes, (a, b))
        nxt += spec.dagger_episodes

        def learner(o: np.ndarray) -> Any:
            return _decide(model, norm.normalize_obs(np.asarray(o, dtype=np.float32)[None]), support)[0]

        new = collect(eps, spec.expert, learner=learner, progress=progress, expert_args=spec.expert_args,
                      teachers=spec.teachers())
        rounds[-1]["dagger_episodes"] = [asdict(e) for e in eps]
        rounds[-1]["learner_episode_return"] = float(np.mean(new["episode_return"])) if eps else None
        data = _concat(data, new)
        refit()
    wall = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    model.save(str(out / "model.zip"))
    norm.save(str(out / "vecnormalize.pkl"))
    record = {
        "command": spec.command(), "scenario": sc.name, "scenarios": names, "algo": "ppo", "action_mapping": "flat",
        "trainer": "commitenv.train.bc (behaviour cloning" + (", DAgger)" if spec.dagger_rounds else ")"),
        "bc": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(spec).items()},
               "demo_episodes_played": [asdict(e) for e in demos],
               "demo_samples": int(demo_samples),
               "expert_demo_mean_return": demo_return,
               "rounds": rounds, "demo_wall_s": round(t_demo, 1)},
        "seed": spec.seed, "hyperparameters": {"policy_kwargs": {"net_arch": list(spec.net_arch),
                                                                 "activation_fn": "tanh"}},
        "observation_features": list(OBS_FEATURES), "versions": _versions(), "steps_done": 0,
        **({"action_support": support_record(data["act"])} if spec.decode == "support" else {}),
        "wall_s": round(wall, 1), "status": "finished",
        "files": {"model.zip": "model.zip", "vecnormalize.pkl": "vecnormalize.pkl", "best_model.zip": None,
                  "best_vecnormalize.pkl": None},
    }
    _write_json(out / "train.json", record)
    return record


# ================================================================================================ CLI
CONFIG_KEYS = {"expert": str, "demo_episodes": int, "dagger_rounds": int, "dagger_episodes": int, "epochs": int,
               "batch_size": int, "learning_rate": (float, int, str), "net_arch": list, "commitment_scale": list,
               "expert_args": dict, "experts": dict, "decode": str}


def load_options(path: str | Path) -> dict[str, Any]:
    """The options of a BC config file (a YAML mapping of `CONFIG_KEYS`); ValueError naming the file and the key."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"--config {path}: cannot read it ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"--config {path}: expected a mapping of options")
    out = {}
    for k, v in doc.items():
        key = str(k).replace("-", "_")
        if key not in CONFIG_KEYS:
            raise ValueError(f"{path}: unknown key {k!r} (accepted: {', '.join(CONFIG_KEYS)})")
        if isinstance(v, bool) or not isinstance(v, CONFIG_KEYS[key]):
            raise ValueError(f"{path}: {k}: wrong type {type(v).__name__}")
        out[key] = v
    return out


def _expert_args(expert: str, from_config: dict[str, Any], items: list[str] | None) -> dict[str, Any]:
    """The expert's constructor arguments: the config file's ``expert_args``, then ``--expert-arg KEY=VALUE`` items
    (which win), validated against the expert's declared configuration; ValueError naming the item."""
    from commitenv.controller_config import check_kwargs, parse_arg_value
    from commitenv.registry import resolve

    kwargs, raw = dict(from_config), {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"--expert-arg {item}: expected KEY=VALUE (KEY a Python identifier)")
        kwargs[key], raw[key] = parse_arg_value(value), value
    return check_kwargs(resolve(expert), kwargs, raw) if kwargs else {}


def _teachers(scenarios: list[str], from_config: dict[str, Any], items: list[str] | None) -> dict[str, dict[str, Any]]:
    """Per-scenario teachers: the config file's ``experts`` mapping (scenario -> spec, or -> {expert, args}), then
    ``--teacher SCENARIO=SPEC`` / ``SCENARIO={"expert": SPEC, "args": {...}}`` items (which win); each scenario one of
    those trained on, each spec resolvable, each argument declared by it. ValueError naming the entry."""
    from commitenv.controller_config import check_kwargs
    from commitenv.registry import resolve

    given: dict[str, Any] = dict(from_config)
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--teacher {item}: expected SCENARIO=SPEC or SCENARIO={{\"expert\": SPEC, \"args\": ...}}")
        try:
            given[key] = json.loads(value)
        except json.JSONDecodeError:
            given[key] = value
    out: dict[str, dict[str, Any]] = {}
    for name, t in given.items():
        where = f"experts: {name}"
        if name not in scenarios:
            raise ValueError(f"{where}: not one of the scenarios trained on ({', '.join(scenarios)})")
        if isinstance(t, str):
            t = {"expert": t}
        if not isinstance(t, dict) or not isinstance(t.get("expert"), str) or set(t) - {"expert", "args"} \
                or not isinstance(t.get("args", {}), dict):
            raise ValueError(f"{where}: expected a controller spec or a mapping {{expert: SPEC, args: {{...}}}}, "
                             f"got {t!r}")
        try:
            ctrl = resolve(t["expert"])
        except (KeyError, ValueError, ImportError) as e:
            raise ValueError(f"{where}: {e}") from None
        try:
            args = check_kwargs(ctrl, dict(t["args"])) if t.get("args") else {}
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        out[name] = {"expert": t["expert"], "args": args} if args else {"expert": t["expert"]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m commitenv.train.bc", description=__doc__.split("\n\n")[0])
    p.add_argument("scenario", nargs="+", help="one scenario, or several of one pool (played in turn)")
    p.add_argument("--out", required=True)
    p.add_argument("--expert", default="mpc")
    p.add_argument("--expert-arg", action="append", default=None, metavar="KEY=VALUE",
                   help="the expert's constructor argument (repeatable); VALUE is read as JSON when it is valid JSON")
    p.add_argument("--teacher", action="append", default=None, metavar="SCENARIO=SPEC",
                   help="another expert for one scenario (repeatable): SPEC, or JSON {\"expert\": SPEC, \"args\": {...}}")
    p.add_argument("--demo-episodes", type=int, default=40)
    p.add_argument("--dagger-rounds", type=int, default=0)
    p.add_argument("--dagger-episodes", type=int, default=10)
    p.add_argument("--seed", type=seed_arg, default=0)
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--net-arch", default="64,64")
    p.add_argument("--demos", default=None)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--decode", default="independent", choices=DECODE,
                   help="the clone's action: each component's most probable value (independent), or the most "
                        "probable of the joint actions its teachers played (support)")
    p.add_argument("--commitment-scale", type=float, nargs=2, default=(1.0, 1.0), metavar=("LO", "HI"),
                   help="each demonstration's commitments scaled by a factor drawn uniformly in [LO, HI]")
    p.add_argument("--config", default=None, help="YAML of options (their long names with _ or -); flags given "
                   "on the command line win")
    a = p.parse_args(argv)
    try:
        if a.config is not None:
            given = {o for tok in (argv if argv is not None else sys.argv[1:]) if tok.startswith("--")
                     for o in [tok[2:].split("=")[0].replace("-", "_")]}
            for k, v in load_options(a.config).items():
                if k not in given:
                    setattr(a, k, ",".join(map(str, v)) if k == "net_arch" and isinstance(v, list) else v)
        arch = [int(x) for x in a.net_arch.split(",") if x]
        expert_args = _expert_args(a.expert, dict(getattr(a, "expert_args", None) or {}), a.expert_arg)
        spec = BCSpec(a.scenario[0] if len(a.scenario) == 1 else list(a.scenario), a.out, a.expert, a.demo_episodes,
                      a.dagger_rounds, a.dagger_episodes, a.seed, a.epochs, a.batch_size, float(a.learning_rate), arch,
                      a.demos, a.torch_threads, a.config, tuple(a.commitment_scale), expert_args,
                      _teachers(list(a.scenario), dict(getattr(a, "experts", None) or {}), a.teacher), a.decode)
        rec = train_bc(spec)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"out": str(a.out), "wall_s": rec["wall_s"], "rounds": rec["bc"]["rounds"]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
