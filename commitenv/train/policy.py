"""A policy trained by ``commitenv train``, loaded from its folder and ready to act: the stable-baselines3 model, its
observation normalization frozen as saved (`VecNormalize` statistics, never updated here) and the action mapping of
the wrapper it was trained through (`commitenv.envs.wrappers`), so that it sees and acts exactly as in training.

A run folder holds ``train.json`` (algorithm, action mapping, ...), the final ``model.zip`` + ``vecnormalize.pkl``
and, when the run evaluated, the best ``best_model.zip`` + ``best_vecnormalize.pkl``. Loading unpickles the
normalizer and the model: load only folders you trust (as with any stable-baselines3 model)."""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np

from commitenv.envs.wrappers import ActionCodec, codec_for
from commitenv.train import ACTION_MAPPING, ALGORITHMS, RL_EXTRA, SB3_CLASS

__all__ = ["FILES", "PolicyFiles", "TrainedPolicy", "algorithm_class", "policy_files"]

FILES = {"final": ("model.zip", "vecnormalize.pkl"), "best": ("best_model.zip", "best_vecnormalize.pkl")}


def algorithm_class(algo: str) -> Any:
    """The stable-baselines3 class of ``algo``; ValueError with the install line when stable-baselines3 is missing."""
    if algo not in ALGORITHMS:
        raise ValueError(f"algorithm '{algo}': expected one of {', '.join(ALGORITHMS)}")
    try:
        import stable_baselines3 as sb3
    except ImportError as e:
        raise ValueError(f"trained policies need stable-baselines3 (the 'rl' extra: {RL_EXTRA}): {e}") from None
    return getattr(sb3, SB3_CLASS[algo])


@dataclass(frozen=True)
class PolicyFiles:
    """The files of one policy in a run folder: which one (``best`` or ``final``), model, normalizer, train.json."""

    which: str
    model: Path
    normalizer: Path
    record: Path


def policy_files(directory: str | Path, which: Literal["best", "final"] = "best") -> PolicyFiles:
    """The files of the ``which`` policy of a run folder: ``best`` is the model the run's evaluation picked, or the
    final one when the run evaluated nothing; ValueError naming what is missing otherwise."""
    d = Path(directory)
    if which not in FILES:
        raise ValueError(f"which: expected 'best' or 'final', got {which!r}")
    if not d.is_dir():
        raise ValueError(f"{d}: no such folder (expected a folder written by `commitenv train`)")
    record = d / "train.json"
    if which == "best" and not (d / FILES["best"][0]).is_file():
        which = "final"
    model, norm = (d / f for f in FILES[which])
    missing = [p.name for p in (record, model, norm) if not p.is_file()]
    if missing:
        raise ValueError(f"{d}: not a finished training run: missing {', '.join(missing)} (expected train.json, "
                         "model.zip and vecnormalize.pkl, as `commitenv train` writes)")
    return PolicyFiles(which, model, norm, record)


class TrainedPolicy:
    """The ``which`` policy (``best`` or ``final``, see `policy_files`) of a ``commitenv train`` folder: `predict` maps
    a raw env observation to the learner's action deterministically, `codec` maps that to the env action."""

    def __init__(self, directory: str | Path, which: Literal["best", "final"] = "best") -> None:
        self.files = policy_files(directory, which)
        self.directory = Path(directory)
        try:
            self.record: dict[str, Any] = json.loads(self.files.record.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{self.files.record}: cannot read it ({e})") from None
        self.algo = str(self.record.get("algo"))
        self.mapping = str(self.record.get("action_mapping", ACTION_MAPPING.get(self.algo, "")))
        if self.algo == "ppo-lagrangian" and self.mapping != "flat":
            raise ValueError(f"{self.files.record}: action_mapping: ppo-lagrangian trains a categorical policy on the "
                             f"flat MultiDiscrete action ('flat'), got {self.mapping!r}")
        cls = algorithm_class(self.algo)
        try:
            self.model = cls.load(str(self.files.model), device="cpu")
        except Exception as e:  # noqa: BLE001  (a broken or foreign zip: say which file)
            raise ValueError(f"{self.files.model}: cannot load the {self.algo.upper()} model "
                             f"({type(e).__name__}: {e})") from None
        try:
            with self.files.normalizer.open("rb") as fh:
                self.normalizer = pickle.load(fh)  # a VecNormalize without its venv: statistics and settings only
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"{self.files.normalizer}: cannot load the observation normalization "
                             f"({type(e).__name__}: {e})") from None
        self.normalizer.training = False  # frozen: running the policy never updates the statistics
        shape = self.model.observation_space.shape
        if getattr(self.normalizer, "observation_space", None) is not None and \
                self.normalizer.observation_space.shape != shape:
            raise ValueError(f"{self.directory}: the model and its normalizer disagree on the observation shape "
                             f"({shape} vs {self.normalizer.observation_space.shape})")

    @property
    def which(self) -> str:
        return self.files.which

    def codec(self, n_replicas: int, clocks_mhz: Sequence[int]) -> ActionCodec:
        """The action mapping of training for a pool of ``n_replicas`` and these clock levels; ValueError when the
        policy was trained for another pool shape (its action space would not fit)."""
        codec = codec_for(self.mapping, n_replicas, len(clocks_mhz), 1, clocks_mhz)
        if codec.space != self.model.action_space:
            raise ValueError(f"{self.directory}: the policy acts in {self.model.action_space}, but this pool "
                             f"({n_replicas} replicas x {len(clocks_mhz)} clock levels) needs {codec.space} under "
                             f"the '{self.mapping}' mapping; use a policy trained on this pool")
        return codec

    def normalize(self, observation: np.ndarray) -> np.ndarray:
        """The observation as the policy saw it in training (a batch of one, float32), statistics unchanged."""
        obs = np.asarray(observation, dtype=np.float32)
        if obs.shape != self.model.observation_space.shape:
            raise ValueError(f"{self.directory}: the policy expects observations of shape "
                             f"{self.model.observation_space.shape}, got {obs.shape}")
        return np.asarray(self.normalizer.normalize_obs(obs[np.newaxis]), dtype=np.float32)

    def predict(self, observation: np.ndarray) -> Any:
        """The learner's deterministic action for a raw env observation."""
        action, _ = self.model.predict(self.normalize(observation), deterministic=True)
        return action[0]
