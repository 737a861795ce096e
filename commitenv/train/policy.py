"""A policy trained by ``commitenv train``, loaded from its folder and ready to act: the stable-baselines3 model, its
observation normalization frozen as saved (`VecNormalize` statistics, never updated here) and the action mapping of
the wrapper it was trained through (`commitenv.envs.wrappers`), so that it sees and acts exactly as in training.

A run folder holds ``train.json`` (algorithm, action mapping, ...), the final ``model.zip`` + ``vecnormalize.pkl``
and, when the run evaluated, the best ``best_model.zip`` + ``best_vecnormalize.pkl``. A model trained elsewhere (any
stable-baselines3 zip taking the env's 16 observation features, with or without its VecNormalize pickle) runs too:
its algorithm comes from the policy class it records and its action mapping from its action space. Loading
unpickles the normalizer and the model: load only files you trust (as with any stable-baselines3 model)."""

from __future__ import annotations

import json
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np

from commitenv.envs.wrappers import ActionCodec, codec_for
from commitenv.train import ACTION_MAPPING, ALGORITHMS, RL_EXTRA, SB3_CLASS

__all__ = ["FILES", "MAPPING_OF_SPACE", "PolicyFiles", "TrainedPolicy", "algorithm_class", "action_support",
           "detect_algorithm", "normalizer_beside", "policy_files", "support_argmax", "support_record"]

FILES = {"final": ("model.zip", "vecnormalize.pkl"), "best": ("best_model.zip", "best_vecnormalize.pkl")}
_STEPS = re.compile(r"^(.*)_(\d+)_steps$")  # SB3's CheckpointCallback: <prefix>_<N>_steps.zip


def algorithm_class(algo: str) -> Any:
    """The stable-baselines3 class of ``algo``; ValueError with the install line when stable-baselines3 is missing."""
    if algo not in ALGORITHMS:
        raise ValueError(f"algorithm '{algo}': expected one of {', '.join(ALGORITHMS)}")
    return getattr(_sb3(), SB3_CLASS[algo])


def _sb3() -> Any:
    try:
        import stable_baselines3 as sb3
    except ImportError as e:
        raise ValueError(f"trained policies need stable-baselines3 (the 'rl' extra: {RL_EXTRA}): {e}") from None
    return sb3


def support_argmax(policy: Any, obs_norm: np.ndarray, support: np.ndarray) -> np.ndarray:
    """For each standardized observation (rows of ``obs_norm``), the joint action of ``support`` (rows of
    MultiDiscrete actions) most probable under ``policy`` (an SB3 ``ActorCriticPolicy`` with a MultiDiscrete head,
    whose components are independent, so a joint log-probability is the sum of the components'). Decoding each
    component by its own argmax can combine values the teacher never played together (e.g. its fewest replicas at
    its lowest clock); restricting the argmax to the demonstrated pairs is the batch-constrained choice of Fujimoto
    et al. 2019 (BCQ). Ties go to the first row of ``support``."""
    import torch

    with torch.no_grad():
        obs_t = torch.as_tensor(np.asarray(obs_norm, dtype=np.float32))
        dist = policy.get_distribution(obs_t)
        logp = [d.logits.cpu().numpy() for d in dist.distribution]  # per component: (n, values), log-normalized
    score = sum(logp[k][:, support[:, k]] for k in range(support.shape[1]))
    return support[np.argmax(score, axis=1)]


def support_record(act: np.ndarray) -> list[dict[str, Any]]:
    """The ``action_support`` entry of a run's train.json for the actions ``act`` (rows) its teachers played: each
    distinct joint action (sorted) with how often it was played; `action_support` reads it back."""
    rows, counts = np.unique(np.asarray(act, dtype=np.int64), axis=0, return_counts=True)
    return [{"action": [int(v) for v in a], "demonstrations": int(n)} for a, n in zip(rows, counts)]


def action_support(record: dict[str, Any], where: str, nvec: Sequence[int]) -> np.ndarray | None:
    """The demonstrated joint actions a run's ``train.json`` declares (``action_support``: a list of
    ``{"action": [i, j, ...], "demonstrations": n}``), as rows; None where it declares none. ValueError naming the
    file when an entry is malformed or lies outside the action space ``nvec``."""
    entries = record.get("action_support")
    if entries is None:
        return None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{where}: action_support: expected a non-empty list of {{action, demonstrations}}")
    rows = []
    for i, e in enumerate(entries):
        a = e.get("action") if isinstance(e, dict) else None
        if not isinstance(a, list) or len(a) != len(nvec) or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n for v, n in zip(a, nvec)):
            raise ValueError(f"{where}: action_support[{i}]: expected an action of {len(nvec)} whole numbers within "
                             f"{list(nvec)}, got {e!r}")
        rows.append(a)
    return np.asarray(rows, dtype=np.int64)


@dataclass(frozen=True)
class PolicyFiles:
    """The files of one policy: which one (``best``, ``final`` or ``zip``: a model file given by its path), the model,
    its normalizer (None: the model takes raw observations) and train.json (None: not a ``commitenv train`` run)."""

    which: str
    model: Path
    normalizer: Path | None
    record: Path | None


def normalizer_beside(model: Path) -> Path | None:
    """The VecNormalize pickle saved with a model zip, by the naming conventions of ``commitenv train``
    (``best_model.zip`` -> ``best_vecnormalize.pkl``), SB3's checkpoints (``model_<N>_steps.zip`` ->
    ``model_vecnormalize_<N>_steps.pkl``) and rl-baselines3-zoo (``vecnormalize.pkl`` in the folder); None if none."""
    d, stem = model.parent, model.stem
    names = []
    m = _STEPS.match(stem)
    if m:
        names.append(f"{m.group(1)}_vecnormalize_{m.group(2)}_steps.pkl")
    if "model" in stem:
        names.append(stem.replace("model", "vecnormalize", 1) + ".pkl")
    names += [f"{stem}_vecnormalize.pkl", "vecnormalize.pkl"]
    return next((d / n for n in names if (d / n).is_file()), None)


def policy_files(where: str | Path, which: Literal["best", "final"] = "best") -> PolicyFiles:
    """The files of a policy: a ``commitenv train`` folder (``best``: the model its evaluation picked, or the final
    one when it evaluated nothing), any other folder holding a stable-baselines3 zip (``best_model.zip`` for
    ``best`` when there, ``model.zip``, or its only ``.zip``), or a model ``.zip`` itself; the VecNormalize pickle
    beside it is used when there (`normalizer_beside`). ValueError naming what is missing otherwise."""
    d = Path(where)
    if which not in FILES:
        raise ValueError(f"which: expected 'best' or 'final', got {which!r}")
    if d.is_file():
        if d.suffix != ".zip":
            raise ValueError(f"{d}: expected a stable-baselines3 model .zip or a folder holding one")
        return PolicyFiles("zip", d, normalizer_beside(d), None)
    if not d.is_dir():
        raise ValueError(f"{d}: no such folder or model zip")
    record = d / "train.json"
    if not record.is_file():  # a model trained elsewhere
        zips = sorted(d.glob("*.zip"))
        pick = [d / FILES[w][0] for w in ([which, "final"] if which == "best" else ["final"])]
        model = next((z for z in pick if z.is_file()), zips[0] if len(zips) == 1 else None)
        if model is None:
            raise ValueError(f"{d}: no model to run: expected model.zip (or best_model.zip, or a single .zip) of "
                             f"stable-baselines3, found {', '.join(z.name for z in zips) or 'no .zip'}")
        return PolicyFiles("best" if model.name == FILES["best"][0] else "final", model, normalizer_beside(model),
                           None)
    if which == "best" and not (d / FILES["best"][0]).is_file():
        which = "final"
    model, norm = (d / f for f in FILES[which])
    missing = [p.name for p in (record, model, norm) if not p.is_file()]
    if missing:
        raise ValueError(f"{d}: not a finished training run: missing {', '.join(missing)} (expected train.json, "
                         "model.zip and vecnormalize.pkl, as `commitenv train` writes)")
    return PolicyFiles(which, model, norm, record)


def detect_algorithm(model: Path) -> str:
    """The stable-baselines3 class that loads a model zip, from the policy class it records (an actor-critic policy:
    PPO when the zip holds a clip range, else A2C; DDPG's through TD3); ValueError naming the file otherwise."""
    from stable_baselines3.common.save_util import load_from_zip_file

    try:
        data, _, _ = load_from_zip_file(str(model), device="cpu", load_data=True)
    except Exception as e:  # noqa: BLE001  (not a zip, not SB3's)
        raise ValueError(f"{model}: not a stable-baselines3 model zip ({type(e).__name__}: {e})") from None
    policy = (data or {}).get("policy_class")
    if isinstance(policy, type):
        from stable_baselines3.common.policies import ActorCriticPolicy
        from stable_baselines3.dqn.policies import DQNPolicy
        from stable_baselines3.sac.policies import SACPolicy
        from stable_baselines3.td3.policies import TD3Policy

        for base, name in ((DQNPolicy, "DQN"), (SACPolicy, "SAC"), (TD3Policy, "TD3")):
            if issubclass(policy, base):
                return name
        if issubclass(policy, ActorCriticPolicy):
            return "PPO" if "clip_range" in data else "A2C"  # (A2C saves no clip range)
    shown = getattr(policy, "__qualname__", None) or repr(policy)[:80]
    raise ValueError(f"{model}: its policy class {shown} is none of stable-baselines3's PPO/A2C, SAC, TD3/DDPG or DQN "
                     "policies (sb3-contrib models are not supported)")


MAPPING_OF_SPACE = {"MultiDiscrete": "flat", "Box": "box", "Discrete": "discrete"}
"""The action mapping (`commitenv.envs.wrappers.ACTION_WRAPPERS`) a model trained elsewhere is run through, by its
action space's type."""


class TrainedPolicy:
    """The ``which`` policy (``best`` or ``final``, see `policy_files`) of a ``commitenv train`` folder, or any
    stable-baselines3 model zip (folder or file): `predict` maps a raw env observation to the learner's action
    deterministically, `codec` maps that to the env action."""

    def __init__(self, directory: str | Path, which: Literal["best", "final"] = "best") -> None:
        from commitenv.envs.commit_serve import OBS_FEATURES

        self.files = policy_files(directory, which)
        self.directory = Path(directory)
        self.record: dict[str, Any] = {}
        if self.files.record is not None:
            try:
                self.record = json.loads(self.files.record.read_text())
            except (OSError, ValueError) as e:
                raise ValueError(f"{self.files.record}: cannot read it ({e})") from None
        if self.record.get("algo") is not None:
            self.algo = str(self.record["algo"])
            cls = algorithm_class(self.algo)
        else:
            _sb3()
            self.algo = detect_algorithm(self.files.model).lower()
            cls = getattr(_sb3(), self.algo.upper())
        if self.algo == "ppo-lagrangian" and self.record.get("action_mapping", "flat") != "flat":
            raise ValueError(f"{self.files.record}: action_mapping: ppo-lagrangian trains a categorical policy on the "
                             f"flat MultiDiscrete action ('flat'), got {self.record.get('action_mapping')!r}")
        try:
            self.model = cls.load(str(self.files.model), device="cpu")
        except Exception as e:  # noqa: BLE001  (a broken or foreign zip: say which file)
            raise ValueError(f"{self.files.model}: cannot load the {self.algo.upper()} model "
                             f"({type(e).__name__}: {e})") from None
        shape = self.model.observation_space.shape
        if shape != (len(OBS_FEATURES),):
            raise ValueError(f"{self.files.model}: the model takes observations of shape {shape}, commitenv's env "
                             f"gives {len(OBS_FEATURES)} features, shape ({len(OBS_FEATURES)},) "
                             "(commitenv.envs.OBS_FEATURES, docs/training.md#observation)")
        space = type(self.model.action_space).__name__
        mapping = self.record.get("action_mapping", ACTION_MAPPING.get(self.algo) if self.record else None)
        if mapping is None:
            if space not in MAPPING_OF_SPACE:
                raise ValueError(f"{self.files.model}: the model acts in {self.model.action_space}; expected "
                                 "MultiDiscrete, Box or Discrete (docs/training.md#actions)")
            mapping = MAPPING_OF_SPACE[space]
        self.mapping = str(mapping)
        self.normalizer = None
        if self.files.normalizer is not None:
            try:
                with self.files.normalizer.open("rb") as fh:
                    self.normalizer = pickle.load(fh)  # a VecNormalize without its venv: statistics and settings
            except Exception as e:  # noqa: BLE001
                raise ValueError(f"{self.files.normalizer}: cannot load the observation normalization "
                                 f"({type(e).__name__}: {e})") from None
            self.normalizer.training = False  # frozen: running the policy never updates the statistics
            if getattr(self.normalizer, "observation_space", None) is not None and \
                    self.normalizer.observation_space.shape != shape:
                raise ValueError(f"{self.directory}: the model and its normalizer disagree on the observation shape "
                                 f"({shape} vs {self.normalizer.observation_space.shape})")
        self.support = None
        if self.record.get("action_support") is not None:
            if space != "MultiDiscrete" or self.algo not in ("ppo", "a2c"):
                raise ValueError(f"{self.files.record}: action_support: decoding to demonstrated actions needs a "
                                 f"PPO/A2C policy on a MultiDiscrete action, got {self.algo} on {space}")
            self.support = action_support(self.record, str(self.files.record), self.model.action_space.nvec.tolist())

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
        if self.normalizer is None:
            return obs[np.newaxis]
        return np.asarray(self.normalizer.normalize_obs(obs[np.newaxis]), dtype=np.float32)

    def predict(self, observation: np.ndarray) -> Any:
        """The learner's deterministic action for a raw env observation: the most probable action or, where the run
        declares an ``action_support``, the most probable of those (`support_argmax`)."""
        if self.support is not None:
            return support_argmax(self.model.policy, self.normalize(observation), self.support)[0]
        action, _ = self.model.predict(self.normalize(observation), deterministic=True)
        return action[0]
