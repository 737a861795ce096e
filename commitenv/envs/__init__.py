"""Gymnasium environments and wrappers."""

from commitenv.envs.commit_serve import OBS_FEATURES, CommitServeEnv
from commitenv.envs.lagrangian import LagrangianReward
from commitenv.envs.wrappers import FlatActionWrapper, SharedFlatActionWrapper

__all__ = ["OBS_FEATURES", "CommitServeEnv", "FlatActionWrapper", "LagrangianReward", "SharedFlatActionWrapper"]
