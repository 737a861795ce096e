"""A policy trained by ``commitenv train`` (stable-baselines3) as a controller: ``--controller sb3:DIR``.

DIR is a run folder (``commitenv train --out DIR``), a folder or ``.zip`` of a stable-baselines3 model trained
elsewhere on the env's observation (``sb3:PATH.zip``; its VecNormalize pickle beside it is used when there), or the
name of a baseline shipped in this package (``data/<name>/``: ``sb3:ppo-h200-hour``). The controller loads the model and its observation statistics, normalizes
every observation exactly as in training (statistics frozen), acts deterministically and maps the action back to the
env action with the training wrapper's own codec (`commitenv.envs.wrappers`). A run records the origin
``sb3:<abs dir>``, from which ``commitenv attribute`` rebuilds it. ``--controller-arg which=final`` runs the final
model instead of the one the run's evaluation picked (``best``, the default).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from commitenv_controllers.base import Controller, ControllerContext

__all__ = ["SHIPPED", "SB3Policy", "SB3PolicyConfig", "policy_dir", "policy_name", "shipped"]

SHIPPED = Path(__file__).resolve().parent / "data"  # shipped baselines, one folder each


def shipped() -> list[str]:
    """Names of the shipped baselines (``sb3:<name>``)."""
    return sorted(p.name for p in SHIPPED.iterdir() if (p / "train.json").is_file()) if SHIPPED.is_dir() else []


def policy_dir(where: str, spec: str | None = None) -> Path:
    """The absolute path ``where`` names: a folder holding a stable-baselines3 model (a ``commitenv train`` run, or
    any folder with ``model.zip``), a model ``.zip``, else a shipped baseline's name; ValueError saying what is
    missing (or that stable-baselines3 is not installed) otherwise."""
    from commitenv.train import RL_EXTRA
    from commitenv.train.policy import policy_files

    label = f"controller '{spec or 'sb3:' + where}'"
    p = Path(where).expanduser()
    if not p.exists() and "/" not in where and "\\" not in where and (SHIPPED / where).is_dir():
        p = SHIPPED / where
    if not p.exists():
        names = shipped()
        raise ValueError(f"{label}: no folder {where} (expected the --out folder of `commitenv train`, a folder "
                         "holding a stable-baselines3 model.zip, or a model .zip"
                         + (f", or a shipped baseline: {', '.join(names)})" if names else ")"))
    if p.is_file() and p.suffix != ".zip":
        raise ValueError(f"{label}: {where} is a file but not a .zip; expected the --out folder of `commitenv train` "
                         "or a stable-baselines3 model .zip")
    try:
        policy_files(p, "final")
    except ValueError as e:
        raise ValueError(f"{label}: {e}") from None
    if importlib.util.find_spec("stable_baselines3") is None:
        raise ValueError(f"{label}: running a trained policy needs stable-baselines3 (the 'rl' extra: {RL_EXTRA})")
    return p.resolve()


def policy_name(path: Path) -> str:
    """The name a trained policy runs under: ``sb3-<folder name>``, or ``sb3-<zip name>`` for a zip not named
    ``model.zip`` / ``best_model.zip``."""
    p = Path(path)
    if p.suffix == ".zip" and p.stem not in ("model", "best_model"):
        return f"sb3-{p.stem}"
    return f"sb3-{(p.parent if p.suffix == '.zip' else p).name}"


class SB3PolicyConfig(BaseModel):
    """``--controller-arg`` of ``sb3:DIR`` (the folder itself comes from the spec)."""

    model_config = ConfigDict(extra="forbid")

    which: Literal["best", "final"] = "best"


class SB3Policy(Controller):
    """A policy trained by `commitenv train` (stable-baselines3), deterministic: ``--controller sb3:DIR``."""

    name = "sb3"
    config_model = SB3PolicyConfig

    def __init__(self, path: str | Path, which: Literal["best", "final"] = "best") -> None:
        from commitenv.train.policy import TrainedPolicy

        self.path = policy_dir(str(path))
        self.policy = TrainedPolicy(self.path, which)
        self.which = self.policy.which  # "best" falls back to "final" when the run kept no best model
        self.name = policy_name(self.path)
        self.codec = None

    @property
    def spec_origin(self) -> str:
        """Where the run records this controller: ``sb3:<abs dir>`` (`commitenv.registry.spec_from_origin`)."""
        return f"sb3:{self.path}"

    def reset(self, ctx: ControllerContext, seed: int | None = None) -> None:
        super().reset(ctx, seed)
        self.codec = self.policy.codec(ctx.n_replicas, ctx.clocks_mhz)  # refuses a pool the policy was not built for

    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict[str, int]:
        if self.codec is None:
            raise RuntimeError("act() called before reset()")
        return self.codec.decode(self.policy.predict(observation))
