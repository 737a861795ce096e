"""Training learners on a scenario with stable-baselines3 (``commitenv train``, the ``rl`` extra) and running the
result as a controller (``--controller sb3:DIR``). Importing this package imports neither stable-baselines3 nor
torch: the CLI parser and the constants below are cheap; `commitenv.train.trainer` and `commitenv.train.policy`
load the learning stack when used. Guide: docs/training.md."""

from __future__ import annotations

ALGORITHMS: tuple[str, ...] = ("ppo", "a2c", "sac", "dqn", "ppo-lagrangian")
"""The algorithms ``commitenv train --algo`` offers: stable-baselines3's, and ``ppo-lagrangian``, PPO on the reward
`commitenv.envs.LagrangianReward` penalises with a dual variable updated from the measured SLO violation after
every rollout (Ray et al. 2019), shared by all vectorised workers."""

SB3_CLASS: dict[str, str] = {"ppo": "PPO", "a2c": "A2C", "sac": "SAC", "dqn": "DQN", "ppo-lagrangian": "PPO"}
"""The stable-baselines3 class that trains (and loads) each algorithm's policy."""

ACTION_MAPPING: dict[str, str] = {"ppo": "flat", "a2c": "flat", "sac": "box", "dqn": "discrete",
                                  "ppo-lagrangian": "flat"}
"""The action wrapper each algorithm trains through (`commitenv.envs.wrappers.ACTION_WRAPPERS`): PPO and A2C take the
``MultiDiscrete`` flat action, SAC needs a continuous ``Box``, DQN a single ``Discrete`` action."""

RL_EXTRA = 'pip install "commitenv[rl]"'

__all__ = ["ACTION_MAPPING", "ALGORITHMS", "RL_EXTRA", "SB3_CLASS"]
