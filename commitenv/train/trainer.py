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

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import platform
import re
import shlex
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from commitenv.envs.wrappers import ActionCodec
from commitenv.train import ACTION_MAPPING, ALGORITHMS, RL_EXTRA, SB3_CLASS
from commitenv.train.config import AlgoConfig, InitialAction, default_config, load_config, parse_config
from commitenv.train.callbacks import callback_classes, save_atomically, write_checkpoint
from commitenv.train.envs import SeedRanges, make_env, seed_ranges
from commitenv.train.resume import (OPTION_FLAGS, EvaluationLog, RolloutState, read_evaluations, read_state,
                                    resolve_options, restore_rng, rewind, saved_options)

log = logging.getLogger("commitenv.train")

__all__ = ["Checkpoint", "Terminated", "TrainSpec", "checkpoints", "start_near", "train"]

SCORE_KEYS = ("cost_kwh_eq", "attainment_pct", "misses", "mean_abs_dev_pct", "energy_mj", "episode_return",
              "penalised_return")  # penalised: the learner's return (LagrangianReward at the miss penalty)
_CKPT = re.compile(r"^model_(\d+)_steps\.zip$")


@dataclass
class TrainSpec:
    """What ``commitenv train`` was asked for (see the CLI's help for each field). The run options left None take
    their defaults in a new run and, with ``resume``, the values the run started with (train.json ``options``)."""

    scenario: str
    algo: str | None = None  # ppo
    steps: int | None = None  # 100000; with resume: the total to reach (None: the run's own)
    envs: int | None = None  # 1
    out: str | Path = "runs/train"
    config: str | Path | None = None
    resume: bool = False
    seed: int | None = None  # 0
    eval_freq: int | None = None  # 6000 env steps between evaluations (0: only at the end)
    eval_episodes: int | None = None  # 5; 0: no evaluation, no best model, no scores
    checkpoint_freq: int | None = None  # 10000
    device: str = "cpu"
    torch_threads: int = 1
    progress: bool = True
    score: bool = True  # score the final and best policies with commitenv.evaluation at the end
    hyperparameters: dict[str, Any] | None = field(default=None, repr=False)  # instead of a config file

    def command(self) -> str:
        """The ``commitenv train`` command line of this spec (with its options resolved)."""
        parts = ["commitenv", "train", self.scenario, "--algo", str(self.algo), "--steps", str(self.steps), "--envs",
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


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a run folder: its step, model zip, normalizer pickle and state file (None: written before
    state files existed; resuming from it restarts the envs' episodes)."""

    step: int
    model: Path
    normalizer: Path
    state: Path | None


def checkpoints(directory: str | Path) -> list[Checkpoint]:
    """Every complete checkpoint under ``directory/checkpoints``, oldest first (a checkpoint whose files are not all
    there, as a kill while writing it leaves, is not listed)."""
    d = Path(directory) / "checkpoints"
    out = []
    if d.is_dir():
        for f in d.iterdir():
            m = _CKPT.match(f.name)
            if not m:
                continue
            norm, state = (d / f"model_{kind}_{m.group(1)}_steps.pkl" for kind in ("vecnormalize", "state"))
            if norm.is_file():
                out.append(Checkpoint(int(m.group(1)), f, norm, state if state.is_file() else None))
    return sorted(out, key=lambda c: c.step)


def _resumable(found: list[Checkpoint]) -> Checkpoint | None:
    """The checkpoint to continue from: the latest with a state file, else (an older run) the latest."""
    full = [c for c in found if c.state is not None]
    return full[-1] if full else (found[-1] if found else None)


# ================================================================================================ checks
def _check_spec(spec: TrainSpec) -> None:
    if spec.algo is not None and spec.algo not in ALGORITHMS:
        raise ValueError(f"--algo {spec.algo}: expected one of {', '.join(ALGORITHMS)}")
    for flag, v, least in (("--steps", spec.steps, 1), ("--envs", spec.envs, 1), ("--eval-freq", spec.eval_freq, 0),
                           ("--eval-episodes", spec.eval_episodes, 0), ("--checkpoint-freq", spec.checkpoint_freq, 1),
                           ("--torch-threads", spec.torch_threads, 1)):
        if v is None:
            continue
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


# ================================================================================================ training
class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the training loop so that it stops as Ctrl-C does (checkpoint, status ``interrupted``)."""


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While training: SIGTERM raises `Terminated` (in the main thread only: elsewhere signals cannot be caught)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise Terminated()

    old = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _resolve(spec: TrainSpec, out: Path) -> tuple[TrainSpec, dict[str, Any] | None]:
    """``spec`` with its run options filled in (the defaults, or on resume the run's own: `resolve_options`) and the
    run's prior train.json record (None for a new run)."""
    given = {k: getattr(spec, k) for k in OPTION_FLAGS}
    if not spec.resume:
        if (out / "train.json").exists():
            raise ValueError(f"--out {out}: already holds a training run (train.json); give --resume to continue it, "
                             "or another folder")
        return dataclasses.replace(spec, **resolve_options(given, None, str(out))), None
    prior = _read_record(out)
    if spec.algo is not None and prior.get("algo") != spec.algo:
        raise ValueError(f"--resume: {out} trained algo {prior.get('algo')!r}, not {spec.algo!r}")
    if spec.config is not None or spec.hyperparameters is not None:
        raise ValueError(f"--resume: the run keeps the hyperparameters it started with ({out / 'train.json'}); "
                         "drop --config")
    return dataclasses.replace(spec, **resolve_options(given, saved_options(prior), str(out))), prior


def train(spec: TrainSpec) -> dict[str, Any]:
    """Train as ``spec`` says and return the train.json record (also written to ``spec.out``); see the module
    docstring. ValueError for bad input (nothing is trained then). train.json never stays ``running`` after this
    returns or raises: ``finished``, ``interrupted`` (Ctrl-C, SIGTERM; a checkpoint is written) or ``failed``."""
    _check_spec(spec)
    out = Path(spec.out)
    spec, prior = _resolve(spec, out)
    sb3 = _import_sb3()
    import torch
    from stable_baselines3.common.logger import configure
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    from commitenv.envs.commit_serve import OBS_FEATURES
    from commitenv.evaluation import _scenario_file
    from commitenv.scenarios import load_scenario

    sc = load_scenario(spec.scenario)
    if prior is not None and prior.get("scenario") != sc.name:
        raise ValueError(f"--resume: {out} trained scenario {prior.get('scenario')!r}, not {sc.name!r}")
    ranges = seed_ranges(sc)
    eval_seeds = ranges.eval_seeds(spec.eval_episodes)
    mapping = ACTION_MAPPING[spec.algo]
    episode_steps = sc.horizon_hours * sc.intervals_per_hour
    offpolicy = spec.algo in ("sac", "dqn")

    start_steps, ckpt, state = 0, None, None
    if prior is not None:
        cfg = parse_config(prior.get("hyperparameters"), spec.algo, str(out / "train.json"))
        ckpt = _resumable(checkpoints(out))
        if ckpt is None:
            log.warning("--resume: no checkpoint in %s: training starts again from step 0 with the run's options",
                        out / "checkpoints")
        else:
            start_steps = ckpt.step
            state = read_state(ckpt.state) if ckpt.state is not None else None
        if start_steps >= spec.steps and prior.get("status") == "finished":
            raise ValueError(f"--resume: {out} has trained {start_steps} steps already, --steps {spec.steps} asks for "
                             "no more (--steps is the total)")
        evaluations = read_evaluations(out / "eval" / "evaluations.npz", spec.eval_episodes).upto(start_steps)
    else:
        if spec.config is not None:
            cfg = load_config(spec.config, spec.algo)
        elif spec.hyperparameters is not None:
            cfg = parse_config(spec.hyperparameters, spec.algo, "hyperparameters")
        else:
            cfg = default_config(spec.algo)
        evaluations = EvaluationLog()
    torch.set_num_threads(spec.torch_threads)
    n = spec.envs
    lo, hi = ranges.train
    width = hi - lo
    if state is not None:  # each env starts from the seed of its episode under way
        firsts = [s for s, _ in state.episodes]
    else:  # (a checkpoint without a state file: the episodes started so far, the last one cut, are skipped)
        episodes_done = -(-start_steps // (episode_steps * n))
        firsts = [lo + (i + n * episodes_done) % width for i in range(n)]
    dual = getattr(cfg, "lagrangian", None)  # ppo-lagrangian: the multiplier the workers start from
    lam, dual_history = None, []
    if dual is not None:
        lam = state.multiplier if state is not None else (prior or {}).get("lagrangian", {}).get("multiplier")
        if lam is None:
            lam = sc.miss_penalty_kwh if dual.initial_multiplier is None else dual.initial_multiplier
        dual_history = state.dual_history if state is not None else []
    fns = [_EnvFn(spec.scenario, mapping, lo, hi, firsts[i], n, multiplier=lam) for i in range(n)]
    venv = SubprocVecEnv(fns) if n > 1 else DummyVecEnv(fns)
    eval_venv, model, record = None, None, None
    status = "failed"
    try:
        norm_cfg = cfg.normalize
        if ckpt is not None:
            train_env = VecNormalize.load(str(ckpt.normalizer), venv)
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
        actions: list[list[Any]] = [[] for _ in range(n)]
        if ckpt is not None:
            model = cls.load(str(ckpt.model), env=train_env, device=spec.device)
            buf = ckpt.model.parent / f"model_replay_buffer_{start_steps}_steps.pkl"
            if offpolicy and buf.is_file():
                model.load_replay_buffer(str(buf))
            elif offpolicy:
                log.warning("--resume: no replay buffer saved at step %d; %s starts with an empty one", start_steps,
                            spec.algo.upper())
            if state is not None:
                actions = _replay(model, train_env, state)
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

        cbs = callback_classes()
        dual_cb = None
        if dual is not None:
            dual_cb = cbs["dual"](lam, dual.lr, sc.epsilon if dual.limit is None else dual.limit, dual_history)
        saver = cbs["checkpoints"](out / "checkpoints", spec.checkpoint_freq, start_steps, actions, offpolicy, dual_cb)
        callbacks: list[Any] = [saver]
        evaluator = None
        if eval_env is not None:
            evaluator = cbs["eval"](eval_env, eval_seeds, spec.eval_freq, spec.steps, start_steps, evaluations, out,
                                    (out / "best_model.zip").is_file())
            callbacks.append(evaluator)
        if dual_cb is not None:
            callbacks.append(dual_cb)
        rich = importlib.util.find_spec("rich") is not None and importlib.util.find_spec("tqdm") is not None
        if spec.progress and not rich:
            callbacks.append(cbs["tqdm"]())
        if state is not None:
            restore_rng(model, state.rng)  # last: loading the model reseeded them

        status = "finished"
        t0 = time.perf_counter()
        try:
            with _sigterm_interrupts():
                if spec.steps <= start_steps:  # killed after its last step: only the final evaluation is left
                    for cb in callbacks:
                        cb.init_callback(model)
                else:
                    model.learn(total_timesteps=spec.steps - start_steps, callback=callbacks,
                                reset_num_timesteps=ckpt is None, progress_bar=spec.progress and rich)
        except KeyboardInterrupt as e:
            status = "interrupted"
            log.warning("%s at step %d: saving a checkpoint; --resume continues from it",
                        "terminated" if isinstance(e, Terminated) else "interrupted", model.num_timesteps)
            if saver.latest is not None and saver.latest.step < model.num_timesteps:
                rewind(model, saver.latest)  # on-policy: back to the last rollout boundary, so resuming is exact
        wall = time.perf_counter() - t0
        steps_done = int(model.num_timesteps)
        if saver.latest is not None and saver.latest.step == steps_done:
            final = saver.latest  # (rewound to it)
        else:
            final = saver.state(with_params=False)
        _save_final(model, out, final, offpolicy)
        if evaluator is not None and status == "finished" and (
                not evaluator.log.timesteps or evaluator.log.timesteps[-1] != steps_done):
            evaluator.evaluate()  # the final policy, after its last update
        segment = {"command": spec.command(), "start_step": start_steps, "end_step": steps_done, "envs": n,
                   "wall_s": round(wall, 1), **_seeds_used(train_env)}
        record["segments"] = list(record.get("segments", [])) + [segment]
        record.update(status=status, steps_done=steps_done,
                      wall_s=round(sum(s["wall_s"] for s in record["segments"]), 1),
                      train_seeds_used=_seed_text([s for seg in record["segments"]
                                                   for s in _expand(seg["train_seeds"])]),
                      evaluations=_evaluations(evaluator), files=_files(out))
        if dual_cb is not None:
            record["lagrangian"] = {"multiplier": dual_cb.multiplier, "lr": dual_cb.lr, "limit": dual_cb.limit,
                                    "history": dual_cb.history}
        record.pop("error", None)
        _write_json(out / "train.json", record)
    except BaseException as e:
        if record is not None:  # never left "running": the exit is recorded
            record.update(status="interrupted" if isinstance(e, KeyboardInterrupt) else "failed",
                          error=f"{type(e).__name__}: {e}")
            _write_json(out / "train.json", record)
        raise
    finally:
        logger = getattr(model, "_logger", None)
        if logger is not None:
            logger.close()  # progress.csv (and event files) closed, not left to the garbage collector
        for env in (venv, eval_venv):
            if env is not None:
                env.close()
    if status == "finished" and spec.score and eval_seeds:
        try:
            record["scores"] = score(out, spec.scenario, eval_seeds, progress=spec.progress)
        except BaseException as e:
            record.update(status="interrupted" if isinstance(e, KeyboardInterrupt) else "failed",
                          error=f"scoring: {type(e).__name__}: {e}")
            _write_json(out / "train.json", record)
            raise
        _write_json(out / "train.json", record)
    return record


def _replay(model: Any, train_env: Any, state: RolloutState) -> list[list[Any]]:
    """Rebuild each env's episode under way at the checkpoint (reset with its seed, replay its actions) and hand
    the learner the observation it had then, without counting it again in the normalizer's statistics."""
    raw = [train_env.venv.env_method("replay", seed, acts, indices=[i])[0]
           for i, (seed, acts) in enumerate(state.episodes)]
    obs = np.stack([np.asarray(o) for o in raw]).astype(train_env.observation_space.dtype)
    train_env.old_obs = obs
    if state.returns is not None:
        train_env.returns = np.array(state.returns, copy=True)
    model._last_obs = train_env.normalize_obs(obs)
    model._last_episode_starts = np.array([len(a) == 0 for _, a in state.episodes], dtype=bool)
    if hasattr(model, "_last_original_obs"):
        model._last_original_obs = obs
    return [list(a) for _, a in state.episodes]


def _seeds_used(train_env: Any) -> dict[str, Any]:
    try:
        used = [s for seeds in train_env.get_attr("seeds_used") for s in seeds]
    except (EOFError, BrokenPipeError, ConnectionError):  # workers gone (Ctrl-C reaches them too)
        return {"train_seeds": [], "episodes_started": None}
    return {"train_seeds": _seed_text(used), "episodes_started": len(used)}


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


def _save_final(model: Any, out: Path, state: RolloutState | None, offpolicy: bool) -> None:
    """model.zip and vecnormalize.pkl (each written beside and moved in), and a checkpoint at the final step (from
    ``state``) so that ``--resume`` continues from exactly here."""
    norm = model.get_vec_normalize_env()
    save_atomically(model.save, out / "model.zip")
    save_atomically(norm.save, out / "vecnormalize.pkl")
    if state is not None and not (out / "checkpoints" / f"model_state_{state.step}_steps.pkl").is_file():
        write_checkpoint(model, out / "checkpoints", state, offpolicy)


def _evaluations(evaluator: Any) -> dict[str, Any] | None:
    if evaluator is None or not evaluator.log.timesteps:
        return None
    rows = [{"steps": int(t), "mean_return": float(np.mean(r)), "std_return": float(np.std(r))}
            for t, r in zip(evaluator.log.timesteps, evaluator.log.results)]
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
    doc: dict[str, Any] = {k: v for k, v in (prior or {}).items() if k not in ("scores", "error")}  # (the old model's)
    doc.update({
        "command": spec.command(),
        "scenario": sc.name,
        "scenario_file": scenario_file,
        "algo": spec.algo,
        "action_mapping": mapping,
        "steps": spec.steps,
        "steps_done": doc.get("steps_done", 0),
        "envs": spec.envs,
        "seed": spec.seed,
        "options": {k: getattr(spec, k) for k in OPTION_FLAGS},  # what --resume restores
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
        "pid": os.getpid(),
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
