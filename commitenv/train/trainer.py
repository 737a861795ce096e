"""``commitenv train``: train a stable-baselines3 learner on a scenario, in one command.

* ``K`` envs (``SubprocVecEnv`` for K > 1, ``DummyVecEnv`` for 1), each reset with run seeds of the scenario's TRAIN
  range (env i: ``lo + i, lo + i + K, ...``), so every episode serves a new trace;
* ``VecNormalize`` standardizes observations and rewards; its statistics are saved with the model;
* evaluation during training on TEST seeds (the last ``eval_episodes`` of the range, see `SeedRanges.eval_seeds`) in
  a separate env that shares the observation statistics (``training=False``, raw rewards), deterministic actions;
  the best model is kept as ``best_model.zip`` with its statistics ``best_vecnormalize.pkl``;
* checkpoints (model, statistics, for SAC/DQN the latest replay buffer) every ``checkpoint_freq`` steps under
  ``checkpoints/``; ``resume=True`` continues from the last one up to ``steps`` in total;
* ``progress.csv`` (and TensorBoard event files under ``tb/`` when tensorboard is installed), a progress bar;
* ``train.json``: the command, scenario, algorithm, steps, seeds used, hyperparameters, versions, evaluations, and
  the final and best policies' scores on the evaluation seeds (`commitenv.evaluation`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import platform
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from commitenv.envs.wrappers import ActionCodec
from commitenv.train import ACTION_MAPPING, ALGORITHMS, RL_EXTRA, SB3_CLASS
from commitenv.train.config import AlgoConfig, InitialAction, default_config, load_config, parse_config
from commitenv.train.envs import SeedRanges, make_env, seed_ranges

log = logging.getLogger("commitenv.train")

__all__ = ["TrainSpec", "checkpoints", "start_near", "train"]

SCORE_KEYS = ("cost_kwh_eq", "attainment_pct", "misses", "mean_abs_dev_pct", "energy_mj", "episode_return",
              "penalised_return")  # penalised: the learner's return (LagrangianReward at the miss penalty)
_CKPT = re.compile(r"^model_(\d+)_steps\.zip$")


@dataclass
class TrainSpec:
    """What ``commitenv train`` was asked for (see the CLI's help for each field)."""

    scenario: str
    algo: str = "ppo"
    steps: int = 100_000
    envs: int = 1
    out: str | Path = "runs/train"
    config: str | Path | None = None
    resume: bool = False
    seed: int = 0
    eval_freq: int = 6_000  # env steps between evaluations (0: only at the end)
    eval_episodes: int = 5  # 0: no evaluation, no best model, no scores
    checkpoint_freq: int = 10_000
    device: str = "cpu"
    torch_threads: int = 1
    progress: bool = True
    score: bool = True  # score the final and best policies with commitenv.evaluation at the end
    hyperparameters: dict[str, Any] | None = field(default=None, repr=False)  # instead of a config file

    def command(self) -> str:
        """The ``commitenv train`` command line of this spec."""
        parts = ["commitenv", "train", self.scenario, "--algo", self.algo, "--steps", str(self.steps), "--envs",
                 str(self.envs)]
        if self.config is not None:
            parts += ["--config", str(self.config)]
        parts += ["--out", str(self.out), "--seed", str(self.seed), "--eval-freq", str(self.eval_freq),
                  "--eval-episodes", str(self.eval_episodes), "--checkpoint-freq", str(self.checkpoint_freq)]
        if self.device != "cpu":
            parts += ["--device", self.device]
        if self.torch_threads != 1:
            parts += ["--torch-threads", str(self.torch_threads)]
        if self.resume:
            parts.append("--resume")
        if not self.score:
            parts.append("--no-score")
        return " ".join(shlex.quote(p) for p in parts)


def checkpoints(directory: str | Path) -> list[tuple[int, Path, Path]]:
    """(steps, model, normalizer) of every complete checkpoint under ``directory/checkpoints``, oldest first."""
    d = Path(directory) / "checkpoints"
    out = []
    if d.is_dir():
        for f in d.iterdir():
            m = _CKPT.match(f.name)
            norm = d / f"model_vecnormalize_{m.group(1)}_steps.pkl" if m else None
            if m and norm is not None and norm.is_file():
                out.append((int(m.group(1)), f, norm))
    return sorted(out)


# ================================================================================================ checks
def _check_spec(spec: TrainSpec) -> None:
    if spec.algo not in ALGORITHMS:
        raise ValueError(f"--algo {spec.algo}: expected one of {', '.join(ALGORITHMS)}")
    for flag, v, least in (("--steps", spec.steps, 1), ("--envs", spec.envs, 1), ("--eval-freq", spec.eval_freq, 0),
                           ("--eval-episodes", spec.eval_episodes, 0), ("--checkpoint-freq", spec.checkpoint_freq, 1),
                           ("--torch-threads", spec.torch_threads, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise ValueError(f"{flag}: expected a whole number >= {least}, got {v!r}")
    if spec.config is not None and spec.hyperparameters is not None:
        raise ValueError("give the hyperparameters as a config file or as a mapping, not both")


def _import_sb3() -> Any:
    try:
        import stable_baselines3
        import torch  # noqa: F401
    except ImportError as e:
        raise ValueError(f"commitenv train needs stable-baselines3 and torch (the 'rl' extra: {RL_EXTRA}): "
                         f"{e}") from None
    return stable_baselines3


def _read_record(out: Path) -> dict[str, Any]:
    path = out / "train.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"--resume: {path} not found; nothing to resume in {out}") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"--resume: {path} cannot be read ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"--resume: {path} is not a train.json record")
    return doc


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _versions() -> dict[str, str]:
    import gymnasium
    import stable_baselines3
    import torch

    import commitenv

    return {"commitenv": commitenv.__version__, "stable_baselines3": stable_baselines3.__version__,
            "torch": torch.__version__, "gymnasium": gymnasium.__version__, "numpy": np.__version__,
            "python": platform.python_version()}


def _seed_text(seeds: list[int]) -> list[str]:
    """Seeds as sorted inclusive ranges ``a-b`` (the ``--seeds`` syntax) and single seeds."""
    out: list[str] = []
    s = sorted(set(seeds))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        out.append(f"{s[i]}-{s[j]}" if j > i else str(s[i]))
        i = j + 1
    return out


# ================================================================================================ callbacks
def _callbacks() -> dict[str, type]:
    """The callback classes (built on first use: they subclass stable-baselines3's)."""
    from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback, EvalCallback

    class TqdmCallback(BaseCallback):
        """A tqdm bar over environment steps (used when rich, which SB3's own bar needs, is not installed)."""

        def _on_training_start(self) -> None:
            from tqdm import tqdm

            total = int(self.locals.get("total_timesteps", 0))
            self.bar = tqdm(total=total, initial=self.model.num_timesteps, unit="step", desc="train", leave=False)

        def _on_step(self) -> bool:
            self.bar.update(self.training_env.num_envs)
            return True

        def _on_training_end(self) -> None:
            self.bar.close()

    class SaveNormalizer(BaseCallback):
        """On a new best evaluation: the training statistics the best model was evaluated with, next to it."""

        def __init__(self, path: Path) -> None:
            super().__init__()
            self.path = path

        def _on_step(self) -> bool:
            norm = self.model.get_vec_normalize_env()
            if norm is not None:
                norm.save(str(self.path))
            return True

    class SeededEval(EvalCallback):
        """`EvalCallback` that restarts its test seeds at every evaluation (the same episodes each time) and can
        evaluate on demand (`evaluate_now`, at the end of training)."""

        def __init__(self, *args: Any, first_seed: int, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.first_seed = first_seed

        def _on_step(self) -> bool:
            if self.eval_freq > 0 and self.n_calls % self.eval_freq == 0:
                self.eval_env.seed(self.first_seed)
            return super()._on_step()

        def evaluate_now(self) -> bool:
            freq, self.eval_freq = self.eval_freq, 1
            try:
                return self._on_step()
            finally:
                self.eval_freq = freq

    class Checkpoints(CheckpointCallback):
        """`CheckpointCallback` that keeps only the latest replay buffer (SAC/DQN: megabytes each)."""

        def _on_step(self) -> bool:
            ok = super()._on_step()
            if self.save_replay_buffer and self.n_calls % self.save_freq == 0:
                for f in Path(self.save_path).glob("model_replay_buffer_*_steps.pkl"):
                    if f.name != f"model_replay_buffer_{self.num_timesteps}_steps.pkl":
                        f.unlink(missing_ok=True)
            return ok

    class DualUpdate(BaseCallback):
        """``ppo-lagrangian``'s dual ascent: after each rollout, multiplier <- max(0, multiplier + lr x (mean over the
        episodes finished in it of the worst arrival hour's miss fraction - limit)), sent to every worker's
        `LagrangianReward`, so that all of them penalise misses at the same price."""

        def __init__(self, multiplier: float, lr: float, limit: float) -> None:
            super().__init__()
            self.multiplier, self.lr, self.limit = multiplier, lr, limit
            self.worst: list[float] = []
            self.history: list[list[float]] = []  # (steps, multiplier, mean worst-hour miss fraction) per update

        def _on_step(self) -> bool:
            for done, info in zip(self.locals["dones"], self.locals["infos"]):
                if done:
                    self.worst.append(max(info.get("miss_fraction_by_hour") or [0.0]))
            return True

        def _on_rollout_end(self) -> None:
            if not self.worst:
                return
            violation = float(np.mean(self.worst)) - self.limit
            self.worst = []
            self.multiplier = max(0.0, self.multiplier + self.lr * violation)
            self.training_env.env_method("set_multiplier", self.multiplier)
            self.history.append([int(self.num_timesteps), self.multiplier, violation + self.limit])
            self.logger.record("lagrangian/multiplier", self.multiplier)
            self.logger.record("lagrangian/violation", violation)

    return {"tqdm": TqdmCallback, "normalizer": SaveNormalizer, "eval": SeededEval, "checkpoints": Checkpoints,
            "dual": DualUpdate}


# ================================================================================================ training
def train(spec: TrainSpec) -> dict[str, Any]:
    """Train as ``spec`` says and return the train.json record (also written to ``spec.out``); see the module
    docstring. ValueError for bad input (nothing is trained then)."""
    _check_spec(spec)
    sb3 = _import_sb3()
    import torch
    from stable_baselines3.common.logger import configure
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    from commitenv.envs.commit_serve import OBS_FEATURES
    from commitenv.evaluation import _scenario_file
    from commitenv.scenarios import load_scenario

    out = Path(spec.out)
    sc = load_scenario(spec.scenario)
    ranges = seed_ranges(sc)
    eval_seeds = ranges.eval_seeds(spec.eval_episodes)
    mapping = ACTION_MAPPING[spec.algo]
    episode_steps = sc.horizon_hours * sc.intervals_per_hour
    offpolicy = spec.algo in ("sac", "dqn")

    prior: dict[str, Any] | None = None
    start_steps, ckpt = 0, None
    if spec.resume:
        prior = _read_record(out)
        for key, given in (("scenario", sc.name), ("algo", spec.algo)):
            if prior.get(key) != given:
                raise ValueError(f"--resume: {out} trained {key} {prior.get(key)!r}, not {given!r}")
        if spec.config is not None or spec.hyperparameters is not None:
            raise ValueError(f"--resume: the run keeps the hyperparameters it started with ({out / 'train.json'}); "
                             "drop --config")
        cfg = parse_config(prior.get("hyperparameters"), spec.algo, str(out / "train.json"))
        found = checkpoints(out)
        if not found:
            raise ValueError(f"--resume: no checkpoint in {out / 'checkpoints'} to continue from")
        start_steps, ckpt_model, ckpt_norm = found[-1]
        ckpt = (ckpt_model, ckpt_norm)
        if start_steps >= spec.steps:
            raise ValueError(f"--resume: {out} has trained {start_steps} steps already, --steps {spec.steps} asks for "
                             "no more (--steps is the total)")
    else:
        if (out / "train.json").exists():
            raise ValueError(f"--out {out}: already holds a training run (train.json); give --resume to continue it, "
                             "or another folder")
        if spec.config is not None:
            cfg = load_config(spec.config, spec.algo)
        elif spec.hyperparameters is not None:
            cfg = parse_config(spec.hyperparameters, spec.algo, "hyperparameters")
        else:
            cfg = default_config(spec.algo)
    torch.set_num_threads(spec.torch_threads)
    n = spec.envs
    # per env, the episodes started so far (the last one cut by the checkpoint): the schedule goes on after them
    episodes_done = -(-start_steps // (episode_steps * n))
    lo, hi = ranges.train
    width = hi - lo
    dual = getattr(cfg, "lagrangian", None)  # ppo-lagrangian: the multiplier the workers start from
    lam = None
    if dual is not None:
        lam = (prior or {}).get("lagrangian", {}).get("multiplier") if prior else None
        if lam is None:
            lam = sc.miss_penalty_kwh if dual.initial_multiplier is None else dual.initial_multiplier
    fns = [_EnvFn(spec.scenario, mapping, lo, hi, lo + (i + n * episodes_done) % width, n, multiplier=lam)
           for i in range(n)]
    venv = SubprocVecEnv(fns) if n > 1 else DummyVecEnv(fns)
    eval_venv, model = None, None
    try:
        norm_cfg = cfg.normalize
        if ckpt is not None:
            train_env = VecNormalize.load(str(ckpt[1]), venv)
            train_env.training = True
        else:
            train_env = VecNormalize(venv, gamma=cfg.gamma, **norm_cfg.model_dump())
        eval_env = None
        if eval_seeds:
            eval_venv = DummyVecEnv([_EnvFn(spec.scenario, mapping, eval_seeds[0], eval_seeds[-1] + 1, eval_seeds[0],
                                            1, honor_given=True)])
            eval_env = VecNormalize(eval_venv, training=False, norm_obs=norm_cfg.norm_obs, norm_reward=False,
                                    clip_obs=norm_cfg.clip_obs, gamma=cfg.gamma)
        cls = getattr(sb3, SB3_CLASS[spec.algo])
        if ckpt is not None:
            model = cls.load(str(ckpt[0]), env=train_env, device=spec.device)
            buf = ckpt[0].parent / f"model_replay_buffer_{start_steps}_steps.pkl"
            if offpolicy and buf.is_file():
                model.load_replay_buffer(str(buf))
            elif offpolicy:
                log.warning("--resume: no replay buffer saved at step %d; %s starts with an empty one", start_steps,
                            spec.algo.upper())
        else:
            kwargs = cfg.algo_kwargs()
            kwargs["policy_kwargs"] = _policy_kwargs(kwargs["policy_kwargs"])
            model = cls("MlpPolicy", train_env, seed=spec.seed, device=spec.device, verbose=0, **kwargs)
            init = getattr(cfg, "initial_action", None)
            if init is not None:
                start_near(model, venv.get_attr("codec", indices=[0])[0], init)
        try:  # only now: bad input found above leaves no folder behind
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"--out {out}: cannot create the folder ({e.strerror or e})") from None
        formats = ["csv"]
        tensorboard = importlib.util.find_spec("tensorboard") is not None
        if tensorboard:
            formats.append("tensorboard")
        logs = out / ("tb" if tensorboard else "logs")
        if start_steps:  # a resumed segment logs beside the earlier ones (progress.csv is rewritten when opened)
            logs = logs / f"from-{start_steps}"
        model.set_logger(configure(str(logs), formats))
        record = _record(spec, sc, ranges, eval_seeds, mapping, cfg, prior, tensorboard, OBS_FEATURES,
                         _scenario_file(sc))
        _write_json(out / "train.json", record)

        cbs = _callbacks()
        callbacks: list[Any] = [cbs["checkpoints"](save_freq=max(spec.checkpoint_freq // n, 1),
                                                   save_path=str(out / "checkpoints"), name_prefix="model",
                                                   save_vecnormalize=True, save_replay_buffer=offpolicy)]
        evaluator = None
        if eval_env is not None:
            evaluator = cbs["eval"](eval_env, first_seed=eval_seeds[0],
                                    callback_on_new_best=cbs["normalizer"](out / "best_vecnormalize.pkl"),
                                    n_eval_episodes=len(eval_seeds),
                                    eval_freq=max(spec.eval_freq // n, 1) if spec.eval_freq else 0,
                                    log_path=str(out / "eval"), best_model_save_path=str(out), deterministic=True,
                                    verbose=0)
            _restore_evaluations(evaluator, out, prior)
            callbacks.append(evaluator)
        dual_cb = None
        if dual is not None:
            dual_cb = cbs["dual"](lam, dual.lr, sc.epsilon if dual.limit is None else dual.limit)
            callbacks.append(dual_cb)
        rich = importlib.util.find_spec("rich") is not None and importlib.util.find_spec("tqdm") is not None
        if spec.progress and not rich:
            callbacks.append(cbs["tqdm"]())

        status = "finished"
        t0 = time.perf_counter()
        try:
            model.learn(total_timesteps=spec.steps - start_steps, callback=callbacks,
                        reset_num_timesteps=ckpt is None, progress_bar=spec.progress and rich)
        except KeyboardInterrupt:
            status = "interrupted"
            log.warning("interrupted at step %d: saving a checkpoint; --resume continues from it", model.num_timesteps)
        wall = time.perf_counter() - t0
        steps_done = int(model.num_timesteps)
        _save_final(model, out, steps_done, offpolicy)
        if evaluator is not None and status == "finished" and (
                not evaluator.evaluations_timesteps or evaluator.evaluations_timesteps[-1] != steps_done):
            evaluator.evaluate_now()
        used = [s for seeds in train_env.get_attr("seeds_used") for s in seeds]
        segment = {"command": spec.command(), "start_step": start_steps, "end_step": steps_done, "envs": n,
                   "wall_s": round(wall, 1), "train_seeds": _seed_text(used), "episodes_started": len(used)}
        record["segments"] = list(record.get("segments", [])) + [segment]
        record.update(status=status, steps_done=steps_done,
                      wall_s=round(sum(s["wall_s"] for s in record["segments"]), 1),
                      train_seeds_used=_seed_text([s for seg in record["segments"]
                                                   for s in _expand(seg["train_seeds"])]),
                      evaluations=_evaluations(evaluator), files=_files(out))
        if dual_cb is not None:
            history = list((record.get("lagrangian") or {}).get("history", [])) + dual_cb.history
            record["lagrangian"] = {"multiplier": dual_cb.multiplier, "lr": dual_cb.lr, "limit": dual_cb.limit,
                                    "history": history}
        _write_json(out / "train.json", record)
    finally:
        logger = getattr(model, "_logger", None)
        if logger is not None:
            logger.close()  # progress.csv (and event files) closed, not left to the garbage collector
        for env in (venv, eval_venv):
            if env is not None:
                env.close()
    if status == "finished" and spec.score and eval_seeds:
        record["scores"] = score(out, spec.scenario, eval_seeds, progress=spec.progress)
        _write_json(out / "train.json", record)
    return record


class _EnvFn:
    """A picklable env factory for the vector envs (`make_env` with fixed arguments)."""

    def __init__(self, scenario: str, mapping: str, lo: int, hi: int, first: int, stride: int,
                 honor_given: bool = False, multiplier: float | None = None) -> None:
        self.args = (scenario, mapping, lo, hi, first, stride, honor_given)
        self.multiplier = multiplier

    def __call__(self) -> Any:
        return make_env(*self.args, multiplier=self.multiplier)


def _policy_kwargs(pk: dict[str, Any]) -> dict[str, Any]:
    from torch import nn

    acts = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "leaky_relu": nn.LeakyReLU}
    return {"net_arch": list(pk["net_arch"]), "activation_fn": acts[pk["activation_fn"]]}


def start_near(model: Any, codec: ActionCodec, init: InitialAction) -> dict[str, int]:
    """Bias a new categorical policy's action head (`InitialAction`): each component's logit of the chosen value
    raised to ln(p (n - 1) / (1 - p)) above the others (SB3 initializes the head's weights near zero, so the
    softmax then gives that value probability p whatever the observation). Returns the configuration; ValueError
    when it is not one of ``codec``'s pool."""
    import math

    import torch

    active = codec.start + codec.n - 1 if init.active == "all" else int(init.active)
    clock = codec.levels - 1 if init.clock == "top" else int(init.clock)
    if not codec.start <= active < codec.start + codec.n:
        raise ValueError(f"initial_action.active: expected 'all' or {codec.start}..{codec.start + codec.n - 1} "
                         f"(the pool's replicas), got {init.active}")
    if not 0 <= clock < codec.levels:
        raise ValueError(f"initial_action.clock: expected 'top' or a clock index in 0..{codec.levels - 1}, "
                         f"got {init.clock}")
    nvec = getattr(model.action_space, "nvec", None)
    if nvec is None or codec.kind != "flat":
        raise ValueError(f"initial_action: only for a flat MultiDiscrete policy (PPO, A2C), not {model.action_space}")
    p = float(init.probability)
    head = model.policy.action_net
    with torch.no_grad():
        off = 0
        for n, k in zip((int(x) for x in nvec), codec.encode(active, clock)):
            head.bias[off:off + n] = 0.0
            if n > 1:
                head.bias[off + int(k)] = math.log(p * (n - 1) / (1.0 - p))
            off += n
    return {"active": active, "clock": clock}


def _save_final(model: Any, out: Path, steps: int, offpolicy: bool) -> None:
    """model.zip and vecnormalize.pkl (each written beside and moved in), and a checkpoint at the final step so that
    ``--resume`` continues from exactly here."""
    norm = model.get_vec_normalize_env()
    tmp_model, tmp_norm = out / f".model-{os.getpid()}.zip", out / f".vecnormalize-{os.getpid()}.pkl"
    try:
        model.save(str(tmp_model))
        norm.save(str(tmp_norm))
        os.replace(tmp_model, out / "model.zip")
        os.replace(tmp_norm, out / "vecnormalize.pkl")
    finally:
        tmp_model.unlink(missing_ok=True)
        tmp_norm.unlink(missing_ok=True)
    ck = out / "checkpoints"
    ck.mkdir(exist_ok=True)
    if not (ck / f"model_{steps}_steps.zip").is_file():
        model.save(str(ck / f"model_{steps}_steps.zip"))
        norm.save(str(ck / f"model_vecnormalize_{steps}_steps.pkl"))
        if offpolicy:
            model.save_replay_buffer(str(ck / f"model_replay_buffer_{steps}_steps.pkl"))
            for f in ck.glob("model_replay_buffer_*_steps.pkl"):
                if f.name != f"model_replay_buffer_{steps}_steps.pkl":
                    f.unlink(missing_ok=True)


def _restore_evaluations(evaluator: Any, out: Path, prior: dict[str, Any] | None) -> None:
    """On resume: the evaluations so far (eval/evaluations.npz) and the best mean return, so that a worse model
    never replaces best_model.zip."""
    if prior is None:
        return
    path = out / "eval" / "evaluations.npz"
    if path.is_file():
        with np.load(path) as z:
            evaluator.evaluations_timesteps = [int(t) for t in z["timesteps"]]
            evaluator.evaluations_results = [list(map(float, r)) for r in z["results"]]
            evaluator.evaluations_length = [list(map(int, r)) for r in z["ep_lengths"]]
    best = (prior.get("evaluations") or {}).get("best")
    if best is not None and (out / "best_model.zip").is_file():
        evaluator.best_mean_reward = float(best["mean_return"])
    elif evaluator.evaluations_results and (out / "best_model.zip").is_file():
        evaluator.best_mean_reward = max(float(np.mean(r)) for r in evaluator.evaluations_results)


def _evaluations(evaluator: Any) -> dict[str, Any] | None:
    if evaluator is None or not evaluator.evaluations_timesteps:
        return None
    rows = [{"steps": int(t), "mean_return": float(np.mean(r)), "std_return": float(np.std(r))}
            for t, r in zip(evaluator.evaluations_timesteps, evaluator.evaluations_results)]
    best = max(rows, key=lambda r: r["mean_return"])
    return {"history": rows, "best": best, "final": rows[-1]}


def _expand(items: list[str]) -> list[int]:
    out: list[int] = []
    for it in items:
        a, _, b = it.partition("-")
        out += range(int(a), int(b or a) + 1)
    return out


def _files(out: Path) -> dict[str, str | None]:
    names = ("model.zip", "vecnormalize.pkl", "best_model.zip", "best_vecnormalize.pkl")
    return {n: (n if (out / n).is_file() else None) for n in names}


def _record(spec: TrainSpec, sc: Any, ranges: SeedRanges, eval_seeds: list[int], mapping: str, cfg: AlgoConfig,
            prior: dict[str, Any] | None, tensorboard: bool, features: tuple[str, ...],
            scenario_file: str | None) -> dict[str, Any]:
    doc: dict[str, Any] = dict(prior or {})
    doc.update({
        "command": spec.command(),
        "scenario": sc.name,
        "scenario_file": scenario_file,
        "algo": spec.algo,
        "action_mapping": mapping,
        "steps": spec.steps,
        "steps_done": doc.get("steps_done", 0),
        "envs": spec.envs,
        "seed": spec.seed if prior is None else prior.get("seed", spec.seed),
        "seed_ranges": {"train": list(ranges.train), "test": list(ranges.test), "source": ranges.source},
        "train_seed_schedule": "env i of K resets with lo + i, lo + i + K, ... of the train range",
        "eval_seeds": eval_seeds,
        "eval_freq": spec.eval_freq,
        "checkpoint_freq": spec.checkpoint_freq,
        "hyperparameters": cfg.model_dump(),
        "observation_features": list(features),
        "versions": _versions(),
        "logs": ("tb/ (progress.csv and TensorBoard events; a resumed segment in tb/from-<step>/)" if tensorboard
                 else "logs/progress.csv (a resumed segment in logs/from-<step>/); TensorBoard: not installed, "
                      "pip install tensorboard for event files"),
        "status": "running",
    })
    return doc


# ================================================================================================ scoring
def score(out: str | Path, scenario: str, seeds: list[int], progress: bool = False) -> dict[str, Any]:
    """The final and (when kept) best policies of a run folder on ``seeds``, scored by `commitenv.evaluation` as
    ``commitenv run --controller sb3:DIR`` would: the mean of `SCORE_KEYS` and each seed's numbers."""
    from commitenv.evaluation import evaluate
    from commitenv.registry import resolve

    resolved = resolve(f"sb3:{Path(out).resolve()}")
    whichs = ["final"] + (["best"] if (Path(out) / "best_model.zip").is_file() else [])
    res: dict[str, Any] = {"seeds": list(seeds)}
    for which in whichs:
        ctrl = resolved.make(which=which)
        rows = [evaluate(ctrl, scenario, seed=s).summary for s in seeds]
        # (None, e.g. the deviation of an energy-only scenario, stays None)
        res[which] = {k: (None if any(r[k] is None for r in rows) else float(np.mean([r[k] for r in rows])))
                      for k in SCORE_KEYS}
        res[which]["slo_gate_passes"] = int(sum(bool(r.get("slo_gate_pass")) for r in rows))
        res[which]["per_seed"] = [{"seed": r["seed"], **{k: r[k] for k in SCORE_KEYS}} for r in rows]
    return res
