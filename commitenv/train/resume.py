"""What ``commitenv train --resume`` needs to continue a run exactly where a checkpoint left it: the run's options
(saved in train.json when it starts), the learner's state at a rollout boundary (`RolloutState`: random generators,
each env's current episode as its seed and the actions taken since, the reward normalizer's running returns, the
dual multiplier), and the evaluation history (``eval/evaluations.npz``, written atomically, repaired or refused).

Checkpoints are taken at the start of a rollout, after the previous rollout's update: the model, its optimizer and
the normalizer statistics are then complete, and the half-finished episode of each env is rebuilt by resetting it
with its seed and replaying its actions (the env is deterministic given seed and actions), so a resumed run takes
the same steps as an uninterrupted one with the same seed."""

from __future__ import annotations

import copy
import os
import pickle
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["OPTION_FLAGS", "EvaluationLog", "RolloutState", "capture", "read_evaluations", "resolve_options",
           "restore_rng", "write_evaluations", "write_state"]

OPTION_FLAGS: dict[str, str] = {"algo": "--algo", "steps": "--steps", "envs": "--envs", "seed": "--seed",
                                "eval_freq": "--eval-freq", "eval_episodes": "--eval-episodes",
                                "checkpoint_freq": "--checkpoint-freq"}
"""The options a run keeps for its whole life (train.json ``options``); ``--steps`` alone may be raised on resume."""

DEFAULTS: dict[str, Any] = {"algo": "ppo", "steps": 100_000, "envs": 1, "seed": 0, "eval_freq": 6_000,
                            "eval_episodes": 5, "checkpoint_freq": 10_000}


def resolve_options(given: dict[str, Any], saved: dict[str, Any] | None, where: str) -> dict[str, Any]:
    """The options of a run: ``given`` (None: not given) over `DEFAULTS` for a new run; for a resumed run the
    ``saved`` ones, refusing in one line every given option that differs (``--steps`` may differ: the new total)."""
    if saved is None:
        return {k: (DEFAULTS[k] if given.get(k) is None else given[k]) for k in OPTION_FLAGS}
    clash = [f"{OPTION_FLAGS[k]} {given[k]} (started with {saved[k]})" for k in OPTION_FLAGS
             if k != "steps" and given.get(k) is not None and given[k] != saved.get(k)]
    if clash:
        raise ValueError(f"--resume: {where} keeps the options it started with; drop {', '.join(clash)}, or train "
                         "into a new --out folder")
    out = dict(saved)
    if given.get("steps") is not None:
        out["steps"] = given["steps"]
    return out


def saved_options(record: dict[str, Any]) -> dict[str, Any]:
    """The options a train.json record started with: its ``options``, or (a record written before they were saved)
    the same figures from its top-level fields."""
    opts = record.get("options")
    if isinstance(opts, dict) and set(OPTION_FLAGS) <= set(opts):
        return {k: opts[k] for k in OPTION_FLAGS}
    return {"algo": record.get("algo"), "steps": record.get("steps"), "envs": record.get("envs"),
            "seed": record.get("seed"), "eval_freq": record.get("eval_freq"),
            "eval_episodes": len(record.get("eval_seeds") or []), "checkpoint_freq": record.get("checkpoint_freq")}


# ================================================================================================ learner state
@dataclass
class RolloutState:
    """The learner's state at a rollout boundary, beside the model zip and the normalizer pickle of a checkpoint."""

    step: int
    rng: dict[str, Any]  # python, numpy, torch, action space
    episodes: list[tuple[int, list[Any]]]  # per env: the current episode's seed and the actions taken in it
    returns: np.ndarray | None  # VecNormalize's running discounted returns (not in its pickle)
    multiplier: float | None = None  # ppo-lagrangian's dual variable
    dual_history: list[list[float]] = field(default_factory=list)
    params: dict[str, Any] | None = field(default=None, repr=False)  # in memory only: the model's state dicts
    counters: dict[str, Any] = field(default_factory=dict, repr=False)  # in memory only
    normalizer: dict[str, Any] = field(default_factory=dict, repr=False)  # in memory only: obs_rms, ret_rms


def _rng(model: Any) -> dict[str, Any]:
    import torch

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "action_space": copy.deepcopy(model.action_space.np_random)}


def restore_rng(model: Any, rng: dict[str, Any]) -> None:
    """Set the random generators the learner draws from (exploration, minibatches, warm-up actions) as saved."""
    import torch

    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    model.action_space._np_random = copy.deepcopy(rng["action_space"])


def capture(model: Any, episodes: list[tuple[int, list[Any]]], multiplier: float | None,
            dual_history: list[list[float]], with_params: bool) -> RolloutState:
    """The learner's state now (``with_params``: also its parameters and counters, to be written later)."""
    norm = model.get_vec_normalize_env()
    state = RolloutState(step=int(model.num_timesteps), rng=_rng(model),
                         episodes=[(int(s), [np.array(a, copy=True) for a in acts]) for s, acts in episodes],
                         returns=None if norm is None else np.array(norm.returns, copy=True),
                         multiplier=multiplier, dual_history=[list(h) for h in dual_history])
    if with_params:
        state.params = copy.deepcopy(model.get_parameters())
        state.counters = {k: copy.copy(getattr(model, k)) for k in ("num_timesteps", "_n_updates", "_episode_num",
                                                                     "_current_progress_remaining")
                          if hasattr(model, k)}
        if norm is not None:
            state.normalizer = {"obs_rms": copy.deepcopy(norm.obs_rms), "ret_rms": copy.deepcopy(norm.ret_rms)}
    return state


def rewind(model: Any, state: RolloutState) -> None:
    """Put the model and its normalizer back to a captured state (after an interrupt, before saving it)."""
    if state.params is None:
        raise ValueError("rewind: the state holds no parameters")
    model.set_parameters(copy.deepcopy(state.params), exact_match=True)
    for k, v in state.counters.items():
        setattr(model, k, v)
    norm = model.get_vec_normalize_env()
    if norm is not None and state.normalizer:
        norm.obs_rms = copy.deepcopy(state.normalizer["obs_rms"])
        norm.ret_rms = copy.deepcopy(state.normalizer["ret_rms"])


def write_state(path: Path, state: RolloutState) -> None:
    """The state file of a checkpoint (its in-memory parts left out), written beside and moved in."""
    disk = RolloutState(state.step, state.rng, state.episodes, state.returns, state.multiplier, state.dual_history)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as fh:
            pickle.dump(disk, fh)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_state(path: Path) -> RolloutState:
    """A checkpoint's state file; ValueError naming it when it cannot be read."""
    try:
        with path.open("rb") as fh:
            state = pickle.load(fh)
    except Exception as e:  # noqa: BLE001  (truncated or foreign file: say which)
        raise ValueError(f"--resume: {path} cannot be read ({type(e).__name__}: {e}); delete this checkpoint's "
                         "files to resume from the one before") from None
    if not isinstance(state, RolloutState):
        raise ValueError(f"--resume: {path} is not a checkpoint state file")
    return state


# ================================================================================================ evaluations
@dataclass
class EvaluationLog:
    """SB3's evaluation log (``eval/evaluations.npz``): per evaluation its step, episode returns and lengths."""

    timesteps: list[int] = field(default_factory=list)
    results: list[list[float]] = field(default_factory=list)
    ep_lengths: list[list[int]] = field(default_factory=list)

    def upto(self, step: int) -> "EvaluationLog":
        """The evaluations made at or before ``step`` (those after a checkpoint are made again on resume)."""
        keep = [i for i, t in enumerate(self.timesteps) if t <= step]
        return EvaluationLog([self.timesteps[i] for i in keep], [self.results[i] for i in keep],
                             [self.ep_lengths[i] for i in keep])


def write_evaluations(path: Path, log: EvaluationLog) -> None:
    """The log in SB3's format, written beside and moved in (a kill never leaves half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.npz")
    try:
        np.savez(tmp, timesteps=np.asarray(log.timesteps, dtype=np.int64),
                 results=np.asarray(log.results, dtype=np.float64).reshape(len(log.timesteps), -1),
                 ep_lengths=np.asarray(log.ep_lengths, dtype=np.int64).reshape(len(log.timesteps), -1))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_evaluations(path: Path, episodes: int) -> EvaluationLog:
    """The evaluation log of a resumed run: empty when there is none; rows cut to those complete in all three
    arrays (repairing a log whose last write stopped half-way); ValueError in one line, naming the file, when it
    cannot be read or holds evaluations of another episode count."""
    if not path.is_file():
        return EvaluationLog()
    fix = f"move it aside to resume with an empty evaluation history"
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in ("timesteps", "results", "ep_lengths") if k not in z.files]
            if missing:
                raise ValueError(f"--resume: {path} is half-written (no {', '.join(missing)}); {fix}")
            t, r, n = (np.asarray(z[k]) for k in ("timesteps", "results", "ep_lengths"))
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001  (a truncated zip, a pickled object array)
        raise ValueError(f"--resume: {path} cannot be read ({type(e).__name__}: {e}); {fix}") from None
    if r.ndim != 2 or n.ndim != 2 or t.ndim != 1:
        raise ValueError(f"--resume: {path}: expected timesteps (k,), results and ep_lengths (k, episodes), got "
                         f"shapes {t.shape}, {r.shape}, {n.shape}; {fix}")
    k = min(len(t), len(r), len(n))
    if k and (r.shape[1] != episodes or n.shape[1] != episodes):
        raise ValueError(f"--resume: {path} holds evaluations of {r.shape[1]} episodes, the run evaluates "
                         f"{episodes}; {fix}")
    return EvaluationLog([int(x) for x in t[:k]], [[float(x) for x in row] for row in r[:k]],
                         [[int(x) for x in row] for row in n[:k]])
