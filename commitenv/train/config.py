"""Hyperparameters of ``commitenv train``: one pydantic model per algorithm, read from a YAML file (``--config``) and
validated strictly: an unknown key, a value of the wrong type or out of range is an error naming the file and the
key. Keys left out take the defaults below (stable-baselines3's own, except the small network [64, 64] and PPO's
``n_steps`` of 512, which suit 60-step episodes and a policy small enough to keep in a repository).

Every algorithm takes ``learning_rate``, ``gamma``, ``policy_kwargs`` (``net_arch``: hidden layer sizes;
``activation_fn``: ``tanh``, ``relu``, ``elu`` or ``leaky_relu``) and ``normalize`` (the `VecNormalize` settings:
``norm_obs``, ``norm_reward``, ``clip_obs``, ``clip_reward``); PPO and A2C also take ``initial_action`` (where the
new policy starts, `InitialAction`); the rest are the algorithm's own constructor arguments under their
stable-baselines3 names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt,
                      ValidationError)

from commitenv.train import ALGORITHMS

__all__ = ["A2CConfig", "AlgoConfig", "DQNConfig", "InitialAction", "LagrangianConfig", "NormalizeConfig", "PPOConfig",
           "PPOLagrangianConfig", "PolicyConfig", "SACConfig", "config_class", "default_config", "load_config",
           "parse_config"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PolicyConfig(_Strict):
    """The policy network: hidden layer sizes (the same for actor and critic) and their activation."""

    net_arch: list[PositiveInt] = Field(default_factory=lambda: [64, 64])
    activation_fn: Literal["tanh", "relu", "elu", "leaky_relu"] = "tanh"


class NormalizeConfig(_Strict):
    """`stable_baselines3.common.vec_env.VecNormalize`: running standardization of observations and rewards; the
    observation statistics are saved with the model (``vecnormalize.pkl``) and frozen when the policy runs."""

    norm_obs: bool = True
    norm_reward: bool = True
    clip_obs: PositiveFloat = 10.0
    clip_reward: PositiveFloat = 10.0


class AlgoConfig(_Strict):
    """What every algorithm takes."""

    learning_rate: PositiveFloat = 3e-4
    gamma: float = Field(0.99, gt=0.0, le=1.0)
    policy_kwargs: PolicyConfig = Field(default_factory=PolicyConfig)
    normalize: NormalizeConfig = Field(default_factory=NormalizeConfig)

    def algo_kwargs(self) -> dict[str, Any]:
        """The algorithm's constructor arguments (``policy_kwargs`` with the activation still a name)."""
        return self.model_dump(exclude={"normalize", "initial_action", "lagrangian"})


class InitialAction(_Strict):
    """Where a new categorical policy starts: its action head biased so that each component picks this
    configuration with ``probability`` (the other values sharing the rest evenly), instead of uniformly at random.
    On a pool with little spare capacity a uniform start keeps half the replicas off and buries the pool in a
    backlog that the early episodes never clear; ``all`` replicas at the ``top`` clock is vLLM's configuration."""

    active: PositiveInt | Literal["all"] = "all"
    clock: NonNegativeInt | Literal["top"] = "top"
    probability: float = Field(0.8, gt=0.0, lt=1.0)


class _CategoricalConfig(AlgoConfig):
    """What the algorithms with a categorical (flat ``MultiDiscrete``) policy take besides: ``initial_action``
    (none: SB3's own near-uniform start)."""

    initial_action: InitialAction | None = None


class PPOConfig(_CategoricalConfig):
    """`stable_baselines3.PPO` (flat ``MultiDiscrete`` actions)."""

    n_steps: PositiveInt = 512
    batch_size: PositiveInt = 64
    n_epochs: PositiveInt = 10
    gae_lambda: float = Field(0.95, ge=0.0, le=1.0)
    clip_range: PositiveFloat = 0.2
    ent_coef: NonNegativeFloat = 0.0
    vf_coef: NonNegativeFloat = 0.5
    max_grad_norm: PositiveFloat = 0.5
    target_kl: PositiveFloat | None = None


class LagrangianConfig(_Strict):
    """The dual variable of ``ppo-lagrangian`` (`commitenv.envs.LagrangianReward`): its start (kWh-eq per miss; null:
    the scenario's ``miss_penalty_kwh``), its step per unit of violation after each rollout, and the miss fraction
    the worst arrival hour may reach (null: the scenario's epsilon)."""

    initial_multiplier: NonNegativeFloat | None = None
    lr: NonNegativeFloat = 1.0
    limit: float | None = Field(None, ge=0.0, le=1.0)


class PPOLagrangianConfig(PPOConfig):
    """PPO on the Lagrangian reward with an adaptive multiplier (flat ``MultiDiscrete`` actions)."""

    lagrangian: LagrangianConfig = Field(default_factory=LagrangianConfig)


class A2CConfig(_CategoricalConfig):
    """`stable_baselines3.A2C` (flat ``MultiDiscrete`` actions)."""

    learning_rate: PositiveFloat = 7e-4
    n_steps: PositiveInt = 5
    gae_lambda: float = Field(1.0, ge=0.0, le=1.0)
    ent_coef: NonNegativeFloat = 0.0
    vf_coef: NonNegativeFloat = 0.5
    max_grad_norm: PositiveFloat = 0.5
    rms_prop_eps: PositiveFloat = 1e-5
    use_rms_prop: bool = True
    normalize_advantage: bool = False


class SACConfig(AlgoConfig):
    """`stable_baselines3.SAC` (``Box`` actions in [-1, 1]^2, rounded to the nearest configuration)."""

    buffer_size: PositiveInt = 100_000
    learning_starts: int = Field(100, ge=0)
    batch_size: PositiveInt = 256
    tau: float = Field(0.005, gt=0.0, le=1.0)
    train_freq: PositiveInt = 1
    gradient_steps: PositiveInt = 1
    ent_coef: Literal["auto"] | PositiveFloat = "auto"
    target_update_interval: PositiveInt = 1


class DQNConfig(AlgoConfig):
    """`stable_baselines3.DQN` (one ``Discrete`` action per (active, clock) pair)."""

    learning_rate: PositiveFloat = 1e-4
    buffer_size: PositiveInt = 100_000
    learning_starts: int = Field(100, ge=0)
    batch_size: PositiveInt = 32
    tau: float = Field(1.0, gt=0.0, le=1.0)
    train_freq: PositiveInt = 4
    gradient_steps: PositiveInt = 1
    target_update_interval: PositiveInt = 1000
    exploration_fraction: float = Field(0.1, gt=0.0, le=1.0)
    exploration_initial_eps: float = Field(1.0, ge=0.0, le=1.0)
    exploration_final_eps: float = Field(0.05, ge=0.0, le=1.0)
    max_grad_norm: PositiveFloat = 10.0


_CLASSES: dict[str, type[AlgoConfig]] = {"ppo": PPOConfig, "a2c": A2CConfig, "sac": SACConfig, "dqn": DQNConfig,
                                         "ppo-lagrangian": PPOLagrangianConfig}


def config_class(algo: str) -> type[AlgoConfig]:
    """The hyperparameter model of ``algo``."""
    if algo not in _CLASSES:
        raise ValueError(f"--algo {algo}: expected one of {', '.join(ALGORITHMS)}")
    return _CLASSES[algo]


def default_config(algo: str) -> AlgoConfig:
    """``algo``'s hyperparameters with nothing changed."""
    return config_class(algo)()


def parse_config(raw: Any, algo: str, source: str = "<config>") -> AlgoConfig:
    """Validate a mapping (parsed YAML, or a train.json's ``hyperparameters``) for ``algo``; ValueError naming
    ``source`` and every offending key otherwise."""
    cls = config_class(algo)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"{source}: expected a mapping of {algo} hyperparameters at the top level, "
                         f"got {type(raw).__name__}")
    try:
        return cls.model_validate(raw)
    except ValidationError as e:
        raise ValueError(_format(source, algo, cls, e)) from None


def load_config(path: str | Path, algo: str) -> AlgoConfig:
    """The hyperparameters of ``algo`` in the YAML file ``path`` (see the module docstring)."""
    from commitenv.scenarios.loader import read_yaml

    try:
        raw = read_yaml(Path(path), ValueError)
    except ValueError as e:
        raise ValueError(f"--config {e}") from None
    return parse_config(raw, algo, str(path))


def _format(source: str, algo: str, cls: type[BaseModel], e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = [str(x) for x in err["loc"]]
        where = ".".join(loc)
        if err["type"] == "extra_forbidden":
            model: Any = cls
            for part in loc[:-1]:  # the model the unknown key sits in, for the accepted keys
                model = getattr(model.model_fields.get(part), "annotation", None) or model
            accepted = ", ".join(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else ""
            parts.append(f"unknown key '{where}' for --algo {algo}" + (f" (accepted: {accepted})" if accepted else ""))
        else:
            parts.append(f"{where}: {err['msg']} (got {err.get('input')!r})")
    return f"{source}: " + "; ".join(parts)
