"""The stable-baselines3 callbacks of ``commitenv train``: checkpoints at rollout boundaries (`RolloutCheckpoints`),
evaluations on fixed test seeds at fixed step counts (`Evaluations`), ppo-lagrangian's dual update (`DualUpdate`)
and a tqdm bar for when rich is missing. Built on first use (`callback_classes`): they subclass SB3's classes, and
importing this module must not load the learning stack."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from commitenv.train.resume import EvaluationLog, RolloutState, capture, write_evaluations, write_state

__all__ = ["callback_classes", "save_atomically", "write_checkpoint"]


def save_atomically(save: Any, path: Path) -> None:
    """``save(tmp)`` beside ``path``, then moved in: a kill leaves the old file or the new one, never half of one."""
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        save(str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_checkpoint(model: Any, directory: Path, state: RolloutState, offpolicy: bool) -> None:
    """Checkpoint ``state.step``: model, normalizer, (SAC/DQN) the replay buffer, then the state file, which marks the
    checkpoint complete (`commitenv.train.trainer.checkpoints` lists only complete ones)."""
    directory.mkdir(parents=True, exist_ok=True)
    step = state.step
    save_atomically(model.save, directory / f"model_{step}_steps.zip")
    norm = model.get_vec_normalize_env()
    save_atomically(norm.save, directory / f"model_vecnormalize_{step}_steps.pkl")
    if offpolicy:
        keep = f"model_replay_buffer_{step}_steps.pkl"
        save_atomically(model.save_replay_buffer, directory / keep)
        for f in directory.glob("model_replay_buffer_*_steps.pkl"):  # the latest only: megabytes each
            if f.name != keep:
                f.unlink(missing_ok=True)
    write_state(directory / f"model_state_{step}_steps.pkl", state)


def callback_classes() -> dict[str, type]:
    """The callback classes (built on first use: they subclass stable-baselines3's)."""
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import sync_envs_normalization

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

    class DualUpdate(BaseCallback):
        """``ppo-lagrangian``'s dual ascent: after each rollout, multiplier <- max(0, multiplier + lr x (mean over the
        episodes finished in it of the worst arrival hour's miss fraction - limit)), sent to every worker's
        `LagrangianReward`, so that all of them penalise misses at the same price."""

        def __init__(self, multiplier: float, lr: float, limit: float, history: list[list[float]]) -> None:
            super().__init__()
            self.multiplier, self.lr, self.limit = multiplier, lr, limit
            self.worst: list[float] = []
            self.history = [list(h) for h in history]  # (steps, multiplier, mean worst-hour miss fraction)

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

    class RolloutCheckpoints(BaseCallback):
        """Checkpoints at the first rollout boundary at or after every ``freq`` steps (`write_checkpoint`), and for
        on-policy learners a snapshot in memory at every boundary (``latest``), which an interrupt writes. Tracks
        each env's current episode (its actions; the seed comes from `SeedSchedule`) for the state file."""

        def __init__(self, directory: Path, freq: int, start_step: int, actions: list[list[Any]], offpolicy: bool,
                     dual: Any = None) -> None:
            super().__init__()
            self.directory, self.freq, self.last, self.offpolicy, self.dual = directory, freq, start_step, offpolicy, dual
            self.actions = [list(a) for a in actions]
            self.latest: RolloutState | None = None

        def _on_step(self) -> bool:
            acts = self.locals["clipped_actions"] if "clipped_actions" in self.locals else self.locals["actions"]
            for i, done in enumerate(self.locals["dones"]):
                if done:
                    self.actions[i] = []
                else:
                    self.actions[i].append(np.array(acts[i], copy=True))
            return True

        def state(self, with_params: bool) -> RolloutState:
            """The learner's state now, with each env's episode under way."""
            seeds = self.training_env.get_attr("current_seed")
            dual = self.dual
            return capture(self.model, [(int(s), a) for s, a in zip(seeds, self.actions)],
                           None if dual is None else dual.multiplier, [] if dual is None else dual.history,
                           with_params)

        def _on_rollout_start(self) -> None:
            step = int(self.model.num_timesteps)
            due = step > self.last and step // self.freq > self.last // self.freq
            if not self.offpolicy:
                self.latest = self.state(with_params=True)
            if due:
                write_checkpoint(self.model, self.directory, self.latest or self.state(with_params=False),
                                 self.offpolicy)
                self.last = step

    class Evaluations(BaseCallback):
        """The deterministic policy on the same test seeds each time the step count passes a multiple of ``freq``
        (before ``target``: the final policy is evaluated after training, `evaluate`); the log is written
        atomically after each, and a new best mean return saves ``best_model.zip`` + ``best_vecnormalize.pkl``."""

        def __init__(self, eval_env: Any, seeds: list[int], freq: int, target: int, start_step: int,
                     log: EvaluationLog, out: Path, best_exists: bool) -> None:
            super().__init__()
            self.eval_env, self.seeds, self.freq, self.target, self.out = eval_env, seeds, freq, target, out
            self.block = start_step // freq if freq else 0
            self.log = log
            self.best = max((float(np.mean(r)) for r in log.results), default=-np.inf) if best_exists else -np.inf

        def _on_step(self) -> bool:
            step = int(self.num_timesteps)
            if self.freq and step < self.target and step // self.freq > self.block:
                self.block = step // self.freq
                self.evaluate()
            return True

        def evaluate(self) -> float:
            """Evaluate the model now, log it, keep it when best; returns the mean return."""
            sync_envs_normalization(self.model.get_env(), self.eval_env)
            self.eval_env.seed(self.seeds[0])
            returns, lengths = evaluate_policy(self.model, self.eval_env, n_eval_episodes=len(self.seeds),
                                               deterministic=True, return_episode_rewards=True, warn=False)
            mean = float(np.mean(returns))
            if mean > self.best:  # (saved before the log row: a logged evaluation's best is on disk, so a run killed
                # between the two and resumed evaluates again, the same, and keeps the same best)
                self.best = mean
                save_atomically(self.model.save, self.out / "best_model.zip")
                save_atomically(self.model.get_vec_normalize_env().save, self.out / "best_vecnormalize.pkl")
            self.log.timesteps.append(int(self.model.num_timesteps))
            self.log.results.append([float(r) for r in returns])
            self.log.ep_lengths.append([int(n) for n in lengths])
            write_evaluations(self.out / "eval" / "evaluations.npz", self.log)
            self.model.logger.record("eval/mean_reward", mean)
            self.model.logger.record("eval/mean_ep_length", float(np.mean(lengths)))
            return mean

    return {"tqdm": TqdmCallback, "dual": DualUpdate, "checkpoints": RolloutCheckpoints, "eval": Evaluations}
